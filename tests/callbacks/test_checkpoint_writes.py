"""fit's best-weights file, a ModelCheckpoint's files and the training state are written on threads of
their own while training goes on, and are whole whenever something relies on them: the next file, a
training state, a callback of the user's (which may read them), the end of fit."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
import weakref

import pytest
import torch
from safetensors.torch import load_file
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import kerastorch as kt
from conftest import make_mlp
from kerastorch.callbacks import kept_weights, model_checkpoint, training_state
from kerastorch.devices import host_memory
from kerastorch.files import background
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
    real_write_state, same = training_state.write_plain_state, []

    def save_then_compare(state, path):
        """Right after the state is written: the best weights it holds against ckpt_path's."""
        real_write_state(state, path)
        saved = load_state_file(path)
        kept = next(s["best_weights"] for s in saved["callbacks"].values() if "best_weights" in s)
        written = load_file(ckpt)
        same.append(all(torch.equal(written[k], v) for k, v in kept.items()))

    monkeypatch.setattr(training_state, "write_plain_state", save_then_compare)
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


# -- a ModelCheckpoint's files --------------------------------------------------------------------


@pytest.fixture
def slow_checkpoint_writes(monkeypatch):
    """A ModelCheckpoint's ``save_weights``, started late as in :func:`slow_writes` (by half as much: still
    far longer than an epoch of the digits): which thread wrote each file, when its write began and
    ended, and the files beside it as it began."""
    real_save, writes = model_checkpoint.save_weights, []

    def slow_save(weights, path):
        began = time.perf_counter()
        beside = sorted(os.listdir(os.path.dirname(path)))
        time.sleep(WRITE_SECONDS / 2)
        real_save(weights, path)
        writes.append(
            {
                "thread": threading.current_thread(),
                "began": began,
                "ended": time.perf_counter(),
                "path": os.path.basename(path),
                "beside": beside,
            }
        )

    monkeypatch.setattr(model_checkpoint, "save_weights", slow_save)
    return writes


class EpochWeights(kt.Callback):
    """A callback of the user's that never reads the files: each epoch's weights, as they were at its end."""

    reads_ckpt_path = False

    def __init__(self):
        self.weights = {}

    def on_epoch_end(self, epoch, logs=None):
        self.weights[epoch] = {k: v.detach().clone() for k, v in self.model.net.state_dict().items()}


def holds(path, weights):
    written = load_file(path)
    return written.keys() == weights.keys() and all(torch.equal(written[k], v) for k, v in weights.items())


def test_a_model_checkpoints_files_are_written_while_training_goes_on_and_whole_when_fit_returns(
    loaders, mlp, tmp_path, slow_checkpoint_writes
):
    forwards = training_forwards(mlp)
    epoch_weights = EpochWeights()
    checkpoint = kt.callbacks.ModelCheckpoint(tmp_path / "e{epoch}.safetensors", keep_last=2)
    model = adam_model(mlp)
    model.fit(*loaders, epochs=3, patience=None, monitor="train_loss", verbose=0, callbacks=[checkpoint, epoch_weights])

    writes = slow_checkpoint_writes
    assert [w["path"] for w in writes] == ["e1.safetensors", "e2.safetensors", "e3.safetensors"]
    # All on one thread of the callback's, gone when fit returns; epoch 2 trained while epoch 1's file
    # was being written.
    writer = writes[0]["thread"]
    assert writer is not threading.main_thread() and not writer.is_alive()
    assert all(w["thread"] is writer for w in writes)
    assert any(writes[0]["began"] < t < writes[0]["ended"] for t in forwards)
    # keep_last=2 let go of epoch 1's file only once epoch 3's was whole: it was still there as that began.
    assert writes[2]["beside"] == ["e1.safetensors", "e2.safetensors"]
    # When fit returned, the two last files held their epochs' weights, whole, and nothing else was left.
    assert sorted(os.listdir(tmp_path)) == ["e2.safetensors", "e3.safetensors"]
    assert holds(tmp_path / "e2.safetensors", epoch_weights.weights[2])
    assert holds(tmp_path / "e3.safetensors", epoch_weights.weights[3])


