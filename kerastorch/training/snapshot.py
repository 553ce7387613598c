"""Everything a trial run could change, captured and put back exactly.

``lr_find`` trains for a few dozen steps to learn something about the model and then
leaves it as it found it: the parameters and every buffer (``persistent=False`` ones too,
which a ``state_dict`` leaves out) of the net and of the loss when it is a module (a
learned temperature, a running count), with their device, any other tensor the optimizer
updates, ``requires_grad`` flags, gradients and train/eval mode, the optimizer's state and
hyper-parameters (its learning rates), the scheduler, every random number generator with
the loaders' shuffle order (:mod:`kerastorch.helpers.rng`, the same capture that
``resume=True`` saves), and the worker processes of a ``persistent_workers=True`` loader
that had none before. So ``lr_find`` followed by ``fit`` gives the history ``fit`` alone gives.

Example::

    with training_snapshot(model, [dl_train]):
        ...  # train, change the learning rate, draw random numbers
    # the model, the optimizer, the scheduler and every RNG are as before the block
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Mapping
from typing import Any, Iterable, Iterator

import torch
from torch import nn

from ..data.peek import workers_as_they_were
from ..helpers.rng import capture_rng_state, restore_rng_state
from ..strategies import unwrap

# The objects whose state a training state keeps when the model holds them as attributes.
STATEFUL_TYPES = (
    torch.optim.Optimizer,
    torch.optim.lr_scheduler.LRScheduler,
    torch.optim.lr_scheduler.ReduceLROnPlateau,
    torch.amp.GradScaler,
)


@contextlib.contextmanager
def training_snapshot(model: Any, loaders: Iterable[Any] = ()) -> Iterator[None]:
    """Capture the model's training state on entry and restore it on exit, also after an error."""
    loaders = list(loaders)
    tensors = TensorSnapshot(trained_tensors(model))
    modes = {module: module.training for root in trained_modules(model) for module in root.modules()}
    optimizer_state = copy.deepcopy(model.optimizer.state_dict())
    scheduler = model.lr_scheduler
    scheduler_state = copy.deepcopy(scheduler.state_dict()) if scheduler is not None else None
    rng_state = capture_rng_state(loaders)
    try:
        with workers_as_they_were(loaders):
            yield
    finally:
        tensors.restore()
        for module, training in modes.items():
            module.training = training
        model.optimizer.load_state_dict(optimizer_state)
        if scheduler is not None:
            scheduler.load_state_dict(scheduler_state)
        restore_rng_state(rng_state, loaders)


def trained_modules(model: Any) -> list[nn.Module]:
    """The modules a training step runs and may change: the bare net, and the loss when it is a module."""
    modules = [unwrap(model.net)]
    if isinstance(model.loss_fn, nn.Module):
        modules.append(model.loss_fn)
    return modules


def trained_tensors(model: Any) -> list[torch.Tensor]:
    """Every tensor a training step may change: the parameters and buffers of :func:`trained_modules`
    (all of them, not only the ``state_dict``'s), then whatever else the optimizer updates."""
    found: dict[int, torch.Tensor] = {}
    for module in trained_modules(model):
        for tensor in (*module.parameters(), *module.buffers()):
            found.setdefault(id(tensor), tensor)
    for group in model.optimizer.param_groups:
        for tensor in group["params"]:
            found.setdefault(id(tensor), tensor)
    return list(found.values())


class TensorSnapshot:
    """Copies of tensors (values, device, dtype; for parameters ``requires_grad`` and the gradient),
    put back into the same tensor objects by :meth:`restore`."""

    def __init__(self, tensors: list[torch.Tensor]):
        self.saved = [
            (
                tensor,
                tensor.detach().clone(),
                tensor.device,
                tensor.dtype,
                tensor.requires_grad,
                tensor.grad.detach().clone() if tensor.grad is not None else None,
            )
            for tensor in tensors
        ]

    def restore(self) -> None:
        with torch.no_grad():
            for tensor, value, device, dtype, requires_grad, grad in self.saved:
                if tensor.device != device or tensor.dtype != dtype:  # moved or cast by the trial: move back
                    tensor.data = tensor.data.to(device=device, dtype=dtype)
                tensor.copy_(value)
                if tensor.is_leaf:
                    tensor.requires_grad_(requires_grad)
                    tensor.grad = grad


def model_attributes(model: Any) -> dict[str, Any]:
    """The optimizers, schedulers and grad scalers the model holds as attributes, besides fit's own,
    by name: ``{"d_optimizer": Adam(...), "optimizers[1]": SGD(...)}``. Each object once (the first
    name that holds it), in the order the attributes were set."""
    fits = [model.optimizer, model.lr_scheduler, grad_scaler(model)]
    found: dict[str, Any] = {}
    for name, value in _attributes_and_items(model):
        if isinstance(value, STATEFUL_TYPES) and not any(value is seen for seen in [*fits, *found.values()]):
            found[name] = value
    return found


def _attributes_and_items(model: Any) -> Iterator[tuple[str, Any]]:
    for name, value in vars(model).items():
        if isinstance(value, (list, tuple)):
            yield from ((f"{name}[{i}]", item) for i, item in enumerate(value))
        elif isinstance(value, Mapping):
            yield from ((f"{name}[{key!r}]", item) for key, item in value.items())
        else:
            yield name, value


def grad_scaler(model: Any) -> Any:
    """fit's grad scaler (``precision="16-mixed"`` on CUDA), or None."""
    return getattr(getattr(model, "runtime", None), "scaler", None)


__all__ = [
    "STATEFUL_TYPES",
    "TensorSnapshot",
    "grad_scaler",
    "model_attributes",
    "trained_modules",
    "trained_tensors",
    "training_snapshot",
]
