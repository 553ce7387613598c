"""Preemption: SIGTERM (and SIGUSR1 under SLURM) during fit ends it like a checkpoint — the step
finished, the state written, the best weights back, ``kt.Preempted`` raised, the caller's handlers
restored — and running it again continues exactly."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import threading

import pandas as pd
import pytest
import torch
from script_runs import ENV, assert_same_run, backup_of, finish, run_script, start_script
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import kerastorch as kt
from kerastorch.files.state import load_state_file, training_state_path
from kerastorch.training.preemption import requeue_slurm_job


class SignalAt(kt.Callback):
    """Sends this process a signal before a training batch (or when validation begins: batch None)."""

    def __init__(self, epoch, batch, signum=signal.SIGTERM):
        self.at, self.signum, self.epoch = (epoch, batch), signum, None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if (self.epoch, batch) == self.at:
            os.kill(os.getpid(), self.signum)

    def on_test_begin(self, logs=None):
        if self.at == (self.epoch, None):
            os.kill(os.getpid(), self.signum)


def tiny_run(callbacks, epochs=3, **fit_options):
    kt.seed_everything(0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(96, 6, generator=g)
    y = (x[:, 0] - x[:, 1] > 0).long()
    dl_train = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)
    dl_val = DataLoader(TensorDataset(x[:32] + 0.1, y[:32]), batch_size=16)
    net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 2))
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=4, gamma=0.7)
    model = kt.KerasModel(net, nn.CrossEntropyLoss(), optimizer=optimizer, lr_scheduler=scheduler)
    model.lr_scheduler_interval = "step"
    options = {"epochs": epochs, "patience": None, "verbose": 0, **fit_options}
    history = model.fit(dl_train, dl_val, callbacks=callbacks, **options)
    return history, {k: v.clone() for k, v in net.state_dict().items()}, model


def assert_same(run, other):
    pd.testing.assert_frame_equal(run[0], other[0], check_exact=True)
    assert all(torch.equal(run[1][k], other[1][k]) for k in run[1])


@pytest.fixture
def own_handler():
    """A handler of the caller's own for SIGTERM, put back by fit; it must not be called."""
    calls = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: calls.append(signum))
    yield calls
    signal.signal(signal.SIGTERM, previous)


def test_sigterm_mid_epoch_finishes_the_step_writes_the_state_restores_the_best_weights_and_raises(
    tmp_path, own_handler
):
    straight = tiny_run([])
    ckpt = tmp_path / "best.safetensors"
    handler = signal.getsignal(signal.SIGTERM)
    with pytest.raises(kt.Preempted) as stopped:
        tiny_run([SignalAt(2, 4)], ckpt_path=ckpt, resume=True)
    message = str(stopped.value)
    assert "stopped by SIGTERM after batch 5 of epoch 2" in message and "best.safetensors.state" in message
    assert "Run the same command again" in message
    assert not isinstance(stopped.value, Exception)  # `except Exception` does not swallow it
    assert stopped.value._render_traceback_() == [f"Preempted: {message}"]  # a notebook shows one line
    assert signal.getsignal(signal.SIGTERM) is handler and own_handler == []
    state = load_state_file(training_state_path(ckpt))
    assert (state["epoch"], state["batches"]) == (1, 5)
    assert_same(tiny_run([], ckpt_path=ckpt, resume=True), straight)  # the same command again


@pytest.mark.skipif(sys.version_info < (3, 11), reason="before Python 3.11 the write's error is a warning")
def test_a_preempted_run_whose_checkpoint_write_failed_stays_preempted_and_a_notebook_shows_the_write(tmp_path):
    """No training state is kept, so nothing waits for epoch 1's file before the stop: its failed write
    comes out as the callbacks end. The caller still gets Preempted (what a requeue script waits for),
    and the one-line form a notebook shows tells of the write."""

    class SignalNotReading(SignalAt):
        reads_ckpt_path = False  # so the files are written on their thread while training goes on

    os.makedirs(tmp_path / "e1.pt" / "in-the-way")
    checkpoint = kt.callbacks.ModelCheckpoint(tmp_path / "e{epoch}.pt")
    with pytest.raises(kt.Preempted) as stopped:
        tiny_run([checkpoint, SignalNotReading(2, 4)])
    shown = stopped.value._render_traceback_()
    assert shown[0] == f"Preempted: {stopped.value}"
    assert any(line.startswith("ModelCheckpoint.on_train_end raised too") and "e1.pt" in line for line in shown[1:])


