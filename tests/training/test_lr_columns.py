"""The history's learning rates: one column per parameter group (``lr``, ``lr_1``, ...), known before
the first batch; a group a callback adds during the run gets its column from that epoch on (NaN
before), beside the other rates; a run resumed in the middle of an epoch logs each group's rate of
that epoch's start."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import kerastorch as kt


def data(n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 4, generator=g)
    return TensorDataset(X, (X[:, 0] > 0).long())


def two_group_model():
    """A body at lr 0.1 and a head at lr 0.01, both halved after every epoch."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    optimizer = torch.optim.SGD([{"params": net[0].parameters(), "lr": 0.1}, {"params": net[2].parameters()}], lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    return kt.KerasModel(net, nn.CrossEntropyLoss(), optimizer=optimizer, lr_scheduler=scheduler)


class SeesColumns(kt.Callback):
    def on_train_begin(self, logs=None):
        self.columns = list(self.params["metrics"])


def test_each_parameter_group_has_its_column_known_before_training_with_its_rate_of_each_epoch():
    model, seen = two_group_model(), SeesColumns()
    history = model.fit(data(), data(32, seed=1), batch_size=16, epochs=3, verbose=0, callbacks=[seen])
    assert seen.columns == ["train_loss", "lr", "lr_1", "val_loss"]
    assert list(history.columns) == ["epoch", *seen.columns]
    assert history["lr"].tolist() == pytest.approx([0.1, 0.05, 0.025])
    assert history["lr_1"].tolist() == pytest.approx([0.01, 0.005, 0.0025])


def test_one_group_keeps_a_single_lr_column_and_the_monitor_check_knows_the_groups():
    net = nn.Linear(4, 2)
    history = kt.KerasModel(net, nn.CrossEntropyLoss()).fit(data(), batch_size=16, epochs=1, verbose=0)
    assert list(history.columns) == ["epoch", "train_loss", "lr"]
    model = two_group_model()
    before = {k: v.clone() for k, v in model.net.state_dict().items()}
    with pytest.raises(ValueError, match=r"monitor='lr_2' is not a value.*available: train_loss, lr, lr_1"):
        model.fit(data(), batch_size=16, epochs=1, monitor="lr_2", verbose=0)
    assert all(torch.equal(before[k], v) for k, v in model.net.state_dict().items())


class UnfreezeAt(kt.Callback):
    """Progressive unfreezing: the frozen body joins the optimizer, at a lower rate, when ``epoch`` begins."""

    def __init__(self, epoch, body):
        self.epoch, self.body = epoch, body

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == self.epoch:
            self.body.requires_grad_(True)
            self.model.optimizer.add_param_group({"params": list(self.body.parameters()), "lr": 1e-3})


def test_a_group_added_during_the_run_gets_its_column_from_then_on_beside_the_others():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    body = net[0].requires_grad_(False)
    optimizer = torch.optim.SGD(net[2].parameters(), lr=0.1)
    model = kt.KerasModel(net, nn.CrossEntropyLoss(), optimizer=optimizer)
    frozen = body.weight.detach().clone()

    class BodyAfterEpoch1(kt.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 1:
                self.weight = body.weight.detach().clone()

    after_1 = BodyAfterEpoch1()
    history = model.fit(
        data(),
        data(32, seed=1),
        batch_size=16,
        epochs=3,
        patience=None,
        verbose=0,
        callbacks=[UnfreezeAt(2, body), after_1],
    )
    assert list(history.columns) == ["epoch", "train_loss", "lr", "lr_1", "val_loss"]
    assert math.isnan(history["lr_1"][0]) and history["lr_1"][1:].tolist() == pytest.approx([1e-3, 1e-3])
    assert history["lr"].tolist() == pytest.approx([0.1, 0.1, 0.1])
    assert torch.equal(after_1.weight, frozen)  # frozen through epoch 1
    assert not torch.equal(body.weight, frozen)  # trained once added


class FailAt(kt.Callback):
    def __init__(self, epoch, batch):
        self.at, self.epoch = (epoch, batch), None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if (self.epoch, batch) == self.at:
            raise RuntimeError("crash")


def per_step_run(callbacks):
    """Two groups whose rates fall at every optimizer step: an epoch's row holds its first step's rates."""
    model = two_group_model()
    model.lr_scheduler = torch.optim.lr_scheduler.ExponentialLR(model.optimizer, gamma=0.9)
    model.lr_scheduler_interval = "step"
    loader = DataLoader(data(), batch_size=8)
    return model.fit(loader, epochs=2, patience=None, verbose=0, callbacks=callbacks)


def test_a_run_resumed_mid_epoch_logs_each_groups_rate_of_that_epochs_start(tmp_path):
    straight = per_step_run([])
    assert straight["lr"].tolist() == pytest.approx([0.1, 0.1 * 0.9**8])
    assert straight["lr_1"].tolist() == pytest.approx([0.01, 0.01 * 0.9**8])
    backup = lambda: kt.callbacks.BackupAndRestore(tmp_path, save_freq=3, delete_checkpoint=False)
    with pytest.raises(RuntimeError, match="crash"):
        per_step_run([backup(), FailAt(2, 5)])  # the backup holds epoch 2 after 3 of its 8 batches
    resumed = per_step_run([backup()])
    pd.testing.assert_frame_equal(resumed, straight, check_exact=True)
