"""Tuning: the learning-rate finder changes nothing and suggests a sensible rate, fit_one_cycle
draws the cycle, and EMA / SWA average the weights that validation and fit's result use."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import kerastorch as kt
from helpers import accuracy


def data(n=512, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    y = ((x[:, 0] - x[:, 1] + 0.3 * torch.randn(n, generator=g)) > 0).long()
    return x, y


def loaders(seed=0):
    x, y = data(seed=seed)
    torch.manual_seed(seed)
    train = DataLoader(TensorDataset(x[:384], y[:384]), batch_size=32, shuffle=True)
    return train, DataLoader(TensorDataset(x[384:], y[384:]), batch_size=64)


def make_model(lr=0.01, seed=0, batch_norm=False, optimizer="adam"):
    torch.manual_seed(seed)
    layers = [nn.Linear(8, 32)] + ([nn.BatchNorm1d(32)] if batch_norm else []) + [nn.ReLU(), nn.Linear(32, 2)]
    net = nn.Sequential(*layers)
    opt = torch.optim.Adam(net.parameters(), lr=lr) if optimizer == "adam" else torch.optim.SGD(net.parameters(), lr)
    return kt.KerasModel(net, nn.CrossEntropyLoss(), {"acc": accuracy}, opt)


def state_of(model):
    return {k: v.clone() for k, v in model.net.state_dict().items()}


def test_lr_find_changes_nothing_and_fit_afterwards_equals_fit_alone():
    train, val = loaders()
    model = make_model(batch_norm=True)
    model.fit(train, epochs=1, verbose=0)  # the optimizer has state (Adam's moments) to keep
    before = state_of(model)
    optimizer_before = {k: v.clone() for k, v in model.optimizer.state_dict()["state"][0].items()}
    rng_before = (random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state().clone())
    result = model.lr_find(train, num_steps=60)
    assert all(torch.equal(before[k], v) for k, v in state_of(model).items())
    after = model.optimizer.state_dict()
    assert all(torch.equal(optimizer_before[k], v) for k, v in after["state"][0].items())
    assert after["param_groups"][0]["lr"] == 0.01
    assert random.getstate() == rng_before[0] and np.array_equal(np.random.get_state()[1], rng_before[1])
    assert torch.equal(torch.get_rng_state(), rng_before[2])
    assert model.net.training and list(result.history.columns) == ["lr", "loss", "raw_loss"]

    alone = make_model(batch_norm=True)
    torch.manual_seed(1)
    alone_history = alone.fit(*loaders(), epochs=2, verbose=0)
    after_finder = make_model(batch_norm=True)
    torch.manual_seed(1)
    train, val = loaders()
    after_finder.lr_find(train, num_steps=30)
    finder_history = after_finder.fit(train, val, epochs=2, verbose=0)
    assert finder_history.equals(alone_history)


def test_lr_find_suggests_a_rate_in_the_known_good_range():
    # Least squares: SGD diverges above lr = 2 / L, with L the largest eigenvalue of x'x/n (about 1 here).
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2048, 4, generator=g)
    y = x @ torch.tensor([1.0, -2.0, 0.5, 3.0]) + 0.1 * torch.randn(2048, generator=g)
    torch.manual_seed(0)
    net = nn.Linear(4, 1)
    model = kt.KerasModel(net, nn.MSELoss(), optimizer=torch.optim.SGD(net.parameters(), lr=1e-3))
    result = model.lr_find(x, y.unsqueeze(1), batch_size=64, start_lr=1e-5, end_lr=100, num_steps=100)
    assert 1e-3 <= result.suggestion <= 1.0, result
    assert result.history["lr"].iloc[-1] < 100  # stopped when the loss diverged
    figure = result.plot()
    assert figure.axes[0].get_xscale() == "log"
    assert result._repr_png_().startswith(b"\x89PNG")


def test_fit_one_cycle_draws_the_cycle_in_the_lr_column_and_refuses_a_second_schedule():
    train, val = loaders()
    model = make_model()
    history = model.fit_one_cycle(train, val, epochs=6, max_lr=0.05, verbose=0, patience=None)
    lrs = history["lr"].tolist()
    peak = int(np.argmax(lrs))
    assert 0 < peak < 5 and lrs[0] < lrs[peak] > lrs[-1]
    assert history["val_acc"].iloc[-1] > 0.85
    assert model.lr_scheduler is None  # the cycle was for that run only

    scheduled = make_model()
    scheduled.lr_scheduler = torch.optim.lr_scheduler.StepLR(scheduled.optimizer, 2)
    with pytest.raises(ValueError, match="already has lr_scheduler=StepLR"):
        scheduled.fit_one_cycle(train, val, epochs=2, verbose=0)


def test_fit_one_cycle_without_max_lr_asks_the_finder(capsys):
    train, val = loaders()
    model = make_model()
    history = model.fit_one_cycle(train, val, epochs=3, verbose=2)
    assert "max_lr=" in capsys.readouterr().out and len(history) >= 1


def hyperparameters(optimizer):
    """Every parameter group's settings but its parameters: lr, momentum or betas, any key a scheduler adds."""
    return [{key: value for key, value in group.items() if key != "params"} for group in optimizer.param_groups]


