"""Shared base of ``EMA`` and ``SWA``: an average of the weights that validation, the best
weights, early stopping and the weights ``fit`` returns see in place of the trained ones.

As Keras's ``SwapEMAWeights`` does, the averaged weights are swapped into the net when an
epoch's training ends (``on_test_begin``, or ``on_epoch_end`` on an epoch that is not
validated) and the trained ones are swapped back when the next epoch begins. This
callback's ``order`` puts it before ``RestoreBestWeights`` and ``EarlyStopping``, so they
see the averaged weights and their scores; the training state (order 90) saves both the
net as it is and the trained weights kept here, so a resumed run continues training from
the trained weights, bit for bit.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch.optim.swa_utils import AveragedModel

from ..strategies import strategy_of, unwrap
from ..training.callback import ORDER_AVERAGED_WEIGHTS, Callback


class AveragedWeights(Callback):
    """Keeps ``self.averaged`` (a torch ``AveragedModel``) and swaps it in and out of the net."""

    order = ORDER_AVERAGED_WEIGHTS

    def __init__(self) -> None:
        self.averaged: Optional[AveragedModel] = None
        self.trained: Optional[dict] = None  # the trained weights while the averaged ones are in the net
        self.swapped_epoch: Optional[int] = None  # the epoch whose end swapped the averaged weights in

    def make_average(self, net: torch.nn.Module) -> AveragedModel:
        raise NotImplementedError

    @property
    def net(self) -> torch.nn.Module:
        return unwrap(self.model.net)

    def on_train_begin(self, logs: Optional[dict] = None) -> None:
        refusal = strategy_of(self.model).whole_copy_refusal
        if refusal:
            raise ValueError(
                f"{type(self).__name__} keeps a whole copy of the net (its average) beside it, but {refusal}."
            )
        # A resumed run loads the saved average into this one afterwards (the training state comes later).
        self.averaged = self.make_average(self.net)
        self.trained, self.swapped_epoch = None, None

    def on_epoch_begin(self, epoch: int, logs: Optional[dict] = None) -> None:
        self.swap_out()

    def swap_in(self, epoch: int) -> None:
        """Put the averaged weights in the net, keeping the trained ones to put back."""
        if self.swapped_epoch is not None or self.averaged is None:
            return
        net = self.net
        self.trained = {k: v.detach().clone() for k, v in net.state_dict().items()}
        net.load_state_dict(self.averaged.module.state_dict(), strict=False)
        self.swapped_epoch = epoch

    def swap_out(self) -> None:
        """Put the trained weights back, to train on."""
        if self.swapped_epoch is None or self.trained is None:
            return
        self.net.load_state_dict(self.trained)
        self.trained, self.swapped_epoch = None, None

    def state_dict(self) -> dict:
        return {
            "averaged": self.averaged.state_dict() if self.averaged is not None else None,
            "trained": self.trained,
            "swapped_epoch": self.swapped_epoch,
        }

    def load_state_dict(self, state: dict) -> None:
        if state["averaged"] is not None and self.averaged is not None:
            self.averaged.load_state_dict(state["averaged"])
        self.trained, self.swapped_epoch = state["trained"], state["swapped_epoch"]
