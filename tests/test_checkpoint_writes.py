"""fit's best-weights file is written on a thread of its own while training goes on, and is whole
whenever something relies on it: the next better epoch, a training state, the end of fit."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import torch
from safetensors.torch import load_file
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import kerastorch as kt
from kerastorch.callbacks import kept_weights
from kerastorch.callbacks.training_state import training_state_path
from kerastorch.files.state import load_state_file

WRITE_SECONDS = 0.3  # far longer than from one epoch's end to the next one's start: the write overlaps it


@pytest.fixture
def slow_writes(monkeypatch):
    """The real ``save_weights``, started late by ``WRITE_SECONDS``, as a slow disk would finish it
    late: which thread wrote each file, and when each write ended."""
    real_save, writes = kept_weights.save_weights, []

    def slow_save(weights, path):
        time.sleep(WRITE_SECONDS)
        real_save(weights, path)
        writes.append((threading.current_thread().name, time.perf_counter()))

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


class EpochStarts(kt.Callback):
    def __init__(self):
        self.starts = []

    def on_epoch_begin(self, epoch, logs=None):
        self.starts.append(time.perf_counter())


def test_the_best_weights_file_is_written_while_the_next_epoch_trains_and_is_whole_when_fit_returns(
    loaders, mlp, tmp_path, slow_writes
):
    ckpt = tmp_path / "best.safetensors"
    starts = EpochStarts()
    history = fit_each_epoch_best(adam_model(mlp), loaders, ckpt, callbacks=[starts])

    assert history["train_loss"].is_monotonic_decreasing
    assert len(slow_writes) == 3
    assert all(thread != threading.main_thread().name for thread, _ in slow_writes)
    # Epoch 2 began before epoch 1's file was written: the write did not hold training up.
    assert starts.starts[1] < slow_writes[0][1]
    # When fit returned, the file held the last (best) epoch's weights, whole, and nothing beside it.
    written = load_file(ckpt)
    assert all(torch.equal(written[k], v) for k, v in mlp.state_dict().items())
    assert os.listdir(tmp_path) == ["best.safetensors"]


class CompareStateWithFile(kt.Callback):
    """After the training state is written (order 90): the best weights it holds against ckpt_path's."""

    order = 91

    def __init__(self, ckpt):
        self.ckpt = ckpt
        self.same = []

    def on_epoch_end(self, epoch, logs=None):
        state = load_state_file(training_state_path(self.ckpt))
        kept = next(s["best_weights"] for s in state["callbacks"].values() if "best_weights" in s)
        written = load_file(self.ckpt)
        self.same.append(all(torch.equal(written[k], v) for k, v in kept.items()))


def test_a_training_state_is_written_only_once_ckpt_path_holds_the_best_weights_it_names(
    loaders, mlp, tmp_path, slow_writes
):
    ckpt = tmp_path / "best.safetensors"
    compare = CompareStateWithFile(ckpt)
    fit_each_epoch_best(adam_model(mlp), loaders, ckpt, resume=True, callbacks=[compare])
    # A run killed right after any of these states would resume with the file its state names.
    assert compare.same == [True, True, True]


class FolderAtCkptPath(kt.Callback):
    """Puts a folder where the checkpoint goes once fit has checked the path: every write there fails."""

    def __init__(self, ckpt):
        self.ckpt = ckpt

    def on_train_begin(self, logs=None):
        os.makedirs(self.ckpt / "in-the-way")


def test_a_write_that_fails_on_its_thread_fails_fit_with_the_best_weights_in_the_net(loaders, mlp, tmp_path):
    dl_val = loaders[1]
    ckpt = tmp_path / "best.pt"
    model = adam_model(mlp)
    with pytest.raises(OSError, match="best.pt"):
        fit_each_epoch_best(model, loaders, ckpt, callbacks=[FolderAtCkptPath(ckpt)])
    # The error came at the next better epoch: epoch 1's weights, the best kept, are back in the net,
    # and no temporary file is left beside the folder.
    assert len(model.history) == 2
    assert model.evaluate(dl_val, quiet=True)["val_loss"] == pytest.approx(model.history["val_loss"].iloc[0])
    assert os.listdir(tmp_path) == ["best.pt"]


def test_a_last_write_that_fails_fails_fit_after_every_callback_has_ended(loaders, mlp, tmp_path):
    ckpt = tmp_path / "best.pt"
    handler_before = signal.getsignal(signal.SIGTERM)
    model = adam_model(mlp)
    # One epoch: its file's write fails on its thread, and fit learns of it only when it ends.
    with pytest.raises(OSError, match="best.pt"):
        fit_each_epoch_best(model, loaders, ckpt, epochs=1, callbacks=[FolderAtCkptPath(ckpt)])
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
    beside one (``benchmarks/thread_beside.py``). So
    the copy of the weights is made on the training thread (``KeptWeights.keep``), and the write's thread
    only hands tensors to the file: no op but views. The net shares a layer, whose weights would be
    copied apart for the file (``standalone_tensors``) were the kept copy still shared."""
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
