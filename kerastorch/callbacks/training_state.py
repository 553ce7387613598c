"""The whole training state, written while ``fit`` trains and put back when it starts again.

One machinery, two ways to ask for it:

- ``fit(..., ckpt_path=PATH, resume=True)`` adds a :class:`TrainingState` that writes
  ``PATH + ".state"`` after every epoch;
- :class:`~kerastorch.callbacks.BackupAndRestore` (Keras's callback) writes ``backup_dir`` after
  every epoch or every N training batches, and removes it when fit completes.

The state holds everything the rest of the run depends on: the net's weights, the optimizer,
the lr scheduler, the grad scaler, the history so far, the other callbacks' own state (early
stopping's best score and wait, the best weights, an EMA's average ...), and, for each process,
every random number generator (python, numpy, torch on the CPU and each GPU, the DataLoader's
shuffle, a Dataset's own generators, the worker processes') and where the training data is.
Saved in the middle of an epoch (every N batches, or when fit is preempted), it also holds the
batch reached, the epoch's lr and the partial sums of its loss and metrics. Writes happen on an
optimizer-step boundary, so an accumulation group is never cut.

When ``fit`` starts and finds a state, all of it is put back and training goes on with the next
batch, so a run killed at any moment ends with the same history and the same weights as one never
interrupted (exactly, on the CPU). With no state, the run starts fresh: keep the same arguments
from the first run on and simply run the same script or notebook cell again after a crash.

The file is written atomically (a kill leaves the previous file, never half a file), only by the
main process, and read without running code stored in it. In ``fit`` it is written on a thread of
its own while training goes on (:mod:`~kerastorch.files.background`): the state's tensors are
copied in host memory first, on the training thread, since training goes on changing the net's and
the optimizer's in place. The next state waits for it, and ``fit`` returns with it whole. It is
written before the later callbacks of its epoch instead when one may read it: a callback of yours
(:func:`~kerastorch.callbacks.base.may_read_ckpt_path`), or the report to Ray Train, which copies it;
and before training goes on when its copy would take more than half of the free host memory
(:mod:`~kerastorch.files.host_memory`).
A preempted run writes its state before it stops. A state whose loss is NaN or infinite
is not written, so the state stays at the last good point. A state from ``k`` processes resumes
under ``k`` processes. A finished run keeps its state (unless the callback removes it): running it
again returns at once with its history and best weights, and a larger ``epochs`` trains on from
where it ended. Delete the file, or pass ``resume=False``, to train from scratch.

Example::

    model.fit(dl_train, dl_val, epochs=20, ckpt_path="runs/best.safetensors", resume=True)
    # killed at epoch 7? run the same line again: it continues with epoch 7.
"""

from __future__ import annotations

import math
import os
from typing import Any, Iterable, Optional, Union

import torch

from ..data.loaders import EpochSteps
from ..data.resumable import resumable_inside
from ..devices.host_memory import copy_too_large, host_tensor_bytes
from ..devices.main_process import read_on_main_process
from ..files.atomic import remove_stale_temporary_files
from ..files.background import BackgroundWriter
from ..files.state import load_state_file, to_plain, training_state_path, write_plain_state
from ..helpers.rng import capture_rng_state, restore_rng_state
from ..strategies import strategy_of, unwrap
from ..training.callback import ORDER_TRAINING_STATE, Callback
from ..training.position import EpochResume, RunPosition
from .monitor import MonitorCallback
from .terminate_on_nan import losses_are_finite

STATE_FORMAT = "kerastorch.training_state"
STATE_VERSION = 2
SaveFreq = Union[str, int, bool]


def check_save_freq(save_freq: Any, owner: str) -> SaveFreq:
    """``"epoch"``, a number of batches, or ``False`` (only when preempted), as Keras takes it."""
    if save_freq == "epoch" or save_freq is False:
        return save_freq
    if isinstance(save_freq, bool) or not isinstance(save_freq, int) or save_freq < 1:
        raise ValueError(
            f"{owner}(save_freq={save_freq!r}): use 'epoch' (after every epoch), a number of training batches "
            "such as 500 (written on the first optimizer step after every 500 batches), or False (only when fit "
            "is preempted)."
        )
    return save_freq