def test_the_preempted_net_holds_the_best_weights(tmp_path):
    ckpt = tmp_path / "best.safetensors"
    model_holder = {}

    class Keep(kt.Callback):
        def on_train_begin(self, logs=None):
            model_holder["model"] = self.model

    with pytest.raises(kt.Preempted):
        tiny_run([SignalAt(3, 2), Keep()], ckpt_path=ckpt, resume=True)
    model = model_holder["model"]
    best = load_state_file(training_state_path(ckpt))["callbacks"]["RestoreBestWeights"]["best_weights"]
    assert all(torch.equal(best[k], v) for k, v in model.net.state_dict().items())


def test_with_accumulation_the_group_is_finished_first(tmp_path):
    straight = tiny_run([], gradient_accumulation_steps=2)
    backup = tmp_path / "b"
    with pytest.raises(kt.Preempted, match="after batch 6 of epoch 2"):  # signalled before batch 5 (index 4)
        tiny_run(
            [kt.callbacks.BackupAndRestore(backup, save_freq=False), SignalAt(2, 4)], gradient_accumulation_steps=2
        )
    assert (backup / "training.state").is_file()  # save_freq=False: written only now
    resumed = tiny_run([kt.callbacks.BackupAndRestore(backup, save_freq=False)], gradient_accumulation_steps=2)
    assert_same(resumed, straight)
    assert not backup.exists()  # completed: delete_checkpoint=True removed it


def test_a_signal_during_validation_stops_at_the_end_of_that_epoch(tmp_path):
    straight = tiny_run([])
    backup = tmp_path / "b"
    with pytest.raises(kt.Preempted, match="after epoch 2"):
        tiny_run([kt.callbacks.BackupAndRestore(backup, save_freq=5), SignalAt(2, None)])
    state = load_state_file(backup / "training.state")
    assert (state["epoch"], state["batches"]) == (2, 0)
    assert_same(tiny_run([kt.callbacks.BackupAndRestore(backup, save_freq=5)]), straight)


def test_without_a_training_state_it_says_nothing_was_kept(tmp_path, own_handler):
    with pytest.raises(kt.Preempted, match=r"No training state is kept.*resume=True.*BackupAndRestore"):
        tiny_run([SignalAt(1, 3)])
    assert os.listdir(tmp_path) == [] and own_handler == []


def test_outside_the_main_thread_fit_runs_and_leaves_the_handlers_alone():
    handler = signal.getsignal(signal.SIGTERM)
    results = []
    thread = threading.Thread(target=lambda: results.append(tiny_run([], epochs=1)))
    thread.start()
    thread.join()
    assert len(results) == 1 and signal.getsignal(signal.SIGTERM) is handler


def fake_scontrol(folder) -> str:
    """A ``scontrol`` that records its arguments in ``folder/scontrol.log``; the PATH to find it first."""
    folder.mkdir(exist_ok=True)
    script = folder / "scontrol"
    script.write_text(f'#!/bin/sh\necho "$@" >> "{folder / "scontrol.log"}"\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return f"{folder}{os.pathsep}{os.environ['PATH']}"


def test_requeue_names_the_job_or_the_array_task(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", fake_scontrol(tmp_path / "bin"))
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    assert requeue_slurm_job() == " SLURM job 4242 was requeued."
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "77")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "3")
    assert requeue_slurm_job() == " SLURM job 77_3 was requeued."
    assert (tmp_path / "bin" / "scontrol.log").read_text().splitlines() == ["requeue 4242", "requeue 77_3"]


# -- real processes ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_script_sigtermed_mid_epoch_exits_preempted_and_the_same_command_continues_exactly(tmp_path):
    reference = start_script(tmp_path / "reference", "--workers", 2)
    code, output = run_script(tmp_path / "stopped", "--workers", 2, "--act", 2, 7, "term")
    assert code == 1, output
    # Signalled before the 8th batch (index 7) of epoch 2: that batch is trained, then the state written.
    assert "kerastorch.Preempted: Training stopped by SIGTERM after batch 8 of epoch 2" in output
    assert (backup_of(tmp_path / "stopped")["epoch"], backup_of(tmp_path / "stopped")["batches"]) == (1, 8)
    code, output = run_script(tmp_path / "stopped", "--workers", 2)
    assert code == 0, output
    code, output = finish(reference)
    assert code == 0, output
    assert_same_run(tmp_path / "stopped", tmp_path / "reference")


