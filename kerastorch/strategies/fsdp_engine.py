"""torch's FSDP2 at work for :class:`~kerastorch.strategies.fsdp.FSDP`: a sharded copy of the net,
the optimizer pointed at its shards, validation in lockstep, and the whole weights and optimizer
state gathered back.

Imported when an FSDP run starts, not by ``import kerastorch``: ``torch.distributed.fsdp``,
DTensor and ``torch.distributed.checkpoint`` take about 0.6 s to import, which every other
run would pay for nothing (``tests/project/test_import_graph.py`` holds this).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import Any, Callable, Optional

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor

from ..data.peek import first_batch
from ..helpers.protocols import RunRuntime, TrainableModel
from .base import unwrap
from .fsdp_blocks import blocks_to_shard
from .sharding import DealtBatches

# fsdp's MixedPrecisionPolicy for fit's mixed precisions: compute in the low precision,
# reduce gradients in float32 (as DDP under autocast does).
POLICY_DTYPES = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}


def whole_state_dict(net: nn.Module) -> dict[str, torch.Tensor]:
    """The bare net's whole weights in host memory; sharded tensors are gathered (a collective)."""
    return {
        k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().to("cpu", copy=True)
        for k, v in unwrap(net).state_dict().items()
    }


def load_whole_weights(net: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load whole weights; a sharded net keeps each process's shard of them."""
    bare = unwrap(net)
    if isinstance(bare, FSDPModule):
        set_model_state_dict(bare, dict(state), options=StateDictOptions(full_state_dict=True))
    else:
        bare.load_state_dict(state)


def shard_copy(net: nn.Module, wrap: tuple[type, ...] = (), precision: str = "32-true") -> nn.Module:
    """A copy of ``net`` sharded over the processes of the default group."""
    sharded = copy.deepcopy(net)
    dtype = POLICY_DTYPES.get(precision)
    policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32) if dtype else MixedPrecisionPolicy()
    # Inner blocks first: the root then holds only what no block took.
    for block in reversed(blocks_to_shard(sharded, wrap)):
        if not isinstance(block, FSDPModule):
            fully_shard(block, mp_policy=policy)
    fully_shard(sharded, mp_policy=policy)
    return sharded


@contextlib.contextmanager
def sharded_training(model: TrainableModel, precision: str, wrap: tuple[type, ...]) -> Iterator[None]:
    """``model.net`` sharded, ``model.optimizer`` pointed at the shards; both given back whole at the end.

    Every process must run this, and leave it, together: gathering is a collective operation.
    """
    users_net, optimizer = model.net, model.optimizer
    sharded = shard_copy(users_net, wrap, precision)
    shards = dict(sharded.named_parameters())
    names = {id(p): name for name, p in users_net.named_parameters()}
    users_params = dict(users_net.named_parameters())
    foreign = [p for group in optimizer.param_groups for p in group["params"] if id(p) not in names]
    if foreign:
        raise ValueError(
            f"strategy='fsdp': the optimizer updates {len(foreign)} tensor(s) that are not parameters of the net. "
            "Build the optimizer over net.parameters() (or param groups of them)."
        )
    repoint_optimizer(optimizer, {id(p): shards[names[id(p)]] for p in users_params.values()})
    shapes = {name: p.shape for name, p in users_params.items()}
    for param in users_params.values():  # the shards hold the weights now: free the full copies
        param.data = torch.empty(0, dtype=param.dtype, device=param.device)
    model.net = sharded
    try:
        yield
    except BaseException:
        # No gathering after an error: the other processes may never get there, and waiting
        # for them would hang the job instead of ending it (the launcher stops them all).
        model.net = users_net
        raise
    model.net = users_net
    full = whole_state_dict(sharded)
    for name, param in users_params.items():
        param.data = torch.empty(shapes[name], dtype=param.dtype, device=param.device)
    users_net.load_state_dict(full)
    gather_optimizer_state(optimizer)
    repoint_optimizer(optimizer, {id(shards[name]): users_params[name] for name in users_params})


