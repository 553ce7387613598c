"""What a failed first batch usually means, and the fix to try: the hints the first-batch checks
(:mod:`~kerastorch.training.first_batch`) add to torch's error, and the one check of shapes that torch
does not make (a regression loss whose outputs and labels broadcast into each other)."""

from __future__ import annotations

import inspect
import re
from collections.abc import Mapping
from typing import Any, Optional

import torch

from ..data.batches import BatchError, describe_reading, unpack
from ..data.forms import holds_arrays
from ..strategies import unwrap

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


def first_batch_hint(model: Any, batch: Any, error: Optional[Exception] = None, culprit: Any = None) -> str:
    """How kerastorch read the batch, and what usually causes a first batch to fail when the batch (and
    torch's ``error``) shows it: the fix to try. The hint about where the labels are comes only when no
    other cause shows and the batch's layout could be the cause (:func:`_layout_may_be_wrong`)."""
    if batch is None:
        return ""
    labels_at = getattr(model, "labels_at", None)
    try:
        args, kwargs, labels, weights_given = unpack(batch, labels_at)
    except BatchError:
        return ""
    labels_to_net = getattr(model, "loss_fn", None) is None and isinstance(batch, Mapping)
    one_dict = getattr(model, "inputs_as", "keywords") == "dict"
    said = f" kerastorch called {describe_reading(batch, labels_at, labels_to_net, one_dict)}."
    inputs = [t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor)]
    weights = [p for p in model.net.parameters() if p.is_floating_point()]
    if weights and any(t.dtype == torch.float64 for t in inputs) and weights[0].dtype == torch.float32:
        return said + (
            " The inputs are float64 but the net's weights are float32: convert the data, X.float() for tensors "
            "or X.astype('float32') for NumPy, or train in float64 with precision='64-true'."
        )
    text = str(error) if error is not None else ""
    if any(holds_arrays(value) for value in (*args, *kwargs.values())):
        return said + (
            " The batch holds NumPy arrays, which the net cannot take. kerastorch makes them tensors in a Python list "
            "of batches, but other iterables' batches go to the net as they are: yield tensors "
            "(torch.from_numpy(x)), pass list(batches), or pass the arrays themselves: fit(X, y)."
        )
    integer_inputs = _integer_inputs_hint(model.net, inputs, weights, labels, text)
    if integer_inputs:
        return said + integer_inputs
    class_labels = _class_labels_hint(getattr(model, "loss_fn", None), labels, text)
    if class_labels:
        return said + class_labels
    if isinstance(labels, (list, tuple)) and labels and isinstance(labels[0], str):
        return said + (
            f" The labels are strings ({labels[0]!r}, ...): map them to integers first, e.g. "
            "classes = sorted(set(labels)); y = [classes.index(c) for c in labels]."
        )
    if weights_given is not None and labels_at is None and len(args) == 1 and not kwargs:
        return said + (
            " The weights come from sample_weight= or from the third array of a tuple, which is read as Keras reads "
            "it: (x, y, sample_weight). If that tuple's second array is an input of the net, not its labels, group "
            "the inputs: fit(((X1, X2), y)) or fit((X1, X2), y)."
        )
    if not _layout_may_be_wrong(batch, args, kwargs, labels, text, culprit):
        return said
    if isinstance(batch, (list, tuple)) and len(batch) >= 2:
        where = "first" if labels_at is None else "at another place"
        example = 0 if labels_at is None else "<their position>"
        return said + (
            f" If the labels are not batch[{len(batch) - 1 if labels_at is None else labels_at}] (a collate_fn that "
            f"returns (labels, text, offsets) puts them {where}), say where they are: "
            f"KerasModel(..., labels_at={example}); predict reads batches the same way. For any other layout "
            "override forward_batch (and predict_batch)."
        )
    if isinstance(batch, Mapping):
        return said + _dict_batch_hint(model.net, labels_at, one_dict)
    return said


