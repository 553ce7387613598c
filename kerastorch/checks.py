"""Everything ``fit`` checks before the first weight changes, with messages for beginners.

Each message says what was wrong, what was expected and what to try.
"""

from __future__ import annotations

import collections.abc
import contextlib
import copy
import difflib
import os
from typing import Any, Optional

import torch

from .batches import BatchError
from .callbacks.base import Callback
from .callbacks.monitor import check_mode
from .callbacks.training_state import training_state_path
from .data import NoBatchesError, dry_run_first_batch, num_batches
from .history import history_columns
from .meters import is_stateful_metric, metric_friendly, metric_update_fn, scalar_metric_value
from .parts import check_loss_fn
from .settings import FitSettings


def check_fit(model: Any, train_data: Any, val_data: Any, settings: FitSettings) -> None:
    """Everything about ``fit``'s arguments that can be checked without running the net."""
    check_loss_fn(model)
    check_optimizer(model)
    check_lr_scheduler(model)
    check_callbacks(settings.callbacks)
    watch, step, output = settings.monitoring, settings.step, settings.output
    _check_whole_number("epochs", settings.epochs, minimum=0)
    if watch.patience is not None:
        _check_whole_number("patience", watch.patience, minimum=0, hint="or patience=None to never stop early")
    _check_whole_number("gradient_accumulation_steps", step.accumulation_steps, minimum=1)
    if output.verbose not in (0, 1, 2, False, True):
        raise ValueError(f"verbose={output.verbose!r}; use 0 (silent), 1 (progress bars) or 2 (one line per epoch).")
    clip_val = step.clip_val
    if clip_val is not None and (not isinstance(clip_val, (int, float)) or isinstance(clip_val, bool) or clip_val <= 0):
        raise ValueError(f"gradient_clip_val={clip_val!r} must be a positive number (or None for no clipping).")
    if step.clip_algorithm not in ("norm", "value"):
        raise ValueError(f"gradient_clip_algorithm={step.clip_algorithm!r}; use 'norm' or 'value'.")
    check_mode(watch.mode)
    data = settings.data
    if data.steps_per_epoch is not None:
        _check_whole_number("steps_per_epoch", data.steps_per_epoch, minimum=1, hint="or None for whole passes")
    _check_whole_number("validation_freq", data.validation_freq, minimum=1)
    if not isinstance(data.shuffle, bool):
        raise TypeError(f"shuffle={data.shuffle!r} must be True or False.")
    check_loader(train_data, "train_data")
    if val_data is not None:
        check_loader(val_data, "val_data")
    check_weighted_metrics(settings.weighted_metrics, model.metrics_dict)
    check_monitor(watch.monitor, settings.metric_names(model.metrics_dict), has_val=val_data is not None)
    if watch.ckpt_path is not None:
        check_writable(watch.ckpt_path)
    check_resume(watch.resume, watch.ckpt_path)


def check_optimizer(model) -> None:
    """An optimizer object (not its class) that updates at least one of the net's parameters."""
    optimizer = model.optimizer
    example = "torch.optim.Adam(net.parameters(), lr=1e-3)"
    if isinstance(optimizer, type):
        raise TypeError(
            f"optimizer is the class {optimizer.__name__}, not an optimizer. Build one over the net's "
            f"parameters: optimizer=torch.optim.{optimizer.__name__}(net.parameters(), lr=1e-3)."
        )
    if not (
        callable(getattr(optimizer, "step", None))
        and callable(getattr(optimizer, "zero_grad", None))
        and isinstance(getattr(optimizer, "param_groups", None), list)
    ):
        raise TypeError(
            f"optimizer is a {type(optimizer).__name__}, but it must be a torch.optim.Optimizer such as {example}."
        )
    trainable = {id(p) for p in model.net.parameters() if p.requires_grad}
    updated = {id(p) for group in optimizer.param_groups for p in group["params"]}
    if trainable and not trainable & updated:
        raise ValueError(
            "The optimizer updates none of the net's parameters, so training would change nothing. It "
            "was probably built for another net (in a notebook: the net's cell was run again after the "
            f"optimizer's). Build it over this net: optimizer={example}."
        )


