"""BackupAndRestore: Keras's arguments, the whole training state every epoch or every N batches, and a
run killed in the middle of an epoch that ends, rerun, exactly as if it had never stopped."""

from __future__ import annotations

import inspect
import os
import random
import signal
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch
import torchmetrics
from script_runs import ENV, REPO_ROOT, assert_same_run, backup_of, finish, read_run, run_script, start_script
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

import kerastorch as kt
from kerastorch.files.state import load_state_file, training_state_path


@pytest.mark.slow
def test_killed_mid_epoch_at_a_chosen_and_a_random_batch_with_workers_accumulation_and_a_step_scheduler(tmp_path):
    # Two worker processes, dropout, numpy / python / Dataset-own randomness in the data, 2 batches per
    # optimizer step with the scheduler stepped after each, a backup every 3 batches (12 batches an epoch).
    options = ("--workers", 2, "--accumulate", 2, "--save-freq", 3)
    reference = start_script(tmp_path / "reference", *options)  # never interrupted, alongside

    # SIGKILL before batch 10 of epoch 2: the backup is from inside that epoch, after batch 8 (3 batches
    # after the one before, rounded up to the end of an accumulation group).
    code, output = run_script(tmp_path / "chosen", *options, "--act", 2, 10, "kill")
    assert code == -signal.SIGKILL, output
    state = backup_of(tmp_path / "chosen")
    assert (state["epoch"], state["batches"]) == (1, 8)
    assert [row["epoch"] for row in state["history"]] == [1]
    code, output = run_script(tmp_path / "chosen", *options)
    assert code == 0, output
    assert "Resuming" not in output  # verbose=0 says nothing

    # SIGKILL at a random batch of epochs 1-3.
    seed = random.randrange(10**6)
    epoch, batch = random.Random(seed).choice([(e, b) for e in (1, 2, 3) for b in range(12) if (e, b) > (1, 3)])
    why = f"(killed before batch {batch} of epoch {epoch}, seed {seed})"
    code, output = run_script(tmp_path / "random", *options, "--act", epoch, batch, "kill")
    assert code == -signal.SIGKILL, output + why
    code, output = run_script(tmp_path / "random", *options)
    assert code == 0, output + why

    code, output = finish(reference)
    assert code == 0, output
    assert_same_run(tmp_path / "chosen", tmp_path / "reference")
    assert_same_run(tmp_path / "random", tmp_path / "reference", why)


@pytest.mark.slow
def test_two_processes_killed_mid_epoch_resume_exactly_and_only_as_two(tmp_path):
    reference = start_script(tmp_path / "reference", "--devices", 2)
    code, output = run_script(tmp_path / "killed", "--devices", 2, "--act", 2, 4, "kill")
    assert code == -signal.SIGKILL, output
    state = backup_of(tmp_path / "killed")
    assert (state["epoch"], state["batches"]) == (1, 3) and len(state["processes"]) == 2  # 6 batches a process
    # Each process's own random state and partial sums: different data, different dropout.
    first, second = state["processes"]
    losses = [torch.stack([loss for loss, _ in p["meters"]["losses"]]) for p in (first, second)]
    assert not torch.equal(*losses)
    code, output = run_script(tmp_path / "killed", "--devices", 2)
    assert code == 0, output
    code, output = finish(reference)
    assert code == 0, output
    assert_same_run(tmp_path / "killed", tmp_path / "reference")

    # A state of two processes does not resume in one: each process's place in the data is in it.
    code, output = run_script(tmp_path / "reference", "--devices", 1)
    assert code != 0
    assert "saved by 2 process(es), and this run has 1" in output and "devices=2" in output


# -- in one process: small runs, stopped by an error and run again as a new process would --------------


