"""How the processes of a run share the work, one class per strategy behind one protocol
(:class:`Strategy`): :class:`SingleDevice`, :class:`ModelParallel` (a net the user spread over
devices), :class:`DDP` and :class:`FSDP`.

``fit(strategy=...)`` takes the word (``"auto"``, ``"ddp"``, ``"fsdp"``) or an object::

    model.fit(dl_train, dl_val, devices=4, strategy=kt.strategies.FSDP(wrap=[nn.TransformerEncoderLayer]))

Nothing outside this folder asks which strategy runs: the run asks the strategy instead.
:class:`FSDP`'s work with torch's FSDP2 lives in ``fsdp_engine`` (its blocks and their checks in
``fsdp_blocks``), imported when an FSDP run starts: ``import kerastorch`` does not pay for it.
"""

from .base import Strategy, cpu_state_dict, unwrap
from .choice import parse_strategy, resolve, strategy_for_net, strategy_of, whole_weights_on_main
from .ddp import DDP
from .fsdp import FSDP
from .model_parallel import ModelParallel
from .single import SingleDevice

__all__ = [
    "DDP",
    "FSDP",
    "ModelParallel",
    "SingleDevice",
    "Strategy",
    "cpu_state_dict",
    "parse_strategy",
    "resolve",
    "strategy_for_net",
    "strategy_of",
    "unwrap",
    "whole_weights_on_main",
]
