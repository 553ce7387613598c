"""LightModel: the net, loss and metrics of a KerasModel, trained by a real Lightning Trainer."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torchmetrics
from torch import nn

import kerastorch as kt
from helpers import TorchkerasAccuracy, accuracy

REPO_ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*does not have many workers"),
    pytest.mark.filterwarnings("ignore:.*smaller than the logging interval"),
    pytest.mark.filterwarnings("ignore:.*LeafSpec.*is deprecated"),  # Lightning's own use of torch internals
]


def digit_metrics() -> dict:
    # The same accuracy three ways: each kind of metric must give the same epoch value.
    return {
        "acc": torchmetrics.Accuracy(task="multiclass", num_classes=10),
        "acc_fn": accuracy,
        "acc_tk": TorchkerasAccuracy(),
    }


def quiet_trainer(pl, root, **kwargs):
    return pl.Trainer(
        accelerator="cpu",
        devices=1,
        default_root_dir=root,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        log_every_n_steps=1,
        **kwargs,
    )


@pytest.fixture(scope="module")
def trained(tmp_path_factory, one_thread):
    """Seed 003's recipe: the CNN on the digits, ModelCheckpoint and EarlyStopping on val_acc."""
    pl = pytest.importorskip("lightning.pytorch")
    from kerastorch.examples import create_cnn, digits_loaders

    kt.seed_everything(0)
    dl_train, dl_val, _ = digits_loaders(val_fraction=0.25, test_fraction=0.0)  # 449 validation digits
    net = create_cnn()
    model = kt.LightModel(
        net,
        loss_fn=nn.CrossEntropyLoss(),
        metrics_dict=digit_metrics(),
        optimizer=torch.optim.Adam(net.parameters(), lr=1e-2),
    )
    checkpoint = pl.callbacks.ModelCheckpoint(monitor="val_acc", mode="max", save_top_k=1)
    early_stopping = pl.callbacks.EarlyStopping(monitor="val_acc", mode="max", patience=2)
    trainer = quiet_trainer(
        pl, tmp_path_factory.mktemp("lightning"), max_epochs=5, callbacks=[checkpoint, early_stopping]
    )
    trainer.fit(model, dl_train, dl_val)
    return {
        "pl": pl,
        "trainer": trainer,
        "model": model,
        "checkpoint": checkpoint,
        "dl_train": dl_train,
        "dl_val": dl_val,
    }


@pytest.mark.slow
def test_trainer_with_checkpoint_and_early_stopping_learns_the_digits(trained):
    checkpoint = trained["checkpoint"]
    assert checkpoint.best_model_score is not None
    assert float(checkpoint.best_model_score) > 0.8
    assert os.path.isfile(checkpoint.best_model_path)
    logged = trained["trainer"].callback_metrics
    assert {
        "train_loss",
        "train_acc",
        "train_acc_fn",
        "train_acc_tk",
        "val_loss",
        "val_acc",
        "val_acc_fn",
        "val_acc_tk",
    } <= set(logged)
    # One accuracy, three kinds of metric: the same sample-weighted epoch value.
    assert float(logged["val_acc_fn"]) == pytest.approx(float(logged["val_acc"]), abs=1e-6)
    assert float(logged["val_acc_tk"]) == pytest.approx(float(logged["val_acc"]), abs=1e-6)
    assert float(logged["train_acc_fn"]) == pytest.approx(float(logged["train_acc"]), abs=1e-6)
    assert float(logged["train_acc_tk"]) == pytest.approx(float(logged["train_acc"]), abs=1e-6)


@pytest.mark.slow
def test_checkpoint_loads_back_with_the_same_val_acc(trained):
    from kerastorch.examples import create_cnn

    pl, checkpoint, dl_val = trained["pl"], trained["checkpoint"], trained["dl_val"]
    best_acc = float(checkpoint.best_model_score)

    restored = kt.LightModel.load_from_checkpoint(
        checkpoint.best_model_path, net=create_cnn(), loss_fn=nn.CrossEntropyLoss(), metrics_dict=digit_metrics()
    )
    [logs] = quiet_trainer(pl, checkpoint.dirpath).validate(restored, dl_val, verbose=False)
    assert logs["val_acc"] == pytest.approx(best_acc, abs=1e-6)

    # The checkpoint holds only the net's weights ("net." keys): a plain net loads them, and
    # KerasModel's exact evaluation agrees with what Lightning logged, loss included.
    state = torch.load(checkpoint.best_model_path, map_location="cpu", weights_only=True)["state_dict"]
    assert all(key.startswith("net.") for key in state)
    fresh_net = create_cnn()
    fresh_net.load_state_dict({key[len("net.") :]: value for key, value in state.items()})
    exact = kt.KerasModel(fresh_net, nn.CrossEntropyLoss(), digit_metrics()).evaluate(dl_val, quiet=True)
    assert exact["val_acc"] == pytest.approx(best_acc, abs=1e-6)
    assert exact["val_loss"] == pytest.approx(logs["val_loss"], rel=1e-5)
    # 449 validation digits in batches of 64 end with a batch of one: a mean of batch
    # means would be far from the exact value.
    assert len(dl_val.dataset) % dl_val.batch_size == 1


