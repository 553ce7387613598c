"""The first batch, run through the net, the loss and copies of the metrics before the first weight
changes: a wrong batch layout, a net/loss mismatch or a metric that does not fit the outputs
fails now, with a message that says what to fix, not after an epoch of training."""

from __future__ import annotations

import copy
from typing import Any, Optional

import torch

from ..data.batches import BatchError, unpack
from ..data.peek import NoBatchesError, dry_run_first_batch
from ..training.meters import is_stateful_metric, metric_friendly, metric_update_fn, scalar_metric_value
from ..training.metric_sync import is_torchmetrics

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
        args, kwargs, labels, _ = unpack(batch)
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


__all__ = ["broadcast_mismatch", "check_first_batch", "check_first_outputs", "check_metrics_on", "checked_first_step"]
