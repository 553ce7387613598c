"""Everything ``fit`` checks before the first weight changes, with messages for beginners.

Each message says what was wrong, what was expected and what to try.
"""

from __future__ import annotations

import collections.abc
import copy
import difflib
import numbers
import os
import warnings
from typing import Any, Optional

import torch

from .batches import BatchError, split_batch, split_sample_weight
from .callbacks.base import Callback
from .callbacks.monitor import check_mode
from .callbacks.training_state import training_state_path
from .checkpoint import check_writable
from .data import NoBatchesError, dry_run_first_batch, num_batches
from .fsdp import blocks_to_shard
from .history import history_columns
from .meters import is_stateful_metric, metric_friendly, metric_update_fn, scalar_metric_value
from .metric_sync import is_torchmetrics
from .parts import check_loss_fn
from .settings import FitSettings
from .torchkeras_runners import check_runner_fit, program_runners


def check_fit(model: Any, train_data: Any, val_data: Any, settings: FitSettings, sample_weight: Any = None) -> None:
    """Everything about ``fit``'s arguments that can be checked without running the net.

    With a torchkeras program's own ``StepRunner``, the loss and the step are the runner's: what
    fit's step would add is refused instead, and the monitored value is checked on the runner's
    first batch (:mod:`kerastorch.torchkeras_runners`)."""
    if not torch.is_grad_enabled():
        raise RuntimeError(
            "Gradients are switched off here (torch.set_grad_enabled(False), or fit called inside a "
            "torch.no_grad() block), so fit cannot train. Call torch.set_grad_enabled(True) first, or move the "
            "fit call out of the no_grad block."
        )
    runners = program_runners(model)
    if runners is None:
        check_loss_fn(model)
    else:
        check_runner_fit(model, settings, sample_weight)
    check_optimizer(model)
    check_lr_scheduler(model)
    if runners is None:  # a program's runner steps the scheduler itself, after every batch as in torchkeras
        warn_if_scheduler_looks_per_batch(model, settings)
    check_callbacks(settings.callbacks)
    watch, step, output = settings.monitoring, settings.step, settings.output
    _check_whole_number("epochs", settings.epochs, minimum=0)
    if isinstance(watch.patience, (str, os.PathLike)):
        raise TypeError(
            f"patience={watch.patience!r} looks like a file path. fit's fourth argument is patience (Keras's "
            "order); torchkeras has ckpt_path there. Pass it by name: fit(train_data, val_data, epochs, "
            f"ckpt_path={os.fspath(watch.patience)!r})."
        )
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
    if settings.devices.fsdp_wrap:
        blocks_to_shard(model.net, settings.devices.fsdp_wrap)
    data = settings.data
    if data.steps_per_epoch is not None:
        _check_whole_number("steps_per_epoch", data.steps_per_epoch, minimum=1, hint="or None for whole passes")
    _check_whole_number("validation_freq", data.validation_freq, minimum=1)
    if not isinstance(data.shuffle, bool):
        raise TypeError(f"shuffle={data.shuffle!r} must be True or False.")
    check_loader(train_data, "train_data")
    check_no_single_sample_batch(model.net, train_data)
    if val_data is not None:
        check_loader(val_data, "val_data")
    check_weighted_metrics(settings.weighted_metrics, model.metrics_dict)
    if runners is None:
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
    left_out = [name for name, p in model.net.named_parameters() if p.requires_grad and id(p) not in updated]
    # An overridden train_step may update the rest with optimizers of its own.
    own_step = getattr(type(model), "train_step", None)
    if left_out and getattr(own_step, "__qualname__", "") in ("KerasModel.train_step", ""):
        warnings.warn(
            f"The optimizer does not update {len(left_out)} of the net's trainable parameters: "
            f"{', '.join(left_out[:5])}{' ...' if len(left_out) > 5 else ''} (added to the net after the optimizer "
            f"was built?). They will not learn. Build the optimizer after the net is complete: optimizer={example}, "
            "or freeze them on purpose with requires_grad_(False).",
            UserWarning,
            stacklevel=4,
        )


def warn_if_scheduler_looks_per_batch(model, settings: FitSettings) -> None:
    """A scheduler sized in batches (torchkeras steps it after every batch) that fit would step once
    per epoch: say what it would do here and how to step it per batch."""
    epochs = settings.epochs
    if (
        model.lr_scheduler is None
        or settings.step.scheduler_interval != "epoch"
        or not isinstance(epochs, int)
        or isinstance(epochs, bool)
        or epochs < 1
    ):
        return
    what_it_would_do = _stepped_per_epoch(model.lr_scheduler, epochs)
    if what_it_would_do is not None:
        warnings.warn(
            f"{what_it_would_do} A scheduler sized in batches (as torchkeras steps them) needs "
            "KerasModel(..., lr_scheduler_interval='step'); one sized in epochs is right as it is.",
            UserWarning,
            stacklevel=4,
        )