def check_lr_scheduler(model) -> None:
    """A scheduler object (not its class) that drives this model's optimizer."""
    scheduler = model.lr_scheduler
    if scheduler is None:
        return
    example = "torch.optim.lr_scheduler.StepLR(optimizer, step_size=10)"
    if isinstance(scheduler, type):
        raise TypeError(
            f"lr_scheduler is the class {scheduler.__name__}, not a scheduler. Build one over the "
            f"optimizer, e.g. lr_scheduler={example}."
        )
    if not callable(getattr(scheduler, "step", None)):
        raise TypeError(
            f"lr_scheduler is a {type(scheduler).__name__}, but it must be a torch.optim.lr_scheduler "
            f"object such as {example}."
        )
    driven = getattr(scheduler, "optimizer", None)
    if isinstance(driven, torch.optim.Optimizer) and _bare_optimizer(driven) is not _bare_optimizer(model.optimizer):
        raise ValueError(
            "The lr_scheduler drives another optimizer than the model's, so the learning rate would "
            "never change. Build it over the optimizer you pass to KerasModel: "
            f"lr_scheduler={example}."
        )


def _bare_optimizer(optimizer):
    # accelerate's AcceleratedOptimizer keeps the user's optimizer as .optimizer
    while (
        isinstance(getattr(optimizer, "optimizer", None), torch.optim.Optimizer)
        and optimizer.optimizer is not optimizer
    ):
        optimizer = optimizer.optimizer
    return optimizer


def check_callbacks(callbacks) -> None:
    if callbacks is not None and (isinstance(callbacks, Callback) or not isinstance(callbacks, (list, tuple))):
        raise TypeError(
            f"callbacks is a {type(callbacks).__name__}, but it must be a list of callbacks, e.g. "
            "callbacks=[kt.callbacks.EarlyStopping('val_loss', patience=3)]."
        )


def check_resume(resume, ckpt_path) -> None:
    if not isinstance(resume, bool):
        raise TypeError(f"resume={resume!r} must be True or False.")
    if not resume:
        return
    if ckpt_path is None:
        raise ValueError(
            "resume=True needs a ckpt_path: the best weights go to that file and the training state "
            "beside it. Try fit(..., ckpt_path='runs/best.safetensors', resume=True), which keeps the "
            "state in 'runs/best.safetensors.state'."
        )
    state_path = training_state_path(ckpt_path)
    if os.path.isdir(state_path):
        raise ValueError(
            f"The training state goes to {state_path!r}, which is a folder. Move it away, or choose another ckpt_path."
        )