class Noisy(Dataset):
    """Draws from numpy, python and its own Generator at each read (all restored on resume)."""

    def __init__(self, n=96, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 6, generator=g)
        self.y = (self.x[:, 0] - self.x[:, 1] > 0).long()
        self.own = np.random.default_rng(seed)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        noise = np.random.normal(0, 0.05, 6) + self.own.normal(0, 0.05, 6) + random.gauss(0, 0.01)
        return self.x[i] + torch.from_numpy(noise.astype(np.float32)), self.y[i]


class FailAt(kt.Callback):
    """Raises before a batch, as a crash would end the run there."""

    def __init__(self, epoch, batch):
        self.at, self.epoch = (epoch, batch), None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if (self.epoch, batch) == self.at:
            raise RuntimeError("crash")


def tiny_run(callbacks, epochs=3, workers=0, persistent=False, batch_size=8, rows=96, **fit_options):
    """A fresh run, as a new process would build it (the seed first)."""
    kt.seed_everything(0)
    dl_train = DataLoader(
        Noisy(rows), batch_size=batch_size, shuffle=True, num_workers=workers, persistent_workers=persistent
    )
    dl_val = DataLoader(Noisy(32, seed=1), batch_size=16)
    net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 2))
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=4, gamma=0.7)
    metrics = {"acc": torchmetrics.Accuracy(task="multiclass", num_classes=2)}
    model = kt.KerasModel(net, nn.CrossEntropyLoss(), metrics, optimizer, lr_scheduler=scheduler)
    model.lr_scheduler_interval = "step"
    options = {"epochs": epochs, "patience": None, "verbose": 0, **fit_options}
    history = model.fit(dl_train, dl_val, callbacks=callbacks, **options)
    return history, {k: v.clone() for k, v in net.state_dict().items()}


def crashed_and_rerun(make_backup, at, **options):
    with pytest.raises(RuntimeError, match="crash"):
        tiny_run([make_backup(), FailAt(*at)], **options)
    return tiny_run([make_backup()], **options)


def assert_same(run, other):
    pd.testing.assert_frame_equal(run[0], other[0], check_exact=True)
    assert all(torch.equal(run[1][k], other[1][k]) for k in run[1])


def test_keras_signature_defaults_and_refusals(tmp_path):
    parameters = inspect.signature(kt.callbacks.BackupAndRestore).parameters
    assert [(p.name, p.default) for p in parameters.values()] == [
        ("backup_dir", inspect.Parameter.empty),
        ("save_freq", "epoch"),
        ("delete_checkpoint", True),
    ]
    for bad in (0, -3, "batch", 2.5):
        with pytest.raises(ValueError, match=r"save_freq=.*'epoch'.*number of training batches.*False"):
            kt.callbacks.BackupAndRestore(tmp_path, save_freq=bad)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="is a file; give a folder"):
        kt.callbacks.BackupAndRestore(tmp_path / "file")
    with pytest.raises(ValueError, match="give the folder"):
        kt.callbacks.BackupAndRestore("")
    with pytest.raises(TypeError, match=r"delete_checkpoint='yes'\) must be True or False"):
        kt.callbacks.BackupAndRestore(tmp_path, delete_checkpoint="yes")


def test_a_backup_every_few_batches_changes_nothing_and_a_crash_mid_epoch_resumes_exactly(tmp_path):
    straight = tiny_run([])
    backup = lambda: kt.callbacks.BackupAndRestore(tmp_path / "b", save_freq=5, delete_checkpoint=False)
    assert_same(tiny_run([backup()]), straight)  # writing backups draws no random number
    (tmp_path / "b" / "training.state").unlink()
    resumed = crashed_and_rerun(backup, at=(2, 9))  # 12 batches an epoch: the backup is after batch 8 of epoch 2
    assert_same(resumed, straight)