class TrainingState(Callback):
    """Write the whole training state to ``path`` and restore it when training begins.

    ``save_freq``: ``"epoch"`` (after every epoch), a number of training batches, or ``False``
    (only when fit is preempted). ``resume=False`` writes without restoring. ``fit`` tells it the
    other callbacks whose state it keeps and the data whose order it keeps (:meth:`attach`):
    ``fit(ckpt_path=..., resume=True)`` builds one, placed after every callback whose state it keeps.
    """

    order = ORDER_TRAINING_STATE
    removes_when_done = False  # BackupAndRestore's delete_checkpoint

    def __init__(
        self,
        path: str | os.PathLike,
        callbacks: Iterable[Any] = (),
        loaders: Iterable[Any] = (),
        resume: bool = True,
        verbose: int = 1,
        save_freq: SaveFreq = "epoch",
    ):
        self.path = os.fspath(path)
        self.callbacks = [cb for cb in callbacks if cb is not self]
        self.loaders = list(loaders)
        self.resume = resume
        self.verbose = verbose
        self.save_freq = check_save_freq(save_freq, type(self).__name__)
        self.position = RunPosition()
        self.mid_epoch = True  # fit's own training step: states inside an epoch can be written
        self.history: list[dict] = []  # the rows so far, restored ones first
        self.resumed_epoch: Optional[int] = None
        self.finished = False  # training ran to its end (the last epoch, or stopped early)
        self._since_save = 0
        self._saved_at: Optional[tuple[int, int]] = None
        self.read_at_epoch_end = False  # a callback after it copies the file (Ray's report): written before it
        self._writer = BackgroundWriter("kerastorch-training-state")
        self._said_written_in_loop = False  # that host memory holds no copy of the state (said once a run)

    def attach(
        self,
        callbacks: Iterable[Any],
        loaders: Iterable[Any],
        position: RunPosition,
        mid_epoch: bool,
        read_at_epoch_end: bool = False,
    ) -> None:
        """What ``fit`` tells it: the callbacks whose state it keeps, the loaders whose data order it
        keeps, where the run is, whether the training step is fit's own (a torchkeras program's
        runner is not: its states are written after epochs only), and whether a callback after it
        reads the file at each epoch's end (it is then written before)."""
        self.callbacks = [cb for cb in callbacks if cb is not self]
        self.loaders = list(loaders)
        self.position = position
        self.mid_epoch = mid_epoch
        self.read_at_epoch_end = read_at_epoch_end
        if not mid_epoch and isinstance(self.save_freq, int) and self.save_freq is not False:
            raise ValueError(
                f"{type(self).__name__}(save_freq={self.save_freq}) writes the state inside epochs, which needs fit's own "
                "training step; this model trains with its own StepRunner. Use save_freq='epoch'."
            )

    # -- hooks -----------------------------------------------------------------------------

    def on_train_begin(self, logs=None):
        self.history, self.resumed_epoch, self.finished = [], None, False
        self._since_save, self._saved_at = 0, None
        self._said_written_in_loop = False
        if self.model.is_main_process:
            # A run killed in the middle of a write leaves a temporary file beside the state; the
            # real file is whole. (Those beside ckpt_path go in KeptWeights.begin, every run.)
            remove_stale_temporary_files(self.path)
        self.check_serializable()
        state = read_on_main_process(self.path, load_state_file) if self.resume else None  # rank 0's file, for all
        if state is not None:
            state = upgraded(state, self.path)
            check_state_fits(state, self.model, self.path)
            check_same_monitors(state, self.callbacks, self.path)
            check_same_metrics(state, self.params.get("metrics"), self.path)
            check_same_processes(state, self.model, self.path)
            self.restore(state)
            if self.verbose and self.params.get("verbose", 1):
                self.model.print(f"Resuming {describe_position(state)} from the training state in {self.path!r}.")

    def on_train_batch_end(self, batch, logs=None):
        if not isinstance(self.save_freq, int) or self.save_freq is False or not self.mid_epoch:
            return
        self._since_save += 1
        step = self.model.fit_step
        # On an optimizer-step boundary only (the state holds no half-accumulated gradients), and not
        # after a batch hook asked to stop (the epoch then ends early, validated, as the saved run's did).
        due = self._since_save >= self.save_freq and step.updates_now and not self.model.stop_training
        if due and self.save(self.position.epoch - 1, batch + 1) is not None:
            self._since_save = 0

    def on_epoch_end(self, epoch, logs=None):
        self.history.append(dict(logs))
        self.finished = epoch >= self.params.get("epochs", epoch) or bool(self.model.stop_training)
        if self.save_freq == "epoch":
            self.save(epoch, 0)

    def on_train_end(self, logs=None):
        for loader in self.loaders[:1]:
            follower = resumable_inside(loader)
            if follower is not None:
                follower.release()
        # fit returns with the last state whole, or raises its write's error (the state before it stays).
        self._writer.close()
        if self.removes_when_done and self.finished and self.model.is_main_process:
            remove_training_state(self.path)

    @property
    def saved_at(self) -> Optional[tuple[int, int]]:
        """Where the state on disk stands, ``(finished epochs, batches of the next)``, once this run wrote
        or resumed from one; None before."""
        return self._saved_at

    # -- writing ---------------------------------------------------------------------------

    def save(self, epoch: int, batches: int, while_training: bool = True) -> Optional[str]:
        """Write the state after ``epoch`` finished epochs and ``batches`` batches of the next one;
        every process calls it at the same point. Returns the path, or None when the state was not
        written (a NaN or infinite loss: the state stays at the last good point).

        The file is written while training goes on when ``while_training`` and the run allow it (see
        the module's note); :meth:`wait_written` returns once it is whole."""
        if self._saved_at == (epoch, batches):
            return self.path
        if not self._losses_are_finite(batches):
            return None
        # The state under way is whole first: one copy waits for the disk at a time, and a failed
        # write (a full disk) stops training here, with the state before it on disk.
        self.wait_written()
        state = self.collect(epoch, batches)
        if state is not None and while_training and self._writes_while_training() and self._copy_fits(state):
            # Copied here, on the training thread: the next batches change the live tensors in place
            # (the optimizer's, the best weights kept), and the writer's thread must compute nothing
            # (see files.background). The net's weights are a copy of their own already (whole_weights).
            weights = state.pop("net")
            plain, path = {**to_plain(state, copy=True), "net": to_plain(weights)}, self.path
            self._writer.start(lambda: write_plain_state(plain, path))
        elif state is not None:
            write_plain_state(to_plain(state), self.path)
        self._saved_at = (epoch, batches)
        return self.path

    def _writes_while_training(self) -> bool:
        # fit's decision for its run (no callback of the user's may read the files), and no report reads it.
        return bool(self.params.get("write_while_training", False)) and not self.read_at_epoch_end

    def _copy_fits(self, state: dict) -> bool:
        """Whether host memory holds the copy that a write beside training needs: the state's tensors in
        host memory, but the net's weights (a copy already). Said once a run when it does not: the
        state is then written before training goes on (see :mod:`~kerastorch.files.host_memory`)."""
        too_large = copy_too_large(host_tensor_bytes({key: value for key, value in state.items() if key != "net"}))
        if too_large is None:
            return True
        if not self._said_written_in_loop and self.verbose and self.params.get("verbose", 1):
            self.model.print(
                f"The training state is written before training goes on, not beside it: {too_large}. "
                "Training pauses while the disk takes each state."
            )
        self._said_written_in_loop = True
        return False

    def wait_written(self) -> None:
        """Return once the last state is whole on disk; raise if writing it failed."""
        self._writer.wait()

    def save_for_preemption(self, epoch: int, batches: int) -> str:
        """Write the state where a preempted run stops, ``batches`` trained of ``epoch`` (0: before it),
        and return once it is on disk (the process ends next)."""
        self.finished = False  # preempted: a backup that is removed when fit completes stays
        path = self.save(epoch - 1, batches, while_training=False) or self.path
        self.wait_written()  # the state of the epoch that just ended may still be on its way
        return path

    def _losses_are_finite(self, batches: int) -> bool:
        if self.history and not losses_are_finite(self.history[-1]):
            return False
        meters, runtime = self.position.train_meters, getattr(self.model, "runtime", None)
        if batches and meters is not None:  # the epoch's running loss (every process's): one read, at the save only
            loss_sum = runtime.reduce_sum(meters.loss_total().clone()) if runtime is not None else meters.loss_total()
            return bool(torch.isfinite(loss_sum).item())
        return True

    # -- the state -------------------------------------------------------------------------

    def collect(self, epoch: int, batches: int) -> Optional[dict]:
        """Everything the rest of the run depends on, as plain tensors and numbers: every process
        takes part (its own random state, data position and meters are gathered); the main process
        gets the state, the others None."""
        model, optimizer = self.model, self.model.optimizer
        scheduler, scaler, strategy = model.lr_scheduler, _grad_scaler(model), strategy_of(model)
        main = model.is_main_process
        own = self.own_part(batches)
        parts = gather_to_main(own, model)
        if not (main or strategy.gathers_together):
            return None
        weights = strategy.whole_weights(model.net)  # gathering whole tensors may need every process
        optimizer_state = strategy.whole_optimizer_state(optimizer)
        if not main:
            return None
        return {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "epoch": epoch,
            "batches": batches,
            "epoch_lr": self.position.lr if batches else None,
            "stopped": bool(model.stop_training) and not batches,
            "history": [dict(row) for row in self.history],
            "net": weights,
            "loss_fn": loss_state(model),
            "optimizer_type": type(optimizer).__name__,
            "optimizer_param_shapes": _param_shapes(optimizer),
            "optimizer": optimizer_state,
            "lr_scheduler_type": type(scheduler).__name__ if scheduler is not None else None,
            "lr_scheduler": scheduler.state_dict() if scheduler is not None else None,
            "grad_scaler": scaler.state_dict() if scaler is not None else None,
            "callbacks": {key: cb.state_dict() for key, cb in keyed_callbacks(self.callbacks).items()},
            "monitors": monitored_values(self.callbacks),
            "processes": parts,
        }

    def own_part(self, batches: int) -> dict:
        """This process's part: its random state, where its training data is, its epoch's partial sums."""
        meters = self.position.train_meters if batches else None
        data = self.data_position(in_epoch=batches > 0)
        part = {"rng": capture_rng_state(self.loaders), "data": data, "meters": None}
        step = getattr(self.model, "fit_step", None)
        if step is not None:  # the micro-batch sizes this process reached after running out of memory
            part["micro_batches"] = step.micro_batches()
        if meters is None:
            return to_plain(part)
        try:
            return to_plain({**part, "meters": meters.state_dict()})
        except TypeError:  # outputs waiting for the metrics that a state cannot hold: hand them over first
            meters.flush()
            return to_plain({**part, "meters": meters.state_dict()})

    def data_position(self, in_epoch: bool) -> dict:
        """Where this process's training data is (see :mod:`~kerastorch.data.resumable`)."""
        loader = self.loaders[0] if self.loaders else None
        follower = resumable_inside(loader)
        if follower is None:
            return {"pass": None, "workers": {}}
        return follower.position(in_use=in_epoch or isinstance(loader, EpochSteps))

    def restore(self, state: dict) -> None:
        """Put a checked state back: weights, optimizer, scheduler, scaler, callbacks, history, and
        this process's random state, data position and epoch in progress."""
        model, strategy = self.model, strategy_of(self.model)
        strategy.load_whole_weights(model.net, state["net"])
        load_loss_state(model, state.get("loss_fn"))
        strategy.load_whole_optimizer_state(model.optimizer, state["optimizer"])
        if model.lr_scheduler is not None:
            model.lr_scheduler.load_state_dict(state["lr_scheduler"])
        scaler = _grad_scaler(model)
        if scaler is not None and state.get("grad_scaler"):
            scaler.load_state_dict(state["grad_scaler"])
        saved_callbacks = state.get("callbacks", {})
        for key, cb in keyed_callbacks(self.callbacks).items():
            if key in saved_callbacks:
                cb.load_state_dict(saved_callbacks[key])
        self.history = [dict(row) for row in state["history"]]
        self.resumed_epoch = int(state["epoch"])
        model.stop_training = bool(state.get("stopped", False))
        epochs = self.params.get("epochs")
        self.finished = model.stop_training or (epochs is not None and self.resumed_epoch >= epochs)
        own = state["processes"][process_index(model) % len(state["processes"])]
        if getattr(model, "fit_step", None) is not None:
            model.fit_step.use_micro_batches(own.get("micro_batches"))
        batches = int(state.get("batches", 0))
        if batches:
            self.position.resume = EpochResume(self.resumed_epoch + 1, batches, state["epoch_lr"], own["meters"])
        loader = self.loaders[0] if self.loaders else None
        if batches and isinstance(loader, EpochSteps):
            loader.continue_epoch_at(batches)
        follower = resumable_inside(loader)
        if follower is not None:
            follower.continue_from(own["data"], own["rng"], self.loaders)
        self._saved_at = (self.resumed_epoch, batches)
        # Last, so nothing above draws from the generators the rest of the run starts from.
        restore_rng_state(own["rng"], self.loaders)

    def check_serializable(self) -> None:
        """Raise before training if some part of the state could not be written safely."""
        model = self.model
        to_plain(strategy_of(model).whole_optimizer_state(model.optimizer), "optimizer.state_dict()")
        to_plain(
            model.lr_scheduler.state_dict() if model.lr_scheduler is not None else None, "lr_scheduler.state_dict()"
        )
        for key, cb in keyed_callbacks(self.callbacks).items():
            to_plain(cb.state_dict(), f"the {key} callback's state_dict()")


