"""Callbacks: the user's hooks, torchkeras-style callbacks, LambdaCallback, ModelCheckpoint,
TerminateOnNaN, and the rule that built-in callbacks never read per-step values."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import kerastorch as kt
from helpers import accuracy
from kerastorch.callbacks import CallbackList, LambdaCallback, ModelCheckpoint
from kerastorch.files.weights import load_weights
from kerastorch.training.meters import EpochMeters


def loaders(n=192, batch_size=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).long()
    train = DataLoader(TensorDataset(x[: n * 3 // 4], y[: n * 3 // 4]), batch_size=batch_size)
    val = DataLoader(TensorDataset(x[n * 3 // 4 :], y[n * 3 // 4 :]), batch_size=batch_size)
    return train, val


def make_model(lr=0.1, seed=0):
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    return kt.KerasModel(net, nn.CrossEntropyLoss(), {"acc": accuracy}, torch.optim.SGD(net.parameters(), lr=lr))


def weights(model):
    return {k: v.detach().clone() for k, v in model.net.state_dict().items()}


def same_weights(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# -- user callbacks ------------------------------------------------------------------------


def test_user_callback_stops_at_epoch_2_and_sees_train_and_val_values():
    class StopAtTwo(kt.Callback):
        def __init__(self):
            self.seen = []

        def on_epoch_end(self, epoch, logs=None):
            self.seen.append(dict(logs))
            if epoch == 2:
                self.model.stop_training = True

    stopper = StopAtTwo()
    train, val = loaders()
    model = make_model()
    history = model.fit(train, val, epochs=10, patience=None, callbacks=[stopper], verbose=0)

    assert list(history["epoch"]) == [1, 2]
    assert [row["epoch"] for row in stopper.seen] == [1, 2]
    for row, (_, expected) in zip(stopper.seen, history.iterrows()):
        assert list(row) == list(history.columns) == ["epoch", "train_loss", "train_acc", "lr", "val_loss", "val_acc"]
        assert all(isinstance(v, (int, float)) for v in row.values())
        assert row == pytest.approx(expected.to_dict())
    assert stopper.seen[1]["train_loss"] < stopper.seen[0]["train_loss"]  # it trained


def test_stop_training_from_a_batch_hook_stops_after_that_batch():
    batches = []

    class StopAtThirdBatch(kt.Callback):
        def on_train_batch_end(self, batch, logs=None):
            batches.append(batch)
            if batch == 2:
                self.model.stop_training = True

    train, val = loaders(n=256, batch_size=16)  # 12 training batches per epoch
    history = make_model().fit(train, val, epochs=5, callbacks=[StopAtThirdBatch()], verbose=0)
    assert batches == [0, 1, 2]
    assert len(history) == 1 and not history.isna().any().any()  # the epoch is still validated and logged


def test_per_step_logs_are_read_only_when_looked_at():
    train_losses = []
    lazy = LambdaCallback(on_train_batch_end=lambda batch, logs: train_losses.append(logs["train_loss"]))
    train, val = loaders(batch_size=48)  # 3 training batches
    history = make_model().fit(train, val, epochs=1, callbacks=[lazy], verbose=0)
    assert len(train_losses) == 3
    # The running value after the last batch is the epoch's value.
    assert train_losses[-1] == pytest.approx(history["train_loss"].iloc[0])


# -- torchkeras-style callbacks ------------------------------------------------------------


def test_torchkeras_style_callback_runs_with_the_model_as_torchkeras_shows_it():
    calls = []

    class TorchkerasStyle:  # not a kt.Callback: written for torchkeras
        def on_fit_start(self, model):
            calls.append(("fit_start", model.epochs, model.monitor, model.mode, dict(model.history)))
            model.run_id = "run-1"  # writes reach the real model

        def on_train_epoch_end(self, model):
            calls.append(("train_epoch_end", max(model.history["epoch"])))

        def on_validation_epoch_end(self, model):
            assert model.accelerator.unwrap_model(model.net) is model.net
            calls.append(("val_epoch_end", model.history["val_loss"][-1], len(model.history["epoch"])))

        def on_fit_end(self, model):
            calls.append(("fit_end", list(model.history["val_acc"])))

    train, val = loaders()
    model = make_model()
    history = model.fit(train, val, epochs=2, monitor="val_acc", mode="max", callbacks=[TorchkerasStyle()], verbose=0)

    assert calls[0] == ("fit_start", 2, "val_acc", "max", {})
    assert [c[0] for c in calls[1:]] == [
        "train_epoch_end",
        "val_epoch_end",
        "train_epoch_end",
        "val_epoch_end",
        "fit_end",
    ]
    assert calls[2][1:] == (pytest.approx(history["val_loss"].iloc[0]), 1)
    assert calls[4][1:] == (pytest.approx(history["val_loss"].iloc[1]), 2)
    assert calls[5][1] == pytest.approx(list(history["val_acc"]))
    assert model.run_id == "run-1"


def test_torchkeras_style_callback_can_call_the_model():
    # torchkeras's KerasModel is an nn.Module: VisDisplay's display_fn runs model(x) on it.
    outputs = []

    class Display:
        def on_validation_epoch_end(self, model):
            model.eval()
            outputs.append((model(torch.zeros(1, 8)), model.net(torch.zeros(1, 8))))

    train, val = loaders()
    model = make_model()
    model.fit(train, val, epochs=2, callbacks=[Display()], verbose=0)

    assert len(outputs) == 2
    assert all(called.shape == (1, 2) and torch.equal(called, net_out) for called, net_out in outputs)


def test_something_that_is_not_a_callback_is_refused_before_training():
    train, val = loaders()
    model = make_model()
    before = weights(model)
    with pytest.raises(TypeError, match="not a kerastorch Callback.*on_epoch_end"):
        model.fit(train, val, epochs=1, callbacks=[object()], verbose=0)
    with pytest.raises(TypeError, match=r"class CSVLogger, not an instance.*CSVLogger\(\.\.\.\)"):
        model.fit(train, val, epochs=1, callbacks=[kt.callbacks.CSVLogger], verbose=0)
    assert same_weights(weights(model), before)


# -- LambdaCallback ------------------------------------------------------------------------


def test_lambda_callback_calls_only_the_hooks_it_is_given():
    events = []
    cb = LambdaCallback(
        on_train_begin=lambda logs: events.append("begin"),
        on_epoch_end=lambda epoch, logs: events.append(("epoch", epoch, round(logs["val_loss"], 6))),
        on_train_batch_begin=lambda batch, logs: events.append("batch"),
    )
    train, val = loaders(batch_size=48)  # 3 training batches
    history = make_model().fit(train, val, epochs=2, callbacks=[cb], verbose=0)
    assert events == [
        "begin",
        "batch",
        "batch",
        "batch",
        ("epoch", 1, round(history["val_loss"][0], 6)),
        "batch",
        "batch",
        "batch",
        ("epoch", 2, round(history["val_loss"][1], 6)),
    ]
    listeners = CallbackList([LambdaCallback(on_epoch_end=print)], model=None, params={})
    assert not listeners.wants("on_train_batch_end") and listeners.wants("on_epoch_end")


def test_lambda_callback_refuses_unknown_hooks():
    with pytest.raises(TypeError, match="on_epoch_ends=.*not a hook.*on_epoch_end"):
        LambdaCallback(on_epoch_ends=print)
    with pytest.raises(TypeError, match="on_epoch_end must be a function"):
        LambdaCallback(on_epoch_end=3)


# -- ModelCheckpoint -----------------------------------------------------------------------


class RecordWeights(kt.Callback):
    """The net's weights at the end of each epoch (placed after the checkpoint callback)."""

    def __init__(self):
        self.by_epoch = {}

    def on_epoch_end(self, epoch, logs=None):
        self.by_epoch[epoch] = {k: v.detach().clone() for k, v in self.model.net.state_dict().items()}