def _stepped_per_epoch(scheduler: Any, epochs: int) -> Optional[str]:
    """What a scheduler whose sizes look like counts of batches does when stepped once per epoch; None if fine."""
    schedulers = torch.optim.lr_scheduler
    if isinstance(scheduler, schedulers.OneCycleLR) and scheduler.total_steps > epochs:
        return (
            f"The OneCycleLR has total_steps={scheduler.total_steps} but fit steps the scheduler once per epoch "
            f"({epochs} epochs), so the cycle would not finish."
        )
    if isinstance(scheduler, schedulers.CosineAnnealingLR) and scheduler.T_max > epochs:
        return (
            f"The CosineAnnealingLR has T_max={scheduler.T_max} but fit steps the scheduler once per epoch "
            f"({epochs} epochs), so the rate would stop partway down its cosine."
        )
    if isinstance(scheduler, schedulers.CosineAnnealingWarmRestarts) and epochs > scheduler.T_0:
        restarts, period, ends = 0, scheduler.T_0, scheduler.T_0
        while ends < epochs:
            restarts, period = restarts + 1, period * scheduler.T_mult
            ends += period
        return (
            f"The CosineAnnealingWarmRestarts has T_0={scheduler.T_0}; fit steps the scheduler once per epoch, so "
            f"the rate restarts {restarts} time{'s' if restarts > 1 else ''} in {epochs} epochs (the first after "
            f"epoch {scheduler.T_0})."
        )
    return None


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
    # NumPy integers (np.int64(10) from a config or a grid) count as whole numbers too.
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
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


def check_no_single_sample_batch(net: torch.nn.Module, loader: Any) -> None:
    """BatchNorm cannot train on a batch of one sample: refuse a loader whose last batch has one."""
    if not any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in net.modules()):
        return
    size, dataset = getattr(loader, "batch_size", None), getattr(loader, "dataset", None)
    if not isinstance(size, int) or getattr(loader, "drop_last", False) or num_batches(dataset) is None:
        return
    samples = num_batches(dataset) or 0  # len(dataset): its number of samples
    if samples % size == 1:
        raise ValueError(
            f"The training data has {samples} samples in batches of {size}, so the last batch of every epoch holds "
            "a single sample, and BatchNorm cannot train on one (torch fails at the end of the first epoch). Pass "
            f"drop_last=True to your DataLoader, or another batch_size (e.g. {size + 1})."
        )


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


REGRESSION_LOSSES = (torch.nn.MSELoss, torch.nn.L1Loss, torch.nn.SmoothL1Loss, torch.nn.HuberLoss)


def broadcast_mismatch(loss_fn: Any, preds: Any, labels: Any) -> Optional[str]:
    """For a regression loss, outputs and labels whose shapes broadcast to something else (``(N, 1)``
    and ``(N,)`` make ``(N, N)``: every output compared with every label): say so, with the fix."""
    if not (
        isinstance(loss_fn, REGRESSION_LOSSES)
        and isinstance(preds, torch.Tensor)
        and isinstance(labels, torch.Tensor)
        and preds.shape != labels.shape
    ):
        return None
    try:
        broadcast = torch.broadcast_shapes(preds.shape, labels.shape)
    except RuntimeError:
        return None
    if broadcast == preds.shape and broadcast == labels.shape:
        return None
    return (
        f"{type(loss_fn).__name__} gets outputs of shape {tuple(preds.shape)} and labels of shape "
        f"{tuple(labels.shape)}, which broadcast to {tuple(broadcast)}: every output is compared with every "
        "label, and the net learns their mean. Make the shapes equal: y = y.reshape(-1, 1) for a net with one "
        "output (or preds.squeeze(1) in forward_batch)."
    )


def check_first_batch(model: Any, data: Any, runtime: Any, name: str) -> None:
    """Run the first batch through the net, the loss and copies of the metrics, in eval mode and
    without gradients, so a wrong batch layout, a net/loss mismatch or a metric that does not
    fit the outputs fails before any weight changes."""
    seen: dict = {}

    def forward(batch: Any) -> Any:
        seen["batch"] = batch
        with runtime.autocast():
            return model.forward_batch(runtime.to_device(batch))

    try:
        loss, preds, labels = dry_run_first_batch(model.net, data, name, forward)
    except (BatchError, NoBatchesError):
        raise
    except Exception as error:
        raise _wrapped(error, name, _first_batch_hint(model, seen.get("batch"))) from error
    check_first_outputs(model, loss, preds, labels, runtime, name)