def process_index(model: Any) -> int:
    """This process's rank among the run's processes (0 alone)."""
    runtime = getattr(model, "runtime", None)
    if runtime is None or runtime.num_processes == 1:
        return 0
    return torch.distributed.get_rank()


def gather_to_main(part: dict, model: Any) -> list[dict]:
    """Every process's ``part``, in rank order, on the main process (a collective; others get [])."""
    runtime = getattr(model, "runtime", None)
    if runtime is None or runtime.num_processes == 1:
        return [part]
    gathered: Optional[list] = [None] * runtime.num_processes if runtime.is_main_process else None
    torch.distributed.gather_object(part, gathered, dst=0)
    return gathered or []


def upgraded(state: dict, path: str) -> dict:
    """A state written by version 1 (one random state for every process, epochs only) read as version 2."""
    if state.get("format") == STATE_FORMAT and state.get("version") == 1 and "rng" in state:
        state = dict(state, version=STATE_VERSION, batches=0, epoch_lr=None)
        state["processes"] = [{"rng": state.pop("rng"), "data": {"pass": None, "workers": {}}, "meters": None}]
        state["any_processes"] = True  # version 1 restored its one random state into every process
    return state


def describe_position(state: dict) -> str:
    """``after epoch 3`` or ``in epoch 4 after batch 17``: where a saved run stopped."""
    if state.get("batches"):
        return f"in epoch {state['epoch'] + 1} after batch {state['batches']}"
    return f"after epoch {state['epoch']}"


