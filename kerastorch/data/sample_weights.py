"""Per-sample and per-class weights of the loss.

With weights, the loss of a batch of n samples is Keras's "sum over batch size":

    loss = (1/n) * sum_i w_i * l_i

where ``l_i`` is the sample's own loss (the user's loss with ``reduction="none"``,
averaged over any non-batch dimensions) and ``w_i`` its weight (``sample_weight``
times ``class_weight[label]``). Summed over an epoch's batches by their sizes, the
history's ``train_loss`` is exactly ``(1/N) * sum over the epoch's N samples of w_i * l_i``,
the quantity the optimizer minimises. ``metrics_dict``'s metrics are not weighted;
``fit(weighted_metrics=...)``'s functions are (:mod:`kerastorch.training.meters`).
"""

from __future__ import annotations

import copy
import warnings
import weakref
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from .batches import WeightedSample, split_sample_weight, unpack

# The per-sample copy of each loss object, made once; a shallow copy shares the user's
# buffers (a CrossEntropyLoss's weight), so moving the loss moves its copy too.
_PER_SAMPLE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

BALANCED = "balanced"


def can_weight(loss_fn: Any) -> bool:
    """True when the loss has a per-sample form: a ``reduction`` attribute, as every torch loss has."""
    return isinstance(getattr(loss_fn, "reduction", None), str)


def check_weighted_loss(loss_fn: Any, asked_for: str) -> None:
    """Refuse weights for a loss that has no per-sample form, before training."""
    if not can_weight(loss_fn):
        raise ValueError(
            f"{asked_for} needs the loss of each sample, but loss_fn ({type(loss_fn).__name__}) has no reduction "
            "attribute to ask for it. Use a torch loss (e.g. nn.CrossEntropyLoss(), nn.MSELoss()), or override "
            "KerasModel.forward_batch to weight your loss yourself."
        )


def per_sample_loss(loss_fn: Any) -> Any:
    """The user's loss with ``reduction="none"``; the user's object itself is never changed."""
    try:
        return _PER_SAMPLE[loss_fn]
    except (KeyError, TypeError):
        pass
    # Weights may come inside the data ((x, y, w) tuples, a 'sample_weight' key) as well as from fit's keywords.
    check_weighted_loss(loss_fn, "Sample weights (sample_weight=, class_weight= or weights in the data)")
    unreduced = copy.copy(loss_fn)
    unreduced.reduction = "none"
    try:
        _PER_SAMPLE[loss_fn] = unreduced
    except TypeError:  # an object that takes no weak reference: made anew each time
        pass
    return unreduced


def weighted_loss(loss_fn: Any, preds: Any, labels: Any, weight: torch.Tensor) -> torch.Tensor:
    """``(1/n) * sum_i w_i * l_i`` over the batch (see the module docstring)."""
    losses = per_sample_loss(loss_fn)(preds, labels)
    if losses.dim() > 1:
        losses = losses.reshape(losses.shape[0], -1).mean(dim=1)
    weight = weight.to(device=losses.device, dtype=losses.dtype).reshape(-1)
    if weight.shape[0] != losses.shape[0]:
        raise ValueError(
            f"The batch has {losses.shape[0]} per-sample losses but {weight.shape[0]} sample weights; "
            "give one weight per sample."
        )
    return (losses * weight).mean()


