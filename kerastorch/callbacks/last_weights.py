"""``fit(monitor=None)``: nothing is monitored, so the net keeps the last epoch's weights."""

from __future__ import annotations

import os
from typing import Optional, Union

from ..training.callback import ORDER_BEST_WEIGHTS, Callback
from .kept_weights import KeptWeights
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

    def __init__(
        self,
        ckpt_path: Optional[Union[str, os.PathLike]] = None,
        stale_state: Optional[str] = None,
        write_while_training: bool = True,
    ):
        # The weights from before training, and the file (see RestoreBestWeights for write_while_training).
        self.kept = KeptWeights(ckpt_path, stale_state, write_while_training)
        self.last_epoch: Optional[int] = None
        self.broke = False

    @property
    def last_weights(self) -> Optional[dict]:
        """The last finite epoch's weights, in host memory (None until an epoch is kept)."""
        return self.kept.weights

    def on_train_begin(self, logs=None):
        self.kept.begin(self.model)
        self.broke = False

    def on_epoch_end(self, epoch, logs=None):
        if not losses_are_finite(logs):
            self.broke = True
            return
        self.kept.keep(self.model)
        self.last_epoch = epoch

    def on_train_end(self, logs=None):
        broke = self.broke or not losses_are_finite(logs or {})
        if broke and self.last_weights is not None:
            self.kept.put_back(self.model, self.last_weights)
            self.model.print(f"Restored the weights of epoch {self.last_epoch}, the last one with a finite loss.")
        self.kept.end(self.model, logs, self.params, broke)

    def state_dict(self):
        # A training state that holds these weights is written only once ckpt_path holds them too:
        # a run killed after it must not resume with an older file at ckpt_path.
        self.kept.wait_written()
        return {"last_weights": self.last_weights, "last_epoch": self.last_epoch}

    def load_state_dict(self, state):
        self.kept.weights, self.last_epoch = state["last_weights"], state["last_epoch"]


__all__ = ["KeepLastWeights"]
