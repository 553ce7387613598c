"""Everything a trial run could change, captured and put back exactly.

``lr_find`` trains for a few dozen steps to learn something about the model and then
leaves it as it found it: the net's weights and buffers (and their device),
``requires_grad`` flags, gradients and train/eval mode, the optimizer's state and
hyper-parameters (its learning rates), the scheduler, and every random number generator
with the loaders' shuffle order (:mod:`kerastorch.training.rng`, the same capture that
``resume=True`` saves). So ``lr_find`` followed by ``fit`` gives the history ``fit`` alone gives.

Example::

    with training_snapshot(model, [dl_train]):
        ...  # train, change the learning rate, draw random numbers
    # the model, the optimizer, the scheduler and every RNG are as before the block
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any, Iterable, Iterator

import torch

from ..strategies import unwrap
from ..training.rng import capture_rng_state, restore_rng_state


@contextlib.contextmanager
def training_snapshot(model: Any, loaders: Iterable[Any] = ()) -> Iterator[None]:
    """Capture the model's training state on entry and restore it on exit, also after an error."""
    loaders = list(loaders)
    net = unwrap(model.net)
    tensors = {name: tensor.detach().clone() for name, tensor in net.state_dict(keep_vars=True).items()}
    places = {name: (tensor.device, tensor.dtype) for name, tensor in net.state_dict(keep_vars=True).items()}
    parameters = dict(net.named_parameters())
    requires_grad = {name: p.requires_grad for name, p in parameters.items()}
    grads = {name: (p.grad.detach().clone() if p.grad is not None else None) for name, p in parameters.items()}
    modes = {name: module.training for name, module in net.named_modules()}
    optimizer_state = copy.deepcopy(model.optimizer.state_dict())
    scheduler = model.lr_scheduler
    scheduler_state = copy.deepcopy(scheduler.state_dict()) if scheduler is not None else None
    rng_state = capture_rng_state(loaders)
    try:
        yield
    finally:
        with torch.no_grad():
            current = net.state_dict(keep_vars=True)
            for name, saved in tensors.items():
                device, dtype = places[name]
                target = current[name]
                if target.device != device or target.dtype != dtype:  # moved or cast by the trial: move back
                    target.data = target.data.to(device=device, dtype=dtype)
                target.copy_(saved)
        for name, param in parameters.items():
            param.requires_grad_(requires_grad[name])
            param.grad = grads[name]
        for name, module in net.named_modules():
            module.training = modes[name]
        model.optimizer.load_state_dict(optimizer_state)
        if scheduler is not None:
            scheduler.load_state_dict(scheduler_state)
        restore_rng_state(rng_state, loaders)


__all__ = ["training_snapshot"]