@pytest.mark.slow
def test_test_and_predict_steps(trained):
    pl, model, dl_val = trained["pl"], trained["model"], trained["dl_val"]
    trainer = quiet_trainer(pl, trained["checkpoint"].dirpath)
    [logs] = trainer.test(model, dl_val, verbose=False)
    assert set(logs) == {"test_loss", "test_acc", "test_acc_fn", "test_acc_tk"}
    assert logs["test_acc_tk"] == pytest.approx(logs["test_acc"], abs=1e-6)

    predictions = torch.cat(trainer.predict(model, dl_val))
    expected = kt.KerasModel(model.net, nn.CrossEntropyLoss()).predict(dl_val)
    assert predictions.shape == (len(dl_val.dataset), 10)
    torch.testing.assert_close(predictions, expected)
    assert float((predictions.argmax(1) == dl_val.dataset.tensors[1]).float().mean()) == pytest.approx(
        logs["test_acc"], abs=1e-6
    )


DDP_VALIDATE = textwrap.dedent("""
    import json, sys
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, Subset
    import lightning.pytorch as pl
    import kerastorch as kt
    from kerastorch.examples import create_cnn, digits_datasets

    out_dir, tests_dir = sys.argv[1], sys.argv[2]
    sys.path[:0] = [tests_dir, tests_dir + "/compat"]  # helpers.py, then this test file
    from test_lightmodel import digit_metrics

    torch.set_num_threads(1)
    net = create_cnn()
    net.load_state_dict(torch.load(out_dir + "/net.pt", weights_only=True))
    dl_val = DataLoader(Subset(digits_datasets(val_fraction=0.25, test_fraction=0.0)[1], range(448)), batch_size=64)
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", default_root_dir=out_dir, logger=False,
                         enable_progress_bar=False, enable_model_summary=False)
    [logs] = trainer.validate(kt.LightModel(net, nn.CrossEntropyLoss(), digit_metrics()), dl_val, verbose=False)
    if trainer.global_rank == 0:
        with open(out_dir + "/logs.json", "w") as f:
            json.dump({"world_size": trainer.world_size, "logs": logs}, f)
    # Close the process group before the interpreter exits: gloo's threads torn down at
    # exit can abort the process ("terminate called without an active exception").
    trainer.strategy.barrier()
    torch.distributed.destroy_process_group()
""")