def test_a_model_checkpoint_every_n_batches_writes_while_the_next_batches_train(
    loaders, mlp, tmp_path, slow_checkpoint_writes
):
    forwards = training_forwards(mlp)
    checkpoint = kt.callbacks.ModelCheckpoint(tmp_path / "e{epoch}-b{batch}.pt", save_freq=10)
    adam_model(mlp).fit(loaders[0], epochs=1, verbose=0, callbacks=[checkpoint])

    writes = slow_checkpoint_writes
    assert [w["path"] for w in writes] == ["e1-b10.pt", "e1-b20.pt"]  # 22 batches of 64 digits
    # The batches after the 10th trained while its file was being written (they take far less than the
    # write): the loop waited only at the 20th, for the file before it.
    began, ended = writes[0]["began"], writes[0]["ended"]
    assert sum(began < t < ended for t in forwards) >= 9
    assert sorted(os.listdir(tmp_path)) == ["e1-b10.pt", "e1-b20.pt"]


def test_a_callback_of_yours_finds_a_model_checkpoints_file_of_this_epoch_at_its_end(
    loaders, mlp, tmp_path, slow_checkpoint_writes
):
    """With a callback of the user's in the run, each file is whole before it is called (as when every
    write stopped training), however slow the disk."""
    reads = []
    reader = kt.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: reads.append(holds(tmp_path / f"e{epoch}.safetensors", mlp.state_dict()))
    )
    checkpoint = kt.callbacks.ModelCheckpoint(tmp_path / "e{epoch}.safetensors")
    adam_model(mlp).fit(*loaders, epochs=2, patience=None, verbose=0, callbacks=[checkpoint, reader])

    assert len(slow_checkpoint_writes) == 2
    assert reads == [True, True]


def test_a_training_state_is_written_only_once_the_model_checkpoint_files_it_names_are_whole(
    loaders, mlp, tmp_path, slow_checkpoint_writes, monkeypatch
):
    real_write_state, named = training_state.write_plain_state, []

    def save_then_look(state, path):
        """Right after the state is written: are the files it names there, whole?"""
        real_write_state(state, path)
        saved = load_state_file(path)
        paths = next(s["saved_paths"] for s in saved["callbacks"].values() if "saved_paths" in s)
        named.append([os.path.basename(p) for p in paths if os.path.isfile(p) and load_file(p)])

    monkeypatch.setattr(training_state, "write_plain_state", save_then_look)
    checkpoint = kt.callbacks.ModelCheckpoint(tmp_path / "e{epoch}.safetensors", keep_last=2)
    adam_model(mlp).fit(
        *loaders, epochs=3, verbose=0, ckpt_path=tmp_path / "best.safetensors", resume=True, callbacks=[checkpoint]
    )

    # A run killed right after any of these states would resume with every file it names.
    assert named == [["e1.safetensors"], ["e1.safetensors", "e2.safetensors"], ["e2.safetensors", "e3.safetensors"]]


def test_a_model_checkpoint_write_that_fails_fails_fit_and_keeps_the_older_files(loaders, mlp, tmp_path):
    # A folder where epoch 2's file goes: its write fails on the callback's thread.
    os.makedirs(tmp_path / "e2.pt" / "in-the-way")
    checkpoint = kt.callbacks.ModelCheckpoint(tmp_path / "e{epoch}.pt", keep_last=1)
    model = adam_model(mlp)
    with pytest.raises(OSError, match="e2.pt"):
        model.fit(*loaders, epochs=4, patience=None, verbose=0, callbacks=[checkpoint])
    # The error came at the next file, epoch 3's, before it was begun; keep_last=1 never removed epoch
    # 1's file, the last written whole, and no temporary file is left.
    assert len(model.history) == 3
    assert sorted(os.listdir(tmp_path)) == ["e1.pt", "e2.pt"]
    assert torch.load(tmp_path / "e1.pt", weights_only=True).keys() == mlp.state_dict().keys()