@pytest.mark.parametrize(
    "options, at",
    [
        ({"gradient_accumulation_steps": 2}, (2, 6)),  # the backup waits for the end of a group: batch 6, not 5
        ({"steps_per_epoch": 5}, (3, 1)),  # epochs of 5 batches from one pass of 12 that goes on across epochs
    ],
    ids=["accumulation 2, step scheduler", "steps_per_epoch"],
)
def test_a_mid_epoch_resume_is_exact_with_accumulation_and_with_steps_per_epoch(tmp_path, options, at):
    straight = tiny_run([], **options)
    backup = lambda: kt.callbacks.BackupAndRestore(tmp_path / "b", save_freq=5, delete_checkpoint=False)
    with pytest.raises(RuntimeError, match="crash"):
        tiny_run([backup(), FailAt(*at)], **options)
    state = load_state_file(tmp_path / "b" / "training.state")
    if "gradient_accumulation_steps" in options:
        assert (state["epoch"], state["batches"]) == (1, 6)  # 12 + 6 batches: the first group end after 15
    assert_same(tiny_run([backup()], **options), straight)


def test_steps_per_epoch_resumes_exactly_after_an_epoch_too(tmp_path):
    # The pass over the loader goes on across epochs (5 of 12 batches an epoch): where it is, is saved.
    straight = tiny_run([], epochs=4, steps_per_epoch=5)
    resume = {"ckpt_path": tmp_path / "best.safetensors", "resume": True}
    with pytest.raises(RuntimeError, match="crash"):
        tiny_run([FailAt(3, 0)], epochs=4, steps_per_epoch=5, **resume)
    assert load_state_file(training_state_path(tmp_path / "best.safetensors"))["epoch"] == 2
    assert_same(tiny_run([], epochs=4, steps_per_epoch=5, **resume), straight)


def test_save_freq_epoch_is_resume_true(tmp_path):
    by_backup = tiny_run([kt.callbacks.BackupAndRestore(tmp_path / "b", delete_checkpoint=False)])
    by_resume = tiny_run([], ckpt_path=tmp_path / "best.safetensors", resume=True)
    assert_same(by_backup, by_resume)
    one = load_state_file(tmp_path / "b" / "training.state")
    other = load_state_file(training_state_path(tmp_path / "best.safetensors"))
    assert (one["epoch"], one["batches"]) == (other["epoch"], other["batches"]) == (3, 0)
    assert one["history"] == other["history"]
    assert all(torch.equal(one["net"][k], other["net"][k]) for k in one["net"])
    assert torch.equal(one["processes"][0]["rng"]["torch"], other["processes"][0]["rng"]["torch"])
    # ... and an epoch-form backup resumes after a crash like resume=True does.
    backup = lambda: kt.callbacks.BackupAndRestore(tmp_path / "c", delete_checkpoint=False)
    assert_same(crashed_and_rerun(backup, at=(3, 2)), by_resume)


def test_delete_checkpoint_removes_only_the_backup_and_only_when_fit_completes(tmp_path):
    folder = tmp_path / "kept_with_notes"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    # A crash keeps the backup, even with delete_checkpoint=True.
    with pytest.raises(RuntimeError, match="crash"):
        tiny_run([kt.callbacks.BackupAndRestore(folder, save_freq=4), FailAt(2, 5)])
    assert (folder / "training.state").is_file()
    # The run that completes removes its backup and nothing else.
    tiny_run([kt.callbacks.BackupAndRestore(folder, save_freq=4)])
    assert sorted(os.listdir(folder)) == ["notes.txt"]
    # A folder that held only the backup goes with it.
    tiny_run([kt.callbacks.BackupAndRestore(tmp_path / "only")])
    assert not (tmp_path / "only").exists()


def test_delete_checkpoint_false_keeps_a_finished_backup_that_returns_at_once(tmp_path):
    backup = lambda: kt.callbacks.BackupAndRestore(tmp_path / "b", delete_checkpoint=False)
    first = tiny_run([backup()])

    class CountEpochs(kt.Callback):
        epochs: list = []

        def on_epoch_begin(self, epoch, logs=None):
            self.epochs.append(epoch)

    counter = CountEpochs()
    again = tiny_run([backup(), counter])
    assert counter.epochs == []
    assert_same(again, first)
    assert (tmp_path / "b" / "training.state").is_file()