def test_model_checkpoint_every_epoch_keeps_the_last_k_files(tmp_path):
    template = str(tmp_path / "ckpt" / "epoch{epoch:02d}-{val_loss:.4f}.safetensors")
    recorder = RecordWeights()
    train, val = loaders()
    model = make_model()
    history = model.fit(train, val, epochs=4, callbacks=[ModelCheckpoint(template, keep_last=2), recorder], verbose=0)

    expected = [template.format(epoch=e, val_loss=history["val_loss"][e - 1]) for e in (3, 4)]
    assert sorted(str(p) for p in (tmp_path / "ckpt").iterdir()) == expected  # no temporary files either
    for epoch, path in zip((3, 4), expected):
        assert same_weights(load_weights(path), recorder.by_epoch[epoch])


def test_model_checkpoint_best_only_holds_the_best_epoch(tmp_path):
    path = tmp_path / "best.safetensors"
    recorder = RecordWeights()
    train, val = loaders()
    model = make_model(lr=0.5)
    history = model.fit(
        train,
        val,
        epochs=5,
        patience=None,
        monitor="val_acc",
        mode="max",
        verbose=0,
        callbacks=[ModelCheckpoint(path, monitor="val_acc", mode="max", save_best_only=True), recorder],
    )

    best_epoch = int(history["epoch"][history["val_acc"].idxmax()])  # idxmax: the first of equal bests
    assert same_weights(load_weights(path), recorder.by_epoch[best_epoch])
    assert same_weights(load_weights(path), weights(model))  # fit restored the same best epoch


