"""SWA with BatchNorm validates in eval mode; the best row is what evaluate gives."""

from __future__ import annotations

import pytest
import torch
from small_runs import loaders, make_model
from torch import nn

import kerastorch as kt

# -- 3. SWA + BatchNorm validates in eval mode --------------------------------------------------


class ModesDuringValidation(kt.Callback):
    def __init__(self):
        self.modes = []

    def on_test_batch_begin(self, batch, logs=None):
        self.modes.append(self.model.net.training)


def test_swa_with_batch_norm_validates_in_eval_mode_and_the_best_row_is_what_evaluate_gives():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(2, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.5), nn.Linear(32, 3))
    model = make_model(net, lr=0.02)
    watch = ModesDuringValidation()
    train, val = loaders()
    history = model.fit(train, val, epochs=4, verbose=0, patience=None, callbacks=[kt.callbacks.SWA(0.01, 2), watch])
    assert watch.modes and not any(watch.modes)  # dropout off and running statistics, every batch
    assert model.net.training  # the net's own mode after fit
    best = history.loc[history["val_loss"].idxmin()]
    assert model.evaluate(val, quiet=True)["val_loss"] == pytest.approx(best["val_loss"], rel=1e-6)
