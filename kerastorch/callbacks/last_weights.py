"""``fit(monitor=None)``: nothing is monitored, so the net keeps the last epoch's weights."""

from __future__ import annotations

import os
from typing import Optional, Union

from ..files.weights import save_weights
from ..strategies import strategy_of
from .base import ORDER_BEST_WEIGHTS, Callback
from .terminate_on_nan import losses_are_finite


class KeepLastWeights(Callback):
    """The weights fit keeps when it monitors nothing: the last epoch's, the last one whose loss was
    finite. (A GAN's losses say little about which epoch is best: ``monitor=None`` trains every epoch
    and keeps the last.)

    A copy of them lives in host memory, so that a NaN or infinite loss (which stops the run) never
    leaves NaN weights in the net: the last finite epoch's come back, and it says so. With
    ``ckpt_path`` they are also written there after every epoch, atomically. Ctrl-C before the first
    epoch ended puts back the weights from before training, as after a NaN in the first epoch.
    ``fit`` adds one of these instead of :class:`~kerastorch.callbacks.RestoreBestWeights` when
    ``monitor=None``.
    """

    order = ORDER_BEST_WEIGHTS

    def __init__(self, ckpt_path: Optional[Union[str, os.PathLike]] = None, stale_state: Optional[str] = None):
        self.ckpt_path = ckpt_path
        self.stale_state = stale_state  # an old run's training state, removed when this run first writes ckpt_path
        self.last_weights: Optional[dict] = None
        self.last_epoch: Optional[int] = None
        self.initial_weights: Optional[dict] = None
        self.broke = False

    def on_train_begin(self, logs=None):
        self.initial_weights = strategy_of(self.model).whole_weights(self.model.net)
        self.broke = False

    def on_epoch_end(self, epoch, logs=None):
        if not losses_are_finite(logs):
            self.broke = True
            return
        self.last_weights = strategy_of(self.model).whole_weights(self.model.net)
        self.last_epoch = epoch
        if self.ckpt_path and self.model.is_main_process:
            save_weights(self.last_weights, self.ckpt_path)
            if self.stale_state and os.path.isfile(self.stale_state):
                os.remove(self.stale_state)  # resume=False: the old run's state belongs to other weights
            self.stale_state = None

    def on_train_end(self, logs=None):
        broke = self.broke or not losses_are_finite(logs or {})
        strategy = strategy_of(self.model)
        if broke and self.last_weights is not None:
            strategy.load_whole_weights(self.model.net, self.last_weights)
            self.model.print(f"Restored the weights of epoch {self.last_epoch}, the last one with a finite loss.")
        elif self.initial_weights is not None and (broke or (not logs and self.params.get("epochs"))):
            strategy.load_whole_weights(self.model.net, self.initial_weights)
            if broke:
                self.model.print("No epoch had a finite loss, so the weights from before training are restored.")
        self.initial_weights = None

    def state_dict(self):
        return {"last_weights": self.last_weights, "last_epoch": self.last_epoch}

    def load_state_dict(self, state):
        self.last_weights, self.last_epoch = state["last_weights"], state["last_epoch"]


__all__ = ["KeepLastWeights"]
