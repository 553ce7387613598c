"""How gradients become updates: lr schedulers per epoch and per step, ReduceLROnPlateau,
LearningRateScheduler, gradient accumulation and gradient clipping."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import kerastorch as kt
from kerastorch.callbacks import LearningRateScheduler


def regression_data(n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    y = x @ torch.randn(6, 2, generator=g) + 0.1 * torch.randn(n, 2, generator=g)
    return x, y


def make_net(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 2))


def fit_once(net, x, y, batch_size, lr=0.1, optimizer=None, **fit_kwargs):
    loader = DataLoader(TensorDataset(x, y), batch_size=batch_size)  # fixed order
    model = kt.KerasModel(net, nn.MSELoss(), optimizer=optimizer or torch.optim.SGD(net.parameters(), lr=lr))
    return model, model.fit(loader, epochs=1, patience=None, verbose=0, **fit_kwargs)


def flat(net):
    return torch.cat([p.detach().reshape(-1) for p in net.parameters()])


class RecordBatchLR(kt.Callback):
    """The lr the optimizer holds as each training batch starts."""

    def __init__(self):
        self.lrs = []

    def on_train_batch_begin(self, batch, logs=None):
        self.lrs.append(self.model.optimizer.param_groups[0]["lr"])


# -- gradient accumulation ------------------------------------------------------------------


def test_accumulating_4_batches_of_16_equals_one_batch_of_64():
    x, y = regression_data(64)
    accumulated, reference = make_net(), make_net()
    start = flat(reference)
    fit_once(accumulated, x, y, batch_size=16, gradient_accumulation_steps=4)
    fit_once(reference, x, y, batch_size=64)
    assert (flat(reference) - start).norm() > 1e-2  # one real update happened
    torch.testing.assert_close(flat(accumulated), flat(reference), atol=1e-5, rtol=0)


def test_a_last_partial_group_is_one_update_over_its_own_batches():
    x, y = regression_data(96)  # 6 batches of 16: a group of 4, then a group of 2
    accumulated, reference = make_net(), make_net()
    updates = []
    optimizer = torch.optim.SGD(accumulated.parameters(), lr=0.1)
    optimizer.register_step_post_hook(lambda *args: updates.append(1))
    fit_once(accumulated, x, y, batch_size=16, optimizer=optimizer, gradient_accumulation_steps=4)
    fit_once(reference, x, y, batch_size=64)  # batches of 64 and 32
    assert len(updates) == 2
    torch.testing.assert_close(flat(accumulated), flat(reference), atol=1e-5, rtol=0)


def test_accumulation_over_a_loader_without_a_length():
    x, y = regression_data(96)

    class Batches:  # an iterable of batches with no len(), like a streaming dataset
        def __iter__(self):
            return iter([(x[i : i + 16], y[i : i + 16]) for i in range(0, 96, 16)])

    accumulated, reference = make_net(), make_net()
    model = kt.KerasModel(accumulated, nn.MSELoss(), optimizer=torch.optim.SGD(accumulated.parameters(), lr=0.1))
    model.fit(Batches(), epochs=1, patience=None, verbose=0, gradient_accumulation_steps=4)
    fit_once(reference, x, y, batch_size=64)
    torch.testing.assert_close(flat(accumulated), flat(reference), atol=1e-5, rtol=0)


def test_gradients_left_before_fit_do_not_leak_into_the_first_update():
    x, y = regression_data(64)
    stale, reference = make_net(), make_net()
    nn.MSELoss()(stale(x * 10), y).backward()  # the user's own backward, never stepped
    fit_once(stale, x, y, batch_size=64)
    fit_once(reference, x, y, batch_size=64)
    torch.testing.assert_close(flat(stale), flat(reference), atol=1e-6, rtol=0)


DDP_SCRIPT = """
import json, os, sys, torch, torch.nn as nn
torch.set_num_threads(1)
import kerastorch as kt
rank = int(os.environ["RANK"])
g = torch.Generator().manual_seed(0)
x = torch.randn(96, 6, generator=g); y = x @ torch.randn(6, 2, generator=g)
torch.manual_seed(0)
net = nn.Linear(6, 2)

