"""Save the whole training state every epoch, and continue from it after a crash.

``fit(..., ckpt_path=PATH, resume=True)`` adds a :class:`TrainingState`. At the end of
every epoch it writes, beside the best weights at ``PATH``, the file ``PATH + ".state"``
holding everything the next epoch depends on: the net's weights, the optimizer, the lr
scheduler, the grad scaler, the history so far, the other callbacks' own state (early
stopping's best score and wait, the best weights) and every random number generator
(python, numpy, torch on the CPU and each GPU, and the DataLoader's shuffle).

When ``fit`` starts again with ``resume=True`` and that file exists, all of it is put
back and training continues with the next epoch, so a run killed at any moment ends
with the same history and the same weights as one never interrupted (exactly, on the
CPU). With no file, the run starts fresh: keep ``resume=True`` from the first run on and
simply run the same script or notebook cell again after a crash.

The file is written atomically (a kill leaves the previous epoch's file, never half a
file), only by the main process, and read without running code stored in it. An epoch
whose loss is NaN or infinite is not written, so the state stays at the last good epoch.
A finished run keeps its state: running it again returns at once with its history and
best weights, and a larger ``epochs`` trains on from where it ended.
Not covered: random generators a Dataset keeps as its own attributes, and those of
DataLoader workers kept alive across epochs (``persistent_workers=True``, warned about). Delete the file, or
pass ``resume=False``, to train from scratch.

Example::

    model.fit(dl_train, dl_val, epochs=20, ckpt_path="runs/best.safetensors", resume=True)
    # killed at epoch 7? run the same line again: it continues with epoch 7.
"""

from __future__ import annotations

import glob
import math
import os
import warnings
from typing import Any, Iterable, Optional

import torch

from ..devices.main_process import read_on_main_process
from ..files.state import load_state_file, save_state_file, to_plain
from ..strategies import strategy_of, unwrap
from ..training.rng import capture_rng_state, restore_rng_state
from .base import ORDER_TRAINING_STATE, Callback
from .monitor import MonitorCallback
from .terminate_on_nan import losses_are_finite

STATE_FORMAT = "kerastorch.training_state"
STATE_VERSION = 1


def training_state_path(ckpt_path: str | os.PathLike) -> str:
    """Where ``fit(ckpt_path=..., resume=True)`` keeps the training state: ``ckpt_path + ".state"``."""
    return os.fspath(ckpt_path) + ".state"