def remove_training_state(path: str) -> None:
    """Remove a training state file and the temporary files beside it; its folder too if it is then empty."""
    remove_stale_temporary_files(path)
    if os.path.isfile(path):
        os.remove(path)


def keyed_callbacks(callbacks: Iterable[Any]) -> dict[str, Any]:
    """Callbacks by class name (``EarlyStopping``, ``EarlyStopping#2`` ...), the key their state is saved under."""
    keyed: dict[str, Any] = {}
    for cb in callbacks:
        name = type(cb).__name__
        key, n = name, 1
        while key in keyed:
            n += 1
            key = f"{name}#{n}"
        keyed[key] = cb
    return keyed


def check_state_fits(state: dict, model: Any, path: str) -> None:
    """Refuse, before anything is loaded, a state saved from another net, optimizer or scheduler."""
    fresh = f"Resume with the same net, optimizer and lr_scheduler, or delete {path!r} (or pass resume=False) to start fresh."
    required = ("epoch", "history", "net", "optimizer_type", "optimizer_param_shapes", "optimizer", "processes")
    if (
        state.get("format") != STATE_FORMAT
        or state.get("version") != STATE_VERSION
        or any(k not in state for k in required)
    ):
        raise ValueError(
            f"{path!r} is not a kerastorch training state (version {STATE_VERSION}). Delete it to start "
            "fresh, or pass resume=False."
        )
    saved, current = state["net"], unwrap(model.net).state_dict()
    problems = [f"{k} is missing from the saved state" for k in current if k not in saved]
    problems += [f"{k} is in the saved state but not in this net" for k in saved if k not in current]
    problems += [
        f"{k} has shape {tuple(saved[k].shape)} there and {tuple(current[k].shape)} here"
        for k in current
        if k in saved and tuple(saved[k].shape) != tuple(current[k].shape)
    ]
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise ValueError(
            f"The training state in {path!r} was saved from a different net: {'; '.join(problems[:3])}{more}. " + fresh
        )
    optimizer = model.optimizer
    if state["optimizer_type"] != type(optimizer).__name__:
        raise ValueError(
            f"The training state in {path!r} was saved with a {state['optimizer_type']} optimizer, but "
            f"this model has a {type(optimizer).__name__}. " + fresh
        )
    saved_shapes, current_shapes = (
        [[list(s) for s in g] for g in state["optimizer_param_shapes"]],
        _param_shapes(optimizer),
    )
    if saved_shapes != current_shapes:
        raise ValueError(
            f"The training state in {path!r} was saved with an optimizer over other parameters: "
            f"{_describe_groups(saved_shapes)} there, {_describe_groups(current_shapes)} here. " + fresh
        )
    scheduler_type = type(model.lr_scheduler).__name__ if model.lr_scheduler is not None else None
    if state.get("lr_scheduler_type") != scheduler_type:
        raise ValueError(
            f"The training state in {path!r} was saved with lr_scheduler={state.get('lr_scheduler_type')}, "
            f"but this model has lr_scheduler={scheduler_type}. " + fresh
        )
    history, epoch = state.get("history"), state.get("epoch")
    ends_at_its_epoch = isinstance(history, list) and (
        history[-1].get("epoch") == epoch if history else state.get("batches", 0) > 0  # inside the first epoch
    )
    if not ends_at_its_epoch or not isinstance(state.get("processes"), list) or not state["processes"]:
        raise ValueError(
            f"The training state in {path!r} is inconsistent (its history does not end at its epoch). "
            "Delete it to start fresh, or pass resume=False."
        )


