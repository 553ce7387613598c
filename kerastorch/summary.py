"""``summary``: a Keras-like table of a net's layers, output shapes and parameter counts.

Counts are exact: each parameter is counted once however many modules share it or
however often a module is called; parameters that container modules hold themselves
are counted on the container's own row; modules that the forward pass never called
still appear, so the total always equals ``sum(p.numel() for p in net.parameters())``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import pandas as pd
import torch
from torch import nn

from .checkpoint import unwrap


@dataclass
class ModelSummary:
    table: pd.DataFrame
    total_params: int
    trainable_params: int
    non_trainable_params: int
    params_size_mb: float

    def __str__(self) -> str:
        width = 80
        lines = ["-" * width, f"{'Layer (type)':<40}{'Output Shape':<26}{'Param #':>14}", "=" * width]
        for row in self.table.itertuples(index=False):
            lines.append(f"{row.layer:<40.40}{row.output_shape:<26.26}{row.params:>14,}")
        lines += ["=" * width,
                  f"Total params: {self.total_params:,}",
                  f"Trainable params: {self.trainable_params:,}",
                  f"Non-trainable params: {self.non_trainable_params:,}",
                  "-" * width,
                  f"Params size (MB): {self.params_size_mb:.6f}",
                  "-" * width]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"ModelSummary(total_params={self.total_params:,}, trainable_params={self.trainable_params:,}, "
                f"non_trainable_params={self.non_trainable_params:,})")


def _shape_of(output: Any) -> str:
    if isinstance(output, torch.Tensor):
        return str([-1, *output.shape[1:]]) if output.dim() > 0 else "[]"
    if isinstance(output, (list, tuple)):
        return ", ".join(_shape_of(o) for o in output)
    if isinstance(output, dict):
        return ", ".join(f"{k}: {_shape_of(v)}" for k, v in output.items())
    return type(output).__name__


def _own_params(module: nn.Module) -> list[nn.Parameter]:
    return list(module.parameters(recurse=False))


def summary(net_or_model: Any, input_data: Any = None, input_shape: Optional[Sequence[int]] = None,
            print_table: bool = True) -> ModelSummary:
    """Run one forward pass (eval mode, no gradients) and tabulate the layers it went through.

    ``input_data`` is what the net takes: a tensor, a tuple of tensors for a net with
    several inputs, or a dict of keyword inputs. ``input_shape`` is one sample's shape
    without the batch dimension (e.g. ``(1, 28, 28)``); a batch of one zeros is used.

    >>> kt.summary(net, input_shape=(1, 28, 28))       # doctest: +SKIP
    """
    net = unwrap(getattr(net_or_model, "net", net_or_model))
    if not isinstance(net, nn.Module):
        raise TypeError(f"summary takes a net (nn.Module) or a KerasModel; got a {type(net_or_model).__name__}.")
    if input_data is None and input_shape is None:
        raise ValueError("summary needs input_data=... (a batch the net takes) or input_shape=(...) of one sample.")
    params = list(net.parameters())
    device = params[0].device if params else torch.device("cpu")
    if input_data is None:
        dtype = params[0].dtype if params and params[0].is_floating_point() else torch.float32
        input_data = torch.zeros((1, *input_shape), device=device, dtype=dtype)

    names = {module: name for name, module in net.named_modules()}
    rows: list[dict] = []
    counted: set[int] = set()

    def add_row(module: nn.Module, shape: str) -> None:
        own = module.parameters() if not list(module.children()) else _own_params(module)
        new = [p for p in own if id(p) not in counted]
        counted.update(id(p) for p in new)
        name = names.get(module) or type(module).__name__
        rows.append({"layer": f"{name} ({type(module).__name__})" if name != type(module).__name__ else name,
                     "output_shape": shape, "params": sum(p.numel() for p in new)})

    def hook(module, _inputs, output):
        is_leaf = not list(module.children())
        if is_leaf or _own_params(module):
            add_row(module, _shape_of(output))

    handles = [m.register_forward_hook(hook) for m in names if m is not net or not list(net.children())]
    was_training = net.training
    net.eval()
    try:
        with torch.no_grad():
            if isinstance(input_data, dict):
                net(**input_data)
            elif isinstance(input_data, (list, tuple)):
                net(*input_data)
            else:
                net(input_data)
    finally:
        for handle in handles:
            handle.remove()
        net.train(was_training)

    # The root's own parameters, and modules the forward pass never called, are counted too.
    for module in names:
        if any(id(p) not in counted for p in (_own_params(module) if list(module.children()) else module.parameters())):
            add_row(module, "-")

    unique = {id(p): p for p in params}.values()
    total = sum(p.numel() for p in unique)
    trainable = sum(p.numel() for p in unique if p.requires_grad)
    size_mb = sum(p.numel() * p.element_size() for p in unique) / 1024**2
    result = ModelSummary(pd.DataFrame(rows, columns=["layer", "output_shape", "params"]), total, trainable,
                          total - trainable, size_mb)
    if print_table:
        print(result)
    return result