def test_model_checkpoint_every_n_epochs_and_last(tmp_path):
    train, val = loaders()
    recorder = RecordWeights()
    make_model().fit(
        train,
        val,
        epochs=5,
        verbose=0,
        callbacks=[
            ModelCheckpoint(tmp_path / "e{epoch}.safetensors", every_n_epochs=2),
            ModelCheckpoint(tmp_path / "last.safetensors"),
            recorder,
        ],
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e2.safetensors", "e4.safetensors", "last.safetensors"]
    assert same_weights(load_weights(tmp_path / "last.safetensors"), recorder.by_epoch[5])
    assert same_weights(load_weights(tmp_path / "e4.safetensors"), recorder.by_epoch[4])


def test_model_checkpoint_bad_template_fails_before_training(tmp_path):
    train, val = loaders()
    model = make_model()
    before = weights(model)
    with pytest.raises(ValueError, match="'val_accuracy'.*does not log.*val_acc"):
        model.fit(
            train,
            val,
            epochs=2,
            verbose=0,
            callbacks=[ModelCheckpoint(tmp_path / "e{epoch}-{val_accuracy:.2f}.safetensors")],
        )
    with pytest.raises(ValueError, match="monitors 'val_f1'"):
        model.fit(
            train,
            val,
            epochs=2,
            verbose=0,
            callbacks=[ModelCheckpoint(tmp_path / "best.safetensors", monitor="val_f1", save_best_only=True)],
        )
    # Epochs that are not validated (validation_freq=2) have no val_loss to name a file with.
    with pytest.raises(ValueError, match=r"names 'val_loss', which only the validated epochs log.*every_n_epochs=2"):
        model.fit(
            train,
            val,
            epochs=2,
            verbose=0,
            validation_freq=2,
            callbacks=[ModelCheckpoint(tmp_path / "e{epoch}-{val_loss:.2f}.safetensors")],
        )
    with pytest.raises(ValueError, match="not a valid template"):
        ModelCheckpoint(tmp_path / "e{epoch.safetensors")
    with pytest.raises(ValueError, match="keep_last=0"):
        ModelCheckpoint(tmp_path / "e.safetensors", keep_last=0)
    assert same_weights(weights(model), before)
    assert list(tmp_path.iterdir()) == []
    # Going on from epoch 3 to 4 with validation_freq=4: the one epoch trained is validated.
    model.fit(
        train,
        val,
        initial_epoch=3,
        epochs=4,
        verbose=0,
        validation_freq=4,
        callbacks=[ModelCheckpoint(tmp_path / "e{epoch}-{val_loss:.2f}.safetensors")],
    )
    assert [p.name[:3] for p in tmp_path.iterdir()] == ["e4-"]
    (next(tmp_path.iterdir())).unlink()
    # Written only at validated epochs, the same names are fine.
    every_second = ModelCheckpoint(tmp_path / "e{epoch}-{val_loss:.2f}.safetensors", every_n_epochs=2)
    history = model.fit(train, val, epochs=4, verbose=0, validation_freq=2, callbacks=[every_second])
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f"e{e}-{history['val_loss'][e - 1]:.2f}.safetensors" for e in (2, 4)
    ]
    best = ModelCheckpoint(tmp_path / "best-{val_loss:.2f}.safetensors", save_best_only=True)
    model.fit(train, val, epochs=4, verbose=0, validation_freq=2, callbacks=[best])
    assert len(list(tmp_path.glob("best-*.safetensors"))) in (1, 2)  # epoch 2's, and epoch 4's if better