class BrokenDataAt(kt.Callback):
    """The user's code failing as epoch ``epoch`` begins (a broken batch, a bug): it never reads the files."""

    reads_ckpt_path = False

    def __init__(self, epoch):
        self.epoch = epoch

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == self.epoch:
            raise RuntimeError(f"the data of epoch {epoch} is broken")


def test_a_write_that_fails_while_training_fails_too_leaves_the_training_error_on_top(loaders, mlp, tmp_path):
    """Epoch 2's file fails on its thread, and epoch 3 fails before the next file would have told of it:
    the caller gets the training error (the one to fix, and the one an ``except`` of theirs waits for),
    and is told of the write's too, not the other way round."""
    os.makedirs(tmp_path / "e2.pt" / "in-the-way")
    checkpoint = kt.callbacks.ModelCheckpoint(tmp_path / "e{epoch}.pt")
    model = adam_model(mlp)
    with warnings.catch_warnings(record=True) as warned:  # where a Python before 3.11 tells of it
        warnings.simplefilter("always")
        with pytest.raises(RuntimeError, match="the data of epoch 3 is broken") as failed:
            model.fit(*loaders, epochs=4, patience=None, verbose=0, callbacks=[checkpoint, BrokenDataAt(3)])
    told = [*getattr(failed.value, "__notes__", []), *(str(w.message) for w in warned)]
    assert any(line.startswith("ModelCheckpoint.on_train_end raised too") and "e2.pt" in line for line in told), told
    # Every callback still ended after the training error (the writer's thread is gone) and two epochs
    # are in the history.
    assert len(model.history) == 2
    assert not [t for t in threading.enumerate() if t.name.startswith("kerastorch-model-checkpoint")]


def test_a_write_that_fails_after_training_failed_from_a_callback_keeps_its_error_class(loaders, mlp, tmp_path):
    """An error a caller catches by its class (here a ValueError of the user's, as Optuna's TrialPruned is)
    reaches them whatever a file's write did."""

    class Stop(kt.Callback):
        reads_ckpt_path = False

        def on_epoch_end(self, epoch, logs=None):
            if epoch == 2:
                raise ValueError("prune this trial")

    os.makedirs(tmp_path / "e2.pt" / "in-the-way")
    model = adam_model(mlp)
    checkpoint = kt.callbacks.ModelCheckpoint(tmp_path / "e{epoch}.pt")
    with pytest.raises(ValueError, match="prune this trial"):
        model.fit(*loaders, epochs=4, patience=None, verbose=0, callbacks=[checkpoint, Stop()])
    assert len(model.history) == 2


def test_a_pruned_trial_stays_pruned_when_a_write_failed_too(loaders, mlp, tmp_path):
    """OptunaPruning raises TrialPruned from its on_train_end, after every other callback's end, one of
    which raises the failed write's error: the study gets the pruned trial, told of the write."""
    optuna = pytest.importorskip("optuna", reason="optuna is in the test extra")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    os.makedirs(tmp_path / "e1.pt" / "in-the-way")
    study = optuna.create_study(pruner=optuna.pruners.ThresholdPruner(upper=0.0))  # any val_loss prunes
    errors = []

    def objective(trial):
        model = adam_model(mlp)
        checkpoint = kt.callbacks.ModelCheckpoint(tmp_path / "e{epoch}.pt")
        try:
            model.fit(
                *loaders, epochs=3, patience=None, verbose=0, callbacks=[checkpoint, kt.callbacks.OptunaPruning(trial)]
            )
        except BaseException as error:
            errors.append(error)
            raise
        return 0.0

    study.optimize(objective, n_trials=1)  # a trial that fails otherwise than pruned would raise here

    assert study.trials[0].state == optuna.trial.TrialState.PRUNED
    assert list(study.trials[0].intermediate_values) == [1]
    notes = getattr(errors[0], "__notes__", [])
    assert any(note.startswith("ModelCheckpoint.on_train_end raised too") and "e1.pt" in note for note in notes), notes