class TrainingState(Callback):
    """Write the full training state to ``path`` after every epoch and restore it when training begins.

    ``callbacks`` are the other callbacks whose ``state_dict()`` is kept; ``loaders`` are the
    data whose shuffle order is kept. ``fit(ckpt_path=..., resume=True)`` builds one, placed
    after every callback whose state it keeps.
    """

    order = ORDER_TRAINING_STATE

    def __init__(
        self,
        path: str | os.PathLike,
        callbacks: Iterable[Any] = (),
        loaders: Iterable[Any] = (),
        resume: bool = True,
        verbose: int = 1,
    ):
        self.path = os.fspath(path)
        self.callbacks = [cb for cb in callbacks if cb is not self]
        self.loaders = list(loaders)
        self.resume = resume
        self.verbose = verbose
        self.history: list[dict] = []  # the rows so far, restored ones first
        self.resumed_epoch: Optional[int] = None

    # -- hooks -----------------------------------------------------------------------------

    def on_train_begin(self, logs=None):
        self.history, self.resumed_epoch = [], None
        if self.model.is_main_process:
            # A run killed in the middle of a write leaves a temporary file beside the state
            # and beside the best weights (PATH for PATH.state); the real files are whole.
            remove_stale_temporary_files(self.path)
            remove_stale_temporary_files(self.path.removesuffix(".state"))
        self.check_serializable()
        if self.resume:
            warn_if_workers_keep_their_rng(self.loaders)
        state = read_on_main_process(self.path, load_state_file) if self.resume else None  # rank 0's file, for all
        if state is not None:
            check_state_fits(state, self.model, self.path)
            check_same_monitors(state, self.callbacks, self.path)
            check_same_metrics(state, self.params.get("metrics"), self.path)
            self.restore(state)
            if self.verbose:
                self.model.print(f"Resuming after epoch {state['epoch']} from the training state in {self.path!r}.")

    def on_epoch_end(self, epoch, logs=None):
        self.history.append(dict(logs))
        if not losses_are_finite(logs):
            return  # the state stays at the last good epoch
        main = self.model.is_main_process
        if main or strategy_of(self.model).gathers_together:  # gathering whole tensors may need every process
            state = self.collect(epoch)
            if main:
                save_state_file(state, self.path)

    # -- the state -------------------------------------------------------------------------

    def collect(self, epoch: int) -> dict:
        """Everything the next epoch depends on, as plain tensors and numbers."""
        model, optimizer = self.model, self.model.optimizer
        scheduler, scaler, strategy = model.lr_scheduler, _grad_scaler(model), strategy_of(model)
        return {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "epoch": epoch,
            "stopped": bool(model.stop_training),
            "history": [dict(row) for row in self.history],
            "net": strategy.whole_weights(model.net),
            "loss_fn": loss_state(model),
            "optimizer_type": type(optimizer).__name__,
            "optimizer_param_shapes": _param_shapes(optimizer),
            "optimizer": strategy.whole_optimizer_state(optimizer),
            "lr_scheduler_type": type(scheduler).__name__ if scheduler is not None else None,
            "lr_scheduler": scheduler.state_dict() if scheduler is not None else None,
            "grad_scaler": scaler.state_dict() if scaler is not None else None,
            "callbacks": {key: cb.state_dict() for key, cb in keyed_callbacks(self.callbacks).items()},
            "monitors": monitored_values(self.callbacks),
            "rng": capture_rng_state(self.loaders),
        }

    def restore(self, state: dict) -> None:
        """Put a checked state back: weights, optimizer, scheduler, scaler, callbacks, history, RNG."""
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
        # Last, so nothing above draws from the generators the next epoch starts from.
        restore_rng_state(state["rng"], self.loaders)

    def check_serializable(self) -> None:
        """Raise before training if some part of the state could not be written safely."""
        model = self.model
        to_plain(strategy_of(model).whole_optimizer_state(model.optimizer), "optimizer.state_dict()")
        to_plain(
            model.lr_scheduler.state_dict() if model.lr_scheduler is not None else None, "lr_scheduler.state_dict()"
        )
        for key, cb in keyed_callbacks(self.callbacks).items():
            to_plain(cb.state_dict(), f"the {key} callback's state_dict()")


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
    required = ("epoch", "history", "net", "optimizer_type", "optimizer_param_shapes", "optimizer", "rng")
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
    history = state.get("history")
    if not isinstance(history, list) or len(history) < 1 or history[-1].get("epoch") != state.get("epoch"):
        raise ValueError(
            f"The training state in {path!r} is inconsistent (its history does not end at its epoch). "
            "Delete it to start fresh, or pass resume=False."
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


def warn_if_workers_keep_their_rng(loaders: Iterable[Any]) -> None:
    """DataLoader workers that outlive an epoch keep random states this file does not hold."""
    for loader in loaders:
        if getattr(loader, "persistent_workers", False) and getattr(loader, "num_workers", 0) > 0:
            warnings.warn(
                "resume=True with DataLoader(persistent_workers=True): the worker processes keep their own random "
                "state across epochs, which the training state cannot save, so random augmentations in a resumed "
                "run differ from the uninterrupted one. Use persistent_workers=False for a bit-exact resume.",
                UserWarning,
                stacklevel=3,
            )
            return


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


def remove_stale_temporary_files(path: str) -> None:
    """Remove temporary files that a run killed in the middle of a write left beside ``path``."""
    folder, name = os.path.split(os.path.abspath(path))
    for stale in glob.glob(os.path.join(glob.escape(folder), "." + glob.escape(name) + ".*.tmp")):
        try:
            os.remove(stale)
        except OSError:
            pass


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


__all__ = ["TrainingState", "resumed_history", "training_state_path"]