@pytest.mark.slow
def test_values_are_synced_over_two_gloo_processes(tmp_path):
    """Two real DDP processes each see half of the data; rank 0 logs the whole set's values."""
    pytest.importorskip("lightning.pytorch")
    import json

    from torch.utils.data import DataLoader, Subset

    from kerastorch.examples import create_cnn, digits_datasets

    kt.seed_everything(0)
    net = create_cnn()
    torch.save(net.state_dict(), tmp_path / "net.pt")
    held_out = digits_datasets(val_fraction=0.25, test_fraction=0.0)[1]  # 449 digits
    val_set = Subset(held_out, range(448))  # even, so the sampler pads nothing
    exact = kt.KerasModel(net, nn.CrossEntropyLoss(), digit_metrics()).evaluate(
        DataLoader(val_set, batch_size=64), quiet=True
    )
    first_half = kt.KerasModel(net, nn.CrossEntropyLoss(), digit_metrics()).evaluate(
        DataLoader(Subset(val_set, range(0, 448, 2)), batch_size=64), quiet=True
    )
    assert first_half["val_acc"] != pytest.approx(exact["val_acc"])  # so an unsynced value would show

    script = tmp_path / "ddp_validate.py"
    script.write_text(DDP_VALIDATE)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONWARNINGS": "ignore"}
    result = subprocess.run(
        [sys.executable, str(script), str(tmp_path), str(REPO_ROOT / "tests")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    reported = json.loads((tmp_path / "logs.json").read_text())
    assert reported["world_size"] == 2
    for name in ("val_loss", "val_acc", "val_acc_fn", "val_acc_tk"):
        assert reported["logs"][name] == pytest.approx(exact[name], rel=1e-5), name


def test_plateau_scheduler_is_stepped_with_val_loss(tmp_path, one_thread):
    pl = pytest.importorskip("lightning.pytorch")
    from torch.utils.data import DataLoader, TensorDataset

    kt.seed_everything(0)
    x = torch.randn(96, 4)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    dl_train = DataLoader(TensorDataset(x[:64], y[:64]), batch_size=16, shuffle=True)
    dl_val = DataLoader(TensorDataset(x[64:], y[64:]), batch_size=10)  # 32 samples: a last batch of 2
    net = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05)
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="min", patience=10)
    model = kt.LightModel(net, nn.MSELoss(), optimizer=optimizer, lr_scheduler=scheduler)

    val_losses = []

    class RecordValLoss(pl.Callback):
        def on_validation_epoch_end(self, trainer, pl_module):
            if not trainer.sanity_checking:
                val_losses.append(float(trainer.callback_metrics["val_loss"]))

    quiet_trainer(pl, tmp_path, max_epochs=3, num_sanity_val_steps=0, callbacks=[RecordValLoss()]).fit(
        model, dl_train, dl_val
    )
    assert len(val_losses) == 3
    assert scheduler.last_epoch == 3
    assert scheduler.best == pytest.approx(min(val_losses), rel=1e-6)


def test_default_optimizer_is_adam_and_bad_arguments_are_refused():
    pytest.importorskip("lightning.pytorch")
    model = kt.LightModel(nn.Linear(2, 1), nn.MSELoss())
    assert isinstance(model.configure_optimizers(), torch.optim.Adam)
    assert model.configure_optimizers().param_groups[0]["lr"] == 1e-3
    with pytest.raises(ValueError, match="no loss_fn"):
        kt.LightModel(nn.Linear(2, 1))
    with pytest.raises(TypeError, match="torch.nn.Module"):
        kt.LightModel(lambda x: x, nn.MSELoss())
    with pytest.raises(TypeError, match=r"metrics_dict\['acc'\]"):
        kt.LightModel(nn.Linear(2, 1), nn.MSELoss(), metrics_dict={"acc": 0.5})


@pytest.mark.slow
def test_without_lightning_import_works_and_light_model_names_the_extra():
    # A real interpreter in which Lightning cannot be imported, as if it were not installed.
    script = textwrap.dedent("""
        import importlib.abc, sys

        class NoLightning(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("lightning", "pytorch_lightning", "lightning_fabric"):
                    raise ModuleNotFoundError(f"No module named {name!r}", name=name)
                return None

        sys.meta_path.insert(0, NoLightning())
        import kerastorch
        from kerastorch import *
        assert "LightModel" not in kerastorch.__all__, kerastorch.__all__
        assert KerasModel is kerastorch.KerasModel
        try:
            kerastorch.LightModel
        except ImportError as error:
            print("ERROR:", error)
        else:
            raise SystemExit("kerastorch.LightModel did not raise")
        try:
            from kerastorch import LightModel
        except ImportError as error:
            print("FROM-IMPORT:", error)
    """)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=180
    )
    assert result.returncode == 0, result.stderr
    assert "ERROR: kerastorch.LightModel needs Lightning" in result.stdout
    assert "pip install 'kerastorch[lightning]'" in result.stdout
    assert "FROM-IMPORT: kerastorch.LightModel needs Lightning" in result.stdout


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.gpu
def test_trains_on_one_gpu_with_mixed_precision(tmp_path):
    pl = pytest.importorskip("lightning.pytorch")
    from kerastorch.examples import create_cnn, digits_loaders

    kt.seed_everything(0)
    dl_train, dl_val, _ = digits_loaders()
    net = create_cnn()
    model = kt.LightModel(net, nn.CrossEntropyLoss(), digit_metrics(), torch.optim.Adam(net.parameters(), lr=1e-2))
    trainer = pl.Trainer(
        accelerator="gpu",
        devices=1,
        precision="16-mixed",
        max_epochs=6,
        default_root_dir=tmp_path,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, dl_train, dl_val)
    assert float(trainer.callback_metrics["val_acc"]) > 0.8
    assert float(trainer.callback_metrics["val_acc_tk"]) == pytest.approx(float(trainer.callback_metrics["val_acc"]))
