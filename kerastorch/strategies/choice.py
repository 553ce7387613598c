"""Which strategy a run uses: the one asked for (a word or an object), matched with the number of
processes and with where the user put the net."""

from __future__ import annotations

import warnings
from typing import Any, Optional

from torch import nn

from ..helpers.protocols import TrainableModel
from .base import Strategy
from .ddp import DDP
from .fsdp import FSDP
from .model_parallel import ModelParallel, check_one_process, is_model_parallel
from .single import SingleDevice

WORDS = {"auto": None, "ddp": DDP, "fsdp": FSDP}


def parse_strategy(strategy: Any = "auto", fsdp_wrap: Any = None) -> Optional[Strategy]:
    """The strategy ``fit(strategy=...)`` asks for: a word (``"auto"``, ``"ddp"``, ``"fsdp"``) or a
    :class:`~kerastorch.strategies.Strategy` object; None for ``"auto"`` (DDP with several processes).

    ``fsdp_wrap=[...]`` is the older spelling of ``strategy=kt.strategies.FSDP(wrap=[...])``.

    >>> parse_strategy("DDP"), parse_strategy("auto"), parse_strategy(FSDP(wrap=[nn.Linear]))
    (DDP(), None, FSDP(wrap=[Linear]))
    """
    asked = _parse_strategy_word(strategy)
    if fsdp_wrap is None:
        return asked
    if not isinstance(asked, FSDP):
        raise ValueError(f"fsdp_wrap is for strategy='fsdp'; this run has strategy={strategy!r}.")
    warnings.warn(
        "fsdp_wrap= is deprecated: pass strategy=kt.strategies.FSDP(wrap=[...]) instead.",
        DeprecationWarning,
        stacklevel=5,
    )
    return FSDP(wrap=fsdp_wrap, spelled="fsdp_wrap=...")


def _parse_strategy_word(strategy: Any) -> Optional[Strategy]:
    if isinstance(strategy, Strategy):
        return strategy
    if isinstance(strategy, type) and issubclass(strategy, Strategy):
        raise TypeError(
            f"strategy={strategy.__name__} is the class; pass an instance: strategy={strategy.__name__}() "
            f"(or the word {strategy.name!r})."
        )
    word = strategy.strip().lower() if isinstance(strategy, str) else strategy
    if isinstance(word, str) and word in WORDS:
        made = WORDS[word]
        return made() if made is not None else None
    hint = ""
    if isinstance(word, str) and word.startswith("deepspeed"):
        hint = " DeepSpeed is not supported: use strategy='ddp' with precision='bf16-mixed', or Lightning's Trainer."
    elif isinstance(word, str) and word.startswith("fsdp"):
        hint = " For FSDP, pass strategy='fsdp', or kt.strategies.FSDP(wrap=[BlockClass]) to choose the sharded blocks."
    raise ValueError(
        f"strategy={strategy!r} is not supported; use one of {', '.join(repr(w) for w in WORDS)}, or a "
        f"kerastorch.strategies object such as kt.strategies.FSDP(wrap=[...]).{hint}"
    )


def resolve(
    asked: Optional[Strategy], net: nn.Module, num_processes: int, alone: Optional[Strategy] = None
) -> Strategy:
    """The strategy a run of ``num_processes`` processes uses, for what was asked (None: "auto").

    One process trains the whole net on one device, or a net the user spread over devices where
    it is (``alone``, when the caller has it already: :func:`strategy_for_net`); several processes
    use what was asked, DDP by default.
    """
    check_one_process(net, num_processes)
    if num_processes > 1:
        if asked is None:
            return DDP()
        if not asked.several_processes:
            raise ValueError(
                f"strategy={asked!r} trains in one process, but {num_processes} processes were asked for. Pass "
                "devices=1, or a strategy for several processes: 'ddp' or 'fsdp'."
            )
        return asked
    if isinstance(asked, FSDP):
        warnings.warn(
            "strategy='fsdp' with one process: there is nothing to shard over, so the net trains as usual. "
            "Pass devices=k (k > 1) to shard it over k processes.",
            UserWarning,
            stacklevel=5,
        )
    return alone if alone is not None else strategy_for_net(net)


def strategy_of(model: TrainableModel) -> Strategy:
    """The strategy ``model`` trains with now: its run's, or, outside a run, the one for its net as it is.

    Callbacks ask it for whole weights: ``strategy_of(self.model).whole_weights(self.model.net)``.
    """
    runtime = getattr(model, "runtime", None)
    return runtime.strategy if runtime is not None else strategy_for_net(model.net)


def whole_weights_on_main(model: TrainableModel) -> Optional[dict]:
    """The net's whole weights on the main process (None on the others), for a callback that writes
    them. Every process calls it at the same point: gathering may need them all."""
    strategy = strategy_of(model)
    if not (model.is_main_process or strategy.gathers_together):
        return None
    weights = strategy.whole_weights(model.net)
    return weights if model.is_main_process else None


def strategy_for_net(net: nn.Module) -> Strategy:
    """The one-process strategy for a net as it is: model parallel when its pieces sit on several devices."""
    return ModelParallel() if is_model_parallel(net) else SingleDevice()


__all__ = ["parse_strategy", "resolve", "strategy_for_net", "strategy_of", "whole_weights_on_main"]