def check_sample_weight(sample_weight: Any) -> None:
    """``fit(sample_weight=...)``'s values: numbers, none negative, NaN or infinite, not all 0 (a loss of 0
    that trains nothing). Weights inside the user's own batches are read only as they come."""
    if sample_weight is None:
        return
    if isinstance(sample_weight, torch.Tensor):
        sample_weight = sample_weight.detach().cpu().double().numpy()
    try:
        values = np.asarray(sample_weight, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        raise TypeError(
            f"sample_weight is a {type(sample_weight).__name__} that is not numbers; give one number per sample, "
            "e.g. sample_weight=np.ones(len(y))."
        ) from None
    how = "0 leaves a sample out, 1 counts it once, 2 twice"
    if not np.isfinite(values).all():
        bad = int((~np.isfinite(values)).sum())
        kind = "NaN" if np.isnan(values).any() else "infinite"
        raise ValueError(
            f"sample_weight holds {bad} {kind} value(s); every sample needs a weight ({how}). Fill them, e.g. "
            "np.nan_to_num(w, nan=1.0)."
        )
    negative = values < 0
    if negative.any():
        raise ValueError(
            f"sample_weight holds {int(negative.sum())} negative value(s) (the smallest {values.min():g}); a "
            f"weight is >= 0 ({how}): a negative one would push the net away from those samples' labels."
        )
    if values.size and not values.any():
        raise ValueError(
            "sample_weight is 0 for every sample: every sample's loss counts 0, so the loss is 0 and nothing "
            "would be learned. Give the samples to learn from positive weights (1.0 is unweighted), or leave "
            "sample_weight out."
        )


def class_ids(labels: torch.Tensor, check: bool = True) -> torch.Tensor:
    """The class of each sample, as Keras reads labels for ``class_weight``: one-hot (or
    probability) rows by their argmax, a ``(N, 1)`` column squeezed, whole-number floats
    (``0.0`` / ``1.0`` labels of a binary loss) as integers.

    >>> class_ids(torch.tensor([[0.0, 1.0], [1.0, 0.0]])).tolist(), class_ids(torch.tensor([[1.0], [0.0]])).tolist()
    ([1, 0], [1, 0])

    ``check=False`` skips the look at the values (a host sync), for batches of labels already checked.
    """
    if labels.dim() > 1:
        if labels.shape[-1] > 1 and check:
            check_one_label_per_sample(labels)
        labels = labels.argmax(dim=-1) if labels.shape[-1] > 1 else labels.squeeze(-1)
    labels = labels.reshape(-1)
    if labels.dtype == torch.bool:
        return labels.long()
    if labels.is_floating_point():
        if check and labels.numel() and not bool((labels == labels.round()).all()):
            raise ValueError(
                f"class_weight needs integer class labels, but the labels are {str(labels.dtype).replace('torch.', '')} "
                "numbers that are not whole (a regression target?). For per-sample weights of a regression use "
                "sample_weight=..."
            )
        return labels.long()
    return labels.long()


def class_weight_table(class_weight: Any, labels: torch.Tensor) -> torch.Tensor:
    """A tensor ``table[c]`` = the weight of class c, from a dict ``{class: weight}`` or ``"balanced"``.

    ``labels`` are all the training labels (class numbers, or one-hot rows: :func:`class_ids`): they
    tell which classes exist and, for ``"balanced"``, how many samples each has
    (``N / (num_classes * count_c)``, as scikit-learn computes it). Classes a dict does not name get
    weight 1. A dict may name a class the training labels never have (a rare class that is only in
    the validation data), as Keras allows: its weight applies to no training sample, and a warning
    says so.

    >>> class_weight_table({1: 3.0}, torch.tensor([0, 1, 1, 2])).tolist()
    [1.0, 3.0, 1.0]
    >>> class_weight_table("balanced", torch.tensor([0, 1, 1, 1])).tolist()
    [2.0, 0.6666666865348816]
    >>> class_weight_table("balanced", torch.tensor([[0.0], [1.0], [1.0], [1.0]])).tolist()  # BCE's labels
    [2.0, 0.6666666865348816]
    """
    labels = class_ids(labels)
    if labels.numel() and int(labels.min()) < 0:
        raise ValueError(f"class_weight needs class labels 0, 1, 2, ...; the labels include {int(labels.min())}.")
    present = sorted(int(c) for c in torch.unique(labels))
    size = (max(present) + 1) if present else 0
    if isinstance(class_weight, str):
        if class_weight != BALANCED:
            raise ValueError(f"class_weight={class_weight!r}; use a dict {{class: weight}} or 'balanced'.")
        counts = torch.bincount(labels, minlength=size).float()
        table = torch.ones(size)
        seen = counts > 0
        table[seen] = labels.numel() / (len(present) * counts[seen])
        return table
    if not isinstance(class_weight, Mapping) or not class_weight:
        raise TypeError(
            f"class_weight is a {type(class_weight).__name__}; use a dict {{class: weight}} such as "
            "{0: 1.0, 1: 5.0}, or 'balanced'."
        )
    named = {}
    for cls, value in class_weight.items():
        try:
            number = int(cls)
        except (TypeError, ValueError):
            number = -1
        if number < 0 or isinstance(cls, bool) or (isinstance(cls, float) and cls != number):
            raise ValueError(f"class_weight names class {cls!r}; classes are numbered 0, 1, 2, ...")
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
            raise ValueError(f"class_weight[{cls!r}]={value!r}; a class weight is a number >= 0.")
        named[number] = float(value)
    absent = sorted(set(named) - set(present))
    if absent:
        warnings.warn(
            f"class_weight names class{'es' if len(absent) > 1 else ''} {', '.join(map(str, absent))}, which the "
            f"training labels never have (they have {present}): {'their weights apply' if len(absent) > 1 else 'its weight applies'} "
            "to no training sample. Keras allows this (a rare class may be only in the validation data); check the "
            "class numbering (labels count from 0) if it was not meant.",
            UserWarning,
            stacklevel=2,
        )
    table = torch.ones(max(size, max(named) + 1))
    for number, value in named.items():
        table[number] = value
    if present and not bool(table[present].any()):
        raise ValueError(
            f"class_weight={class_weight!r}: every class weight is 0, so every sample's loss counts 0 and "
            "nothing would be learned. Give the classes positive weights (1.0 is unweighted), or leave "
            "class_weight out."
        )
    return table


def check_one_label_per_sample(labels: torch.Tensor) -> None:
    """class_weight weighs each sample by its one class: one-hot rows have one (their argmax),
    multi-label targets (several ones in a row) have none."""
    one_hot = bool(((labels == 0) | (labels == 1)).all()) and bool((labels.sum(dim=-1) == 1).all())
    if labels.dim() >= 2 and labels[0].numel() > 1 and not one_hot:
        integers = not (labels.is_floating_point() or labels.dtype == torch.bool)
        if integers and (labels.dim() >= 3 or bool((labels > 1).any())):
            # Class ids at every pixel or position (segmentation, tagging): the loss weighs classes itself.
            where = "pixel" if labels.dim() >= 3 else "position"
            raise ValueError(
                f"class_weight weighs each sample by its class, so it needs one label per sample, but the labels "
                f"have shape {tuple(labels.shape)}: a class id for each {where} (segmentation, tagging?). Weight the "
                "classes in the loss instead: KerasModel(net, loss_fn=nn.CrossEntropyLoss(weight=torch.tensor([1.0, "
                "5.0]))), one weight per class in class order, and drop class_weight; or weight whole samples with "
                "sample_weight=..."
            )
        raise ValueError(
            f"class_weight weighs each sample by its class, so it needs one label per sample, but the labels "
            f"have shape {tuple(labels.shape)} (multi-label targets?). Weight the rare tags in the loss instead: "
            "nn.BCEWithLogitsLoss(pos_weight=torch.tensor([...])), one weight per tag; or per sample with "
            "sample_weight=..."
        )


class ClassWeighted:
    """A training loader whose batches carry ``class_weight[label]`` as their sample weights
    (times any sample weights they already have). Works over any loader, sharded or not."""

    def __init__(self, loader: Any, table: torch.Tensor):
        self.loader = loader  # named so that rng.py finds the data order inside
        self.table = table

    def __iter__(self):
        for batch in self.loader:
            plain, weight = split_sample_weight(batch)
            labels = unpack(plain).labels
            class_weight = self.table.to(labels.device)[class_ids(labels, check=False)]
            yield WeightedSample(plain, class_weight if weight is None else weight.reshape(-1) * class_weight)

    def __len__(self) -> int:
        return len(self.loader)


__all__ = [
    "ClassWeighted",
    "check_sample_weight",
    "check_weighted_loss",
    "class_ids",
    "class_weight_table",
    "weighted_loss",
]