@pytest.mark.slow
@pytest.mark.parametrize("persistent", [False, True], ids=["workers", "persistent workers"])
def test_worker_processes_resume_exactly_mid_epoch_and_after_an_epoch(tmp_path, persistent):
    # Each worker process draws the Dataset's noise from its own random state: saved with its batches.
    straight = tiny_run([], workers=2, persistent=persistent)
    backup = lambda: kt.callbacks.BackupAndRestore(tmp_path / "mid", save_freq=5, delete_checkpoint=False)
    assert_same(crashed_and_rerun(backup, at=(2, 8), workers=2, persistent=persistent), straight)
    # resume=True, after an epoch: persistent workers kept their random state across epochs in the saved run.
    resume = {"ckpt_path": tmp_path / "best.safetensors", "resume": True}
    with pytest.raises(RuntimeError, match="crash"):
        tiny_run([FailAt(3, 0)], workers=2, persistent=persistent, **resume)
    assert_same(tiny_run([], workers=2, persistent=persistent, **resume), straight)


def test_a_datasets_own_generator_is_part_of_the_state(tmp_path):
    ckpt = tmp_path / "best.safetensors"
    straight = tiny_run([])
    with pytest.raises(RuntimeError, match="crash"):
        tiny_run([FailAt(2, 0)], ckpt_path=ckpt, resume=True)
    saved = load_state_file(training_state_path(ckpt))["processes"][0]["rng"]["data_generators"]
    assert len(saved[0]) == 1 and saved[0][0]["bit_generator"] == "PCG64"  # the train Dataset's `own`
    assert_same(tiny_run([], ckpt_path=ckpt, resume=True), straight)


def test_a_mid_epoch_state_keeps_the_epochs_partial_sums_and_its_lr(tmp_path):
    backup = lambda: kt.callbacks.BackupAndRestore(tmp_path / "b", save_freq=6, delete_checkpoint=False)
    with pytest.raises(RuntimeError, match="crash"):
        tiny_run([backup(), FailAt(2, 7)])
    state = load_state_file(tmp_path / "b" / "training.state")
    assert (state["epoch"], state["batches"]) == (1, 6)
    meters = state["processes"][0]["meters"]
    # The 6 batch losses (batches of 8), waiting to be added to loss_sum at the same batch as in a run
    # never stopped.
    assert meters["count"] == 6 * 8 and [n for _, n in meters["losses"]] == [8] * 6
    assert meters["loss_sum"] + sum(loss * n for loss, n in meters["losses"]) > 0
    assert set(meters["meters"]) == {"acc"}  # the torchmetrics Accuracy's states so far
    assert state["epoch_lr"] == pytest.approx({"lr": state["history"][0]["lr"] * 0.7**3})  # 12 steps of StepLR(4, 0.7)
    assert state["processes"][0]["data"]["pass"]["trained"] == 6


class OwnShuffle(torch.utils.data.Sampler):
    """A sampler that shuffles with a numpy Generator of its own."""

    def __init__(self, n):
        self.n, self.rng = n, np.random.default_rng(5)

    def __iter__(self):
        return iter(self.rng.permutation(self.n).tolist())

    def __len__(self):
        return self.n


def test_a_custom_samplers_own_generator_resumes_mid_epoch(tmp_path):
    def run(callbacks):
        kt.seed_everything(0)
        dl = DataLoader(Noisy(), batch_size=8, sampler=OwnShuffle(96))
        net = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 2))
        model = kt.KerasModel(net, nn.CrossEntropyLoss(), optimizer=torch.optim.SGD(net.parameters(), lr=0.1))
        return model.fit(dl, epochs=3, verbose=0, callbacks=callbacks), dict(net.state_dict())

    straight = run([])
    backup = lambda: kt.callbacks.BackupAndRestore(tmp_path / "b", save_freq=5, delete_checkpoint=False)
    with pytest.raises(RuntimeError, match="crash"):
        run([backup(), FailAt(2, 8)])
    assert_same(run([backup()]), straight)


