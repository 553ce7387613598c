"""Lower the learning rate when a monitored value has stopped improving (Keras's ``ReduceLROnPlateau``)."""

from __future__ import annotations

from typing import Optional

import torch

from ..helpers.values import check_real_number, check_verbose, check_whole_number
from .monitor import MonitorCallback


class ReduceLROnPlateau(MonitorCallback):
    """Multiply the learning rate of every param group of ``model.optimizer`` by ``factor`` when
    ``monitor`` has not improved for ``patience`` epochs: Keras's callback, rule for rule.

    After each epoch whose logs hold ``monitor`` (epochs that were not validated, with
    ``fit(validation_freq=n)``, are skipped and count for nothing):

    1. during a cooldown, the cooldown counter goes down by one and ``wait`` is reset to 0;
    2. a value better than the best so far by more than ``min_delta`` (``value < best - min_delta``
       in ``"min"`` mode, ``value > best + min_delta`` in ``"max"``; the first value always is, a
       NaN never) becomes the best and resets ``wait``;
    3. otherwise, unless still in the cooldown, ``wait`` goes up by one, and when it reaches
       ``patience`` every group's rate above ``min_lr`` becomes ``max(lr * factor, min_lr)``; if
       one did, ``wait`` goes back to 0 and a cooldown of ``cooldown`` epochs begins.

    The new rate applies from the next epoch, so the history's ``lr`` column (the rate each
    epoch trained with) shows it one row later. With ``fit(resume=True)`` its counters are part
    of the training state (and the rates are in the optimizer's). This is a callback, like
    Keras's; torch's ``torch.optim.lr_scheduler.ReduceLROnPlateau`` passed as ``lr_scheduler``
    works too (stepped with fit's ``monitor``).

    Example::

        model.fit(dl_train, dl_val, epochs=20, callbacks=[
            kt.callbacks.ReduceLROnPlateau(monitor="val_loss", factor=0.5, patience=2, min_lr=1e-4)])
    """

    def __init__(
        self,
        monitor: str = "val_loss",
        factor: float = 0.1,
        patience: int = 10,
        verbose: int = 0,
        mode: str = "auto",
        min_delta: float = 1e-4,
        cooldown: int = 0,
        min_lr: float = 0.0,
    ):
        super().__init__(monitor, mode, min_delta)
        self.factor = check_real_number("factor", factor, " (the new rate is lr * factor), e.g. factor=0.1")
        if not 0.0 <= self.factor < 1.0:
            raise ValueError(
                f"factor={factor!r} must be at least 0 and below 1, since the new rate is lr * factor "
                "(factor=0.1 divides it by 10, factor=0.5 halves it)."
            )
        self.patience = check_whole_number("patience", patience, 0, ", e.g. patience=5")
        self.verbose = check_verbose(verbose)
        self.cooldown = check_whole_number("cooldown", cooldown, 0, " (epochs to wait after a reduction)")
        self.min_lr = check_real_number("min_lr", min_lr, ", e.g. min_lr=1e-6")
        if self.min_lr < 0:
            raise ValueError(f"min_lr={min_lr!r} must be >= 0: it is the lowest learning rate the callback sets.")
        self.wait = 0
        self.cooldown_counter = 0

    def on_train_begin(self, logs=None):
        self.check_monitor_is_logged()
        self.resolve_mode()
        # A reused instance starts afresh (a resumed run gets its state back afterwards).
        self.best, self.best_epoch = None, None
        self.wait = 0
        self.cooldown_counter = 0

    def on_epoch_end(self, epoch, logs=None):
        if not self.watches(logs):  # not validated this epoch: it counts for nothing
            return
        if self.cooldown_counter > 0:
            self.cooldown_counter -= 1
            self.wait = 0
        if self.update_best(epoch, logs):
            self.wait = 0
        elif self.cooldown_counter == 0:
            self.wait += 1
            if self.wait >= self.patience and self.reduce_lr(epoch) is not None:
                self.cooldown_counter = self.cooldown
                self.wait = 0

    def reduce_lr(self, epoch: int) -> Optional[list[float]]:
        """Lower every group's rate above ``min_lr``; the new rates, or None when all were at ``min_lr``."""
        groups = self.model.optimizer.param_groups
        if not any(float(group["lr"]) > self.min_lr for group in groups):
            return None
        for group in groups:
            old = float(group["lr"])
            if old > self.min_lr:
                new = max(old * self.factor, self.min_lr)
                if isinstance(group["lr"], torch.Tensor):  # a tensor rate (capturable optimizers) is changed in place
                    group["lr"].fill_(new)
                else:
                    group["lr"] = new
        rates = [float(group["lr"]) for group in groups]
        if self.verbose:
            shown = ", ".join(f"{lr:.4g}" for lr in rates)
            self.model.print(
                f"Epoch {epoch}: ReduceLROnPlateau reducing the learning rate to {shown} ({self.monitor} has not "
                f"improved for {self.wait} epoch(s))."
            )
        return rates

    def state_dict(self):
        return {**super().state_dict(), "wait": self.wait, "cooldown_counter": self.cooldown_counter}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.wait = int(state["wait"])
        self.cooldown_counter = int(state["cooldown_counter"])


__all__ = ["ReduceLROnPlateau"]
