"""Putting the user's net, loss and optimizer state on the run's device, in the run's dtype.

The ``*-true`` precisions convert the net (``64-true`` trains in float64). The other
precisions train float32 weights: a net that is wholly in another floating dtype (left
so by an earlier ``fit(precision="64-true")``, or ``.double()``-ed by hand) is brought
back to float32, since autocast leaves float64 alone and a grad scaler refuses
half-precision gradients. The optimizer's state follows its parameters, so a second
``fit`` with another precision or device continues where the first stopped.
"""

from __future__ import annotations

import itertools
import warnings
from typing import Any, Optional

import torch
from torch import nn

from .runtime import Runtime, uniform_floating_dtype
from .words import TRUE_PRECISION_OF


def place_model(
    net: nn.Module, loss_fn: Any, optimizer: Optional[torch.optim.Optimizer], runtime: Runtime, move_net: bool = True
) -> None:
    """Move ``net`` (and a module ``loss_fn``) to the runtime's device and dtype, and the optimizer's state with them.

    When the net has to be brought back to float32, ``runtime.param_dtype`` becomes
    float32, so that floating inputs are cast to match. ``move_net=False`` changes only
    the dtype (for a net whose pieces the user placed on several devices).
    """
    target = runtime.param_dtype
    current = uniform_floating_dtype(net)
    if target is None and current not in (None, torch.float32):
        name = str(current).replace("torch.", "")
        warnings.warn(
            f"The net's weights are {name}; precision={runtime.precision!r} trains float32 weights, so they are "
            f"converted to float32. Pass precision='{TRUE_PRECISION_OF.get(current, '32-true')}' to train in {name}.",
            UserWarning,
            stacklevel=4,
        )
        target = torch.float32
        runtime.set_param_dtype(target)  # float64 inputs are cast too, so the converted net can take them
    device = runtime.device if move_net else None
    if not is_placed(net, device, target):
        net.to(device=device, dtype=target)
    if isinstance(loss_fn, nn.Module) and not is_placed(loss_fn, runtime.device, target):
        loss_fn.to(device=runtime.device, dtype=target)  # a class-weight tensor must match the outputs' dtype
    if optimizer is not None:
        match_optimizer_state(optimizer)
        if target == torch.float16:
            warn_if_eps_vanishes(optimizer)


def is_placed(module: nn.Module, device: Optional[torch.device], dtype: Optional[torch.dtype]) -> bool:
    """Every parameter and buffer of ``module`` on ``device`` already and, when floating, of ``dtype``:
    ``module.to(device, dtype)`` would change nothing. (Checked first because ``to`` walks every
    module and tensor whatever it finds, which a second ``fit`` of the same net would pay again.)"""
    for tensor in itertools.chain(module.parameters(), module.buffers()):
        if tensor.is_complex() or (device is not None and tensor.device != device):
            return False
        if dtype is not None and tensor.is_floating_point() and tensor.dtype != dtype:
            return False
    return True


def warn_if_eps_vanishes(optimizer: torch.optim.Optimizer) -> None:
    """Adam's default ``eps=1e-8`` is 0 in float16: a parameter whose gradient is zero gets 0/0 = NaN."""
    for group in optimizer.param_groups:
        eps = group.get("eps")
        if isinstance(eps, float) and eps > 0 and torch.tensor(eps, dtype=torch.float16).item() == 0:
            warnings.warn(
                f"precision='16-true' with {type(optimizer).__name__}(eps={eps}): float16 rounds eps to 0, so updates "
                "can divide by zero and the loss becomes NaN. Use eps=1e-4, or precision='16-mixed' (float32 "
                "weights) or 'bf16-true'.",
                UserWarning,
                stacklevel=5,
            )
            return


def match_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Give each parameter's optimizer state (Adam's moments ...) the parameter's device and dtype.

    ``net.to(...)`` changes the parameters in place but not the optimizer's state; the
    next step would fail on mixed dtypes. ``step`` counters stay as they are, as torch's
    own ``load_state_dict`` leaves them.
    """
    for param, state in optimizer.state.items():
        for key, value in state.items():
            if key == "step" or not isinstance(value, torch.Tensor) or not value.is_floating_point():
                continue
            if value.dtype != param.dtype or value.device != param.device:
                state[key] = value.to(device=param.device, dtype=param.dtype)


def place_parts(model: Any, runtime: Runtime) -> None:
    """The model's net and loss on the run's device and dtype; a model-parallel net keeps its pieces' devices."""
    moves_net = runtime.strategy.moves_net  # False: the user placed the net's pieces, only their dtype may change
    place_model(model.net, model.loss_fn, model.optimizer, runtime, move_net=moves_net)
    if not moves_net and isinstance(model.loss_fn, nn.Module):
        model.loss_fn.to(runtime.outputs_device)  # the loss meets the outputs where they come out