def check_same_processes(state: dict, model: Any, path: str) -> None:
    """A state holds each process's random state and data position: it resumes under as many processes."""
    saved = len(state["processes"])
    runtime = getattr(model, "runtime", None)
    current = runtime.num_processes if runtime is not None else 1
    if saved != current and not state.get("any_processes"):
        raise ValueError(
            f"The training state in {path!r} was saved by {saved} process(es), and this run has {current}: each "
            f"process's random state and place in the data are part of it. Resume with devices={saved} (or the "
            "same launcher command), or delete it (or pass resume=False) to start fresh."
        )


def check_same_metrics(state: dict, names: Optional[list], path: str) -> None:
    """A resumed run must log the metrics the saved one logged: the history's columns would mix."""
    if names is None or not state.get("history"):
        return
    saved = {k for row in state["history"] for k in row if k.startswith("train_") and k != "train_loss"}
    current = {k for k in names if k.startswith("train_") and k != "train_loss"}
    if saved != current:
        raise ValueError(
            f"The training state in {path!r} was saved with the metrics {sorted(m[6:] for m in saved)}, but this run "
            f"has {sorted(m[6:] for m in current)}: the history would mix columns. Resume with the same metrics_dict, "
            "or delete the state file (or pass resume=False) to start fresh."
        )


