"""The one protocol every strategy follows: what a run asks of the way its processes share the work.

A :class:`Strategy` answers every question whose answer differs between strategies, so that
nothing outside ``kerastorch/strategies/`` asks which strategy runs:

- :meth:`~Strategy.check`: refuse, before anything runs, a model this strategy cannot train;
- :meth:`~Strategy.runtime_for`: adjust the runtime to the net (a model-parallel net's devices);
- :meth:`~Strategy.training`: the net, optimizer and loaders as this process trains them (DDP's
  wrapper, FSDP's shards, each process's share of the data), given back whole at the end;
- :meth:`~Strategy.no_sync` and :meth:`~Strategy.finish_accumulation`: the gradient exchange
  around accumulation groups;
- :attr:`~Strategy.split_refusal` and :meth:`~Strategy.forward_failed`: whether a process that ran
  out of memory may redo its batch alone in smaller pieces, and what a pass cut short leaves;
- :meth:`~Strategy.whole_weights`, :meth:`~Strategy.load_whole_weights` and their optimizer
  counterparts: whole tensors for checkpoints and the training state, whatever is sharded.

The defaults are those of one process holding the whole net.
"""

from __future__ import annotations

import contextlib
from typing import Any, ClassVar, Iterator, Optional, TypeVar

import torch
from torch import nn

from ..helpers.protocols import RunRuntime, TrainableModel

R = TypeVar("R", bound=RunRuntime)  # the runtime a strategy is given back, adjusted


class Strategy:
    """How a run's processes share the net, the data and the updates (the defaults: one process)."""

    #: The word ``fit(strategy=...)`` takes for it, and what fit's first line calls it.
    name: ClassVar[str] = ""
    #: True when k processes train together (each runs this same code as one rank).
    several_processes: ClassVar[bool] = False
    #: False for a net whose pieces the user placed on several devices: placement leaves them there.
    moves_net: ClassVar[bool] = True
    #: True when gathering whole weights is a collective: every process must take part, at the same point.
    gathers_together: ClassVar[bool] = False
    #: Why a step that fit does not drive itself (a program's own step class) cannot run, or None.
    foreign_step_refusal: ClassVar[Optional[str]] = None
    #: Why a callback that keeps a whole copy of the net beside it (EMA, SWA) cannot run, or None.
    whole_copy_refusal: ClassVar[Optional[str]] = None
    #: Why a process that ran out of memory cannot redo its batch alone in smaller pieces, or None.
    split_refusal: ClassVar[Optional[str]] = None

    def check(self, model: TrainableModel) -> None:
        """Refuse, before anything runs, a model this strategy cannot train (nothing to refuse by default)."""

    def runtime_for(self, runtime: R, model: TrainableModel, data: Any) -> R:
        """The runtime adjusted to the net (the same one by default)."""
        return runtime

    @contextlib.contextmanager
    def training(
        self,
        model: TrainableModel,
        runtime: RunRuntime,
        train_data: Any,
        val_data: Any,
        even_validation: bool = False,
    ) -> Iterator[tuple[Any, Any]]:
        """Yield ``(train_loader, val_loader)`` for this process, with ``model.net`` (and the
        optimizer) as this strategy trains them; both are the user's objects again afterwards.

        ``even_validation`` gives every process as many validation batches (for a step that
        gathers over the processes at every batch)."""
        yield train_data, val_data

    def no_sync(self, net: nn.Module) -> contextlib.AbstractContextManager:
        """The context of a batch whose gradients wait for the end of its accumulation group."""
        return contextlib.nullcontext()

    def finish_accumulation(self, net: nn.Module, runtime: RunRuntime) -> None:
        """A group whose batches all ran under :meth:`no_sync`: exchange its gradients now."""

    def forward_failed(self, net: nn.Module) -> None:
        """A forward pass of ``net`` raised (out of memory) before its end, and this process redoes its
        batch in pieces: leave ``net`` so that its next pass exchanges with the other processes what
        their next pass does (nothing to do by default)."""

    def whole_weights(self, net: nn.Module, into: Optional[dict[str, torch.Tensor]] = None) -> dict[str, torch.Tensor]:
        """The net's whole weights in host memory, under the net's own keys: a copy of their own (a
        training state written while training goes on copies them no more), written over the tensors of
        ``into`` (an earlier copy that nobody needs any more) where they fit (see :func:`cpu_state_dict`)."""
        return cpu_state_dict(net, into)

    def load_whole_weights(self, net: nn.Module, state: dict[str, torch.Tensor]) -> None:
        """Load whole weights (as :meth:`whole_weights` gives them) into the net."""
        unwrap(net).load_state_dict(state)

    def whole_optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict:
        """The optimizer's ``state_dict()`` with whole tensors."""
        return optimizer.state_dict()

    def load_whole_optimizer_state(self, optimizer: torch.optim.Optimizer, state: dict) -> None:
        """Load a whole optimizer state (as :meth:`whole_optimizer_state` gives it)."""
        optimizer.load_state_dict(state)

    def engine(self, runtime: RunRuntime) -> str:
        """What fit's first line says trains the processes (e.g. ``"DDP"``)."""
        return self.name

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def foreign_parameters(model: TrainableModel) -> list[str]:
    """What the optimizer updates besides the net's parameters, by name where one is known (a loss
    module's ``loss_fn.<name>``): tensors a strategy that exchanges the net's gradients leaves alone."""
    owned = {id(p) for p in model.net.parameters()}
    names = {id(p): f"loss_fn.{name}" for name, p in getattr(model.loss_fn, "named_parameters", lambda: [])()}
    return [
        names.get(id(p), f"a tensor of shape {tuple(p.shape)}")
        for group in model.optimizer.param_groups
        for p in group["params"]
        if id(p) not in owned
    ]


