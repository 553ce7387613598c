"""The parts a kerastorch model is made of, shared by ``KerasModel`` and ``LightModel``:
a net, a loss, a dict of metrics, an optimizer and a scheduler, and the two calls that
turn a batch into ``(loss, preds, labels)`` or into predictions."""

from __future__ import annotations

from typing import Any, Optional

import torch

from ..data.batches import labels_to_outputs, split_inputs, unpack
from ..data.sample_weights import weighted_loss
from .meters import check_metrics


class ModelParts:
    """A net, its loss, metrics, optimizer and scheduler, and how a batch goes through them.

    Subclass and override :meth:`forward_batch` (and :meth:`predict_batch`) for a batch
    layout or a loss that the defaults do not cover.
    """

    net: torch.nn.Module
    loss_fn: Optional[Any]
    metrics_dict: dict
    optimizer: torch.optim.Optimizer
    lr_scheduler: Optional[Any]
    lr_scheduler_interval: str

    def set_parts(
        self,
        net: torch.nn.Module,
        loss_fn: Optional[Any],
        metrics_dict: Optional[dict],
        optimizer: Optional[torch.optim.Optimizer],
        lr_scheduler: Optional[Any],
        lr_scheduler_interval: str,
    ) -> None:
        """Check and keep the parts; Adam with lr=1e-3 when no optimizer is given."""
        check_model_parts(net, loss_fn, lr_scheduler, lr_scheduler_interval)
        self.net = net
        self.loss_fn = loss_fn
        self.metrics_dict = check_metrics(metrics_dict)
        self.optimizer = optimizer if optimizer is not None else torch.optim.Adam(net.parameters(), lr=1e-3)
        self.lr_scheduler = lr_scheduler
        self.lr_scheduler_interval = lr_scheduler_interval

    def forward_batch(self, batch: Any) -> tuple[torch.Tensor, Any, Any]:
        """Turn one batch into ``(loss, preds, labels)``; ``loss`` is the batch mean.

        The default reads ``(x, y)``, ``(x1, ..., xn, y)`` or a dict with a ``labels``
        key, calls the net and ``loss_fn``. Override it for anything else; training,
        evaluation, the meters and the callbacks all go through it. A batch with sample
        weights (a ``sample_weight`` key in a dict, or what ``fit(sample_weight=...,
        class_weight=...)`` makes) gets the weighted loss of :mod:`kerastorch.data.sample_weights`.
        """
        args, kwargs, labels, sample_weight = unpack(batch)
        preds = self.net(*args, **kwargs)
        labels = labels_to_outputs(labels, preds)  # a model-parallel net's output may be on another device
        if sample_weight is not None:
            return weighted_loss(self.loss_fn, preds, labels, sample_weight), preds, labels
        return self.loss_fn(preds, labels), preds, labels  # type: ignore[misc]

    def predict_batch(self, batch: Any) -> Any:
        """The net's output for one batch; labels in the batch, if any, are ignored."""
        args, kwargs = split_inputs(batch)
        return self.net(*args, **kwargs)


def check_model_parts(net: Any, loss_fn: Any, lr_scheduler: Any, lr_scheduler_interval: Any) -> None:
    """What KerasModel and LightModel refuse at construction."""
    if not isinstance(net, torch.nn.Module):
        raise TypeError(f"net must be a torch.nn.Module; got a {type(net).__name__}.")
    if loss_fn is not None and not callable(loss_fn):
        raise TypeError(f"loss_fn must be callable, like nn.CrossEntropyLoss(); got a {type(loss_fn).__name__}.")
    if lr_scheduler_interval not in ("epoch", "step"):
        raise ValueError(f"lr_scheduler_interval={lr_scheduler_interval!r}; use 'epoch' or 'step'.")
    if lr_scheduler_interval == "step" and isinstance(lr_scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        raise ValueError("ReduceLROnPlateau needs an epoch's monitored value; use lr_scheduler_interval='epoch'.")


def check_loss_fn(model: ModelParts) -> None:
    """A loss object (not its class), required unless ``forward_batch`` computes the loss itself."""
    if isinstance(model.loss_fn, type):
        name = model.loss_fn.__name__
        raise TypeError(
            f"loss_fn is the class {name}, not a loss. Pass an instance: loss_fn=nn.{name}() (note the brackets)."
        )
    if model.loss_fn is None and type(model).forward_batch is ModelParts.forward_batch:
        kind = type(model).__name__
        raise ValueError(
            f"{kind} has no loss_fn. Pass one, e.g. {kind}(net, loss_fn=nn.CrossEntropyLoss()), "
            "or override forward_batch to compute the loss yourself."
        )


__all__ = ["ModelParts", "check_loss_fn", "check_model_parts"]
