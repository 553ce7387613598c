"""The labels as a loss needs them, the way Keras reads them: labels of shape ``(N,)`` for outputs
of shape ``(N, 1)`` (and the other way round) take the outputs' shape for the losses that compare
each output with its label, and integer labels become floats for the losses that need floats (float
labels of another precision take the outputs' dtype, as Keras casts them).

Without this, ``MSELoss`` broadcasts ``(N, 1)`` against ``(N,)`` to ``(N, N)`` (every output
compared with every label: the net learns their mean) and ``BCEWithLogitsLoss`` refuses 0/1
integer labels. The decision is made once, on a run's first batch (:func:`label_fix`), and said
once; every later batch costs a view or a cast, and no wait for the device. The user's data is
not changed, and the metrics get the labels in their own dtype (torchmetrics' classification
metrics want integer targets), in the outputs' shape.

>>> import torch
>>> fix = label_fix(torch.nn.MSELoss(), torch.zeros(4, 1), torch.tensor([1, 2, 3, 4]))
>>> fix.for_loss(torch.tensor([1, 2, 3, 4])).shape, fix.for_loss(torch.tensor([1, 2])).dtype
(torch.Size([4, 1]), torch.float32)
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import torch
from torch import nn

from ..data.batches import describe_tensor

# Losses that compare each output with the label in the same place, and want float labels.
ELEMENTWISE_LOSSES = (nn.MSELoss, nn.L1Loss, nn.SmoothL1Loss, nn.HuberLoss, nn.BCELoss, nn.BCEWithLogitsLoss)


class LabelFix(NamedTuple):
    """What is done to each batch's labels, decided on the first batch."""

    add_last_dim: bool = False  # (N,) labels for (N, 1) outputs
    drop_last_dim: bool = False  # (N, 1) labels for (N,) outputs
    dtype: Optional[torch.dtype] = None  # integer labels as floats, for the loss only
    note: str = ""  # what was done, in words (said once); "" when the labels go as they are

    def for_metrics(self, labels: Any) -> Any:
        """The labels in the outputs' shape, in their own dtype."""
        if self.add_last_dim:
            return labels.unsqueeze(-1)
        if self.drop_last_dim:
            return labels.squeeze(-1)
        return labels

    def for_loss(self, labels: Any) -> Any:
        """The labels as the loss needs them: the outputs' shape, and floats where it needs floats."""
        labels = self.for_metrics(labels)
        return labels if self.dtype is None else labels.to(self.dtype)


AS_GIVEN = LabelFix()


def label_fix(loss_fn: Any, preds: Any, labels: Any) -> LabelFix:
    """What Keras would do with these labels for this loss: nothing, a reshape, a cast, or both."""
    if not (
        isinstance(loss_fn, ELEMENTWISE_LOSSES) and isinstance(preds, torch.Tensor) and isinstance(labels, torch.Tensor)
    ):
        return AS_GIVEN
    add = preds.dim() >= 1 and preds.shape[-1] == 1 and preds.shape[:-1] == labels.shape
    drop = labels.dim() >= 1 and labels.shape[-1] == 1 and labels.shape[:-1] == preds.shape
    dtype = None
    if not labels.is_floating_point() and not labels.is_complex():
        dtype = preds.dtype if preds.dtype in (torch.float32, torch.float64) else torch.float32
    elif labels.is_floating_point() and labels.dtype != preds.dtype and preds.dtype in (torch.float32, torch.float64):
        dtype = preds.dtype  # float64 labels for float32 outputs: the loss's backward wants one dtype
    if not (add or drop or dtype is not None):
        return AS_GIVEN
    fix = LabelFix(add, drop, dtype)
    given, for_loss, for_metrics = (describe_tensor(t) for t in (labels, fix.for_loss(labels), fix.for_metrics(labels)))
    note = f"The labels ({given}) go to {type(loss_fn).__name__} as {for_loss}"
    if add or drop:
        note += f", the shape of the outputs {tuple(preds.shape)}"
    note += ", as Keras does"
    if dtype is not None and (add or drop):
        note += f"; the metrics get them as {for_metrics}"
    elif dtype is not None:
        note += "; the metrics get them as they are"
    return fix._replace(note=note + ". Your data is unchanged.")


__all__ = ["ELEMENTWISE_LOSSES", "LabelFix", "label_fix"]
