"""``strategy="fsdp"`` (or ``kt.strategies.FSDP(wrap=[Block])``): parameters, gradients and
optimizer state sharded over the processes, with PyTorch's own engine
(``torch.distributed.fsdp.fully_shard``, FSDP2).

One code path for the CPU (gloo) and for GPUs: accelerate's FSDP plugin is not used,
because on the CPU it silently trains with DDP instead. While ``fit`` trains:

- the net that trains is a copy of the user's, sharded with ``fully_shard``: each block
  of ``wrap``'s classes (by default, each direct child that holds parameters), then
  the root. Each parameter becomes a DTensor holding this process's shard;
- the user's optimizer object is kept — its hyper-parameters, param groups, scheduler and
  hooks stay as they are — and its param groups point at the sharded parameters, so its
  state (Adam's moments) is sharded too. Nothing is re-created;
- the user's net keeps its module and parameter objects, emptied while the copy trains,
  so a process holds about 1/k of the weights, gradients and optimizer state.

When training ends, every process gathers the full weights (the best epoch's, loaded by
``RestoreBestWeights``) and the full optimizer state, and the user's net and optimizer
get them back as ordinary tensors. Checkpoints and the training state always hold full
tensors under the net's own keys: one file loads into the bare net, and ``resume=True``
reshards it (see :func:`~kerastorch.strategies.fsdp_engine.full_optimizer_state_dict`).

This module holds the strategy object, which ``import kerastorch`` needs; the work with torch's
FSDP2 is in :mod:`~kerastorch.strategies.fsdp_engine`, imported when an FSDP run starts.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any, Optional, Sequence

import torch
from torch import nn

from ..helpers.protocols import RunRuntime, TrainableModel
from .base import Strategy, refuse_foreign_parameters
from .fsdp_blocks import blocks_to_shard, check_tied_parameters
from .sharding import bare_module, shard_loaders, users_net_kept


@dataclasses.dataclass(frozen=True)
class FSDP(Strategy):
    """k processes, each holding 1/k of the parameters, gradients and optimizer state.

    ``wrap``: the module classes sharded as blocks (e.g. ``[nn.TransformerEncoderLayer]``); by
    default each direct child of the net that holds parameters.

    Example::

        model.fit(dl_train, dl_val, devices=4, strategy=kt.strategies.FSDP(wrap=[Block]))
    """

    wrap: Sequence[type] = ()
    spelled: str = dataclasses.field(default="FSDP(wrap=...)", repr=False, compare=False)  # for messages

    name = "fsdp"
    several_processes = True
    gathers_together = True  # the whole weights are gathered from every process's shard
    foreign_step_refusal = "use strategy='ddp'"
    whole_copy_refusal = (
        "strategy='fsdp' shards the net over the processes so that none holds it whole. Use strategy='ddp' "
        "(each process holds the whole net), or train without it"
    )
    split_refusal = (
        "strategy='fsdp' gathers each block's weights from every process inside the forward pass, so a process "
        "cannot redo its batch alone in smaller pieces while the others go on"
    )

    def __post_init__(self) -> None:
        classes = tuple(self.wrap) if isinstance(self.wrap, (list, tuple, set)) else (self.wrap,)
        bad = [c for c in classes if not (isinstance(c, type) and issubclass(c, nn.Module))]
        if bad:
            raise TypeError(
                f"{self.spelled} holds {bad[0]!r}, which is not a module class; pass classes, e.g. "
                "FSDP(wrap=[nn.TransformerEncoderLayer]) (the class, not an instance)."
            )
        object.__setattr__(self, "wrap", classes)

    def check(self, model: TrainableModel) -> None:
        blocks = blocks_to_shard(model.net, tuple(self.wrap), self.spelled)
        check_tied_parameters(model.net, blocks, bool(self.wrap))
        refuse_foreign_parameters(model, "fsdp", "Only the net's parameters are sharded and their gradients exchanged.")

    # The methods below run in an FSDP run only: they import torch's FSDP2 then (see fsdp_engine).

    @contextlib.contextmanager
    def training(
        self, model: TrainableModel, runtime: RunRuntime, train_data: Any, val_data: Any, even_validation: bool = False
    ) -> Iterator[tuple[Any, Any]]:
        from .fsdp_engine import lockstep_validation, sharded_training

        train_loader, val_loader = shard_loaders(runtime, train_data, val_data, even_validation)
        with users_net_kept(model, runtime) as users_net:
            model.net = bare_module(users_net)
            if val_loader is not None:
                val_loader = lockstep_validation(val_loader, val_data, model, runtime)
            with sharded_training(model, runtime.precision, tuple(self.wrap)):
                yield train_loader, val_loader

    def whole_weights(self, net: nn.Module, into: Optional[dict[str, torch.Tensor]] = None) -> dict[str, torch.Tensor]:
        """The whole weights, gathered from every process's shard: every process calls it, at the same point.
        (Gathered into new tensors: ``into`` is not used.)"""
        from .fsdp_engine import whole_state_dict

        return whole_state_dict(net)

    def load_whole_weights(self, net: nn.Module, state: dict[str, torch.Tensor]) -> None:
        """Load whole weights; a sharded net keeps each process's shard of them."""
        from .fsdp_engine import load_whole_weights

        load_whole_weights(net, state)

    def whole_optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict:
        from .fsdp_engine import full_optimizer_state_dict

        return full_optimizer_state_dict(optimizer)

    def load_whole_optimizer_state(self, optimizer: torch.optim.Optimizer, state: dict) -> None:
        from .fsdp_engine import load_optimizer_state_dict

        load_optimizer_state_dict(optimizer, state)

    def engine(self, runtime: RunRuntime) -> str:
        return "FSDP"

    def __repr__(self) -> str:
        return f"FSDP(wrap=[{', '.join(c.__name__ for c in self.wrap)}])" if self.wrap else "FSDP()"


__all__ = ["FSDP"]