def _dict_batch_hint(net: torch.nn.Module, labels_at: Any, one_dict: bool) -> str:
    """The net refused a dict batch's inputs: as keywords when its forward takes one argument (or as one
    dict when it takes several), else the labels may be under another key than kerastorch read."""
    try:
        parameters = list(inspect.signature(unwrap(net).forward).parameters.values())
    except (TypeError, ValueError):
        parameters = []
    named = [p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(named) != len(parameters):  # *args or **kwargs: the forward does not say what it takes
        named = []
    if not one_dict and len(named) == 1:
        return (
            f" The net's forward takes one argument, {named[0]}: to give it the inputs as one dict, say so: "
            "KerasModel(..., inputs_as='dict'); predict reads batches the same way."
        )
    if one_dict and len(named) > 1:
        return (
            f" With inputs_as='dict' the net gets the inputs as one dict, but its forward takes {', '.join(named)}: "
            "drop inputs_as to give them as keyword arguments."
        )
    if labels_at is None:
        return (
            " If the labels are under another key, say which: KerasModel(..., labels_at='target'); predict reads "
            "batches the same way. For any other layout override forward_batch (and predict_batch)."
        )
    takes = f"The net's forward takes {', '.join(named)}" if named else "The net refused them"
    return (
        f" {takes}: name the batch's inputs as its arguments, or override forward_batch (and predict_batch) for "
        "another layout."
    )


def _layout_may_be_wrong(batch: Any, args: tuple, kwargs: dict, labels: Any, text: str, culprit: Any) -> bool:
    """Whether reading the batch another way could fix the failure: the net got something that looks
    like labels (a 1-d integer tensor), or a batch of three or more items (which is the labels?), or a
    dict whose keys the net refused as keyword arguments; or the loss got labels whose first dimension
    is not the inputs'. A failure inside the net on inputs that look like features is the net's own."""
    inputs = [value for value in (*args, *kwargs.values()) if isinstance(value, torch.Tensor)]
    if culprit is not None and not culprit.net_entered:
        return True
    if isinstance(batch, Mapping):
        return "keyword argument" in text or "positional argument" in text
    if isinstance(batch, (list, tuple)) and len(batch) >= 3:
        return True
    if any(t.dim() == 1 and not (t.is_floating_point() or t.is_complex()) for t in inputs):
        return True  # an input that looks like class ids: are the labels first?
    if culprit is not None and culprit.in_net:
        return False
    rows = {t.shape[0] for t in inputs if t.dim() > 0}
    return isinstance(labels, torch.Tensor) and labels.dim() > 0 and bool(rows) and labels.shape[0] not in rows


CLASS_ID_LOSSES = (torch.nn.CrossEntropyLoss, torch.nn.NLLLoss)
INTEGER_TYPE_WORDS = re.compile(r"dtype|type|Long|Int|Short|Char|Byte|Bool")


def _class_labels_hint(loss_fn: Any, labels: Any, text: str) -> str:
    """CrossEntropyLoss or NLLLoss refused the labels (torch's message is about the target): float or bool
    class ids (a CSV column read as 0.0/1.0), or one id per row of shape (N, 1). Empty when neither shows."""
    if not (isinstance(loss_fn, CLASS_ID_LOSSES) and isinstance(labels, torch.Tensor) and "target" in text):
        return ""
    loss = type(loss_fn).__name__
    shape = tuple(labels.shape)
    extra_dim = labels.dim() >= 2 and labels.shape[1] == 1
    not_ids = labels.is_floating_point() or labels.dtype == torch.bool
    dtype = str(labels.dtype).replace("torch.", "")
    if extra_dim:
        flat = (shape[0],) if labels.dim() == 2 else (shape[0], *shape[2:])
        cast = " and cast them to int64: y.squeeze(1).long() (NumPy: .astype('int64'))" if not_ids else ""
        each = "sample" if labels.dim() == 2 else "pixel"
        return (
            f" The labels have shape {shape}, but {loss} takes one class id per {each}, shape {flat}: drop the "
            f"dimension of size 1, y.squeeze(1) (tensors, NumPy and pandas alike){cast}."
        )
    if labels.dtype == torch.bool:
        return (
            f" The labels are bool (True/False), but {loss} takes class ids as int64: cast them, y.long() for "
            "tensors or y.astype('int64') for NumPy and pandas."
        )
    if labels.is_floating_point():
        seen = ", ".join(str(v) for v in labels.detach().flatten()[:1000].unique()[:3].tolist())
        if bool((labels == labels.round()).all()):
            return (
                f" The labels are {dtype} class ids ({seen}, ...; a CSV column read as floats?), but {loss} takes "
                "class ids as int64: cast them, y.long() for tensors or y.astype('int64') for NumPy and pandas. "
                "(Float labels are read as class probabilities only when they have the outputs' shape, (N, C).)"
            )
        return (
            f" The labels are {dtype} numbers that are not whole ({seen}, ...), but {loss} takes class ids "
            "(int64, shape (N,)) or class probabilities of the outputs' shape (N, C). For a regression target use "
            "a regression loss, e.g. nn.MSELoss(), with a net of one output per target."
        )
    return ""


def _integer_inputs_hint(net: Any, inputs: list, weights: list, labels: Any, text: str) -> str:
    """Integer inputs into a float net whose first layer is not an embedding (torch's message is about a
    dtype): the features are to be made float. Empty when that does not show."""
    integers = [t for t in inputs if not (t.is_floating_point() or t.is_complex())]
    if not (integers and weights and weights[0].is_floating_point() and INTEGER_TYPE_WORDS.search(text)):
        return ""
    first = next((m for m in net.modules() if any(True for _ in m.parameters(recurse=False))), None)
    if isinstance(first, (torch.nn.Embedding, torch.nn.EmbeddingBag)):
        return ""  # token ids: integers are right, and something else failed
    if isinstance(labels, torch.Tensor) and labels.is_floating_point() and labels.dim() > integers[0].dim():
        return ""  # the batch looks swapped, (labels, features): the hint about labels_at fits better
    dtype = str(integers[0].dtype).replace("torch.", "")
    weight_dtype = str(weights[0].dtype).replace("torch.", "")
    return (
        f" The inputs are {dtype} but the net's weights are {weight_dtype}: convert the features to float, "
        "X.float() for tensors or X.astype('float32') for NumPy and pandas. (Integer inputs are right for a net "
        "that starts with nn.Embedding, token ids.)"
    )


__all__ = ["broadcast_mismatch", "first_batch_hint"]
