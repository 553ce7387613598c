"""Inside the step: the hooks callbacks reach (EMA of the weights, gradient norms), an
overridden train_step with two optimizers, and the order callbacks run in."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from torch.utils.data import DataLoader, TensorDataset

import kerastorch as kt


def data(n=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    y = (x[:, 0] - x[:, 1] > 0).long()
    return x, y


def make_net(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))


class EMAWeights(kt.Callback):
    """An exponential moving average of the weights, updated after every optimizer step."""

    def __init__(self, decay=0.9):
        self.decay = decay
        self.averaged = None
        self.updates = 0

    def on_train_begin(self, logs=None):
        self.averaged = AveragedModel(self.model.net, multi_avg_fn=get_ema_multi_avg_fn(self.decay))

    def on_after_optimizer_step(self, optimizer):
        self.averaged.update_parameters(self.model.net)
        self.updates += 1


def test_an_ema_callback_on_the_step_hook_averages_exactly_what_a_hand_loop_averages():
    x, y = data()
    loader = DataLoader(TensorDataset(x, y), batch_size=32)  # no shuffle: the same batches in both runs
    net = make_net()
    ema = EMAWeights(decay=0.9)
    model = kt.KerasModel(net, nn.CrossEntropyLoss(), optimizer=torch.optim.SGD(net.parameters(), lr=0.1))
    model.fit(loader, epochs=2, patience=None, verbose=0, callbacks=[ema])

    by_hand = make_net()
    optimizer = torch.optim.SGD(by_hand.parameters(), lr=0.1)
    averaged = None
    for _ in range(2):
        for xb, yb in loader:
            nn.functional.cross_entropy(by_hand(xb), yb).backward()
            optimizer.step()
            optimizer.zero_grad()
            if averaged is None:  # AveragedModel's first update takes the weights as they are
                averaged = [p.detach().clone() for p in by_hand.parameters()]
            else:
                for avg, p in zip(averaged, by_hand.parameters()):
                    avg.mul_(0.9).add_(p.detach(), alpha=0.1)

    assert ema.updates == 2 * len(loader)
    for avg, expected in zip(ema.averaged.module.parameters(), averaged):
        torch.testing.assert_close(avg, expected)
    # the average lags the trained weights: it is not a copy of them
    assert not torch.equal(next(ema.averaged.module.parameters()), next(model.net.parameters()))


class StepRecorder(kt.Callback):
    def __init__(self):
        self.events = []
        self.grad_norms = []

    def on_before_backward(self, loss):
        assert loss.requires_grad
        self.events.append("before_backward")

    def on_after_backward(self):
        assert all(p.grad is not None for p in self.model.net.parameters())
        self.events.append("after_backward")

    def on_before_optimizer_step(self, optimizer):
        grads = [p.grad for p in self.model.net.parameters()]
        self.grad_norms.append(float(torch.norm(torch.stack([g.norm() for g in grads]))))
        self.events.append("before_step")

    def on_after_optimizer_step(self, optimizer):
        assert all(p.grad is None for p in self.model.net.parameters())  # zeroed after the step
        self.events.append("after_step")


def test_step_hooks_fire_per_batch_and_per_update_with_accumulation_and_see_the_clipped_input():
    x, y = data(n=224)
    loader = DataLoader(TensorDataset(x, y), batch_size=32)  # 7 batches: groups of 3, 3 and 1
    net = make_net()
    recorder = StepRecorder()
    model = kt.KerasModel(net, nn.CrossEntropyLoss(), optimizer=torch.optim.SGD(net.parameters(), lr=0.1))
    model.fit(
        loader,
        epochs=2,
        patience=None,
        verbose=0,
        callbacks=[recorder],
        gradient_accumulation_steps=3,
        gradient_clip_val=1e-3,
    )
    per_epoch = ["before_backward", "after_backward"] * 3 + ["before_step", "after_step"]
    per_epoch = per_epoch * 2 + ["before_backward", "after_backward", "before_step", "after_step"]
    assert recorder.events == per_epoch * 2
    # the hook sees the gradients before clipping (the clip value is far below them)
    assert len(recorder.grad_norms) == 6 and min(recorder.grad_norms) > 1e-2


class TwoOptimizers(kt.KerasModel):
    """The body and the head learn at their own rates: a custom update in train_step."""

    def __init__(self, net, **kwargs):
        body, head = net[:2], net[2]
        super().__init__(net, nn.CrossEntropyLoss(), optimizer=torch.optim.SGD(body.parameters(), lr=0.2), **kwargs)
        self.head_optimizer = torch.optim.Adam(head.parameters(), lr=0.02)

    def train_step(self, batch):
        with self.autocast():
            loss, preds, labels = self.forward_batch(batch)
        self.backward(loss)
        self.optimizer_step(self.optimizer)
        self.optimizer_step(self.head_optimizer)
        return loss, preds, labels


class CountSteps(kt.Callback):
    def __init__(self):
        self.stepped = []

    def on_after_optimizer_step(self, optimizer):
        self.stepped.append(type(optimizer).__name__)


def test_an_overridden_train_step_with_two_optimizers_trains_and_accumulates():
    x, y = data(n=320)
    train = DataLoader(TensorDataset(x[:256], y[:256]), batch_size=16, shuffle=True)  # 16 batches
    val = DataLoader(TensorDataset(x[256:], y[256:]), batch_size=64)
    net = make_net()
    head_before = net[2].weight.detach().clone()
    body_before = net[0].weight.detach().clone()
    model = TwoOptimizers(net, metrics_dict={"acc": lambda p, t: (p.argmax(1) == t).float().mean()})
    counter = CountSteps()
    history = model.fit(
        train, val, epochs=6, patience=None, verbose=0, gradient_accumulation_steps=3, callbacks=[counter]
    )
    assert history["val_acc"].iloc[-1] > 0.85
    assert not torch.equal(net[2].weight, head_before) and not torch.equal(net[0].weight, body_before)
    updates_per_epoch = math.ceil(16 / 3)
    assert counter.stepped == ["SGD", "Adam"] * updates_per_epoch * 6


def test_backward_outside_fit_says_where_it_works():
    net = make_net()
    model = kt.KerasModel(net, nn.CrossEntropyLoss())
    with pytest.raises(RuntimeError, match="inside train_step while fit trains"):
        model.backward(net(torch.randn(2, 8)).sum())


class Record(kt.Callback):
    def __init__(self, name, log, order=0):
        self.name, self.log, self.order = name, log, order

    def on_train_begin(self, logs=None):
        self.log.append(self.name)

    def on_epoch_end(self, epoch, logs=None):
        self.log.append((self.name, self.model.stop_training))


def test_callbacks_run_by_order_after_fits_own_watchers():
    x, y = data()
    loader = DataLoader(TensorDataset(x, y), batch_size=64)
    net = make_net()
    log = []
    model = kt.KerasModel(net, nn.CrossEntropyLoss(), optimizer=torch.optim.SGD(net.parameters(), lr=0.0))
    # lr=0: no epoch improves on the first, so patience=1 stops at epoch 2
    model.fit(
        loader,
        loader,
        epochs=5,
        patience=1,
        verbose=0,
        callbacks=[Record("mine", log), Record("early", log, order=-100)],
    )
    assert log[:2] == ["early", "mine"]
    # at epoch 2, EarlyStopping (order -10) has decided before "mine" (order 0) runs, not before "early"
    assert log[-2:] == [("early", False), ("mine", True)]


@pytest.mark.parametrize("overridden", ["backward", "optimizer_step", "autocast"])
def test_a_call_of_the_default_step_overridden_alone_runs_at_every_batch(overridden):
    # fit runs the default train_step's calls itself when none is overridden; a subclass that
    # overrides one of them (and not train_step) must still have it called, batch after batch.
    calls = []

    class Traced(kt.KerasModel):
        pass

    def traced(self, *args):
        calls.append(overridden)
        return getattr(kt.KerasModel, overridden)(self, *args)

    setattr(Traced, overridden, traced)
    x, y = data()
    net = make_net()
    model = Traced(net, nn.CrossEntropyLoss(), optimizer=torch.optim.SGD(net.parameters(), lr=0.1))
    history = model.fit(DataLoader(TensorDataset(x, y), batch_size=32), epochs=2, patience=None, verbose=0)
    assert len(calls) == 2 * 8
    assert history["train_loss"].iloc[1] < history["train_loss"].iloc[0]
