"""strategy="fsdp": the net, its gradients and the optimizer state sharded over CPU processes (gloo),
with the same history, checkpoints, best weights and resume as DDP."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import warnings

import pytest
import torch
import torchmetrics
from torch import nn
from torch.utils.data import DataLoader, Subset

import kerastorch as kt
from kerastorch.examples import digits_datasets
from kerastorch.files.weights import load_weights

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO_ROOT, "tests", "fsdp_training_script.py")
ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join([REPO_ROOT, os.path.join(REPO_ROOT, "tests")]),
    "OMP_NUM_THREADS": "1",
}


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 48), nn.ReLU(), nn.Linear(48, 48), nn.ReLU(), nn.Linear(48, 10))


def make_model() -> kt.KerasModel:
    net = mlp()
    metrics = {"acc": torchmetrics.Accuracy(task="multiclass", num_classes=10)}
    return kt.KerasModel(net, nn.CrossEntropyLoss(), metrics, torch.optim.Adam(net.parameters(), lr=1e-2))


class RecordShards(kt.Callback):
    """Each process writes how many parameter elements it holds while it trains."""

    def __init__(self, folder):
        self.folder = folder

    def on_train_begin(self, logs=None):
        from torch.distributed.tensor import DTensor

        held = sum(p.to_local().numel() if isinstance(p, DTensor) else p.numel() for p in self.model.net.parameters())
        with open(os.path.join(self.folder, f"held{os.environ.get('RANK', '0')}.txt"), "w") as f:
            f.write(str(held))


@pytest.fixture(scope="module")
def digits():
    ds_train, ds_val, _ = digits_datasets(size=8)
    # 101 validation samples in batches of 16: 4 batches for one process, 3 for the other.
    return DataLoader(ds_train, batch_size=64, shuffle=True), DataLoader(Subset(ds_val, range(101)), batch_size=16)


@pytest.mark.slow
def test_fsdp_shards_over_two_processes_and_trains_as_ddp_does(digits, tmp_path):
    dl_train, dl_val = digits
    runs = {}
    for strategy in ("ddp", "fsdp"):
        folder = tmp_path / strategy
        folder.mkdir()
        model = make_model()
        torch.manual_seed(1)  # the same shuffling for both
        history = model.fit(
            dl_train,
            dl_val,
            epochs=4,
            patience=None,
            monitor="val_acc",
            ckpt_path=folder / "best.safetensors",
            accelerator="cpu",
            devices=2,
            strategy=strategy,
            gradient_accumulation_steps=2,
            gradient_clip_val=0.5,
            verbose=0,
            callbacks=[RecordShards(str(folder))],
        )
        runs[strategy] = (model, history, folder)

    ddp_history, (fsdp, history, folder) = runs["ddp"][1], runs["fsdp"]
    total = sum(p.numel() for p in fsdp.net.parameters())
    held = [int((folder / f"held{rank}.txt").read_text()) for rank in (0, 1)]
    assert sum(held) == total and max(held) < 0.55 * total  # each process holds about half
    # The same history as DDP (accumulation and clipping included), within float tolerance.
    assert history["val_acc"].iloc[-1] > 0.8
    for column in history.columns:
        assert history[column].tolist() == pytest.approx(ddp_history[column].tolist(), rel=1e-4, abs=1e-5), column
    # The caller's net and optimizer hold whole, ordinary tensors: the best epoch's weights.
    params = list(fsdp.net.parameters())
    assert all(type(p) is nn.Parameter for p in params)
    assert all(group["params"][0] is params[0] for group in fsdp.optimizer.param_groups[:1])
    moments = fsdp.optimizer.state[params[0]]["exp_avg"]
    assert type(moments) is torch.Tensor and moments.shape == params[0].shape
    best = int(history["val_acc"].idxmax())
    evaluated = fsdp.evaluate(dl_val, quiet=True)
    assert evaluated["val_loss"] == pytest.approx(history["val_loss"].iloc[best], rel=1e-6)
    assert evaluated["val_acc"] == pytest.approx(history["val_acc"].iloc[best])
    # The checkpoint is the whole best net: it loads into a bare one and scores the best row.
    bare = mlp()
    bare.load_state_dict(load_weights(folder / "best.safetensors"))
    reloaded = kt.KerasModel(
        bare, nn.CrossEntropyLoss(), {"acc": torchmetrics.Accuracy(task="multiclass", num_classes=10)}
    )
    assert reloaded.evaluate(dl_val, quiet=True)["val_acc"] == pytest.approx(history["val_acc"].iloc[best])


def run_script(out, *args, torchrun=False):
    command = [sys.executable, SCRIPT, str(out), *args]
    if torchrun:
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", SCRIPT, str(out), *args]
    # A session of its own, so that --kill-at kills the script and its workers, not pytest.
    process = subprocess.run(command, env=ENV, capture_output=True, text=True, timeout=300, start_new_session=True)
    return process.returncode, process.stdout + process.stderr


def read_run(folder):
    with open(folder / "history.json") as f:
        history = json.load(f)
    return history, load_weights(folder / "final.safetensors")


@pytest.mark.slow
def test_a_sharded_run_killed_mid_epoch_resumes_exactly_and_torchrun_gives_the_same_run(tmp_path):
    code, output = run_script(tmp_path / "whole")
    assert code == 0, output
    history, weights = read_run(tmp_path / "whole")
    assert history["val_acc"][-1] > 0.7 and history["lr"] == [0.003, 0.003, 0.0015, 0.0015, 0.00075]

    code, output = run_script(tmp_path / "killed", "--kill-at", "3", "4")
    assert code == -signal.SIGKILL, output
    assert not (tmp_path / "killed" / "history.json").exists()
    code, output = run_script(tmp_path / "killed")  # resume=True: continues after epoch 2
    assert code == 0, output
    resumed, resumed_weights = read_run(tmp_path / "killed")
    assert resumed == history
    assert all(torch.equal(weights[k], resumed_weights[k]) for k in weights)

    code, output = run_script(tmp_path / "torchrun", torchrun=True)
    assert code == 0, output
    under_torchrun, _ = read_run(tmp_path / "torchrun")
    assert under_torchrun == history
    held = [int((tmp_path / "torchrun" / f"elements{rank}.txt").read_text()) for rank in (0, 1)]
    assert sum(held) == sum(w.numel() for k, w in weights.items()) and max(held) < 0.55 * sum(held)


@pytest.mark.slow
def test_compile_under_fsdp_trains_and_keeps_the_modules_own_keys(tmp_path):
    code, output = run_script(tmp_path / "compiled", "--compile")
    assert code == 0, output
    history, weights = read_run(tmp_path / "compiled")
    assert history["val_acc"][-1] > 0.7
    assert not any("_orig_mod" in key for key in load_weights(tmp_path / "compiled" / "best.safetensors"))
    assert not any("_orig_mod" in key for key in weights)


def test_one_process_with_fsdp_trains_as_usual_and_says_so_once(digits):
    dl_train, dl_val = digits
    model = make_model()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = model.fit(dl_train, dl_val, epochs=1, strategy="fsdp", accelerator="cpu", devices=1, verbose=0)
    said = [w for w in caught if "strategy='fsdp' with one process" in str(w.message)]
    assert len(said) == 1 and "devices=k" in str(said[0].message)
    assert history["val_acc"].iloc[0] > 0.3
    assert all(type(p) is nn.Parameter for p in model.net.parameters())


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (
            {"strategy": "deepspeed"},
            ValueError,
            r"strategy='deepspeed' is not supported; use one of 'auto', 'ddp', 'fsdp'",
        ),
        ({"strategy": "horovod"}, ValueError, r"use one of 'auto', 'ddp', 'fsdp'"),
        ({"strategy": "fsdp_full_shard"}, ValueError, r"For FSDP, pass strategy='fsdp'"),
        ({"strategy": "fsdp", "fsdp_wrap": [nn.Linear(2, 2)]}, TypeError, r"not a module class; pass classes"),
        ({"strategy": "ddp", "fsdp_wrap": [nn.Linear]}, ValueError, r"fsdp_wrap is for strategy='fsdp'"),
        (
            {"strategy": "fsdp", "devices": 2, "fsdp_wrap": [nn.Conv2d]},
            ValueError,
            r"fsdp_wrap=\[Conv2d\]: the net has no module of these classes",
        ),
    ],
)
def test_unsupported_strategies_and_wrong_fsdp_wrap_are_refused_before_training(digits, kwargs, error, message):
    dl_train, _ = digits
    model = make_model()
    before = {k: v.clone() for k, v in model.net.state_dict().items()}
    with pytest.raises(error, match=message):
        model.fit(dl_train, epochs=1, accelerator="cpu", verbose=0, **kwargs)
    assert all(torch.equal(before[k], v) for k, v in model.net.state_dict().items())


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="FSDP over NCCL needs two CUDA GPUs")
@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_fsdp_on_two_gpus_trains_as_ddp_does(digits, precision):
    dl_train, dl_val = digits
    histories = {}
    for strategy in ("ddp", "fsdp"):
        model = make_model()
        torch.manual_seed(1)
        histories[strategy] = model.fit(
            dl_train, dl_val, epochs=3, accelerator="cuda", devices=2, strategy=strategy, precision=precision, verbose=0
        )
        assert all(p.device.type == "cpu" for p in model.net.parameters())  # handed back to the caller's net
    tolerance = 1e-3 if precision == "32-true" else 5e-2
    for column in ("train_loss", "val_loss"):
        assert histories["fsdp"][column].tolist() == pytest.approx(histories["ddp"][column].tolist(), rel=tolerance)
