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
reshards it (see :func:`full_optimizer_state_dict`).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Iterator
from typing import Any, Callable, Optional, Sequence

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor

from ..data.peek import first_batch
from .base import Strategy, refuse_foreign_parameters, unwrap
from .sharding import DealtBatches, bare_module, shard_loaders, users_net_kept

# fsdp's MixedPrecisionPolicy for fit's mixed precisions: compute in the low precision,
# reduce gradients in float32 (as DDP under autocast does).
POLICY_DTYPES = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}


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

    def __post_init__(self) -> None:
        classes = tuple(self.wrap) if isinstance(self.wrap, (list, tuple, set)) else (self.wrap,)
        bad = [c for c in classes if not (isinstance(c, type) and issubclass(c, nn.Module))]
        if bad:
            raise TypeError(
                f"{self.spelled} holds {bad[0]!r}, which is not a module class; pass classes, e.g. "
                "FSDP(wrap=[nn.TransformerEncoderLayer]) (the class, not an instance)."
            )
        object.__setattr__(self, "wrap", classes)

    def check(self, model: Any) -> None:
        blocks = blocks_to_shard(model.net, tuple(self.wrap), self.spelled)
        check_tied_parameters(model.net, blocks, bool(self.wrap))
        refuse_foreign_parameters(model, "fsdp", "Only the net's parameters are sharded and their gradients exchanged.")

    @contextlib.contextmanager
    def training(
        self, model: Any, runtime: Any, train_data: Any, val_data: Any, even_validation: bool = False
    ) -> Iterator[tuple[Any, Any]]:
        train_loader, val_loader = shard_loaders(runtime, train_data, val_data, even_validation)
        with users_net_kept(model, runtime) as users_net:
            model.net = bare_module(users_net)
            if val_loader is not None:
                val_loader = lockstep_validation(val_loader, val_data, model, runtime)
            with sharded_training(model, runtime.precision, tuple(self.wrap)):
                yield train_loader, val_loader

    def whole_weights(self, net: nn.Module) -> dict[str, torch.Tensor]:
        """The whole weights, gathered from every process's shard: every process calls it, at the same point."""
        return whole_state_dict(net)

    def load_whole_weights(self, net: nn.Module, state: dict[str, torch.Tensor]) -> None:
        """Load whole weights; a sharded net keeps each process's shard of them."""
        bare = unwrap(net)
        if isinstance(bare, FSDPModule):
            set_model_state_dict(bare, dict(state), options=StateDictOptions(full_state_dict=True))
        else:
            bare.load_state_dict(state)

    def whole_optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict:
        return full_optimizer_state_dict(optimizer)

    def load_whole_optimizer_state(self, optimizer: torch.optim.Optimizer, state: dict) -> None:
        load_optimizer_state_dict(optimizer, state)

    def engine(self, runtime: Any) -> str:
        return "FSDP"

    def __repr__(self) -> str:
        return f"FSDP(wrap=[{', '.join(c.__name__ for c in self.wrap)}])" if self.wrap else "FSDP()"


def whole_state_dict(net: nn.Module) -> dict[str, torch.Tensor]:
    """The bare net's whole weights in host memory; sharded tensors are gathered (a collective)."""
    return {
        k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().to("cpu", copy=True)
        for k, v in unwrap(net).state_dict().items()
    }


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


def blocks_to_shard(net: nn.Module, wrap: tuple[type, ...] = (), spelled: str = "FSDP(wrap=...)") -> list[nn.Module]:
    """The modules sharded before the root: those of ``wrap``'s classes, or each direct child holding parameters."""
    if not wrap:
        return [child for child in net.children() if any(True for _ in child.parameters())]
    blocks = [m for m in net.modules() if m is not net and isinstance(m, wrap)]
    if not blocks:
        names = ", ".join(cls.__name__ for cls in wrap)
        raise ValueError(
            f"{spelled.replace('...', '[' + names + ']')}: the net has no module of these classes. Pass the classes of its repeated "
            "blocks (e.g. FSDP(wrap=[nn.TransformerEncoderLayer])), or leave wrap out to shard each "
            "direct child of the net."
        )
    return blocks


def check_tied_parameters(net: nn.Module, blocks: list[nn.Module], wrap_given: bool) -> None:
    """Refuse one parameter (tied weights: an embedding shared with the output layer) that the sharding
    would put in two shards: each of ``blocks`` is a shard, the root takes what no block holds."""
    prefixes = sorted(
        (name for name, module in net.named_modules() if any(module is block for block in blocks)),
        key=len,
        reverse=True,  # the innermost block holding a parameter is its shard
    )
    names_of: dict[int, dict[str, str]] = {}  # id(parameter) -> {name: its shard's module name, "" for the root}
    for name, param in net.named_parameters(remove_duplicate=False):
        shard = next((prefix for prefix in prefixes if name.startswith(prefix + ".")), "")
        names_of.setdefault(id(param), {})[name] = shard
    split = [names for names in names_of.values() if len(set(names.values())) > 1]
    if not split:
        return
    names = split[0]
    shards = ", ".join(sorted({f"'{shard}'" if shard else "the root" for shard in names.values()}))
    tied_ids = {key for key, found in names_of.items() if len(found) > 1}
    classes = untied_block_classes(net, tied_ids)
    how = (
        "FSDP(wrap=[...]) shards the blocks of those classes"
        if wrap_given
        else ("strategy='fsdp' shards each direct child of the net on its own")
    )
    suggestion = ", ".join(cls.__name__ for cls in classes) if classes else "YourBlock"
    raise ValueError(
        f"{' and '.join(names)} are one parameter (tied weights), but {how}, which puts it in several shards "
        f"({shards}); a parameter can belong to one shard only. Pass strategy=kt.strategies.FSDP(wrap=[{suggestion}]), "
        "the classes of the net's blocks that hold no tied parameter: the root then keeps the tied ones."
    )


def untied_block_classes(net: nn.Module, tied_ids: set[int]) -> list[type]:
    """The classes of the net's repeated blocks (two instances or more) that hold no tied parameter,
    the outermost ones: what ``FSDP(wrap=[...])`` can shard while the root keeps the tied parameters."""
    containers = (nn.Sequential, nn.ModuleList, nn.ModuleDict)
    counts: dict[type, list[nn.Module]] = {}
    holders: set[type] = set()
    for module in net.modules():
        params = list(module.parameters())
        if module is net or isinstance(module, containers) or not params:
            continue
        if any(id(p) in tied_ids for p in params):
            holders.add(type(module))
        else:
            counts.setdefault(type(module), []).append(module)
    candidates = {cls: found for cls, found in counts.items() if len(found) >= 2 and cls not in holders}
    inner = {id(m) for found in candidates.values() for block in found for m in block.modules() if m is not block}
    return [cls for cls, found in candidates.items() if any(id(block) not in inner for block in found)]


@contextlib.contextmanager
def sharded_training(model: Any, precision: str, wrap: tuple[type, ...]) -> Iterator[None]:
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


def lockstep_validation(loader: Any, users_loader: Any, model: Any, runtime: Any) -> LockstepBatches:
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
    "FSDP",
    "blocks_to_shard",
    "full_optimizer_state_dict",
    "load_optimizer_state_dict",
    "shard_copy",
    "sharded_training",
]