def test_a_failed_fit_s_error_holds_its_batch_only_as_long_as_the_caller_holds_the_error(loaders, mlp):
    """The error's traceback holds the loop's frames and their tensors (the batch, the activations): once
    the caller lets go of the error, they go at once, not at the garbage collector's next pass."""
    batches = []

    def fail_on_third(module, args):
        batches.append(weakref.ref(args[0]))
        if len(batches) == 3:
            raise RuntimeError("a bad batch")

    mlp.register_forward_pre_hook(fail_on_third)
    model = adam_model(mlp)
    gc.collect()
    gc.disable()  # only reference counts free anything from here on
    try:
        try:
            model.fit(*loaders, epochs=1, verbose=0)
        except RuntimeError as error:
            assert "a bad batch" in str(error)
            assert batches[-1]() is not None  # held by the error's frames while the error is held
        assert batches[-1]() is None
    finally:
        gc.enable()


def test_a_model_checkpoints_thread_computes_nothing(loaders, tmp_path, monkeypatch):
    """As fit's own file (above): the copy is made on the training thread, the thread only writes."""
    real_write, ops = model_checkpoint.ModelCheckpoint._write, []

    def recorded_write(self, *args):
        with OpsOnThisThread() as recorder:
            real_write(self, *args)
        ops.extend(recorder.ops)

    monkeypatch.setattr(model_checkpoint.ModelCheckpoint, "_write", recorded_write)
    torch.manual_seed(0)
    shared = nn.Linear(64, 64)
    net = nn.Sequential(shared, nn.ReLU(), shared, nn.ReLU(), nn.Linear(64, 10))
    checkpoint = kt.callbacks.ModelCheckpoint(tmp_path / "e{epoch}.safetensors")
    adam_model(net).fit(*loaders, epochs=2, verbose=0, callbacks=[checkpoint])

    assert ops, "the recorder saw no op on the write's thread: it did not record the write"
    computing = sorted({str(op) for op in ops if not op.is_view})
    assert not computing, f"the write's thread ran {computing}: copy on the training thread instead"


# -- the training state ---------------------------------------------------------------------------


@pytest.fixture
def slow_state_writes(monkeypatch):
    """The training state's real write, started late as in :func:`slow_checkpoint_writes`: which thread
    wrote each state, when its write began and ended, and the state read back from the file."""
    real_write, writes = training_state.write_plain_state, []

    def slow_write(plain, path):
        began = time.perf_counter()
        time.sleep(WRITE_SECONDS / 2)
        real_write(plain, path)
        ended = time.perf_counter()
        writes.append(
            {"thread": threading.current_thread(), "began": began, "ended": ended, "state": load_state_file(path)}
        )

    monkeypatch.setattr(training_state, "write_plain_state", slow_write)
    return writes


class EpochTensors(kt.Callback):
    """A callback of the user's that never reads the files: the net's weights and Adam's first moments
    at each epoch's end (the next epoch changes both in place)."""

    reads_ckpt_path = False

    def __init__(self):
        self.weights, self.moments = {}, {}

    def on_epoch_end(self, epoch, logs=None):
        self.weights[epoch] = {k: v.detach().to("cpu", copy=True) for k, v in self.model.net.state_dict().items()}
        self.moments[epoch] = [s["exp_avg"].to("cpu", copy=True) for s in self.model.optimizer.state.values()]


ON_A_GPU = pytest.param(
    "cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
)