def _check_whole_number(name: str, value: Any, minimum: int, hint: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        extra = f" ({hint})" if hint else ""
        raise ValueError(f"{name}={value!r} must be a whole number >= {minimum}{extra}.")


def check_weighted_metrics(weighted_metrics: Optional[dict], metrics_dict: dict) -> None:
    """Functions under names of their own, apart from the model's metrics."""
    if weighted_metrics is None:
        return
    if not isinstance(weighted_metrics, dict):
        raise TypeError(
            f"weighted_metrics is a {type(weighted_metrics).__name__}; use a dict of name -> function, e.g. "
            "{'wacc': lambda preds, y: (preds.argmax(1) == y).float()}."
        )
    for name, fn in weighted_metrics.items():
        if not isinstance(name, str) or not name or not callable(fn) or is_stateful_metric(fn):
            raise TypeError(
                f"weighted_metrics[{name!r}] must be a function f(preds, labels) returning one value per "
                "sample (or per batch); stateful metric objects cannot be weighted."
            )
        if name in metrics_dict:
            raise ValueError(
                f"weighted_metrics[{name!r}] has the name of a metric in metrics_dict; give it another, "
                f"e.g. 'weighted_{name}'."
            )


def check_monitor(monitor: str, metrics_dict: Any, has_val: bool) -> None:
    names = history_columns(metrics_dict, has_val)
    if monitor in names:
        return
    if monitor.startswith("val_") and not has_val and monitor in history_columns(metrics_dict, True):
        raise ValueError(
            f"monitor={monitor!r} needs validation data, but val_data is None. Pass val_data=..., "
            f"or monitor one of: {', '.join(names)}."
        )
    close = difflib.get_close_matches(str(monitor), names, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ValueError(f"monitor={monitor!r} is not a value this run produces; available: {', '.join(names)}.{hint}")


def check_loader(data: Any, name: str) -> None:
    if data is None or isinstance(data, (torch.Tensor, str, bytes, dict)) or not hasattr(data, "__iter__"):
        raise TypeError(
            f"{name} is a {type(data).__name__}, but it must be an iterable of batches, such as "
            "torch.utils.data.DataLoader(TensorDataset(x, y), batch_size=32)."
        )
    if isinstance(data, collections.abc.Iterator):
        raise TypeError(
            f"{name} is a {type(data).__name__}, a one-shot iterator: it would be used up by the first epoch (and by "
            "the check of its first batch), and the next epoch would find no batches. Pass something that can be "
            "iterated again: a DataLoader, a Dataset, or arrays. For an endless stream, wrap it in an "
            "IterableDataset and pass steps_per_epoch=..."
        )
    length = num_batches(data)
    if length == 0:
        raise ValueError(f"{name} is empty (0 batches). Check the dataset's size, batch_size and drop_last.")


def check_writable(ckpt_path) -> None:
    if not isinstance(ckpt_path, (str, os.PathLike)):
        raise TypeError(
            f"ckpt_path={ckpt_path!r} must be a file path (a str or pathlib.Path) like 'runs/best.safetensors'."
        )
    path = os.path.abspath(os.fspath(ckpt_path))
    if os.path.isdir(path):
        raise ValueError(
            f"ckpt_path={os.fspath(ckpt_path)!r} is a folder; give a file path like 'checkpoint.safetensors'."
        )
    folder = os.path.dirname(path)
    probe = None
    try:
        os.makedirs(folder, exist_ok=True)
        probe = os.path.join(folder, f".kerastorch-write-test-{os.getpid()}")
        with open(probe, "wb") as f:
            f.write(b"")
    except OSError as error:
        blocker = _file_in_the_way(folder)
        why = (
            f"{blocker!r} is a file, so it cannot hold a folder"
            if blocker
            else f"its folder {folder!r} cannot be written ({error.strerror})"
        )
        raise ValueError(
            f"ckpt_path={os.fspath(ckpt_path)!r} cannot be written: {why}. Choose a path in a folder you "
            "can write to, e.g. ckpt_path='runs/best.safetensors'."
        ) from None
    finally:
        if probe is not None:
            with contextlib.suppress(OSError):
                os.remove(probe)


def _file_in_the_way(folder: str) -> Optional[str]:
    """The nearest existing ancestor of ``folder``, if it is a file rather than a folder."""
    while folder and not os.path.exists(folder):
        parent = os.path.dirname(folder)
        if parent == folder:
            return None
        folder = parent
    return folder if os.path.isfile(folder) else None


def check_first_batch(model: Any, data: Any, runtime: Any, name: str) -> None:
    """Run the first batch through the net, the loss and copies of the metrics, in eval mode and
    without gradients, so a wrong batch layout, a net/loss mismatch or a metric that does not
    fit the outputs fails before any weight changes."""

    def forward(batch: Any) -> Any:
        with runtime.autocast():
            return model.forward_batch(runtime.to_device(batch))

    try:
        loss, preds, labels = dry_run_first_batch(model.net, data, name, forward)
    except (BatchError, NoBatchesError):
        raise
    except Exception as error:
        raise _wrapped(error, name) from error
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise ValueError(
            f"The loss must be a single number (a 0-d tensor, the mean over the batch); got {shape}. Use a loss "
            "with reduction='mean', or return loss.mean() (or loss.squeeze() for one element) from your loss or "
            "forward_batch."
        )
    check_metrics_on(model.metrics_dict, preds, labels, name, runtime.outputs_device)


def check_metrics_on(metrics_dict: dict, preds: Any, labels: Any, name: str, device: torch.device) -> None:
    """Update and compute a copy of every metric on one batch: a metric that does not fit the
    outputs (3 classes into Accuracy(num_classes=2)) fails now, not after an epoch of training."""
    preds = metric_friendly(preds)
    for key, metric in metrics_dict.items():
        try:
            with torch.no_grad():
                if is_stateful_metric(metric):
                    trial = copy.deepcopy(metric)
                    if isinstance(trial, torch.nn.Module):
                        trial.to(device)
                    metric_update_fn(trial)(preds, labels)
                    value = trial.compute()
                else:
                    value = metric(preds, labels)
                scalar_metric_value(value, key)
        except Exception as error:
            raise ValueError(
                f"Metric {key!r} failed on the first batch of {name}, before training started: "
                f"{type(error).__name__}: {error}. Check that it fits the net's outputs (number of classes, task) "
                "and the labels."
            ) from error


def _wrapped(error: Exception, name: str) -> Exception:
    message = f"The first batch of {name} failed in the net or the loss, before training started: {error}"
    try:
        return type(error)(message)
    except Exception:  # an exception type that takes other arguments
        return RuntimeError(message)
