"""torchkeras's metrics by their names, on torchmetrics: ``from kerastorch.metrics import Accuracy``.

torchkeras programs use these binary metrics on the net's raw outputs (logits: a sample is
positive when ``sigmoid(output) >= 0.5``) and on labels that may be floats (positive when
``> 0.5``). The same names here keep that meaning, and are exact where torchkeras's were
not: ``AUC`` and ``KS`` come from the whole ROC curve rather than 10,000 score bins. Being
torchmetrics metrics, they combine exactly over several processes.

| name | what | torchmetrics underneath |
| --- | --- | --- |
| `Accuracy` | share of samples on the right side of 0.5 | `BinaryAccuracy` |
| `Precision` | true positives / predicted positives | `BinaryPrecision` |
| `Recall` | true positives / actual positives | `BinaryRecall` |
| `AUC` | area under the ROC curve | `BinaryAUROC` |
| `KS` | Kolmogorov-Smirnov: the largest `TPR - FPR` | `BinaryROC` |
| `IOU` | mean intersection over union of the classes | `MulticlassJaccardIndex` |
"""

from __future__ import annotations

from typing import Any

import torch
from torchmetrics.classification import (
    BinaryAccuracy,
    BinaryAUROC,
    BinaryPrecision,
    BinaryRecall,
    BinaryROC,
    MulticlassJaccardIndex,
)


class FromLogits:
    """torchkeras's reading of a binary batch, before a torchmetrics binary metric's own update:
    ``sigmoid`` of the outputs, labels positive above 0.5."""

    def update(self, preds: torch.Tensor, target: torch.Tensor) -> None:
        probabilities, labels = torch.sigmoid(preds.float()).reshape(-1), (target.reshape(-1) > 0.5).long()
        super().update(probabilities, labels)  # type: ignore[misc]


class Accuracy(FromLogits, BinaryAccuracy):
    """Binary accuracy from logits: ``sigmoid(preds) >= 0.5`` against ``targets > 0.5``."""


class Precision(FromLogits, BinaryPrecision):
    """Binary precision from logits (threshold 0.5 on ``sigmoid(preds)``)."""


class Recall(FromLogits, BinaryRecall):
    """Binary recall from logits (threshold 0.5 on ``sigmoid(preds)``)."""


class AUC(FromLogits, BinaryAUROC):
    """The exact area under the ROC curve of ``sigmoid(preds)`` (torchkeras binned the scores)."""


class KS(FromLogits, BinaryROC):
    """The Kolmogorov-Smirnov statistic: the largest gap ``TPR - FPR`` over all thresholds."""

    def compute(self) -> Any:
        false_positive_rate, true_positive_rate, _ = super().compute()
        return (true_positive_rate - false_positive_rate).abs().max()


class IOU(MulticlassJaccardIndex):
    """Mean intersection over union of the classes, for segmentation or classification.

    ``num_classes >= 2``: ``preds`` are per-class scores (``(N, C, ...)``), the class is their
    argmax. ``num_classes=1``: one logit per pixel, foreground when ``> 0``; the mean is over
    background and foreground, as in torchkeras. ``if_print`` is accepted for torchkeras's
    signature; print the metric's value yourself.
    """

    def __init__(self, num_classes: int, if_print: bool = False, **kwargs: Any):
        self.binary = num_classes < 2
        super().__init__(num_classes=max(num_classes, 2), average="macro", **kwargs)
        self.if_print = if_print

    def update(self, preds: torch.Tensor, target: torch.Tensor) -> None:
        if self.binary:
            preds, target = (preds > 0).long().reshape(target.shape), target.long()
        super().update(preds, target.long())


__all__ = ["AUC", "Accuracy", "IOU", "KS", "Precision", "Recall"]
