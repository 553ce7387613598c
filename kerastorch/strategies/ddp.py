"""``strategy="ddp"`` (the default with several processes): each process holds the whole net,
``DistributedDataParallel`` averages the gradients.

The net is wrapped by accelerate's ``prepare_model``, which starts every process from the
main process's weights; each process trains on its share of the batches
(:mod:`~kerastorch.strategies.sharding`). Under gradient accumulation the gradients are
exchanged only on the batch that ends a group.

DDP waits, after every backward pass, for the gradient of every trainable parameter: one the
forward pass does not use stops training after the first step with DDP's own error. Before
training, the first batch's forward and backward pass (its traces put back) finds such
parameters: ``fit`` names them and the option, ``kt.strategies.DDP(find_unused_parameters=True)``.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Iterator, Optional

import torch
from accelerate.utils import DistributedDataParallelKwargs
from torch import nn

from ..data.batches import on_fewer_samples
from ..data.peek import first_batch
from ..helpers.modes import train_mode
from ..helpers.protocols import RunRuntime, TrainableModel
from .base import Strategy, refuse_foreign_parameters
from .sharding import bare_module, shard_loaders, users_net_kept


@dataclasses.dataclass(frozen=True)
class DDP(Strategy):
    """k processes, each with the whole net; gradients averaged by ``DistributedDataParallel``.

    ``find_unused_parameters``: True for a net whose forward pass leaves some trainable
    parameters out (an auxiliary head, a branch some batches skip), at a small cost per step;
    False never looks; None (the default) refuses, before training, a net whose first batch
    leaves some out, naming them.

    Example::

        model.fit(dl_train, dl_val, devices=2, strategy=kt.strategies.DDP())   # the same as strategy="ddp"
        model.fit(dl_train, dl_val, devices=2, strategy=kt.strategies.DDP(find_unused_parameters=True))
    """

    find_unused_parameters: Optional[bool] = None

    name = "ddp"
    several_processes = True

    def __post_init__(self) -> None:
        if self.find_unused_parameters not in (None, True, False):
            raise TypeError(
                f"DDP(find_unused_parameters={self.find_unused_parameters!r}); use True, False or None (find out)."
            )

    def check(self, model: TrainableModel) -> None:
        refuse_foreign_parameters(
            model,
            "ddp",
            "DDP averages the gradients of the net's parameters over the processes, not of these, so each process "
            "would train its own copy.",
        )

    @contextlib.contextmanager
    def training(
        self, model: TrainableModel, runtime: RunRuntime, train_data: Any, val_data: Any, even_validation: bool = False
    ) -> Iterator[tuple[Any, Any]]:
        train_loader, val_loader = shard_loaders(runtime, train_data, val_data, even_validation)
        with users_net_kept(model, runtime) as users_net:
            # A train_step of the user's own steps the optimizer itself: only fit's step can be tried aside.
            if self.find_unused_parameters is None and getattr(model, "uses_default_train_step", False):
                refuse_unused_parameters(model, train_data, runtime)
            with ddp_options(runtime.accelerator, find_unused_parameters=bool(self.find_unused_parameters)):
                model.net = runtime.accelerator.prepare_model(bare_module(users_net), device_placement=False)
            yield train_loader, val_loader

    def no_sync(self, net: nn.Module) -> contextlib.AbstractContextManager:
        """Skip DDP's gradient all-reduce for a batch that does not end an accumulation group."""
        if isinstance(net, nn.parallel.DistributedDataParallel):
            return net.no_sync()
        return contextlib.nullcontext()

    def finish_accumulation(self, net: nn.Module, runtime: RunRuntime) -> None:
        """A group that ended after the loop ran all its batches under ``no_sync``: average its
        gradients over the processes, as DDP's own all-reduce would have."""
        if not isinstance(net, nn.parallel.DistributedDataParallel) or runtime.num_processes == 1:
            return
        for param in net.parameters():
            if param.grad is not None:
                param.grad.copy_(runtime.reduce_sum(param.grad) / runtime.num_processes)

    def forward_failed(self, net: nn.Module) -> None:
        """DDP broadcasts the buffers at the start of a pass that follows one whose gradients it exchanges,
        as it notes at a pass's end. A pass cut short noted nothing: note that no exchange follows. This
        process's next passes, the pieces of its batch, then broadcast nothing more, as the other
        processes, which went on with the whole batch, broadcast nothing more before the batch's gradient
        exchange (its last piece's)."""
        if isinstance(net, nn.parallel.DistributedDataParallel):
            net.require_forward_param_sync = False

    def engine(self, runtime: RunRuntime) -> str:
        return runtime.accelerator.distributed_type.value

    def __repr__(self) -> str:
        if self.find_unused_parameters is None:
            return "DDP()"
        return f"DDP(find_unused_parameters={self.find_unused_parameters})"


@contextlib.contextmanager
def ddp_options(accelerator: Any, find_unused_parameters: bool) -> Iterator[None]:
    """accelerate's ``prepare_model`` builds DDP with its handler's keywords: add ours for the call."""
    handler = accelerator.ddp_handler
    if find_unused_parameters:
        accelerator.ddp_handler = dataclasses.replace(
            handler or DistributedDataParallelKwargs(), find_unused_parameters=True
        )
    try:
        yield
    finally:
        accelerator.ddp_handler = handler


def refuse_unused_parameters(model: TrainableModel, train_data: Any, runtime: RunRuntime) -> None:
    """Refuse, before any weight changes, a net with trainable parameters its first batch leaves out."""
    unused = parameters_without_gradient(model, train_data, runtime)
    if unused:
        raise ValueError(
            f"strategy='ddp': {len(unused)} trainable parameter(s) of the net got no gradient from the first "
            f"batch's loss: {', '.join(unused[:5])}{' ...' if len(unused) > 5 else ''}. DDP waits for every "
            "parameter's gradient, so training would stop after its first step. If the forward pass leaves them "
            "out on purpose (an auxiliary head, a branch some batches skip), pass "
            "strategy=kt.strategies.DDP(find_unused_parameters=True); to freeze them, param.requires_grad_(False); "
            "else use them in forward, or remove them (model.doctor(...) finds them too)."
        )


def parameters_without_gradient(model: TrainableModel, train_data: Any, runtime: RunRuntime) -> list[str]:
    """The names of the net's trainable parameters that the loss of the first training batch gives no
    gradient (a forward and backward pass in train mode; gradients, buffers and RNG put back)."""
    net = bare_module(model.net)
    params = {name: p for name, p in net.named_parameters() if p.requires_grad}
    grads = {name: p.grad for name, p in params.items()}
    buffers = [(buffer, buffer.detach().clone()) for buffer in net.buffers()]  # BatchNorm's statistics move
    batch = first_batch(train_data, "train_data")
    devices = [runtime.device] if runtime.device.type == "cuda" else []

    def unused(batch: Any) -> list[str]:
        for param in params.values():
            param.grad = None
        with runtime.autocast():
            loss, _, _ = model.forward_batch(batch)
        loss.backward()
        return [name for name, param in params.items() if param.grad is None]

    try:
        with torch.random.fork_rng(devices=devices), train_mode(net):  # dropout draws, nothing else sees it
            return on_fewer_samples(unused, runtime.to_device(batch), model.labels_at)  # out of memory: fewer samples
    finally:
        with torch.no_grad():
            for buffer, saved in buffers:
                buffer.copy_(saved)
        for name, param in params.items():
            param.grad = grads[name]


__all__ = ["DDP"]
