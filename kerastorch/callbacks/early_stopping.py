"""Stop training when a monitored value has stopped improving."""

from __future__ import annotations

import numbers
from typing import Optional

from .base import ORDER_EARLY_STOPPING
from .monitor import MonitorCallback


class EarlyStopping(MonitorCallback):
    """Stop when ``monitor`` has not improved by more than ``min_delta`` for ``patience`` epochs.

    Training stops exactly ``patience`` epochs after the best one. ``fit(patience=...)``
    adds one of these; pass your own in ``callbacks`` for other settings.

    Example::

        model.fit(dl_train, dl_val, epochs=50,
                  callbacks=[kt.callbacks.EarlyStopping("val_acc", mode="max", patience=3)])
    """

    order = ORDER_EARLY_STOPPING

    def __init__(
        self, monitor: str = "val_loss", mode: str = "min", patience: int = 5, min_delta: float = 0.0, verbose: int = 1
    ):
        super().__init__(monitor, mode, min_delta)
        if not isinstance(patience, numbers.Integral) or isinstance(patience, bool) or patience < 0:
            raise ValueError(
                f"patience={patience!r} must be a whole number of epochs >= 0 (or None in fit to never stop early)."
            )
        self.patience = int(patience)
        self.verbose = verbose
        self.wait = 0
        self.stopped_epoch: Optional[int] = None

    def on_train_begin(self, logs=None):
        self.check_monitor_is_logged()
        # A reused instance must not compare with the previous fit's best (Keras resets it too).
        self.best, self.best_epoch = None, None
        self.wait = 0
        self.stopped_epoch = None

    def on_epoch_end(self, epoch, logs=None):
        if not self.watches(logs):  # not validated this epoch: it does not count towards patience
            return
        if self.update_best(epoch, logs):
            self.wait = 0
            return
        self.wait += 1
        if self.wait >= self.patience:
            self.stopped_epoch = epoch
            self.model.stop_training = True
            if self.verbose:
                self.model.print(
                    f"Early stopping at epoch {epoch}: {self.monitor} has not improved for {self.wait} epoch(s); "
                    f"best {self.monitor}={self.best:.6g} at epoch {self.best_epoch}."
                )

    def state_dict(self):
        return {**super().state_dict(), "wait": self.wait}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.wait = state["wait"]
