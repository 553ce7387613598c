"""fit's best-weights file is written on a thread of its own while training goes on, and is whole
whenever something relies on it: the next better epoch, a training state, a callback of the user's
(which may read it), the end of fit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch
from safetensors.torch import load_file
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import kerastorch as kt
from kerastorch.callbacks import kept_weights, training_state
from kerastorch.files.state import load_state_file

WRITE_SECONDS = 0.3  # far longer than from one epoch's end to the next one's start: the write overlaps it


@pytest.fixture
def slow_writes(monkeypatch):
    """The real ``save_weights``, started late by ``WRITE_SECONDS``, as a slow disk would finish it
    late: which thread wrote each file (the thread itself), and when each write began and ended."""
    real_save, writes = kept_weights.save_weights, []

    def slow_save(weights, path):
        began = time.perf_counter()
        time.sleep(WRITE_SECONDS)
        real_save(weights, path)
        writes.append((threading.current_thread(), began, time.perf_counter()))

    monkeypatch.setattr(kept_weights, "save_weights", slow_save)
    return writes


def adam_model(mlp):
    return kt.KerasModel(mlp, nn.CrossEntropyLoss(), optimizer=torch.optim.Adam(mlp.parameters(), lr=1e-2))


def fit_each_epoch_best(model, loaders, ckpt, epochs=3, **options):
    """On the digits the training loss falls every epoch: each epoch is the best so far, and its
    weights are written to ``ckpt``."""
    dl_train, dl_val = loaders
    return model.fit(
        dl_train, dl_val, epochs=epochs, monitor="train_loss", patience=None, ckpt_path=ckpt, verbose=0, **options
    )


def training_forwards(net):
    """When ``net`` ran a training forward pass: a hook, not a callback (a callback of the user's would
    have fit write the file before calling it)."""
    times = []
    net.register_forward_pre_hook(lambda module, args: times.append(time.perf_counter()) if module.training else None)
    return times


class EpochTimes(kt.Callback):
    """A callback of the user's that says it never reads the file."""

    reads_ckpt_path = False

    def __init__(self):
        self.ends = []

    def on_epoch_end(self, epoch, logs=None):
        self.ends.append(time.perf_counter())


def test_the_best_weights_file_is_written_while_the_next_epoch_trains_and_is_whole_when_fit_returns(
    loaders, mlp, tmp_path, slow_writes
):
    ckpt = tmp_path / "best.safetensors"
    forwards = training_forwards(mlp)
    # Neither kerastorch's own callbacks nor one of the user's that never reads the file keep it from
    # being written while training goes on.
    epoch_times = EpochTimes()
    history = fit_each_epoch_best(
        adam_model(mlp), loaders, ckpt, callbacks=[kt.callbacks.CSVLogger(tmp_path / "log.csv"), epoch_times]
    )

    assert history["train_loss"].is_monotonic_decreasing
    assert len(slow_writes) == 3
    # All on one thread, started for the run (a thread started for each write costs the loop 0.2 ms),
    # which is gone when fit returns.
    writer = slow_writes[0][0]
    assert writer is not threading.main_thread()
    assert all(thread is writer for thread, _, _ in slow_writes)
    assert not writer.is_alive()
    # Epoch 2 trained while epoch 1's file was being written: the write did not hold training up.
    _, began, ended = slow_writes[0]
    assert any(began < t < ended for t in forwards)
    assert epoch_times.ends[0] < ended
    # When fit returned, the file held the last (best) epoch's weights, whole, and nothing beside it.
    written = load_file(ckpt)
    assert all(torch.equal(written[k], v) for k, v in mlp.state_dict().items())
    assert sorted(os.listdir(tmp_path)) == ["best.safetensors", "log.csv"]


def test_a_training_state_is_written_only_once_ckpt_path_holds_the_best_weights_it_names(
    loaders, mlp, tmp_path, slow_writes, monkeypatch
):
    ckpt = tmp_path / "best.safetensors"
    real_save_state, same = training_state.save_state_file, []

    def save_then_compare(state, path):
        """Right after the state is written: the best weights it holds against ckpt_path's."""
        real_save_state(state, path)
        saved = load_state_file(path)
        kept = next(s["best_weights"] for s in saved["callbacks"].values() if "best_weights" in s)
        written = load_file(ckpt)
        same.append(all(torch.equal(written[k], v) for k, v in kept.items()))

    monkeypatch.setattr(training_state, "save_state_file", save_then_compare)
    fit_each_epoch_best(adam_model(mlp), loaders, ckpt, resume=True)
    # A run killed right after any of these states would resume with the file its state names.
    assert same == [True, True, True]


class ReadTheFile(kt.Callback):
    """A callback of the user's that reads ckpt_path at each epoch's end (to upload it, say)."""

    def __init__(self):
        self.reads = []

    def on_epoch_end(self, epoch, logs=None):
        self.reads.append(read_the_file(self.params["ckpt_path"], self.model.net))


class ReadTheFileTorchkerasStyle:
    """The same, written for torchkeras: a plain object whose hook gets the model."""

    def __init__(self):
        self.reads = []

    def on_validation_epoch_end(self, model):
        self.reads.append(read_the_file(model.ckpt_path, model.net))


def read_the_file(path, net):
    """Whether the file at ``path`` holds ``net``'s weights (a file not there yet: False)."""
    if not os.path.exists(path):
        return False
    written = load_file(path)
    return all(torch.equal(written[k], v) for k, v in net.state_dict().items())


