"""Ctrl-C and NaN/Inf losses: fit stops cleanly, the best finite weights come back, the saved state stays good."""

from __future__ import annotations

import math
import os
import re

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

import kerastorch as kt
import kerastorch.files.state
from kerastorch.files.state import load_state_file, training_state_path


class ScriptedLoss(nn.Module):
    """Cross entropy that, from epoch ``from_epoch`` on, raises Ctrl-C or turns NaN/Inf."""

    def __init__(self, what: str = "nothing", from_epoch: int = 0, at_batch: int = 0):
        super().__init__()
        self.what, self.from_epoch, self.at_batch = what, from_epoch, at_batch
        self.epoch, self.batch = 0, 0

    def forward(self, preds, labels):
        loss = F.cross_entropy(preds, labels)
        if self.what == "nothing" or self.epoch < self.from_epoch:
            return loss
        if self.what == "ctrl-c":
            if torch.is_grad_enabled() and self.batch == self.at_batch:  # a training step
                raise KeyboardInterrupt
            return loss
        return loss * {"nan": math.nan, "inf": math.inf}[self.what]


class TellTheLoss(kt.Callback):
    """Tells the scripted loss which epoch and batch it is in."""

    def __init__(self, loss: ScriptedLoss):
        self.loss = loss

    def on_epoch_begin(self, epoch, logs=None):
        self.loss.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        self.loss.batch = batch


def tiny_run(loss: ScriptedLoss, metrics=None):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(96, 6, generator=g)
    y = (x[:, 0] - x[:, 1] > 0).long()
    torch.manual_seed(0)
    dl_train = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    dl_val = DataLoader(TensorDataset(x[:48] + 0.1, y[:48]), batch_size=24)
    net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 2))
    optimizer = torch.optim.SGD(net.parameters(), lr=0.2, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    model = kt.KerasModel(net, loss, metrics, optimizer, lr_scheduler=scheduler)
    return model, dl_train, dl_val, [TellTheLoss(loss)]


def weights_equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_ctrl_c_inside_the_loss_returns_the_history_with_best_weights_and_an_intact_state(tmp_path, capsys):
    ckpt = tmp_path / "best.safetensors"
    model, dl_train, dl_val, callbacks = tiny_run(ScriptedLoss("ctrl-c", from_epoch=3, at_batch=2))
    history = model.fit(
        dl_train, dl_val, epochs=4, patience=None, verbose=0, ckpt_path=ckpt, resume=True, callbacks=callbacks
    )

    assert history["epoch"].tolist() == [1, 2]
    assert model.history.equals(history)
    out_lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    state_path = training_state_path(ckpt)
    assert out_lines == [
        "Interrupted during epoch 3: returning the history of the 2 finished epoch(s) with the best weights restored. "
        f"The training state after epoch 2 is in {state_path!r}: the same call goes on from there."
    ]
    assert weights_equal(model.net.state_dict(), load_file(ckpt))  # the best epoch's weights
    state = load_state_file(training_state_path(ckpt))
    assert state["epoch"] == 2

    # Started again, the run ends exactly as one never interrupted.
    straight, dl_train, dl_val, callbacks = tiny_run(ScriptedLoss())
    straight_history = straight.fit(dl_train, dl_val, epochs=4, patience=None, verbose=0, callbacks=callbacks)
    resumed, dl_train, dl_val, callbacks = tiny_run(ScriptedLoss())
    resumed_history = resumed.fit(
        dl_train, dl_val, epochs=4, patience=None, verbose=0, ckpt_path=ckpt, resume=True, callbacks=callbacks
    )
    pd.testing.assert_frame_equal(resumed_history, straight_history, check_exact=True)
    assert weights_equal(resumed.net.state_dict(), straight.net.state_dict())


def test_ctrl_c_while_the_state_is_written_keeps_the_previous_state_whole(tmp_path, monkeypatch):
    ckpt = tmp_path / "best.safetensors"
    real_save, calls = torch.save, []

    def save_then_ctrl_c(obj, path, *args, **kwargs):
        calls.append(path)
        real_save(obj, path, *args, **kwargs)
        if len(calls) == 2:  # the state of epoch 2 is on disk under its temporary name
            raise KeyboardInterrupt

    monkeypatch.setattr(kerastorch.files.state.torch, "save", save_then_ctrl_c)
    model, dl_train, dl_val, callbacks = tiny_run(ScriptedLoss())
    history = model.fit(
        dl_train, dl_val, epochs=3, patience=None, verbose=0, ckpt_path=ckpt, resume=True, callbacks=callbacks
    )
    assert history["epoch"].tolist() == [1, 2]
    assert load_state_file(training_state_path(ckpt))["epoch"] == 1
    assert sorted(os.listdir(tmp_path)) == ["best.safetensors", "best.safetensors.state"]  # no temporary file


@pytest.mark.parametrize("bad", ["nan", "inf"])
def test_a_nan_or_inf_loss_stops_naming_the_epoch_with_finite_best_weights_and_the_last_good_state(
    tmp_path, capsys, bad
):
    ckpt = tmp_path / "best.safetensors"
    model, dl_train, dl_val, callbacks = tiny_run(ScriptedLoss(bad, from_epoch=3))
    history = model.fit(
        dl_train, dl_val, epochs=6, patience=None, verbose=2, ckpt_path=ckpt, resume=True, callbacks=callbacks
    )

    assert history["epoch"].tolist() == [1, 2, 3]
    assert not math.isfinite(history["train_loss"].iloc[-1])
    out = capsys.readouterr().out
    # (an Inf loss makes NaN weights, so the epoch's mean may read NaN)
    assert re.search(r"Stopping: train_loss is (nan|inf) at epoch 3\. The best finite weights are restored", out)
    weights = model.net.state_dict()
    assert all(torch.isfinite(w).all() for w in weights.values())
    assert weights_equal(weights, load_file(ckpt))
    state = load_state_file(training_state_path(ckpt))
    assert state["epoch"] == 2 and len(state["history"]) == 2  # the last good epoch
    assert all(torch.isfinite(w).all() for w in state["net"].values())


def test_a_nan_epoch_is_never_restored_even_when_the_monitored_metric_prefers_it(tmp_path):
    def nan_share(preds, labels):  # 1.0 once the net outputs NaN
        return torch.isnan(preds).float().mean()

    model, dl_train, dl_val, callbacks = tiny_run(ScriptedLoss("nan", from_epoch=3), metrics={"nan_share": nan_share})
    history = model.fit(
        dl_train,
        dl_val,
        epochs=5,
        patience=None,
        monitor="val_nan_share",
        mode="max",
        verbose=0,
        ckpt_path=tmp_path / "best.safetensors",
        callbacks=callbacks,
    )
    assert history["val_nan_share"].tolist()[-1] == 1.0
    assert all(torch.isfinite(w).all() for w in model.net.state_dict().values())
    assert weights_equal(model.net.state_dict(), load_file(tmp_path / "best.safetensors"))