class LockstepBatches:
    """One process's validation batches, then as many forward passes as it takes to keep pace.

    In a sharded net every forward pass is a collective (each block gathers its parameters
    from all processes), so every process must run as many as the others. Validation shards
    are uneven, to count every sample exactly once; a process with fewer batches runs the
    forward pass of a spare batch for each missing one, and nothing of those is counted.
    ``most_batches`` is None for an iterable's batches dealt out (:class:`~kerastorch.strategies.sharding.DealtBatches`),
    whose count each process knows once it has read them all.

    Before the first batch, every process takes the main process's buffers (BatchNorm's running
    statistics), as DDP's first validation forward pass does: each process updated its own on its
    own share of the batches, and the history, the checkpoints and ``evaluate`` of the returned
    net all use the main process's.
    """

    def __init__(
        self,
        loader: Any,
        spare_batch: Any,
        most_batches: Optional[int],
        forward: Callable[[Any], Any],
        before: Callable[[], None] = lambda: None,
    ):
        self.loader = loader
        self.spare_batch = spare_batch
        self.most_batches = most_batches
        self.forward = forward
        self.before = before

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        self.before()
        count = 0
        for batch in self.loader:
            count += 1
            yield batch
        most = self.most_batches if self.most_batches is not None else self.loader.most_per_process()
        for _ in range(most - count):
            self.forward(self.spare_batch)


def lockstep_validation(loader: Any, users_loader: Any, model: TrainableModel, runtime: RunRuntime) -> LockstepBatches:
    """``loader`` (this process's share of ``users_loader``) wrapped in :class:`LockstepBatches`."""
    most = None
    if not isinstance(loader, DealtBatches):
        most = int(runtime.accelerator.gather(torch.tensor([len(loader)], device=runtime.device)).max())
    spare = first_batch(users_loader, "the validation data")

    def forward(batch: Any) -> None:
        with torch.no_grad(), runtime.autocast():
            model.forward_batch(runtime.to_device(batch))

    return LockstepBatches(loader, spare, most, forward, before=lambda: broadcast_buffers(model.net))


def broadcast_buffers(net: nn.Module) -> None:
    """Every process's buffers set to the main process's (a collective: every process calls it).
    FSDP shards the parameters only; each process keeps and updates its own buffers."""
    with torch.no_grad():
        for buffer in net.buffers():
            torch.distributed.broadcast(buffer, src=0)


def repoint_optimizer(optimizer: torch.optim.Optimizer, new_of: dict[int, torch.Tensor]) -> None:
    """Make the optimizer's param groups (and its state) refer to other tensors, by ``id`` of the old ones.

    A state tensor shaped like its full parameter is sharded (or gathered) to match the new one.
    """
    moved_state = {}
    for group in optimizer.param_groups:
        new_params = []
        for old in group["params"]:
            new = new_of[id(old)]
            if old in optimizer.state:
                moved_state[new] = {k: _like(v, new) for k, v in optimizer.state[old].items()}
            new_params.append(new)
        group["params"] = new_params
    optimizer.state.clear()
    optimizer.state.update(moved_state)


def _like(value: Any, param: torch.Tensor) -> Any:
    """A state value placed like ``param``: sharded for a DTensor parameter, whole for a plain one."""
    if not isinstance(value, torch.Tensor) or value.dim() == 0:
        return value  # Adam's step count and other scalars stay as they are
    if isinstance(param, DTensor) and not isinstance(value, DTensor) and value.shape == param.shape:
        return distribute_tensor(value.to(param.device), param.device_mesh, param.placements)
    if not isinstance(param, DTensor) and isinstance(value, DTensor):
        return value.full_tensor()
    return value


def gather_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Replace every sharded state tensor by the whole one (a collective: every process calls it)."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            state = optimizer.state.get(param, {})
            for key, value in state.items():
                if isinstance(value, DTensor):
                    state[key] = value.full_tensor()


def full_optimizer_state_dict(optimizer: torch.optim.Optimizer) -> dict:
    """The optimizer's ``state_dict()`` with whole tensors (a collective when its parameters are sharded).

    The training state keeps the gathered state, not ``torch.distributed.checkpoint``'s one
    file per process: a state file then resumes under any number of processes, or none, and
    is read and checked like every other (the cost is the gather, once per epoch).
    """
    state = optimizer.state_dict()  # its per-parameter dicts are the live ones: build new ones
    state["state"] = {
        index: {key: value.full_tensor() if isinstance(value, DTensor) else value for key, value in saved.items()}
        for index, saved in state["state"].items()
    }
    return state


def load_optimizer_state_dict(optimizer: torch.optim.Optimizer, state: dict) -> None:
    """``optimizer.load_state_dict`` of a whole state, resharded for sharded parameters."""
    optimizer.load_state_dict(state)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if any(isinstance(p, DTensor) for p in params):
        repoint_optimizer(optimizer, {id(p): p for p in params})


__all__ = [
    "LockstepBatches",
    "full_optimizer_state_dict",
    "load_optimizer_state_dict",
    "load_whole_weights",
    "lockstep_validation",
    "shard_copy",
    "sharded_training",
    "whole_state_dict",
]