def refuse_foreign_parameters(model: TrainableModel, word: str, why: str) -> None:
    """Refuse, before training, an optimizer that updates tensors outside the net under a strategy
    that exchanges only the net's gradients (``why``: what that strategy does with the net's)."""
    foreign = foreign_parameters(model)
    if foreign:
        raise ValueError(
            f"strategy={word!r}: the optimizer also updates {', '.join(foreign[:5])}, which are not parameters of "
            f"the net. {why} Compute that part in the net's forward (its parameters then belong to the net), or "
            "train with devices=1."
        )


def unwrap(net: nn.Module) -> nn.Module:
    """The bare module inside DataParallel / DistributedDataParallel / torch.compile wrappers."""
    while True:
        if isinstance(net, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
            net = net.module
        elif hasattr(net, "_orig_mod") and isinstance(net._orig_mod, nn.Module):
            net = net._orig_mod
        else:
            return net


def cpu_state_dict(net: nn.Module, into: Optional[dict[str, torch.Tensor]] = None) -> dict[str, torch.Tensor]:
    """A copy of the bare net's weights in host memory (keys without ``module.``): the whole
    weights of a net each process holds whole.

    ``into``: an earlier copy, of no more use to anyone, whose tensors are written over where a key's
    shape and dtype still match. Copying into host memory already in use is several times faster than
    into new memory for a large net (whose every page the system must first hand out), and a run
    that keeps a copy per better epoch holds one copy, not two at each change.
    """
    copied = {}
    for key, value in unwrap(net).state_dict().items():
        old = into.get(key) if into is not None else None
        if old is not None and old.device.type == "cpu" and old.shape == value.shape and old.dtype == value.dtype:
            copied[key] = old.copy_(value.detach())
        else:
            copied[key] = value.detach().to("cpu", copy=True)
    return copied


__all__ = ["Strategy", "cpu_state_dict", "foreign_parameters", "refuse_foreign_parameters", "unwrap"]