class MakesAFile:
    """Pickled, it would create a file when loaded: a training state must never run it."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.mark.parametrize("damage", ["truncated", "garbage", "code", "another net"])
def test_a_damaged_or_foreign_backup_is_refused_runs_nothing_and_deletes_nothing(tmp_path, damage):
    folder = tmp_path / "b"
    tiny_run([kt.callbacks.BackupAndRestore(folder, save_freq=5, delete_checkpoint=False)], epochs=1)
    path = folder / "training.state"
    data = path.read_bytes()
    marker = tmp_path / "ran"
    if damage == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "garbage":
        path.write_bytes(b"not a backup" * 10)
    elif damage == "code":
        torch.save({"format": "kerastorch.training_state", "payload": MakesAFile(str(marker))}, path)
    else:
        torch.save({**load_state_file(path), "net": {"weight": torch.zeros(3)}}, path)
    before = path.read_bytes()
    expected = "saved from a different net" if damage == "another net" else "could not be read as a training state"
    with pytest.raises(ValueError, match=rf"training\.state.*{expected}|{expected}.*training\.state"):
        tiny_run([kt.callbacks.BackupAndRestore(folder)])  # delete_checkpoint=True: still deletes nothing
    assert not marker.exists()
    assert path.read_bytes() == before


def test_one_training_state_per_fit(tmp_path):
    dl = DataLoader(TensorDataset(torch.randn(16, 6), torch.randint(0, 2, (16,))), batch_size=8)
    net = nn.Linear(6, 2)
    model = kt.KerasModel(net, nn.CrossEntropyLoss(), optimizer=torch.optim.SGD(net.parameters(), lr=0.1))
    with pytest.raises(ValueError, match="2 training states.*Keep one"):
        model.fit(
            dl,
            epochs=1,
            verbose=0,
            ckpt_path=tmp_path / "w.safetensors",
            resume=True,
            callbacks=[kt.callbacks.BackupAndRestore(tmp_path / "b")],
        )


class NamedStep(kt.KerasModel):
    """A train_step of the user's own that names its values: their epoch sums are part of the state too."""

    def train_step(self, batch):
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.backward(loss)
        self.optimizer_step()
        return {"loss": loss.detach(), "margin": (self.net(x).max(1).values.mean()).detach()}


def named_run(callbacks):
    kt.seed_everything(0)
    g = torch.Generator().manual_seed(2)
    data = TensorDataset(torch.randn(96, 6, generator=g), torch.randint(0, 2, (96,), generator=g))
    net = nn.Linear(6, 2)
    model = NamedStep(net, optimizer=torch.optim.SGD(net.parameters(), lr=0.1))
    history = model.fit(DataLoader(data, batch_size=8, shuffle=True), epochs=3, callbacks=callbacks, verbose=0)
    return history, {k: v.clone() for k, v in net.state_dict().items()}


def test_named_train_step_values_resume_mid_epoch_exactly(tmp_path):
    straight = named_run([])
    assert list(straight[0].columns) == ["epoch", "train_loss", "train_margin", "lr"]
    backup = lambda: kt.callbacks.BackupAndRestore(tmp_path / "b", save_freq=5, delete_checkpoint=False)
    with pytest.raises(RuntimeError, match="crash"):
        named_run([backup(), FailAt(2, 9)])
    assert (
        load_state_file(tmp_path / "b" / "training.state")["batches"] == 8
    )  # mid-epoch (every 5 batches of the run): the partial sums count
    assert_same(named_run([backup()]), straight)


