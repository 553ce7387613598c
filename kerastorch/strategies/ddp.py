"""``strategy="ddp"`` (the default with several processes): each process holds the whole net,
``DistributedDataParallel`` averages the gradients.

The net is wrapped by accelerate's ``prepare_model``, which starts every process from the
main process's weights; each process trains on its share of the batches
(:mod:`~kerastorch.strategies.sharding`). Under gradient accumulation the gradients are
exchanged only on the batch that ends a group.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Iterator

from torch import nn

from .base import Strategy
from .sharding import bare_module, shard_loaders


@dataclasses.dataclass(frozen=True)
class DDP(Strategy):
    """k processes, each with the whole net; gradients averaged by ``DistributedDataParallel``.

    Example::

        model.fit(dl_train, dl_val, devices=2, strategy=kt.strategies.DDP())   # the same as strategy="ddp"
    """

    name = "ddp"
    several_processes = True

    @contextlib.contextmanager
    def training(
        self, model: Any, runtime: Any, train_data: Any, val_data: Any, even_validation: bool = False
    ) -> Iterator[tuple[Any, Any]]:
        train_loader, val_loader = shard_loaders(runtime, train_data, val_data, even_validation)
        users_net = model.net
        try:
            model.net = runtime.accelerator.prepare_model(bare_module(users_net), device_placement=False)
            yield train_loader, val_loader
        finally:
            model.net = users_net
            runtime.accelerator.free_memory()  # accelerate forgets the wrapped net and loaders

    def no_sync(self, net: nn.Module) -> contextlib.AbstractContextManager:
        """Skip DDP's gradient all-reduce for a batch that does not end an accumulation group."""
        if isinstance(net, nn.parallel.DistributedDataParallel):
            return net.no_sync()
        return contextlib.nullcontext()

    def finish_accumulation(self, net: nn.Module, runtime: Any) -> None:
        """A group that ended after the loop ran all its batches under ``no_sync``: average its
        gradients over the processes, as DDP's own all-reduce would have."""
        if not isinstance(net, nn.parallel.DistributedDataParallel) or runtime.num_processes == 1:
            return
        for param in net.parameters():
            if param.grad is not None:
                param.grad.copy_(runtime.reduce_sum(param.grad) / runtime.num_processes)

    def engine(self, runtime: Any) -> str:
        return runtime.accelerator.distributed_type.value

    def __repr__(self) -> str:
        return "DDP()"


__all__ = ["DDP"]