@pytest.mark.parametrize("accelerator", ["cpu", ON_A_GPU])
def test_a_training_state_is_written_while_the_next_epoch_trains_and_holds_its_own_epochs_tensors(
    loaders, mlp, tmp_path, slow_state_writes, accelerator
):
    forwards = training_forwards(mlp)
    ends = EpochTensors()
    model = adam_model(mlp)
    ckpt = tmp_path / "best.safetensors"
    model.fit(*loaders, epochs=3, verbose=0, ckpt_path=ckpt, resume=True, callbacks=[ends], accelerator=accelerator)

    writes = slow_state_writes
    assert [w["state"]["epoch"] for w in writes] == [1, 2, 3]
    # On one thread of the state's, gone when fit returns; epoch 2 trained while epoch 1's state was written.
    writer = writes[0]["thread"]
    assert writer is not threading.main_thread() and not writer.is_alive()
    assert all(w["thread"] is writer for w in writes)
    assert any(writes[0]["began"] < t < writes[0]["ended"] for t in forwards)
    # Each state holds its own epoch's weights and moments, though the next epoch changed both in place
    # while it was being written: they were copied at the epoch's end.
    for write in writes:
        state, epoch = write["state"], write["state"]["epoch"]
        assert all(torch.equal(state["net"][k], v) for k, v in ends.weights[epoch].items())
        saved_moments = [s["exp_avg"] for s in state["optimizer"]["state"].values()]
        assert len(saved_moments) == len(ends.moments[epoch]) == 4
        assert all(torch.equal(saved, then) for saved, then in zip(saved_moments, ends.moments[epoch]))
    # The run that finds the last state returns its history without training.
    again = adam_model(make_mlp(seed=5)).fit(
        *loaders, epochs=3, verbose=0, ckpt_path=ckpt, resume=True, accelerator=accelerator
    )
    assert again["train_loss"].tolist() == model.history["train_loss"].tolist()


def test_a_callback_of_yours_finds_the_last_epochs_training_state_whole(loaders, mlp, tmp_path, slow_state_writes):
    """With a callback of the user's in the run, each state is whole before the next callback is called:
    at an epoch's beginning, the state of the epoch before, however slow the disk."""
    state_path = tmp_path / "best.safetensors.state"
    found = []
    reader = kt.callbacks.LambdaCallback(
        on_epoch_begin=lambda epoch, logs: found.append(load_state_file(state_path)["epoch"] if epoch > 1 else None)
    )
    adam_model(mlp).fit(
        *loaders, epochs=3, verbose=0, ckpt_path=tmp_path / "best.safetensors", resume=True, callbacks=[reader]
    )
    assert len(slow_state_writes) == 3
    assert found == [None, 1, 2]


class FolderInTheWay(kt.Callback):
    """Never reads the files; at the end of the first epoch, before its state is written, puts a folder
    where the state goes, so writing it fails."""

    reads_ckpt_path = False

    def __init__(self, path):
        self.path = path

    def on_epoch_end(self, epoch, logs=None):
        if epoch == 1:
            os.makedirs(self.path / "in-the-way")


def test_a_training_state_write_that_fails_fails_fit_at_the_next_state_and_leaves_no_half_file(loaders, mlp, tmp_path):
    state_path = tmp_path / "best.safetensors.state"
    model = adam_model(mlp)
    with pytest.raises(OSError, match="best.safetensors.state"):
        model.fit(
            *loaders, epochs=4, verbose=0, ckpt_path=tmp_path / "best.safetensors", resume=True,
            callbacks=[FolderInTheWay(state_path)],
        )  # fmt: skip
    # Epoch 1's state failed on the state's thread while epoch 2 trained; the error stopped fit at epoch
    # 2's state, before it was begun. No temporary file is left beside the folder.
    assert len(model.history) == 2
    assert sorted(os.listdir(tmp_path)) == ["best.safetensors", "best.safetensors.state"]
    assert os.listdir(state_path) == ["in-the-way"]