# -- the model's own optimizers, schedulers and grad scalers ---------------------------------------

GAN_SCRIPT = os.path.join(REPO_ROOT, "tests", "gan_training_script.py")


def run_gan(out_dir, *args) -> tuple[int, str]:
    process = subprocess.run(
        [sys.executable, GAN_SCRIPT, str(out_dir), *map(str, args)],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return process.returncode, process.stdout + process.stderr


@pytest.mark.slow
def test_a_gans_own_optimizer_and_scheduler_resume_bit_for_bit_after_kill_9(tmp_path):
    # docs/custom-steps.md's GAN: the model's optimizer trains the generator, self.d_optimizer (with its
    # own self.d_scheduler) the discriminator. Killed before batch 5 of epoch 2 (8 batches an epoch, a
    # backup every 3 batches of the run: the last after batch 4 of epoch 2): resumed from there.
    code, output = run_gan(tmp_path / "reference")
    assert code == 0, output
    code, output = run_gan(tmp_path / "killed", "--kill-at", 2, 5)
    assert code == -signal.SIGKILL, output
    state = backup_of(tmp_path / "killed")
    assert (state["epoch"], state["batches"]) == (1, 4)
    code, output = run_gan(tmp_path / "killed")
    assert code == 0, output

    history, weights = read_run(tmp_path / "killed")
    reference_history, reference_weights = read_run(tmp_path / "reference")
    pd.testing.assert_frame_equal(history, reference_history, check_exact=True)
    assert all(torch.equal(weights[k], reference_weights[k]) for k in reference_weights)
    own, reference_own = (torch.load(os.path.join(d, "own.pt")) for d in (tmp_path / "killed", tmp_path / "reference"))
    assert own["d_scheduler"] == reference_own["d_scheduler"]
    assert own["d_optimizer"]["param_groups"] == reference_own["d_optimizer"]["param_groups"]
    for i, moments in reference_own["d_optimizer"]["state"].items():
        assert moments["step"] == 24  # 3 epochs of 8 batches
        assert all(torch.equal(own["d_optimizer"]["state"][i][k], v) for k, v in moments.items())
    kept = {name: part["type"] for name, part in state["model_attributes"].items()}
    assert kept == {"d_optimizer": "Adam", "d_scheduler": "StepLR"}


class ScaledStep(kt.KerasModel):
    """A train_step with grad scalers of its own, kept in a dict attribute: the scale doubles every step
    (from 2**100, so that some steps overflow and are skipped, as mixed precision's are)."""

    def __init__(self, net, optimizer):
        super().__init__(net, optimizer=optimizer)
        self.scalers = {"main": torch.amp.GradScaler("cpu", init_scale=2.0**100, growth_interval=1)}
        self.unused = [torch.amp.GradScaler("cpu", enabled=False)]  # saves {}: nothing to put back

    def train_step(self, batch):
        x, y = batch
        scaler = self.scalers["main"]
        loss = nn.functional.cross_entropy(self.net(x), y)
        scaler.scale(loss).backward()
        scaler.step(self.optimizer)
        scaler.update()
        self.optimizer.zero_grad()
        return {"loss": loss.detach(), "log2_scale": torch.tensor(float(np.log2(scaler.get_scale())))}


def scaled_run(callbacks):
    kt.seed_everything(0)
    g = torch.Generator().manual_seed(3)
    data = TensorDataset(torch.randn(96, 6, generator=g), torch.randint(0, 2, (96,), generator=g))
    net = nn.Linear(6, 2)
    model = ScaledStep(net, torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9))
    loader = DataLoader(data, batch_size=8, shuffle=True)  # the CPU: its grad scaler is the CPU's
    history = model.fit(loader, epochs=3, callbacks=callbacks, verbose=0, accelerator="cpu")
    return history, {k: v.clone() for k, v in net.state_dict().items()}, model.scalers["main"].state_dict()