def test_fit_after_fit_one_cycle_trains_at_the_optimizers_own_rate():
    # OneCycleLR ends at a tiny fraction of max_lr; left there, the next fit trained at about 7e-05 and
    # its loss hardly moved (0.687, 0.683, 0.680 here).
    train, val = loaders()
    model = make_model(lr=0.01)
    before = hyperparameters(model.optimizer)
    model.fit_one_cycle(train, val, epochs=1, max_lr=0.002, verbose=0, patience=None)
    assert hyperparameters(model.optimizer) == before  # lr, betas, and no initial_lr / max_lr keys left
    history = model.fit(train, val, epochs=3, verbose=0, patience=None)
    assert list(history["lr"]) == [0.01] * 3
    assert history["train_loss"].iloc[-1] < 0.6 * history["train_loss"].iloc[0]


class StopsAt(kt.Callback):
    """Ends the run at the third batch of its second epoch: an early stop, a Ctrl-C or an error."""

    def __init__(self, how):
        self.how, self.batches = how, 0

    def on_train_batch_end(self, batch, logs=None):
        self.batches += 1
        if self.batches == 12 + 3:
            if self.how == "stop":
                self.model.stop_training = True
            elif self.how == "ctrl-c":
                raise KeyboardInterrupt
            else:
                raise RuntimeError("a callback failed")


@pytest.mark.parametrize("how", ["stop", "ctrl-c", "error"])
def test_fit_one_cycle_puts_every_groups_rate_and_momentum_back_however_it_ends(how):
    train, val = loaders()
    model = make_model()
    net = model.net
    model.optimizer = torch.optim.SGD(  # two groups of their own rates; the cycle moves momentum too
        [{"params": net[0].parameters(), "lr": 0.03}, {"params": net[2].parameters()}], lr=0.01, momentum=0.9
    )
    model.lr_scheduler_interval = "step"  # the model's own setting comes back too
    before = hyperparameters(model.optimizer)
    stopper = StopsAt(how)
    if how == "error":
        with pytest.raises(RuntimeError, match="a callback failed"):
            model.fit_one_cycle(train, val, epochs=3, max_lr=0.1, verbose=0, patience=None, callbacks=[stopper])
    else:
        history = model.fit_one_cycle(train, val, epochs=3, max_lr=0.1, verbose=0, patience=None, callbacks=[stopper])
        assert len(history) == (2 if how == "stop" else 1)
    assert stopper.batches == 15
    assert hyperparameters(model.optimizer) == before
    assert model.lr_scheduler is None and model.lr_scheduler_interval == "step"


@pytest.mark.slow
def test_fit_one_cycle_over_two_processes_puts_the_rates_back():
    # The workers send back the optimizer's state, whose groups carry the cycle's last rate and keys.
    train, val = loaders()
    model = make_model()
    before = hyperparameters(model.optimizer)
    history = model.fit_one_cycle(
        train, val, epochs=2, max_lr=0.05, accelerator="cpu", devices=2, verbose=0, patience=None
    )
    assert len(history) == 2 and history["lr"].iloc[1] != history["lr"].iloc[0]
    assert hyperparameters(model.optimizer) == before


def test_lr_find_puts_every_groups_rate_and_momentum_back_also_after_an_error():
    train, _ = loaders()
    model = make_model()
    net = model.net
    model.optimizer = torch.optim.SGD(
        [{"params": net[0].parameters(), "lr": 0.03}, {"params": net[2].parameters()}], lr=0.01, momentum=0.9
    )
    before = hyperparameters(model.optimizer)
    model.lr_find(train, num_steps=20)
    assert hyperparameters(model.optimizer) == before
    calls = []

    def fails_on_the_tenth_batch(module, inputs):
        calls.append(1)
        if len(calls) == 10:
            raise RuntimeError("the net failed")

    net.register_forward_pre_hook(fails_on_the_tenth_batch)
    with pytest.raises(RuntimeError, match="the net failed"):
        model.lr_find(train, num_steps=20)
    assert hyperparameters(model.optimizer) == before


def test_ema_with_decay_zero_is_plain_training_exactly():
    plain = make_model()
    plain_history = plain.fit(*loaders(), epochs=3, verbose=0, patience=None)
    averaged = make_model()
    ema_history = averaged.fit(*loaders(), epochs=3, verbose=0, patience=None, callbacks=[kt.callbacks.EMA(0.0)])
    assert ema_history.equals(plain_history)
    assert all(torch.equal(a, b) for a, b in zip(plain.net.state_dict().values(), averaged.net.state_dict().values()))