def test_the_training_states_thread_computes_nothing(loaders, mlp, tmp_path, monkeypatch):
    """As the weights' files (above): the state's tensors are copied on the training thread, and what runs
    on the state's thread only hands them to the file."""
    real_start, recorded = background.BackgroundWriter.start, []

    def recorded_start(self, write):
        def write_recorded():
            with OpsOnThisThread() as recorder:
                write()
            recorded.append((self.name, recorder.ops))

        real_start(self, write_recorded)

    monkeypatch.setattr(background.BackgroundWriter, "start", recorded_start)
    adam_model(mlp).fit(*loaders, epochs=2, verbose=0, ckpt_path=tmp_path / "best.safetensors", resume=True)

    states = [ops for name, ops in recorded if name == "kerastorch-training-state"]
    assert len(states) == 2, recorded
    computing = sorted({str(op) for ops in states for op in ops if not op.is_view})
    assert not computing, f"the state's thread ran {computing}: copy on the training thread instead"


class SigtermDuringValidation(kt.Callback):
    """Never reads the files; sends this process SIGTERM as epoch 2's validation begins (fit then
    stops at that epoch's end), and notes when its own on_train_end is called."""

    reads_ckpt_path = False

    def __init__(self):
        self.epoch, self.train_end = None, None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_test_begin(self, logs=None):
        if self.epoch == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    def on_train_end(self, logs=None):
        self.train_end = time.perf_counter()


def test_a_preempted_run_stops_once_the_state_of_its_last_epoch_is_on_disk(loaders, mlp, tmp_path, slow_state_writes):
    signaller = SigtermDuringValidation()
    with pytest.raises(kt.Preempted, match="after epoch 2"):
        adam_model(mlp).fit(
            *loaders, epochs=4, verbose=0, ckpt_path=tmp_path / "best.safetensors", resume=True, callbacks=[signaller]
        )
    writes = slow_state_writes
    assert [w["state"]["epoch"] for w in writes] == [1, 2]
    # Epoch 2's state went to the state's thread at the epoch's end; the stop waited for it, before the
    # callbacks' ends (where fit would wait for it anyway) and before a requeue under SLURM.
    assert writes[1]["thread"] is not threading.main_thread()
    assert writes[1]["ended"] < signaller.train_end


def test_a_training_state_too_large_to_copy_is_written_before_training_goes_on_and_says_so(
    loaders, mlp, tmp_path, slow_state_writes, monkeypatch, capsys
):
    """A state whose copy would take more than half of the free host memory is written on the training
    thread from the tensors themselves, before the next epoch trains. (The free memory reads 10 kB here:
    no state of a test comes near half of this machine's.)"""
    monkeypatch.setattr(host_memory, "available_host_memory", lambda: 10_000)
    forwards = training_forwards(mlp)
    ends = EpochTensors()
    model = adam_model(mlp)
    model.fit(*loaders, epochs=3, ckpt_path=tmp_path / "best.safetensors", resume=True, callbacks=[ends])

    writes = slow_state_writes
    assert [w["state"]["epoch"] for w in writes] == [1, 2, 3]
    assert all(w["thread"] is threading.main_thread() for w in writes)
    assert not any(w["began"] < t < w["ended"] for w in writes for t in forwards)
    for write in writes:  # written from the live tensors, which nothing changed meanwhile
        state, epoch = write["state"], write["state"]["epoch"]
        assert all(torch.equal(state["net"][k], v) for k, v in ends.weights[epoch].items())
        saved_moments = [s["exp_avg"] for s in state["optimizer"]["state"].values()]
        assert all(torch.equal(saved, then) for saved, then in zip(saved_moments, ends.moments[epoch]))
    # Said once, with the sizes: Adam's two moments and the best weights kept (float32), and the random
    # generators' states (about 5 kB for each torch generator), not the net's weights (a copy already).
    copied = sum(3 * p.numel() * 4 for p in mlp.parameters())
    said = [line for line in capsys.readouterr().out.splitlines() if "The training state is written before" in line]
    assert len(said) == 1, said
    size = float(said[0].split("a copy of it (")[1].split(" kB)")[0]) * 1e3
    assert copied < size < copied + 15_000
    assert "more than half of the free host memory (10.0 kB)" in said[0]