@pytest.mark.slow
def test_sigusr1_under_slurm_stops_two_processes_writes_their_state_and_requeues_the_job(tmp_path):
    reference = start_script(tmp_path / "reference", "--devices", 2)
    env = {**ENV, "PATH": fake_scontrol(tmp_path / "bin"), "SLURM_JOB_ID": "4242"}
    code, output = run_script(tmp_path / "stopped", "--devices", 2, "--act", 2, 1, "usr1-parent", env=env)
    assert code == 1, output
    assert "kerastorch.Preempted: Training stopped by SIGUSR1" in output and "SLURM job 4242 was requeued" in output
    assert "Process ForkProcess" not in output  # said once, by the caller, not in a traceback per worker
    assert (tmp_path / "bin" / "scontrol.log").read_text() == "requeue 4242\n"  # once, by the main process
    state = backup_of(tmp_path / "stopped")
    assert len(state["processes"]) == 2 and (state["epoch"], state["batches"]) >= (1, 2)
    code, output = run_script(tmp_path / "stopped", "--devices", 2)  # the requeued job runs the same command
    assert code == 0, output
    code, output = finish(reference)
    assert code == 0, output
    assert_same_run(tmp_path / "stopped", tmp_path / "reference")


class SignalTheCaller(SignalAt):
    """In the worker of rank 0, sends SIGTERM to the process that started the workers (as a cluster,
    or `docker stop`, signals the command it ran)."""

    def on_train_batch_begin(self, batch, logs=None):
        if (self.epoch, batch) == self.at and os.environ.get("RANK") == "0":
            os.kill(os.getppid(), signal.SIGTERM)


@pytest.mark.slow
def test_a_sigterm_to_the_caller_of_two_processes_leaves_it_the_best_weights_and_the_history(tmp_path):
    """The workers stop, write the state and restore the best weights; the caller's model gets those
    weights and the finished epochs' history before it raises ``Preempted``."""
    kt.seed_everything(0)
    x = torch.randn(96, 6, generator=torch.Generator().manual_seed(0))
    y = (x[:, 0] - x[:, 1] > 0).long()
    net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 2))
    before = {k: v.clone() for k, v in net.state_dict().items()}
    model = kt.KerasModel(net, nn.CrossEntropyLoss(), optimizer=torch.optim.SGD(net.parameters(), lr=0.1))
    ckpt = tmp_path / "best.safetensors"
    handler = signal.getsignal(signal.SIGTERM)
    with pytest.raises(kt.Preempted, match="SIGTERM"):
        model.fit(
            DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True),
            DataLoader(TensorDataset(x[:32], y[:32]), batch_size=16),
            epochs=4, patience=None, verbose=0, devices=2, accelerator="cpu", ckpt_path=ckpt, resume=True,
            callbacks=[SignalTheCaller(2, 1)],
        )  # fmt: skip
    assert signal.getsignal(signal.SIGTERM) is handler
    finished = model.history["epoch"].tolist()  # torch's launcher passes the signal on when it next looks
    assert finished == list(range(1, len(finished) + 1)) and 1 <= len(finished) < 4, finished
    best = load_state_file(training_state_path(ckpt))["callbacks"]["RestoreBestWeights"]["best_weights"]
    assert best.keys() == net.state_dict().keys()
    assert all(torch.equal(best[k], v) for k, v in net.state_dict().items())
    assert not all(torch.equal(before[k], v) for k, v in net.state_dict().items())


GAN_LIKE_SCRIPT = """
import os, signal, torch
from torch import nn
import kerastorch as kt

class Signalled(kt.KerasModel):
    def train_step(self, batch):  # the first call is fit's trial of this step
        os.kill(os.getpid(), signal.SIGTERM)
        return super().train_step(batch)

x, y = torch.randn(64, 4), torch.randint(0, 2, (64,))
net = nn.Linear(4, 2)
before = [p.clone() for p in net.parameters()]
model = Signalled(net, nn.CrossEntropyLoss(), optimizer=torch.optim.SGD(net.parameters(), lr=0.1))
try:
    model.fit(x, y, epochs=2, verbose=0)
except kt.Preempted as stopped:
    same = all(torch.equal(a, b) for a, b in zip(before, net.parameters()))
    print("preempted;", "weights unchanged" if same else "weights changed", ";", stopped)
"""


def test_a_sigterm_during_the_trial_of_an_own_train_step_stops_fit_cleanly(tmp_path):
    """fit's signal handlers are in place before it first runs a step of the user's own."""
    script = tmp_path / "own_step.py"
    script.write_text(GAN_LIKE_SCRIPT)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=ENV, timeout=300)
    assert done.returncode == 0, done.stderr  # not killed by the signal (-15)
    assert done.stdout.startswith("preempted; weights unchanged ;"), done.stdout + done.stderr
    assert "Training stopped by SIGTERM before training began." in done.stdout, done.stdout