@pytest.mark.parametrize(
    "callback", [lambda: kt.callbacks.EMA(0.9), lambda: kt.callbacks.SWA(0.01, 3)], ids=["EMA", "SWA"]
)
def test_evaluate_after_fit_with_averaged_weights_equals_the_best_row(callback):
    train, val = loaders()
    model = make_model(batch_norm=True, lr=0.02)
    history = model.fit(train, val, epochs=5, verbose=0, patience=None, callbacks=[callback()])
    best = history.loc[history["val_loss"].idxmin()]
    scores = model.evaluate(val, quiet=True)
    assert scores["val_loss"] == pytest.approx(best["val_loss"], rel=1e-6)
    assert best["val_acc"] > 0.85


def test_ema_averages_exactly_as_torchs_averaged_model():
    """kt's EMA updates without reading its counter back (no GPU wait per step); its average is
    torch's ``AveragedModel`` with ``get_ema_multi_avg_fn`` bit for bit: parameters, BatchNorm's
    float statistics and its integer batch count, through a state loaded in between."""
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

    from kerastorch.callbacks.ema import EMAModel

    net = make_model(batch_norm=True).net
    ours, torchs = EMAModel(net, 0.8), AveragedModel(net, multi_avg_fn=get_ema_multi_avg_fn(0.8), use_buffers=True)
    g = torch.Generator().manual_seed(0)

    def train_a_little():
        net.train()
        net(torch.randn(16, 8, generator=g))  # moves BatchNorm's statistics and its count
        with torch.no_grad():
            for p in net.parameters():
                p.add_(torch.randn(p.shape, generator=g))

    def same():
        return all(torch.equal(a, b) for a, b in zip(ours.state_dict().values(), torchs.state_dict().values()))

    for _ in range(5):
        train_a_little()
        ours.update_parameters(net)
        torchs.update_parameters(net)
        assert same()
    assert ours.n_averaged.item() == 5 and not torch.equal(ours.module[0].weight, net[0].weight)
    # A state loaded into a started average: one not yet started makes the next update a copy again.
    fresh = AveragedModel(net, multi_avg_fn=get_ema_multi_avg_fn(0.8), use_buffers=True).state_dict()
    ours.load_state_dict(fresh)
    torchs.load_state_dict(fresh)
    for _ in range(2):
        train_a_little()
        ours.update_parameters(net)
        torchs.update_parameters(net)
        assert same()


def test_ema_validates_the_average_not_the_trained_weights():
    train, val = loaders()
    model = make_model(lr=0.05)
    ema = kt.callbacks.EMA(0.9)
    model.fit(train, val, epochs=2, verbose=0, patience=None, callbacks=[ema])
    # what fit returned is the average of the best epoch, not the last trained weights
    average = ema.averaged.module.state_dict()
    assert all(torch.equal(average[k], v) for k, v in model.net.state_dict().items())


def test_swa_refuses_a_scheduler_and_a_bad_start():
    with pytest.raises(ValueError, match="swa_epoch_start=1.5"):
        kt.callbacks.SWA(0.01, swa_epoch_start=1.5)
    train, val = loaders()
    model = make_model()
    model.lr_scheduler = torch.optim.lr_scheduler.StepLR(model.optimizer, 2)
    with pytest.raises(ValueError, match="SWA sets the learning rate"):
        model.fit(train, val, epochs=2, verbose=0, callbacks=[kt.callbacks.SWA(0.01)])


@pytest.mark.parametrize(
    "callback", [lambda: kt.callbacks.EMA(0.8), lambda: kt.callbacks.SWA(0.01, 2)], ids=["EMA", "SWA"]
)
def test_resume_with_averaged_weights_is_exact(tmp_path, callback):
    whole = make_model(batch_norm=True)
    torch.manual_seed(3)
    whole_history = whole.fit(*loaders(), epochs=4, verbose=0, patience=None, callbacks=[callback()])

    ckpt = tmp_path / "best.safetensors"
    first = make_model(batch_norm=True)
    torch.manual_seed(3)
    first.fit(*loaders(), epochs=2, verbose=0, patience=None, callbacks=[callback()], ckpt_path=ckpt, resume=True)
    second = make_model(batch_norm=True, seed=7)  # other starting weights: the state must replace them
    torch.manual_seed(11)
    resumed = second.fit(
        *loaders(), epochs=4, verbose=0, patience=None, callbacks=[callback()], ckpt_path=ckpt, resume=True
    )
    assert resumed.equals(whole_history)
    assert all(torch.equal(a, b) for a, b in zip(whole.net.state_dict().values(), second.net.state_dict().values()))


@pytest.mark.slow
def test_ema_over_two_processes_returns_the_averaged_best_weights():
    train, val = loaders()
    model = make_model(lr=0.02)
    history = model.fit(
        train,
        val,
        epochs=3,
        accelerator="cpu",
        devices=2,
        verbose=0,
        patience=None,
        callbacks=[kt.callbacks.EMA(0.9)],
        gradient_accumulation_steps=2,
    )
    best = history.loc[history["val_loss"].idxmin()]
    assert model.evaluate(val, quiet=True)["val_loss"] == pytest.approx(best["val_loss"], rel=1e-5)