class Samples(torch.utils.data.IterableDataset):  # no len(): the last, short group is found only after the loop
    def __iter__(self):
        return iter(zip(x, y))

# accelerate shards an iterable dataset batch by batch: each global batch of 16 is rank 0's 8 and rank 1's 8.
loader = torch.utils.data.DataLoader(Samples(), batch_size=8)
model = kt.KerasModel(net, nn.MSELoss(), optimizer=torch.optim.SGD(net.parameters(), lr=0.1))
model.fit(loader, epochs=1, patience=None, verbose=0, gradient_accumulation_steps=4)
with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
    json.dump(torch.cat([p.detach().reshape(-1) for p in net.parameters()]).tolist(), f)
if torch.distributed.is_initialized():  # close gloo before exit, not in the interpreter's teardown
    torch.distributed.destroy_process_group()
"""


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")
@pytest.mark.slow
def test_a_last_partial_group_is_averaged_over_processes_under_ddp(tmp_path):
    import json
    import os
    import signal
    import subprocess
    import sys

    script = tmp_path / "train.py"
    script.write_text(DDP_SCRIPT)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": root, "OMP_NUM_THREADS": "1"}
    # A session of its own, so a hung run's worker processes can be ended with it.
    run = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            str(script),
            str(tmp_path),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _, stderr = run.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(run.pid, signal.SIGKILL)
        run.communicate()
        pytest.fail("torchrun with 2 gloo processes did not finish in 240 s")
    assert run.returncode == 0, stderr[-3000:]
    ranks = [torch.tensor(json.loads((tmp_path / f"rank{r}.json").read_text())) for r in (0, 1)]

    g = torch.Generator().manual_seed(0)  # the script's data, in one process
    x = torch.randn(96, 6, generator=g)
    y = x @ torch.randn(6, 2, generator=g)
    torch.manual_seed(0)
    reference = nn.Linear(6, 2)
    fit_once(reference, x, y, batch_size=16, gradient_accumulation_steps=4)
    torch.testing.assert_close(ranks[0], ranks[1], atol=1e-6, rtol=0)
    torch.testing.assert_close(ranks[0], flat(reference), atol=1e-5, rtol=0)


# -- gradient clipping ----------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ["norm", "value"])
def test_clipping_bounds_the_update(algorithm):
    x, y = regression_data(64)
    clip = 0.01
    free, clipped = make_net(), make_net()
    start = flat(free)
    fit_once(free, x, y, batch_size=64, lr=1.0)  # SGD with lr=1: the update is minus the gradient
    fit_once(clipped, x, y, batch_size=64, lr=1.0, gradient_clip_val=clip, gradient_clip_algorithm=algorithm)
    free_step, clipped_step = flat(free) - start, flat(clipped) - start
    if algorithm == "norm":
        assert free_step.norm() > 10 * clip
        assert clipped_step.norm() == pytest.approx(clip, rel=1e-4)
        # Clipping by norm rescales the gradient: same direction.
        torch.testing.assert_close(clipped_step / clipped_step.norm(), free_step / free_step.norm())
    else:
        assert free_step.abs().max() > 10 * clip
        assert clipped_step.abs().max() <= clip + 1e-7
        torch.testing.assert_close(clipped_step, free_step.clamp(-clip, clip))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="16-mixed with a GradScaler needs CUDA")
@pytest.mark.gpu
def test_clipping_under_16_mixed_clips_the_unscaled_gradient():
    x, y = regression_data(64)
    clip = 0.01
    net = make_net()
    start = flat(net).cuda()
    fit_once(net, x, y, batch_size=64, lr=1.0, precision="16-mixed", accelerator="cuda", gradient_clip_val=clip)
    assert (flat(net) - start).norm().item() == pytest.approx(clip, rel=1e-2)  # the net stays on the GPU


def test_bad_clipping_and_accumulation_arguments_are_refused_before_training():
    x, y = regression_data(64)
    net = make_net()
    start = flat(net)
    with pytest.raises(ValueError, match="gradient_clip_val=-1 must be a positive number"):
        fit_once(net, x, y, batch_size=16, gradient_clip_val=-1)
    with pytest.raises(ValueError, match="gradient_clip_algorithm='l2'; use 'norm' or 'value'"):
        fit_once(net, x, y, batch_size=16, gradient_clip_val=1.0, gradient_clip_algorithm="l2")
    with pytest.raises(ValueError, match="gradient_accumulation_steps=0"):
        fit_once(net, x, y, batch_size=16, gradient_accumulation_steps=0)
    assert torch.equal(flat(net), start)


# -- torch lr schedulers --------------------------------------------------------------------


def classification_loaders(n=112, batch_size=16):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 6, generator=g)
    y = (x[:, 0] > 0).long()
    return DataLoader(TensorDataset(x, y), batch_size=batch_size), DataLoader(TensorDataset(x, y), batch_size=64)


def test_one_cycle_per_step_reaches_its_last_step_exactly():
    train, val = classification_loaders()  # 7 batches per epoch
    epochs = 3
    net = make_net()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.5, total_steps=epochs * len(train))
    recorder = RecordBatchLR()
    model = kt.KerasModel(
        net, nn.CrossEntropyLoss(), optimizer=optimizer, lr_scheduler=scheduler, lr_scheduler_interval="step"
    )
    history = model.fit(train, val, epochs=epochs, patience=None, callbacks=[recorder], verbose=0)

    assert scheduler.last_epoch == epochs * len(train) == 21
    assert len(recorder.lrs) == 21
    assert recorder.lrs[0] == pytest.approx(0.5 / 25)  # max_lr / div_factor
    assert max(recorder.lrs) == pytest.approx(0.5, rel=1e-2)
    assert recorder.lrs[-1] == pytest.approx(0.5 / 25 / 1e4)  # the cycle's very last value
    assert list(history["lr"]) == [recorder.lrs[0], recorder.lrs[7], recorder.lrs[14]]  # lr as each epoch began


def test_per_step_scheduler_counts_real_updates_under_accumulation():
    train, val = classification_loaders()  # 7 batches: updates after batches 2, 4, 6 and 7
    epochs = 3
    net = make_net()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.5, total_steps=epochs * 4)
    model = kt.KerasModel(
        net, nn.CrossEntropyLoss(), optimizer=optimizer, lr_scheduler=scheduler, lr_scheduler_interval="step"
    )
    model.fit(train, val, epochs=epochs, patience=None, verbose=0, gradient_accumulation_steps=2)
    assert scheduler.last_epoch == 12


# -- a per-step scheduler sized for another number of steps than fit makes ----------------------


def step_scheduled_model(make_scheduler):
    net = make_net()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    return kt.KerasModel(
        net,
        nn.CrossEntropyLoss(),
        optimizer=optimizer,
        lr_scheduler=make_scheduler(optimizer),
        lr_scheduler_interval="step",
    )


class RecordUpdateLR(kt.Callback):
    """The lr each optimizer step uses."""

    def __init__(self):
        self.lrs = []

    def on_before_optimizer_step(self, optimizer):
        self.lrs.append(optimizer.param_groups[0]["lr"])


def one_cycle(total_steps):
    return lambda optimizer: torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.5, total_steps=total_steps)


def warning_before_training(model, train, val, **fit_kwargs):
    """fit's warning on the scheduler's steps, turned into an error so that fit stops where it warns:
    the weights show that it came before training."""
    before = flat(model.net)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="lr_scheduler=")
        with pytest.raises(UserWarning) as warned:
            model.fit(train, val, epochs=3, patience=None, verbose=0, **fit_kwargs)
    assert torch.equal(flat(model.net), before)
    return str(warned.value)


def test_one_cycle_sized_in_batches_under_accumulation_warns_with_the_right_total():
    # The docs' OneCycleLR(total_steps=epochs * len(dl_train)) with gradient_accumulation_steps: the
    # scheduler steps once per update, so the cycle would stop partway and never anneal.
    train, val = classification_loaders()  # 7 batches: 4 updates an epoch under accumulation of 2
    model = step_scheduled_model(one_cycle(3 * len(train)))
    message = warning_before_training(model, train, val, gradient_accumulation_steps=2)
    assert message.startswith(
        "lr_scheduler=OneCycleLR(total_steps=21) has 21 optimizer steps left, and this fit makes 12: 3 epochs x 4 "
        "optimizer steps (7 batches / gradient_accumulation_steps=2, rounded up). So the cycle stops 57% of the way "
        "through and the rate never anneals. Build it with total_steps=12."
    )
    rates = RecordUpdateLR()
    with pytest.warns(UserWarning, match="total_steps=12"):  # trained anyway: the warning was right
        model.fit(train, val, epochs=3, patience=None, verbose=0, gradient_accumulation_steps=2, callbacks=[rates])
    assert len(rates.lrs) == 12 and rates.lrs[-1] > 0.1  # the last update, still at a high rate

    model = step_scheduled_model(one_cycle(12))  # the number it said: no warning, and the cycle anneals
    rates = RecordUpdateLR()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.fit(train, val, epochs=3, patience=None, verbose=0, gradient_accumulation_steps=2, callbacks=[rates])
    assert len(rates.lrs) == 12 and rates.lrs[-1] == pytest.approx(0.5 / 25 / 1e4)  # the cycle's end


def test_one_cycle_shorter_than_the_run_warns_that_torch_will_raise_and_when():
    train, val = classification_loaders()  # 7 batches, 21 updates in 3 epochs
    model = step_scheduled_model(one_cycle(10))
    message = warning_before_training(model, train, val)
    assert (
        "has 10 optimizer steps left, and this fit makes 21: 3 epochs x 7 optimizer steps (7 batches). So torch "
        "raises at the optimizer step 11, in epoch 2, which ends training there. Build it with total_steps=21."
    ) in message
    epochs = []
    record = kt.callbacks.LambdaCallback(on_epoch_begin=lambda epoch, logs: epochs.append(epoch))
    with pytest.warns(UserWarning, match="total_steps=21"), pytest.raises(ValueError, match="Tried to step 11 times"):
        model.fit(train, val, epochs=3, patience=None, verbose=0, callbacks=[record])
    assert epochs == [1, 2]


@pytest.mark.parametrize(
    "fit_kwargs, counted, right",
    [
        ({"steps_per_epoch": 5}, "3 epochs x 5 optimizer steps (steps_per_epoch=5 batches)", 15),
        ({"initial_epoch": 1}, "2 epochs (epochs=3 - initial_epoch=1) x 7 optimizer steps (7 batches)", 14),
        (
            {"accelerator": "cpu", "devices": 2},
            "3 epochs x 4 optimizer steps in each process (7 batches shared by 2 processes)",
            12,
        ),
    ],
    ids=["steps_per_epoch", "initial_epoch", "two-processes"],
)
def test_one_cycle_check_counts_steps_per_epoch_initial_epoch_and_processes(fit_kwargs, counted, right):
    train, val = classification_loaders()
    model = step_scheduled_model(one_cycle(3 * len(train)))
    message = warning_before_training(model, train, val, **fit_kwargs)
    assert f"this fit makes {right}: {counted}." in message and f"Build it with total_steps={right}." in message


def test_one_cycle_split_over_two_fits_warns_once_then_goes_on():
    train, val = classification_loaders()
    model = step_scheduled_model(one_cycle(2 * 21))
    with pytest.warns(UserWarning, match="stops 50% of the way through.*a later fit goes on with this schedule"):
        model.fit(train, val, epochs=3, patience=None, verbose=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # 21 steps left, 21 to make
        model.fit(train, val, epochs=3, patience=None, verbose=0)
    assert model.lr_scheduler.last_epoch == 42
    model.lr_scheduler = torch.optim.lr_scheduler.OneCycleLR(model.optimizer, max_lr=0.5, total_steps=30)
    model.lr_scheduler.last_epoch = 20  # as after a state of another run was loaded: 10 steps left
    message = warning_before_training(model, train, val)
    assert "has 10 optimizer steps left of its 30 (20 taken already), and this fit makes 21" in message
    assert "Build a new one with total_steps=21 for this run, or total_steps=41 to go on from its 20." in message


def test_cosine_longer_than_the_run_warns_and_a_shorter_one_does_not():
    train, val = classification_loaders()
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR
    model = step_scheduled_model(lambda optimizer: cosine(optimizer, T_max=3 * 28))  # sized for 28 batches
    message = warning_before_training(model, train, val)
    assert "CosineAnnealingLR(T_max=84) has 84 optimizer steps left, and this fit makes 21" in message
    assert "the rate stops 25% of the way down its cosine, above its eta_min. Build it with T_max=21." in message
    model = step_scheduled_model(lambda optimizer: cosine(optimizer, T_max=5))  # down and up again: may be meant
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.fit(train, val, epochs=3, patience=None, verbose=0)


def test_epoch_scheduler_and_the_lr_column():
    train, val = classification_loaders()
    net = make_net()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.4)
    recorder = RecordBatchLR()
    model = kt.KerasModel(
        net,
        nn.CrossEntropyLoss(),
        optimizer=optimizer,
        lr_scheduler=torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5),
    )
    history = model.fit(train, val, epochs=3, patience=None, callbacks=[recorder], verbose=0)
    assert list(history["lr"]) == pytest.approx([0.4, 0.2, 0.1])
    assert recorder.lrs == pytest.approx([0.4] * 7 + [0.2] * 7 + [0.1] * 7)  # the lr each epoch really used


def test_reduce_lr_on_plateau_lowers_the_lr_and_the_lr_column_shows_it():
    # Zero weights and zero targets: the loss is 0 and its gradient 0, a perfect plateau.
    x = torch.randn(64, 6)
    loader = DataLoader(TensorDataset(x, torch.zeros(64, 2)), batch_size=16)
    net = nn.Linear(6, 2)
    nn.init.zeros_(net.weight), nn.init.zeros_(net.bias)
    optimizer = torch.optim.SGD(net.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="min", factor=0.5, patience=1)
    recorder = RecordBatchLR()
    model = kt.KerasModel(net, nn.MSELoss(), optimizer=optimizer, lr_scheduler=scheduler)
    history = model.fit(loader, loader, epochs=6, patience=None, callbacks=[recorder], verbose=0)

    # Epoch 1 sets the best; epochs 2 and 3 do not improve; after the second of them (patience=1) the lr halves.
    assert list(history["lr"]) == [1.0, 1.0, 1.0, 0.5, 0.5, 0.25]
    assert recorder.lrs == [lr for lr in history["lr"] for _ in range(4)]
    assert optimizer.param_groups[0]["lr"] == 0.25


def test_reduce_lr_on_plateau_follows_the_monitored_value():
    # It is stepped once per epoch with the value of fit's monitor (here val_acc), not with the loss.
    train, val = classification_loaders()
    net = make_net()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.3)
    seen = []
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="max", factor=0.1, patience=0)
    real_step = scheduler.step
    scheduler.step = lambda value: (seen.append(value), real_step(value))
    model = kt.KerasModel(
        net,
        nn.CrossEntropyLoss(),
        {"acc": lambda p, y: (p.argmax(1) == y).float().mean()},
        optimizer=optimizer,
        lr_scheduler=scheduler,
    )
    history = model.fit(train, val, epochs=3, patience=None, monitor="val_acc", mode="max", verbose=0)
    assert seen[1:] == list(history["val_acc"])  # seen[0]: fit's trial call before training, undone


def test_reduce_lr_on_plateau_whose_mode_disagrees_with_fits_is_refused():
    # torch's default mode="min" fed val_acc would cut the rate each time the accuracy improves.
    train, val = classification_loaders()
    net = make_net()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.3)
    before = [p.clone() for p in net.parameters()]
    model = kt.KerasModel(
        net,
        nn.CrossEntropyLoss(),
        {"acc": lambda p, y: (p.argmax(1) == y).float().mean()},
        optimizer=optimizer,
        lr_scheduler=torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, patience=0, factor=0.5),
    )
    with pytest.raises(ValueError, match=r"ReduceLROnPlateau\(mode='min'\) gets val_acc.*better higher.*mode='max'"):
        model.fit(train, val, epochs=2, monitor="val_acc", verbose=0)
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters()))
    assert optimizer.param_groups[0]["lr"] == 0.3
    # The same scheduler on the loss, which is better lower, trains.
    assert len(model.fit(train, val, epochs=2, monitor="val_loss", verbose=0)) == 2


def test_reduce_lr_on_plateau_per_step_is_refused_with_advice():
    train, val = classification_loaders()
    net = make_net()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    before = [p.clone() for p in net.parameters()]
    with pytest.raises(ValueError, match="lr_scheduler_interval='epoch'"):  # refused as soon as it is built
        model = kt.KerasModel(
            net,
            nn.CrossEntropyLoss(),
            optimizer=optimizer,
            lr_scheduler_interval="step",
            lr_scheduler=torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer),
        )
        model.fit(train, val, epochs=1, verbose=0)
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters()))
    pytest.importorskip("lightning.pytorch")
    with pytest.raises(ValueError, match="lr_scheduler_interval='epoch'"):  # LightModel: the same check
        kt.LightModel(
            net,
            nn.CrossEntropyLoss(),
            optimizer=optimizer,
            lr_scheduler_interval="step",
            lr_scheduler=torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer),
        )


# -- LearningRateScheduler callback ---------------------------------------------------------


def test_learning_rate_scheduler_sets_each_epochs_lr():
    train, val = classification_loaders()
    net = make_net()
    optimizer = torch.optim.SGD(
        [{"params": net[0].parameters(), "lr": 0.2}, {"params": net[2].parameters(), "lr": 0.02}]
    )
    recorder = RecordBatchLR()
    schedule = LearningRateScheduler(lambda epoch, lr: 0.1 * epoch if epoch <= 2 else lr / 4)
    model = kt.KerasModel(net, nn.CrossEntropyLoss(), optimizer=optimizer)
    history = model.fit(train, val, epochs=4, patience=None, callbacks=[schedule, recorder], verbose=0)
    assert list(history["lr"]) == pytest.approx([0.1, 0.2, 0.05, 0.0125])
    assert recorder.lrs[::7] == pytest.approx([0.1, 0.2, 0.05, 0.0125])
    assert optimizer.param_groups[1]["lr"] == pytest.approx(0.2 / 16)  # each group's own lr


def test_learning_rate_scheduler_of_the_epoch_alone_and_a_bad_return():
    train, val = classification_loaders()
    net = make_net()
    model = kt.KerasModel(net, nn.CrossEntropyLoss(), optimizer=torch.optim.SGD(net.parameters(), lr=1.0))
    history = model.fit(
        train, val, epochs=2, patience=None, verbose=0, callbacks=[LearningRateScheduler(lambda epoch: 0.01 * epoch)]
    )
    assert list(history["lr"]) == pytest.approx([0.01, 0.02])
    before = flat(net)
    with pytest.raises(ValueError, match="returned None at epoch 1; it must return a learning rate"):
        model.fit(train, val, epochs=2, verbose=0, callbacks=[LearningRateScheduler(lambda epoch, lr: None)])
    assert torch.equal(flat(net), before)