def monitored_values(callbacks: Iterable[Any]) -> dict[str, list]:
    """What each monitoring callback (early stopping, best weights) watches: ``{key: [monitor, mode]}``."""
    return {
        key: [cb.monitor, cb.mode] for key, cb in keyed_callbacks(callbacks).items() if isinstance(cb, MonitorCallback)
    }


def check_same_monitors(state: dict, callbacks: Iterable[Any], path: str) -> None:
    """A best score kept for one value must not be compared with another."""
    saved = state.get("monitors", {})
    for key, (monitor, mode) in monitored_values(callbacks).items():
        if key in saved and list(saved[key]) != [monitor, mode]:
            was_monitor, was_mode = saved[key]
            raise ValueError(
                f"The training state in {path!r} was saved with {key} watching monitor={was_monitor!r}, "
                f"mode={was_mode!r}; this run asks for monitor={monitor!r}, mode={mode!r}, so its best score would "
                f"be compared with another value. Resume with monitor={was_monitor!r}, mode={was_mode!r}, or delete "
                f"{path!r} (or pass resume=False) to start fresh."
            )


def resumed_history(callbacks: Iterable[Any]) -> list[dict]:
    """The history rows a :class:`TrainingState` among ``callbacks`` restored (empty for a fresh run)."""
    for cb in callbacks:
        if isinstance(cb, TrainingState) and cb.resumed_epoch is not None:
            return [dict(row) for row in cb.history]
    return []


