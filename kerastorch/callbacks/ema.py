"""``EMA``: train as usual, validate and keep an exponential moving average of the weights."""

from __future__ import annotations

from typing import Optional

import torch
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from .averaged_weights import AveragedWeights


class EMA(AveragedWeights):
    """An exponential moving average of the weights, updated after every optimizer step, used
    for validation, the best weights, early stopping and the weights ``fit`` returns.

    After each update the average is ``decay * average + (1 - decay) * weights`` (torch's
    ``AveragedModel`` with ``get_ema_multi_avg_fn``; the first update copies the weights).
    ``decay=0.0`` is plain training, exactly. Buffers — BatchNorm's running statistics —
    are averaged the same way (``use_buffers=True``), so the averaged net needs no extra pass
    over the data. Under several processes every process keeps the same average of the
    same (all-reduced) weights. Its state is part of ``resume=True``'s training state.

    Example::

        model.fit(dl_train, dl_val, epochs=20, callbacks=[kt.callbacks.EMA(decay=0.999)])
        model.evaluate(dl_val)   # the averaged weights of the best epoch
    """

    def __init__(self, decay: float = 0.999):
        super().__init__()
        if not isinstance(decay, (int, float)) or isinstance(decay, bool) or not 0 <= decay < 1:
            raise ValueError(f"EMA(decay={decay!r}); use a number in [0, 1), e.g. 0.999 (0 is plain training).")
        self.decay = float(decay)

    def make_average(self, net: torch.nn.Module) -> AveragedModel:
        return AveragedModel(net, multi_avg_fn=get_ema_multi_avg_fn(self.decay), use_buffers=True)

    def on_after_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.averaged is not None and optimizer is self.model.optimizer:
            self.averaged.update_parameters(self.net)

    def on_test_begin(self, logs: Optional[dict] = None) -> None:
        self.swap_in(epoch=-1)

    def on_epoch_end(self, epoch: int, logs: Optional[dict] = None) -> None:
        self.swap_in(epoch)  # an epoch that was not validated: the best weights still see the average


__all__ = ["EMA"]