def test_a_grad_scaler_kept_in_a_dict_attribute_resumes_mid_epoch_exactly(tmp_path):
    straight = scaled_run([])
    assert straight[0]["train_log2_scale"].nunique() == 3  # the scale moved (and overflowed: steps skipped)
    backup = lambda: kt.callbacks.BackupAndRestore(tmp_path / "b", save_freq=5, delete_checkpoint=False)
    with pytest.raises(RuntimeError, match="crash"):
        scaled_run([backup(), FailAt(2, 9)])
    saved = load_state_file(tmp_path / "b" / "training.state")
    resumed = scaled_run([backup()])
    assert_same(resumed[:2], straight[:2])
    assert resumed[2] == straight[2]
    assert set(saved["model_attributes"]) == {"scalers['main']", "unused[0]"}


class StepsAGlobalOptimizer(kt.KerasModel):
    """Updates the second layer with an optimizer the model does not hold (a notebook's variable)."""

    outside: torch.optim.Optimizer

    def train_step(self, batch):
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.backward(loss)
        self.optimizer_step()
        self.optimizer_step(StepsAGlobalOptimizer.outside)
        return loss.detach(), None, None


def test_an_optimizer_the_model_does_not_hold_is_refused_before_training(tmp_path):
    net = nn.Sequential(nn.Linear(6, 4), nn.ReLU(), nn.Linear(4, 2))
    StepsAGlobalOptimizer.outside = torch.optim.Adam(net[2].parameters(), lr=0.1)
    model = StepsAGlobalOptimizer(net, optimizer=torch.optim.SGD(net[0].parameters(), lr=0.1))
    before = {k: v.clone() for k, v in net.state_dict().items()}
    data = DataLoader(TensorDataset(torch.randn(32, 6), torch.randint(0, 2, (32,))), batch_size=8)
    with pytest.raises(ValueError) as refused:
        model.fit(data, epochs=1, verbose=0, callbacks=[kt.callbacks.BackupAndRestore(tmp_path / "b")])
    message = str(refused.value)
    assert "2.weight, 2.bias" in message and "self.d_optimizer = torch.optim.Adam" in message
    assert all(torch.equal(before[k], v.cpu()) for k, v in net.state_dict().items())
    assert not os.path.exists(tmp_path / "b" / "training.state")

    # Kept on the model, it is in the state: the same run trains.
    model.outside_optimizer = StepsAGlobalOptimizer.outside
    model.fit(
        data, epochs=1, verbose=0, callbacks=[kt.callbacks.BackupAndRestore(tmp_path / "b", delete_checkpoint=False)]
    )
    assert set(load_state_file(tmp_path / "b" / "training.state")["model_attributes"]) == {"outside_optimizer"}


def test_a_state_of_other_own_optimizers_is_refused_before_anything_is_loaded(tmp_path):
    backup = lambda: kt.callbacks.BackupAndRestore(tmp_path / "b", save_freq=5, delete_checkpoint=False)
    with pytest.raises(RuntimeError, match="crash"):
        scaled_run([backup(), FailAt(2, 3)])
    kt.seed_everything(0)
    net = nn.Linear(6, 2)
    model = ScaledStep(net, torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9))
    del model.unused
    before = {k: v.clone() for k, v in net.state_dict().items()}
    data = TensorDataset(torch.randn(96, 6), torch.randint(0, 2, (96,)))
    with pytest.raises(
        ValueError,
        match=r"keeps the model's own .*scalers\['main'\] \(GradScaler\), unused\[0\].*this model holds scalers\['main'\] \(GradScaler\), so",
    ):
        model.fit(DataLoader(data, batch_size=8), epochs=3, verbose=0, callbacks=[backup()], accelerator="cpu")
    assert all(torch.equal(before[k], v.cpu()) for k, v in net.state_dict().items())


# -- the training data's shape is part of the state ------------------------------------------------


