"""The parts a kerastorch model is made of, shared by ``KerasModel`` and ``LightModel``:
a net, a loss, a dict of metrics, an optimizer and a scheduler, where a batch holds its labels,
and the two calls that turn a batch into ``(loss, preds, labels)`` or into predictions.

How a batch is read is decided on a run's first batch and kept: the net's own loss when there is
no ``loss_fn`` (a Hugging Face model given its labels), the labels in the outputs' shape and dtype
for an element-wise loss (:mod:`~kerastorch.training.labels`), and what the run is told about it.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

import torch

from ..data.batches import (
    check_labels_at,
    describe_reading,
    labels_to_outputs,
    split_batch,
    split_inputs,
    split_sample_weight,
)
from ..data.sample_weights import weighted_loss
from .labels import AS_GIVEN, LabelFix, label_fix
from .meters import check_metrics
from .outputs import NoLossError, describe_output, has_fields, own_loss, predictions_of


class ModelParts:
    """A net, its loss, metrics, optimizer and scheduler, and how a batch goes through them.

    Subclass and override :meth:`forward_batch` (and :meth:`predict_batch`) for a batch
    layout or a loss that the defaults and ``labels_at`` do not cover.
    """

    net: torch.nn.Module
    loss_fn: Optional[Any]
    metrics_dict: dict
    optimizer: torch.optim.Optimizer
    lr_scheduler: Optional[Any]
    lr_scheduler_interval: str
    labels_at: Optional[Union[int, str]]
    label_fix: Optional[LabelFix]  # decided on the first batch of a run; None until then

    def set_parts(
        self,
        net: torch.nn.Module,
        loss_fn: Optional[Any],
        metrics_dict: Optional[dict],
        optimizer: Optional[torch.optim.Optimizer],
        lr_scheduler: Optional[Any],
        lr_scheduler_interval: str,
        labels_at: Optional[Union[int, str]] = None,
    ) -> None:
        """Check and keep the parts; Adam with lr=1e-3 when no optimizer is given."""
        check_model_parts(net, loss_fn, lr_scheduler, lr_scheduler_interval)
        self.net = net
        self.loss_fn = loss_fn
        self.metrics_dict = check_metrics(metrics_dict)
        self.optimizer = optimizer if optimizer is not None else torch.optim.Adam(net.parameters(), lr=1e-3)
        self.lr_scheduler = lr_scheduler
        self.lr_scheduler_interval = lr_scheduler_interval
        self.labels_at = check_labels_at(labels_at)
        self.start_reading()

    def start_reading(self, say: Optional[Callable[[str], Any]] = None) -> None:
        """Read the next batch afresh: a run (fit, evaluate) decides on its first batch how it reads
        the labels and the net's output, keeps that for its other batches, and ``say``s it once."""
        self.label_fix = None
        self._say_reading = say

    def forward_batch(self, batch: Any) -> tuple[torch.Tensor, Any, Any]:
        """Turn one batch into ``(loss, preds, labels)``; ``loss`` is the batch mean.

        The default reads ``(x, y)``, ``(x1, ..., xn, y)`` or a dict with a ``labels`` key (or the
        labels where ``labels_at`` says), calls the net and ``loss_fn``. Without a ``loss_fn``, the
        net computes its own loss: a dict batch goes to it whole, labels included, and its output's
        ``loss`` is used (a Hugging Face model's ``ModelOutput``, or any object or dict with
        ``loss``); the predictions are the output's ``logits``. Labels of shape ``(N,)`` for outputs
        ``(N, 1)`` and integer labels for a loss that needs floats are fixed as Keras does
        (:mod:`~kerastorch.training.labels`). Override it for anything else; training,
        evaluation, the meters and the callbacks all go through it. A batch with sample weights (a
        ``sample_weight`` key in a dict, or what ``fit(sample_weight=..., class_weight=...)`` makes)
        gets the weighted loss of :mod:`kerastorch.data.sample_weights`.
        """
        kwargs: dict[str, Any]
        if type(batch) in (list, tuple) and len(batch) == 2 and self.labels_at is None:
            # (x, y), the usual batch: read as the two calls below would read it, without their
            # cost (about 1.7 us a step on a 2-core CPU).
            plain, sample_weight, args, kwargs, labels = batch, None, (batch[0],), {}, batch[1]
        else:
            plain, sample_weight = split_sample_weight(batch)
            args, kwargs, labels = split_batch(plain, self.labels_at)
        if self.loss_fn is None and isinstance(plain, dict):
            kwargs = plain  # the net computes its own loss: it gets the labels too (Hugging Face's way)
        output = self.net(*args, **kwargs)
        preds = output if isinstance(output, torch.Tensor) else predictions_of(output)  # the common case first
        labels = labels_to_outputs(labels, preds)  # a model-parallel net's output may be on another device
        fix = self.label_fix if self.label_fix is not None else self._decide_reading(plain, output, preds, labels)
        if self.loss_fn is None:
            loss = own_loss(output)
            if sample_weight is not None:
                raise ValueError(
                    "Sample weights need each sample's loss, but the net computes its own (one number for the batch, "
                    "as loss_fn is None). Pass a loss_fn (e.g. nn.CrossEntropyLoss()) to weight the samples."
                )
            return loss, preds, labels  # type: ignore[return-value]
        loss_labels = labels
        if fix is not AS_GIVEN:  # decided on the first batch: a view or a cast, no wait for the device
            loss_labels, labels = fix.for_loss(labels), fix.for_metrics(labels)
        if sample_weight is not None:
            return weighted_loss(self.loss_fn, preds, loss_labels, sample_weight), preds, labels
        return self.loss_fn(preds, loss_labels), preds, labels

    def predict_batch(self, batch: Any) -> Any:
        """The net's output for one batch (its ``logits`` for an output with fields); labels in the batch,
        if any, are ignored (read as ``forward_batch`` reads them)."""
        args, kwargs = split_inputs(batch, self.labels_at)
        return predictions_of(self.net(*args, **kwargs))

    def _decide_reading(self, batch: Any, output: Any, preds: Any, labels: Any) -> LabelFix:
        """On a run's first batch: the net's own loss or the labels fixed for ``loss_fn``, said once."""
        if self.loss_fn is None:
            if own_loss(output) is None:
                kind = type(self).__name__
                raise NoLossError(
                    f"{kind} has no loss_fn. Pass one, e.g. {kind}(net, loss_fn=nn.CrossEntropyLoss()), or let the "
                    "net compute its own (as Hugging Face models do: a dict batch with 'labels' goes to the net "
                    "whole, and its output's .loss is used). kerastorch called "
                    f"{describe_reading(batch, self.labels_at, labels_to_net=isinstance(batch, dict))}, and the net "
                    f"returned {describe_output(output)}, which has no loss. Or override forward_batch to compute "
                    "the loss yourself."
                )
            fix = AS_GIVEN
            note = (
                f"No loss_fn: the net computes its own loss. kerastorch calls "
                f"{describe_reading(batch, self.labels_at, labels_to_net=isinstance(batch, dict))} and uses the "
                f"output's loss; the metrics and predict get its {'logits' if has_fields(output) else 'output'}."
            )
        else:
            fix = label_fix(self.loss_fn, preds, labels)
            note = fix.note
            if has_fields(output):
                note = (
                    f"The net returns {describe_output(output)}: the loss, the metrics and predict get its logits. "
                    + note
                )
        self.label_fix = fix
        say = getattr(self, "_say_reading", None)
        if note and say is not None:
            say(note)
        return fix


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


def check_loss_fn(model: ModelParts, net_may_compute_it: bool = True) -> None:
    """A loss object, not its class. No loss at all is fine when the net may compute its own (found on
    the first batch), or a custom ``forward_batch`` or ``train_step`` needs none."""
    if isinstance(model.loss_fn, type):
        name = model.loss_fn.__name__
        raise TypeError(
            f"loss_fn is the class {name}, not a loss. Pass an instance: loss_fn=nn.{name}() (note the brackets)."
        )
    if model.loss_fn is None and not net_may_compute_it and type(model).forward_batch is ModelParts.forward_batch:
        kind = type(model).__name__
        raise ValueError(
            f"{kind} has no loss_fn. Pass one, e.g. {kind}(net, loss_fn=nn.CrossEntropyLoss()), "
            "or override forward_batch to compute the loss yourself."
        )


__all__ = ["ModelParts", "NoLossError", "check_loss_fn", "check_model_parts"]
