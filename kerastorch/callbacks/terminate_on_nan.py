"""Stop when the loss becomes NaN or infinite."""

from __future__ import annotations

import math

from .base import ORDER_WATCH_NAN, Callback


def losses_are_finite(logs: dict) -> bool:
    """False when the epoch's ``train_loss`` or ``val_loss`` is NaN or infinite."""
    return all(math.isfinite(logs[k]) for k in ("train_loss", "val_loss") if k in logs)


class TerminateOnNaN(Callback):
    """Stop training at the end of an epoch whose loss is NaN or infinite.

    The check reads the epoch's loss, which the loop already has as a float, so it adds
    no device sync. The NaN epoch is never the best one, so the weights restored at the
    end are the last finite best. ``fit`` adds one of these to every run.
    """

    order = ORDER_WATCH_NAN

    def __init__(self, verbose: int = 1):
        self.verbose = verbose
        self.nan_epoch = None

    def on_train_begin(self, logs=None):
        self.nan_epoch = None

    def on_epoch_end(self, epoch, logs=None):
        bad = [k for k in ("train_loss", "val_loss") if k in logs and not math.isfinite(logs[k])]
        if bad:
            self.nan_epoch = epoch
            self.model.stop_training = True
            if self.verbose:
                self.model.print(
                    f"Stopping: {bad[0]} is {logs[bad[0]]} at epoch {epoch}. "
                    + ("The best finite weights are restored. " if epoch > 1 else "")
                    + "Try a lower learning rate, gradient_clip_val, or check the data for NaNs."
                )
