"""The whole training state, written while ``fit`` trains and put back when it starts again.

One machinery, two ways to ask for it:

- ``fit(..., ckpt_path=PATH, resume=True)`` adds a :class:`TrainingState` that writes
  ``PATH + ".state"`` after every epoch;
- :class:`~kerastorch.callbacks.BackupAndRestore` (Keras's callback) writes ``backup_dir`` after
  every epoch or every N training batches, and removes it when fit completes.

The state holds everything the rest of the run depends on: the net's weights, every optimizer,
lr scheduler and grad scaler the model holds (fit's, and its own attributes such as a GAN's
``self.d_optimizer``: :mod:`~kerastorch.callbacks.state_contents`), the history so far, the other
callbacks' own state (early stopping's best score and wait, the best weights, an EMA's average ...),
the training data's batch size and batches per epoch, and, for each process,
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
(:func:`~kerastorch.training.callback.may_read_ckpt_path`), or the report to Ray Train, which copies it;
and before training goes on when its copy would take more than half of the free host memory
(:mod:`~kerastorch.devices.host_memory`).
A preempted run writes its state before it stops. A state whose loss is NaN or infinite
is not written, so the state stays at the last good point. A state resumes only where it can go on
exactly: under as many processes, with the same net, optimizers, metrics, batch size and batches per
epoch (:mod:`~kerastorch.callbacks.resume_checks` refuses the rest, saying what differs); the file's
format is :mod:`~kerastorch.files.state`'s. A finished run keeps its state (unless the callback removes it): running it
again returns at once with its history and best weights, and a larger ``epochs`` trains on from
where it ended. Delete the file, or pass ``resume=False``, to train from scratch.

Example::

    model.fit(dl_train, dl_val, epochs=20, ckpt_path="runs/best.safetensors", resume=True)
    # killed at epoch 7? run the same line again: it continues with epoch 7.
"""

from __future__ import annotations

import os
from typing import Any, Iterable, Optional, Union

import torch

from ..data.loaders import EpochSteps
from ..data.resumable import resumable_inside
from ..devices.host_memory import copy_too_large, host_tensor_bytes
from ..devices.main_process import read_on_main_process
from ..files.atomic import remove_stale_temporary_files
from ..files.background import BackgroundWriter
from ..files.state import (
    STATE_FORMAT,
    STATE_VERSION,
    describe_position,
    read_training_state,
    to_plain,
    write_plain_state,
)
from ..helpers.rng import capture_rng_state, restore_rng_state
from ..strategies import strategy_of
from ..training.callback import ORDER_TRAINING_STATE, Callback
from ..training.position import EpochResume, RunPosition
from ..training.snapshot import grad_scaler
from .resume_checks import (
    check_same_attributes,
    check_same_batches,
    check_same_metrics,
    check_same_monitors,
    check_same_processes,
    check_state_fits,
    monitored_values,
)
from .state_contents import (
    attributes_state,
    check_optimizers_found,
    check_serializable,
    data_shape,
    keyed_callbacks,
    load_attributes_state,
    load_loss_state,
    loss_state,
    param_shapes,
)
from .terminate_on_nan import losses_are_finite

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
        self.batch_size: Optional[int] = None  # of the training data, read when training begins
        self.batches_per_epoch: Optional[int] = None

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
        check_serializable(self.model, self.callbacks)
        check_optimizers_found(self.model)
        self.batch_size, self.batches_per_epoch = data_shape(self.loaders[0] if self.loaders else None)
        state = read_on_main_process(self.path, read_training_state) if self.resume else None  # rank 0's, for all
        if state is not None:
            check_state_fits(state, self.model, self.path)
            check_same_attributes(state, self.model, self.path)
            check_same_monitors(state, self.callbacks, self.path)
            check_same_metrics(state, self.params.get("metrics"), self.path)
            check_same_processes(state, self.model, self.path)
            check_same_batches(state, self.batch_size, self.batches_per_epoch, self.path)
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
        state is then written before training goes on (see :mod:`~kerastorch.devices.host_memory`)."""
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
        scheduler, scaler, strategy = model.lr_scheduler, grad_scaler(model), strategy_of(model)
        main = model.is_main_process
        own = self.own_part(batches)
        parts = gather_to_main(own, model)
        if not (main or strategy.gathers_together):
            return None
        weights = strategy.whole_weights(model.net)  # gathering whole tensors may need every process
        optimizer_state = strategy.whole_optimizer_state(optimizer)
        own_attributes = attributes_state(model)
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
            "optimizer_param_shapes": param_shapes(optimizer),
            "optimizer": optimizer_state,
            "lr_scheduler_type": type(scheduler).__name__ if scheduler is not None else None,
            "lr_scheduler": scheduler.state_dict() if scheduler is not None else None,
            "grad_scaler": scaler.state_dict() if scaler is not None else None,
            "model_attributes": own_attributes,
            "batch_size": self.batch_size,
            "batches_per_epoch": self.batches_per_epoch,
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
        scaler = grad_scaler(model)
        if scaler is not None and state.get("grad_scaler"):
            scaler.load_state_dict(state["grad_scaler"])
        load_attributes_state(model, state.get("model_attributes"))
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


def remove_training_state(path: str) -> None:
    """Remove a training state file and the temporary files beside it; its folder too if it is then empty."""
    remove_stale_temporary_files(path)
    if os.path.isfile(path):
        os.remove(path)


def resumed_history(callbacks: Iterable[Any]) -> list[dict]:
    """The history rows a :class:`TrainingState` among ``callbacks`` restored (empty for a fresh run)."""
    for cb in callbacks:
        if isinstance(cb, TrainingState) and cb.resumed_epoch is not None:
            return [dict(row) for row in cb.history]
    return []


def training_states_in(callbacks: Iterable[Any]) -> list[TrainingState]:
    """The training states among ``callbacks`` (``fit(resume=True)``'s, a BackupAndRestore)."""
    return [cb for cb in callbacks if isinstance(cb, TrainingState)]


__all__ = ["TrainingState", "check_save_freq", "resumed_history", "training_states_in"]
