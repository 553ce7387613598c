"""``EMA``: train as usual, validate and keep an exponential moving average of the weights."""

from __future__ import annotations

import itertools
from typing import Any, Optional

import torch
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from .averaged_weights import AveragedWeights


class EMAModel(AveragedModel):
    """torch's ``AveragedModel`` with ``get_ema_multi_avg_fn`` and ``use_buffers=True``, whose update
    reads nothing back from the device.

    torch's ``update_parameters`` tests its ``n_averaged`` counter twice per update and copies it to
    the weights' device; on a GPU that copy waits for the queued training step, at every step. This
    update does the same arithmetic (torch's EMA function on the same groups of tensors, the first
    update a copy) and knows whether averaging has started from a flag read off the counter once,
    after the average is built or a state loaded into it. The state dict is ``AveragedModel``'s.
    """

    def __init__(self, net: torch.nn.Module, decay: float):
        ema_update = get_ema_multi_avg_fn(decay)
        super().__init__(net, multi_avg_fn=ema_update, use_buffers=True)
        self._ema_update = ema_update
        self._started: Optional[bool] = None  # None: read n_averaged at the next update

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        self._started = None  # the loaded counter says whether the loaded average had started
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    @torch.no_grad()
    def update_parameters(self, model: torch.nn.Module) -> None:
        averaged = [t.detach() for t in itertools.chain(self.module.parameters(), self.module.buffers())]
        current = [
            t.detach().to(a.device) for t, a in zip(itertools.chain(model.parameters(), model.buffers()), averaged)
        ]
        if self._started is None:
            self._started = bool(self.n_averaged > 0)  # once per average, never per step
        if not self._started:
            for a, c in zip(averaged, current):
                a.copy_(c)
            self._started = True
        else:
            groups: dict = {}  # torch's foreach EMA takes tensors of one device and dtype at a time
            for a, c in zip(averaged, current):
                pair = groups.setdefault((a.device, a.dtype), ([], []))
                pair[0].append(a)
                pair[1].append(c)
            for averaged_group, current_group in groups.values():
                self._ema_update(averaged_group, current_group, self.n_averaged)
        self.n_averaged += 1  # where it lives (the CPU, as torch builds it): no device read


class EMA(AveragedWeights):
    """An exponential moving average of the weights, updated after every optimizer step, used
    for validation, the best weights, early stopping and the weights ``fit`` returns.

    After each update the average is ``decay * average + (1 - decay) * weights`` (torch's
    ``AveragedModel`` with ``get_ema_multi_avg_fn``; the first update copies the weights),
    updated without reading anything back from the device (``EMAModel``).
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
        return EMAModel(net, self.decay)

    def on_after_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.averaged is not None and optimizer is self.model.optimizer:
            self.averaged.update_parameters(self.net)

    def on_test_begin(self, logs: Optional[dict] = None) -> None:
        self.swap_in(epoch=-1)

    def on_epoch_end(self, epoch: int, logs: Optional[dict] = None) -> None:
        self.swap_in(epoch)  # an epoch that was not validated: the best weights still see the average


__all__ = ["EMA"]