def training_states_in(callbacks: Iterable[Any]) -> list[TrainingState]:
    """The training states among ``callbacks`` (``fit(resume=True)``'s, a BackupAndRestore)."""
    return [cb for cb in callbacks if isinstance(cb, TrainingState)]


# -- a loss that is a module: its learned parameters and buffers ----------------------------------


def loss_state(model: Any) -> Optional[dict]:
    """The loss's parameters and buffers (a learned temperature, a running count), or None for a
    loss that keeps nothing: its optimizer moments are in the optimizer's state already."""
    loss_fn = model.loss_fn
    if not isinstance(loss_fn, torch.nn.Module):
        return None
    state = {k: v.detach().to("cpu", copy=True) for k, v in loss_fn.state_dict().items()}
    return state or None


def load_loss_state(model: Any, state: Optional[dict]) -> None:
    """Put back what :func:`loss_state` saved; a loss that keeps nothing has nothing to load."""
    if state is None:
        return
    if not isinstance(model.loss_fn, torch.nn.Module):
        raise ValueError(
            f"The training state holds the state of a loss module ({', '.join(state)}), but this model's loss_fn "
            f"is a {type(model.loss_fn).__name__}. Resume with the same loss, or pass resume=False to start fresh."
        )
    model.loss_fn.load_state_dict(state)


def _grad_scaler(model: Any) -> Any:
    runtime = getattr(model, "runtime", None)
    return getattr(runtime, "scaler", None)


def _param_shapes(optimizer: Any) -> list[list[list[int]]]:
    return [[list(p.shape) for p in group["params"]] for group in optimizer.param_groups]


def _describe_groups(groups: list) -> str:
    return " + ".join(f"{len(g)} tensors ({sum(math.prod(s) for s in g)} numbers)" for g in groups) or "no parameters"


__all__ = ["TrainingState", "check_save_freq", "resumed_history", "training_state_path", "training_states_in"]