def checked_first_step(model: Any, batch: Any, runtime: Any) -> tuple[torch.Tensor, Any, Any]:
    """The default ``train_step`` on the run's first training batch, with :func:`check_first_batch`'s
    checks between the forward pass and the backward: they cost no pass of their own, and a
    failure still comes before any weight changes. (The forward pass in train mode has moved
    BatchNorm's running statistics by then: a run that ends before its first epoch does gets
    the weights and buffers from before training back from ``RestoreBestWeights``.)"""
    try:
        with runtime.autocast():
            loss, preds, labels = model.forward_batch(batch)
    except BatchError:
        raise
    except Exception as error:
        raise _wrapped(error, "train_data", _first_batch_hint(model, batch)) from error
    check_first_outputs(model, loss, preds, labels, runtime, "train_data")
    model.backward(loss)
    model.optimizer_step()
    return loss, preds, labels


def check_first_outputs(model: Any, loss: Any, preds: Any, labels: Any, runtime: Any, name: str) -> None:
    """The loss is one number, outputs and labels do not broadcast into each other, and every
    metric takes the outputs: checked on the first batch, before any weight changes."""
    mismatch = broadcast_mismatch(model.loss_fn, preds, labels)
    if mismatch:
        raise ValueError(f"The first batch of {name}: {mismatch}")
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise ValueError(
            f"The loss must be a single number (a 0-d tensor, the mean over the batch); got {shape}. Use a loss "
            "with reduction='mean', or return loss.mean() (or loss.squeeze() for one element) from your loss or "
            "forward_batch."
        )
    check_metrics_on(model.metrics_dict, preds, labels, name, runtime.outputs_device, runtime.num_processes)


def check_metrics_on(
    metrics_dict: dict, preds: Any, labels: Any, name: str, device: torch.device, processes: int = 1
) -> None:
    """Update and compute a copy of every metric on one batch: a metric that does not fit the
    outputs (3 classes into Accuracy(num_classes=2)) fails now, not after an epoch of training.
    Under several processes, a metric whose state is plain Python numbers (which cannot be
    summed over processes) is refused too: it would report one process's share alone."""
    preds = metric_friendly(preds)
    for key, metric in metrics_dict.items():
        number_states: list[str] = []
        try:
            with torch.no_grad():
                if is_stateful_metric(metric):
                    trial = copy.deepcopy(metric)
                    if isinstance(trial, torch.nn.Module):
                        trial.to(device)
                    trial.reset()
                    numbers = {
                        k: v for k, v in vars(trial).items() if isinstance(v, (int, float)) and not isinstance(v, bool)
                    }
                    metric_update_fn(trial)(preds, labels)
                    number_states = [k for k, v in numbers.items() if vars(trial).get(k) != v]
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
        if number_states and processes > 1 and not is_torchmetrics(metric):
            raise ValueError(
                f"Metric {key!r} keeps its state in plain Python numbers ({', '.join(number_states)}), which cannot "
                f"be combined over the {processes} processes: it would report one process's share of the data. "
                f"Keep the state in tensors, e.g. self.register_buffer('{number_states[0]}', torch.tensor(0.0)) or "
                f"nn.Parameter(torch.tensor(0.0), requires_grad=False), or use a torchmetrics metric."
            )


def _first_batch_hint(model: Any, batch: Any) -> str:
    """What usually causes a first batch to fail, when the batch shows it: the fix to try."""
    if batch is None:
        return ""
    try:
        args, kwargs, labels = split_batch(split_sample_weight(batch)[0])
    except BatchError:
        return ""
    inputs = [t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor)]
    weights = [p for p in model.net.parameters() if p.is_floating_point()]
    if weights and any(t.dtype == torch.float64 for t in inputs) and weights[0].dtype == torch.float32:
        return (
            " The inputs are float64 but the net's weights are float32: convert the data, X.float() for tensors "
            "or X.astype('float32') for NumPy, or train in float64 with precision='64-true'."
        )
    if isinstance(labels, (list, tuple)) and labels and isinstance(labels[0], str):
        return (
            f" The labels are strings ({labels[0]!r}, ...): map them to integers first, e.g. "
            "classes = sorted(set(labels)); y = [classes.index(c) for c in labels]."
        )
    loss_fn = model.loss_fn
    if (
        isinstance(loss_fn, (torch.nn.BCEWithLogitsLoss, torch.nn.BCELoss))
        and isinstance(labels, torch.Tensor)
        and not labels.is_floating_point()
    ):
        return (
            f" {type(loss_fn).__name__} needs float labels in [0, 1]: y.float() (and y.reshape(-1, 1) for a net "
            "with one output)."
        )
    return ""


def _wrapped(error: Exception, name: str, hint: str = "") -> Exception:
    message = f"The first batch of {name} failed in the net or the loss, before training started: {error}{hint}"
    try:
        return type(error)(message)
    except Exception:  # an exception type that takes other arguments
        return RuntimeError(message)
