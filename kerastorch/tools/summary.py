"""``summary``: a Keras-like table of a net's layers, output shapes and parameter counts.

Counts are exact, where simpler tools double count or miss parameters:

- each parameter is counted once, however many modules share it and however often a
  module is called (a second call gets its own row, marked ``(reused)``);
- parameters that a container module holds itself (a class token, a scale) are counted
  on the container's own row;
- modules the forward pass never called still appear, marked ``(not called)``;

so the total always equals ``sum(p.numel() for p in net.parameters())``.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import pandas as pd
import torch
from torch import nn

from ..data.batches import first_tensor
from ..helpers.modes import eval_mode
from ..strategies import unwrap

NOT_CALLED = "(not called)"


@dataclass
class ModelSummary:
    """What :func:`summary` found: the table (a DataFrame) and the totals."""

    table: pd.DataFrame  # columns: layer, output_shape, params, reused
    total_params: int
    trainable_params: int
    non_trainable_params: int
    params_size_mb: float

    def __str__(self) -> str:
        rows = [
            (row.layer, row.output_shape, "(reused)" if row.reused else f"{row.params:,}")
            for row in self.table.itertuples(index=False)
        ]
        header = ("Layer (type)", "Output Shape", "Param #")
        widths = [max([len(header[i]), *(len(r[i]) for r in rows)]) for i in range(3)]
        widths[0], widths[1] = min(widths[0], 60), min(widths[1], 40)
        width = sum(widths) + 4

        def line(cells):
            layer, shape, params = cells
            return (
                f"{_clip(layer, widths[0]):<{widths[0]}}  {_clip(shape, widths[1]):<{widths[1]}}  {params:>{widths[2]}}"
            )

        lines = [
            "-" * width,
            line(header),
            "=" * width,
            *(line(r) for r in rows),
            "=" * width,
            f"Total params: {self.total_params:,}",
            f"Trainable params: {self.trainable_params:,}",
            f"Non-trainable params: {self.non_trainable_params:,}",
            "-" * width,
            f"Params size (MB): {self.params_size_mb:.6f}",
            "-" * width,
        ]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (
            f"ModelSummary(total_params={self.total_params:,}, trainable_params={self.trainable_params:,}, "
            f"non_trainable_params={self.non_trainable_params:,}, params_size_mb={self.params_size_mb:.4f})"
        )


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def summary(
    net_or_model: Any,
    input_data: Any = None,
    input_shape: Optional[Sequence] = None,
    print_table: bool = True,
    *,
    input_data_args: Optional[Sequence] = None,
    input_dtype: Any = None,
    batch_size: Optional[int] = None,
) -> ModelSummary:
    """Run one forward pass (eval mode, no gradients) and tabulate the layers it went through.

    ``input_data`` is what the net takes: a tensor, a tuple of tensors for a net with
    several inputs (``net(*input_data)``), or a dict of keyword inputs (``net(**input_data)``);
    a net whose ``forward`` takes one tuple or one dict gets it whole. ``input_shape`` is
    one sample's shape without the batch dimension (e.g. ``(1, 28, 28)``), or a list of
    shapes for several inputs; a batch of zeros in the net's dtype is used. Output
    shapes show the batch dimension as ``-1``.

    torchkeras's keywords work too: ``input_data_args=(q, k, v)`` is ``input_data`` for a net
    called as ``net(q, k, v)``; ``input_dtype`` (``torch.long``, or torchkeras's
    ``torch.LongTensor``) is the dtype of the zeros made from ``input_shape`` (default: the
    net's); ``batch_size`` is accepted and ignored (the batch shows as ``-1``).

    Prints the table (unless ``print_table=False``) and returns a :class:`ModelSummary`.

    >>> info = kt.summary(create_cnn(), input_shape=(1, 28, 28))      # doctest: +SKIP
    >>> info.total_params                                             # doctest: +SKIP
    53994
    """
    net = unwrap(getattr(net_or_model, "net", net_or_model))
    if input_data_args is not None:
        if input_data is not None:
            raise ValueError("summary takes input_data or input_data_args (another name for it), not both.")
        input_data = tuple(input_data_args)
    if not isinstance(net, nn.Module):
        raise TypeError(f"summary takes a net (nn.Module) or a KerasModel; got a {type(net_or_model).__name__}.")
    if (input_data is None) == (input_shape is None):
        raise ValueError(
            "summary needs exactly one of input_data=... (a batch the net takes, e.g. "
            "next(iter(dl_train))[0]) or input_shape=(...) (one sample's shape, without the batch)."
        )
    params = list(net.parameters())
    made_from_shape = input_data is None
    if input_data is None:
        assert input_shape is not None  # exactly one of the two was given, checked above
        input_data = _zeros_for(input_shape, params, input_dtype)

    names = {module: name for name, module in net.named_modules()}  # shared modules: their first name
    tracked = [m for m in names if _is_leaf(m) or _own_params(m)]
    rows: list[dict] = []
    counted: set[int] = set()
    open_calls: dict[nn.Module, list[int]] = {}

    def add_row(module: nn.Module, shape: str) -> int:
        own = list(module.parameters()) if _is_leaf(module) else _own_params(module)
        new = [p for p in own if id(p) not in counted]
        counted.update(id(p) for p in new)
        reused = any(row["module"] is module for row in rows)
        rows.append(
            {
                "layer": _label(module, names),
                "output_shape": shape,
                "params": sum(p.numel() for p in new),
                "reused": reused and bool(own),
                "module": module,
            }
        )
        return len(rows) - 1

    # A row is opened when a module starts (so rows read in call order, containers above
    # their children) and gets its output shape when the module returns.
    def before(module, _inputs):
        open_calls.setdefault(module, []).append(add_row(module, ""))

    def after(module, _inputs, output):
        rows[open_calls[module].pop()]["output_shape"] = _shape_of(output, batch_size)

    batch_size = _batch_size(input_data)
    handles = [m.register_forward_pre_hook(before) for m in tracked]
    handles += [m.register_forward_hook(after) for m in tracked]
    try:
        with eval_mode(net), torch.no_grad():
            _call(net, input_data)
    except Exception as error:
        made = " made from input_shape (float zeros)" if made_from_shape else ""
        raise RuntimeError(
            f"summary could not run {type(net).__name__} on the input{made}: {_describe(input_data)}. "
            f"The net raised {type(error).__name__}: {error}\nPass input_data= a real batch the net takes, e.g. "
            "next(iter(dl_train))[0] (a tuple or a dict for several inputs; integer ids for an Embedding)."
        ) from error
    finally:
        for handle in handles:
            handle.remove()

    for module in tracked:  # modules the forward pass never called
        own = list(module.parameters()) if _is_leaf(module) else _own_params(module)
        if any(id(p) not in counted for p in own):
            add_row(module, NOT_CALLED)

    unique = list({id(p): p for p in params}.values())
    total = sum(p.numel() for p in unique)
    trainable = sum(p.numel() for p in unique if p.requires_grad)
    size_mb = sum(p.numel() * p.element_size() for p in unique) / 1024**2
    table = pd.DataFrame(rows, columns=["layer", "output_shape", "params", "reused", "module"]).drop(columns="module")
    result = ModelSummary(table, total, trainable, total - trainable, size_mb)
    if print_table:
        print(result)
    return result


def _is_leaf(module: nn.Module) -> bool:
    return next(module.children(), None) is None


def _own_params(module: nn.Module) -> list[nn.Parameter]:
    return list(module.parameters(recurse=False))


def _label(module: nn.Module, names: dict) -> str:
    kind = type(module).__name__
    name = names.get(module, "")
    return f"{name} ({kind})" if name else kind


def _zeros_for(input_shape: Sequence, params: list, input_dtype: Any = None) -> Any:
    device = params[0].device if params else torch.device("cpu")
    dtype = next((p.dtype for p in params if p.is_floating_point()), torch.float32)
    if isinstance(input_dtype, torch.dtype):
        dtype = input_dtype
    elif input_dtype is not None:  # tensor types are accepted too: torch.FloatTensor, torch.LongTensor
        dtype = torch.zeros(0).type(input_dtype).dtype
    shapes = list(input_shape)
    if shapes and all(isinstance(s, (list, tuple, torch.Size)) for s in shapes):  # several inputs
        return tuple(torch.zeros((1, *s), device=device, dtype=dtype) for s in shapes)
    if not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in shapes):
        raise ValueError(
            f"input_shape={input_shape!r} must be one sample's shape, like (1, 28, 28), "
            "or a list of such shapes for a net with several inputs."
        )
    return torch.zeros((1, *shapes), device=device, dtype=dtype)


def _call(net: nn.Module, input_data: Any) -> Any:
    """Call the net the way its ``forward`` expects ``input_data``."""
    try:
        parameters = list(inspect.signature(net.forward).parameters.values())
    except (TypeError, ValueError):
        parameters = None
    if isinstance(input_data, dict):
        if parameters is None or _takes_keywords(parameters, input_data):
            return net(**input_data)
        return net(input_data)
    if isinstance(input_data, (list, tuple)):
        if parameters is not None and len(input_data) > 1 and _positional_slots(parameters) == 1:
            return net(input_data)  # forward(self, batch) that unpacks a tuple itself
        return net(*input_data)
    return net(input_data)


def _takes_keywords(parameters: list, data: dict) -> bool:
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return True
    names = {
        p.name
        for p in parameters
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    }
    return set(data) <= names


def _positional_slots(parameters: list) -> float:
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in parameters):
        return float("inf")
    return sum(
        p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD) for p in parameters
    )


def _batch_size(input_data: Any) -> Optional[int]:
    first = first_tensor(input_data)
    return int(first.shape[0]) if first is not None and first.dim() > 0 else None


def _shape_of(output: Any, batch_size: Optional[int]) -> str:
    if isinstance(output, torch.Tensor):
        dims = list(output.shape)
        if dims and dims[0] == batch_size:
            dims[0] = -1
        return str(dims)
    if isinstance(output, (list, tuple)):
        return "(" + ", ".join(_shape_of(o, batch_size) for o in output) + ")"
    if isinstance(output, dict):
        return "{" + ", ".join(f"{k}: {_shape_of(v, batch_size)}" for k, v in output.items()) + "}"
    return type(output).__name__


def _describe(input_data: Any) -> str:
    if isinstance(input_data, torch.Tensor):
        return f"a {input_data.dtype} tensor of shape {list(input_data.shape)}"
    if isinstance(input_data, dict):
        return "a dict with " + ", ".join(f"{k}: {_describe(v)}" for k, v in input_data.items())
    if isinstance(input_data, (list, tuple)):
        return f"a {type(input_data).__name__} of " + ", ".join(_describe(v) for v in input_data)
    return f"a {type(input_data).__name__}"


__all__ = ["summary", "ModelSummary"]