# -- TerminateOnNaN ------------------------------------------------------------------------


def test_terminate_on_nan_stops_and_keeps_the_last_finite_weights():
    class PoisonAfterEpoch2(kt.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 2:
                with torch.no_grad():
                    self.model.net[0].weight[0, 0] = float("nan")

    recorder = RecordWeights()
    train, val = loaders()
    model = make_model()
    history = model.fit(train, val, epochs=6, patience=None, verbose=0, callbacks=[recorder, PoisonAfterEpoch2()])
    assert list(history["epoch"]) == [1, 2, 3]
    assert torch.isnan(torch.tensor(history["train_loss"][2]))
    best = 1 + int(history["val_loss"][:2].idxmin())
    assert same_weights(weights(model), recorder.by_epoch[best])


# -- speed: built-in callbacks never read per-step values ----------------------------------


def test_built_in_callbacks_never_read_per_step_values(tmp_path, monkeypatch):
    reads = []
    real_read = EpochMeters.read

    def counting_read(self, synced=True):
        reads.append(self.prefix)
        return real_read(self, synced)

    monkeypatch.setattr(EpochMeters, "read", counting_read)
    callbacks = [
        kt.callbacks.CSVLogger(tmp_path / "h.csv"),
        kt.callbacks.TensorBoard(tmp_path / "tb"),
        kt.callbacks.ModelCheckpoint(tmp_path / "last.safetensors"),
        kt.callbacks.LearningRateScheduler(lambda epoch, lr: lr * 0.9),
        kt.callbacks.EarlyStopping(patience=10),
        LambdaCallback(on_epoch_end=lambda epoch, logs: None),
    ]
    train, val = loaders(batch_size=8)  # 18 training batches per epoch
    make_model().fit(train, val, epochs=2, callbacks=callbacks, verbose=0)
    assert reads == ["train", "val", "train", "val"]  # once per stage per epoch
    per_step = CallbackList(callbacks, model=None, params={})
    assert not any(
        per_step.wants(h)
        for h in ("on_train_batch_begin", "on_train_batch_end", "on_test_batch_begin", "on_test_batch_end")
    )


# -- the examples in the docstrings run ----------------------------------------------------


def _needs(module):
    try:
        __import__(module)
        return []
    except ImportError:
        return [pytest.mark.skip(reason=f"{module} is not installed")]


@pytest.mark.parametrize(
    "cls",
    [
        kt.callbacks.ModelCheckpoint,
        kt.callbacks.CSVLogger,
        kt.callbacks.LambdaCallback,
        kt.callbacks.LearningRateScheduler,
        kt.callbacks.TorchkerasCallback,
        kt.callbacks.EarlyStopping,
        pytest.param(kt.callbacks.TensorBoard, marks=_needs("tensorboard")),
        pytest.param(kt.callbacks.WandbLogger, marks=_needs("wandb")),
    ],
    ids=lambda cls: cls.__name__,
)
def test_docstring_example_runs(cls, tmp_path, monkeypatch, capsys):
    import inspect
    import textwrap

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_SILENT", "true")
    code = textwrap.dedent(inspect.getdoc(cls).split("Example::", 1)[1])
    train, val = loaders()
    model = make_model()
    model.fit = lambda *args, _fit=model.fit, **kwargs: _fit(*args, **{"verbose": 0, **kwargs})
    exec(code, {"kt": kt, "model": model, "dl_train": train, "dl_val": val})
    assert len(model.history) > 0
