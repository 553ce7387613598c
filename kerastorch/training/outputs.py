"""What a net returns, read: a tensor (the predictions), or an object with a ``loss`` field,
whose ``loss`` is the net's own loss and whose ``logits`` (or first other tensor field) are the
predictions.

Hugging Face models return such an object (a ``ModelOutput``: a dataclass that is also a dict,
whose ``loss`` is set when they are given ``labels``); so may any net, as a dataclass, a named
tuple or a dict with a ``loss`` key. It is found by its fields, never by its class: ``import
kerastorch`` does not import transformers. Other structures (a tuple, a dict of outputs) reach the
loss, the metrics and ``predict`` as they are.

>>> import torch
>>> output = {"loss": torch.tensor(0.5), "logits": torch.zeros(4, 2)}
>>> own_loss(output), predictions_of(output).shape
(tensor(0.5000), torch.Size([4, 2]))
>>> predictions_of(torch.zeros(3)) is not None, own_loss(torch.zeros(3))
(True, None)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Iterator, Optional

import torch

LOSS_FIELD = "loss"  # the net's own loss (Hugging Face's name)
PREDICTIONS_FIELD = "logits"  # the predictions, when the output has them under this name


class NoLossError(ValueError):
    """No ``loss_fn``, and the net's output carries no loss of its own."""


def has_fields(output: Any) -> bool:
    """An output that carries a loss of its own, read by its fields: a mapping with a ``loss`` key, or an
    object (a dataclass, a named tuple, a ``ModelOutput``, whose ``loss`` is None without labels) with a
    ``loss`` attribute. Anything else (tensors, tuples, dicts, named tuples of predictions) is the net's
    output as it is, handed to the loss, the metrics and ``predict`` unchanged."""
    if isinstance(output, torch.Tensor):
        return False
    if isinstance(output, Mapping) and LOSS_FIELD in output:
        return True
    try:
        return hasattr(output, LOSS_FIELD)
    except Exception:  # a mapping whose __getattr__ raises KeyError for a missing key
        return False


def field(output: Any, name: str) -> Any:
    """The field ``name`` of an output with fields (None when absent)."""
    if isinstance(output, Mapping):
        return output.get(name)
    return getattr(output, name, None)


def fields_of(output: Any) -> Iterator[tuple[str, Any]]:
    """The named fields of an output, in their order."""
    if isinstance(output, Mapping):
        yield from output.items()
    elif dataclasses.is_dataclass(output) and not isinstance(output, type):
        for item in dataclasses.fields(output):
            yield item.name, getattr(output, item.name)
    elif hasattr(output, "_asdict"):  # a named tuple
        yield from output._asdict().items()
    else:
        yield from vars(output).items()


def own_loss(output: Any) -> Optional[torch.Tensor]:
    """The loss the net computed itself (``output.loss``), or None."""
    if not has_fields(output):
        return None
    loss = field(output, LOSS_FIELD)
    return loss if isinstance(loss, torch.Tensor) else None


def predictions_of(output: Any) -> Any:
    """What the metrics and ``predict`` get from the net's output: the output itself, or, for an
    output with fields, its ``logits`` (else its first tensor field besides the loss)."""
    if isinstance(output, torch.Tensor) or not has_fields(output):
        return output
    logits = field(output, PREDICTIONS_FIELD)
    if isinstance(logits, torch.Tensor):
        return logits
    for name, value in fields_of(output):
        if name != LOSS_FIELD and isinstance(value, torch.Tensor):
            return value
    raise ValueError(
        f"The net returned {describe_output(output)}, with no tensor besides its loss to use as predictions. "
        "Return the predictions too (as a 'logits' field), or override forward_batch and predict_batch."
    )


def describe_output(output: Any) -> str:
    """An output in a few words: ``a SequenceClassifierOutput with loss, logits``.

    >>> describe_output({"loss": None, "logits": torch.zeros(2)}), describe_output(torch.zeros(2, 3))
    ('a dict with logits', 'a tensor of shape (2, 3)')
    """
    if isinstance(output, torch.Tensor):
        return f"a tensor of shape {tuple(output.shape)}"
    if has_fields(output):
        names = [name for name, value in fields_of(output) if value is not None]
        return f"a {type(output).__name__} with {', '.join(names)}"
    return f"a {type(output).__name__}"


__all__ = ["NoLossError", "describe_output", "has_fields", "own_loss", "predictions_of"]