@pytest.mark.parametrize("save_freq, changed", [(5, "batch_size"), (5, "rows"), ("epoch", "batch_size")])
def test_a_state_resumed_with_other_batches_is_refused_saying_what_differs(tmp_path, save_freq, changed):
    backup = lambda: kt.callbacks.BackupAndRestore(tmp_path / "b", save_freq=save_freq, delete_checkpoint=False)
    with pytest.raises(RuntimeError, match="crash"):
        tiny_run([backup(), FailAt(2, 9)])

    # The same run, but for its training batches: they are 16 rows, or 120 rows make 15 batches of 8.
    other = {"batch_size": 16} if changed == "batch_size" else {"rows": 120}
    with pytest.raises(ValueError) as refused:
        tiny_run([backup()], **other)
    message = str(refused.value)
    if changed == "batch_size":
        assert "batches of 8 there and of 16 here; 12 batches an epoch there and 6 here" in message
        assert "Resume with batch_size=8" in message
    else:
        assert "12 batches an epoch there and 15 here" in message and "batches of" not in message
    if save_freq == 5:
        assert "in epoch 2 after batch 8" in message and "skip rows or train some twice" in message
    else:
        assert "data order and its learning-rate schedule" in message
    assert "resume=False" in message
    saved = load_state_file(tmp_path / "b" / "training.state")
    assert (saved["batch_size"], saved["batches_per_epoch"]) == (8, 12)


class TwoOptimizers(kt.KerasModel):
    """Two halves of a net, each with its optimizer: the model's, and one of its own with a scheduler."""

    def __init__(self, net):
        super().__init__(net, optimizer=torch.optim.Adam(net[0].parameters(), lr=1e-2))
        self.head_optimizer = torch.optim.Adam(net[2].parameters(), lr=1e-2)
        self.head_scheduler = torch.optim.lr_scheduler.StepLR(self.head_optimizer, step_size=3, gamma=0.5)

    def train_step(self, batch):
        x, y = batch
        with self.autocast():
            loss = nn.functional.cross_entropy(self.net(x), y)
        self.backward(loss)
        self.optimizer_step(self.head_optimizer)
        self.optimizer_step(self.optimizer)
        self.head_scheduler.step()
        return {"loss": loss.detach()}


def two_optimizer_run(callbacks, **fit_options):
    kt.seed_everything(0)
    g = torch.Generator().manual_seed(4)
    data = TensorDataset(torch.randn(96, 6, generator=g), torch.randint(0, 2, (96,), generator=g))
    net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 2))
    model = TwoOptimizers(net)
    loader = DataLoader(data, batch_size=8, shuffle=True)
    history = model.fit(loader, epochs=3, callbacks=callbacks, verbose=0, **fit_options)
    own = {k: v.detach().cpu().clone() for k, v in model.head_optimizer.state_dict()["state"][0].items()}
    return history, {k: v.cpu().clone() for k, v in net.state_dict().items()}, own, model.head_scheduler.last_epoch


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.gpu
def test_on_a_gpu_the_models_own_optimizer_and_the_16_mixed_grad_scaler_resume_exactly(tmp_path):
    options = {"accelerator": "cuda", "precision": "16-mixed"}
    straight = two_optimizer_run([], **options)
    backup = lambda: kt.callbacks.BackupAndRestore(tmp_path / "b", save_freq=5, delete_checkpoint=False)
    with pytest.raises(RuntimeError, match="crash"):
        two_optimizer_run([backup(), FailAt(2, 9)], **options)
    saved = load_state_file(tmp_path / "b" / "training.state")
    assert saved["grad_scaler"] and set(saved["model_attributes"]) == {"head_optimizer", "head_scheduler"}
    resumed = two_optimizer_run([backup()], **options)
    assert_same(resumed[:2], straight[:2])
    assert all(torch.equal(resumed[2][k], v) for k, v in straight[2].items()) and resumed[3] == straight[3]