@pytest.mark.parametrize("form", ["class", "LambdaCallback", "torchkeras"])
def test_a_callback_of_yours_finds_this_epochs_file_at_its_end(loaders, mlp, tmp_path, slow_writes, form):
    """Every epoch is the best: at its end, a callback of the user's finds that epoch's weights in the
    file (the first epoch's too), however slow the disk, as it did when each write stopped training."""
    ckpt = tmp_path / "best.safetensors"
    if form == "class":
        reader = ReadTheFile()
        callback, reads = reader, reader.reads
    elif form == "LambdaCallback":
        reads = []
        callback = kt.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: reads.append(read_the_file(ckpt, mlp)))
    else:
        plain = ReadTheFileTorchkerasStyle()
        callback, reads = plain, plain.reads
    fit_each_epoch_best(adam_model(mlp), loaders, ckpt, callbacks=[callback])

    assert reads == [True, True, True]


def put_a_folder_at(ckpt, monkeypatch):
    """A folder where the checkpoint goes, put there once fit has checked the path (as the best weights'
    keeper begins): every write there fails. Not from a callback: one of the user's would have fit
    write the file before calling it, not on its thread."""
    real_begin = kept_weights.KeptWeights.begin

    def begin_then_block(self, model):
        os.makedirs(ckpt / "in-the-way")
        real_begin(self, model)

    monkeypatch.setattr(kept_weights.KeptWeights, "begin", begin_then_block)


class EpochEnds(kt.Callback):
    """A callback of the user's, which may read the file: with one, each file is written before it is called."""

    def on_epoch_end(self, epoch, logs=None):
        pass


@pytest.mark.parametrize("yours, epochs_run", [(False, 2), (True, 1)])
def test_a_write_that_fails_fails_fit_with_the_best_weights_in_the_net(
    loaders, mlp, tmp_path, monkeypatch, yours, epochs_run
):
    dl_val = loaders[1]
    ckpt = tmp_path / "best.pt"
    put_a_folder_at(ckpt, monkeypatch)
    model = adam_model(mlp)
    with pytest.raises(OSError, match="best.pt"):
        fit_each_epoch_best(model, loaders, ckpt, callbacks=[EpochEnds()] if yours else [])
    # Written on its thread, the error came at the next better epoch; written before a callback of the
    # user's, at the epoch's own end. Either way epoch 1's weights, the best kept, are back in the net,
    # and no temporary file is left beside the folder.
    assert len(model.history) == epochs_run
    assert model.evaluate(dl_val, quiet=True)["val_loss"] == pytest.approx(model.history["val_loss"].iloc[0])
    assert os.listdir(tmp_path) == ["best.pt"]


def test_a_last_write_that_fails_fails_fit_after_every_callback_has_ended(loaders, mlp, tmp_path, monkeypatch):
    ckpt = tmp_path / "best.pt"
    put_a_folder_at(ckpt, monkeypatch)
    handler_before = signal.getsignal(signal.SIGTERM)
    model = adam_model(mlp)
    # One epoch: its file's write fails on its thread, and fit learns of it only when it ends.
    with pytest.raises(OSError, match="best.pt"):
        fit_each_epoch_best(model, loaders, ckpt, epochs=1)
    # The callbacks after the best weights' still ended: fit's SIGTERM handler is taken away again.
    assert signal.getsignal(signal.SIGTERM) is handler_before
    assert len(model.history) == 1


class OpsOnThisThread(TorchDispatchMode):
    """The torch ops called while it is entered: a dispatch mode holds for the thread that enters it."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("file_name", ["best.pt", "best.safetensors"])
def test_the_write_thread_computes_nothing_so_it_never_slows_training(loaders, tmp_path, monkeypatch, file_name):
    """A thread that has run a torch op that computes (a copy, a clone) may hold a team of OpenMP threads
    of its own as long as it lives: on a 2-core machine the training loop ran at less than half its speed
    beside one (``benchmarks/thread_beside.py``). So the copy of the weights is made on the training
    thread (``KeptWeights.keep``), and the write's thread only hands tensors to the file: no op but
    views. The net shares a layer, whose weights would be copied apart for the file
    (``standalone_tensors``) were the kept copy still shared."""
    real_write, ops = kept_weights._write, []

    def recorded_write(*args):
        with OpsOnThisThread() as recorder:
            real_write(*args)
        ops.extend(recorder.ops)

    monkeypatch.setattr(kept_weights, "_write", recorded_write)
    torch.manual_seed(0)
    shared = nn.Linear(64, 64)
    net = nn.Sequential(shared, nn.ReLU(), shared, nn.ReLU(), nn.Linear(64, 10))
    history = fit_each_epoch_best(adam_model(net), loaders, tmp_path / file_name, epochs=2)

    assert history["train_loss"].is_monotonic_decreasing  # two better epochs: two writes
    computing = sorted({str(op) for op in ops if not op.is_view})
    assert ops, "the recorder saw no op on the write's thread: it did not record the write"
    assert not computing, f"the write's thread ran {computing}: copy on the training thread instead"


def test_a_program_that_ends_while_a_file_is_being_written_lets_the_write_finish(tmp_path):
    """The write's thread is no daemon: a script that ends (or fails) while a write is under way exits
    once the file is whole, not with a temporary file or none."""
    ckpt = tmp_path / "best.pt"
    script = f"""
import time, torch
from kerastorch.files.background import BackgroundWriter
from kerastorch.files.weights import save_weights
def write():
    time.sleep(0.5)  # still writing when the script ends
    save_weights({{"w": torch.ones(3)}}, {str(ckpt)!r})
BackgroundWriter().start(write)
raise SystemExit(3)
"""
    ended = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert ended.returncode == 3, ended.stderr
    assert torch.equal(torch.load(ckpt)["w"], torch.ones(3))
    assert os.listdir(tmp_path) == ["best.pt"]
