"""How a batch from the user's DataLoader becomes ``net(...)`` inputs, labels and sample weights:
:func:`unpack` is the one reading of a batch that fit, evaluate, the checks and the tools share."""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import torch
from accelerate.utils import concatenate, recursively_apply

LABEL_KEYS = ("labels", "label", "y")
SAMPLE_WEIGHT_KEY = "sample_weight"  # per-sample weights in a dict batch

EXPECTED_BATCHES = (
    "a tuple (x, y), a tuple (x1, ..., xn, y) for a net with n inputs, "
    f"or a dict with one of the keys {', '.join(repr(k) for k in LABEL_KEYS)} for the labels "
    "and the net's keyword arguments as the other keys"
)


class BatchError(ValueError):
    """A batch that kerastorch cannot split into inputs and labels."""


def _describe(batch: Any) -> str:
    if isinstance(batch, torch.Tensor):
        return f"a bare tensor of shape {tuple(batch.shape)}"
    if isinstance(batch, dict):
        return f"a dict with keys {sorted(map(str, batch))}"
    if isinstance(batch, (list, tuple)):
        return f"a {type(batch).__name__} of length {len(batch)}"
    return f"a {type(batch).__name__}"


def split_batch(batch: Any) -> tuple[tuple, dict, Any]:
    """Return ``(args, kwargs, labels)`` so that the net is called as ``net(*args, **kwargs)``."""
    if isinstance(batch, dict):
        for key in LABEL_KEYS:
            if key in batch:
                kwargs = {k: v for k, v in batch.items() if k != key}
                return (), kwargs, batch[key]
    elif isinstance(batch, (list, tuple)) and len(batch) >= 2:
        return tuple(batch[:-1]), {}, batch[-1]
    raise BatchError(
        f"Got {_describe(batch)} as a batch, which has no labels. kerastorch expects {EXPECTED_BATCHES}. "
        "Make your Dataset return (features, label), or override KerasModel.forward_batch for another layout."
    )


def split_inputs(batch: Any) -> tuple[tuple, dict]:
    """Inputs only, for ``predict``: labels, if the batch has them, are dropped.

    A bare tensor, a 1-tuple or a dict without a label key is all inputs. A tuple of
    two or more is read as fit reads it, the last item being the labels; a net with
    several inputs and no labels should get a dict. Sample weights are dropped too.
    """
    if isinstance(batch, torch.Tensor):
        return (batch,), {}
    batch, _ = split_sample_weight(batch)
    if isinstance(batch, Inputs):
        return tuple(batch.args), {}
    if isinstance(batch, dict):
        return (), {k: v for k, v in batch.items() if k not in LABEL_KEYS}
    if isinstance(batch, (list, tuple)):
        if len(batch) == 1:
            return (batch[0],), {}
        return tuple(batch[:-1]), {}
    raise BatchError(
        f"Got {_describe(batch)} as a batch for predict; expected a tensor of inputs or {EXPECTED_BATCHES}."
    )


def batch_size_of(labels: Any, preds: Any) -> int:
    """Number of samples in a batch, read from shapes only (no device sync)."""
    for obj in (labels, preds):
        tensor = first_tensor(obj)
        if tensor is not None and tensor.dim() > 0:
            return tensor.shape[0]
    if isinstance(labels, (list, tuple)):
        return len(labels)
    return 1


def first_tensor(obj: Any):
    if isinstance(obj, torch.Tensor):
        return obj
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, (list, tuple)):
        for item in obj:
            found = first_tensor(item)
            if found is not None:
                return found
    return None


# Nested outputs (tuples, lists, namedtuples, dicts and their subclasses) are walked
# with accelerate's recursively_apply, which rebuilds each container as its own type.


def detach(outputs: Any) -> Any:
    """``outputs`` with every tensor detached from the graph (the common bare tensor first: it runs every step)."""
    if isinstance(outputs, torch.Tensor):
        return outputs.detach()
    return recursively_apply(torch.Tensor.detach, outputs)


def _host_copy(tensor: torch.Tensor) -> torch.Tensor:
    out = tensor.detach().to("cpu")
    if out.dtype in (torch.float16, torch.bfloat16):
        out = out.float()  # what every consumer of predictions accepts
    return out.reshape(1) if out.dim() == 0 else out  # a scalar per batch concatenates to one per batch


def to_host(outputs: Any) -> Any:
    """``outputs`` copied to the CPU, half precision as float32, scalars as one-element tensors."""
    return recursively_apply(_host_copy, outputs)


def concatenate_batches(outputs: list) -> Any:
    """One structure of the batches' outputs, concatenated along the first dimension."""
    return concatenate(outputs)


class Inputs(NamedTuple):
    """Several inputs of the net and no labels: what ``predict([X1, X2])``'s loader yields (Keras's
    rule: predict has no labels, every array is an input). The default collate keeps the type."""

    args: tuple


class WeightedSample(NamedTuple):
    """A batch (or sample) with per-sample weights: what kerastorch's own loaders yield when
    ``fit`` is given ``sample_weight`` or ``class_weight``. The default collate keeps the
    type, so a batch of these is one of these with batched fields."""

    sample: Any
    weight: torch.Tensor


def split_sample_weight(batch: Any) -> tuple[Any, Optional[torch.Tensor]]:
    """``(batch without weights, weights or None)``: a :class:`WeightedSample`, or a dict with a
    ``sample_weight`` key (the dict-batch way of giving weights)."""
    if isinstance(batch, WeightedSample):
        return batch.sample, batch.weight
    if isinstance(batch, dict) and SAMPLE_WEIGHT_KEY in batch:
        return {k: v for k, v in batch.items() if k != SAMPLE_WEIGHT_KEY}, batch[SAMPLE_WEIGHT_KEY]
    return batch, None


def labels_to_outputs(labels: Any, preds: Any) -> Any:
    """Tensor labels on the device of the net's output (a no-op when they share one, as they do
    unless the net's pieces sit on several devices)."""
    if not isinstance(labels, torch.Tensor):
        return labels
    if isinstance(preds, torch.Tensor) and preds.device == labels.device:
        return labels  # the common case, checked first: it runs every step
    out = first_tensor(preds)
    if out is None or labels.device == out.device:
        return labels
    return labels.to(out.device, non_blocking=True)


class Unpacked(NamedTuple):
    """A batch as kerastorch reads it: the net is called ``net(*args, **kwargs)``; ``labels`` go to the
    loss and the metrics; ``weight`` holds the samples' weights (None without any)."""

    args: tuple
    kwargs: dict
    labels: Any
    weight: Optional[torch.Tensor]


def unpack(batch: Any) -> Unpacked:
    """Read a batch: ``(x, y)``, ``(x1, ..., xn, y)`` or a dict with a labels key, with sample weights
    (a :class:`WeightedSample`, or a ``sample_weight`` key) or without.

    >>> unpack((torch.zeros(2, 3), torch.tensor([0, 1]))).labels
    tensor([0, 1])
    """
    plain, weight = split_sample_weight(batch)
    args, kwargs, labels = split_batch(plain)
    return Unpacked(args, kwargs, labels, weight)
