"""Stop when the loss becomes NaN or infinite."""

from __future__ import annotations

import math
from typing import Optional

import torch

from ..strategies import unwrap
from ..training.callback import ORDER_WATCH_NAN, Callback


def losses_are_finite(logs: dict) -> bool:
    """False when the epoch's ``train_loss`` or ``val_loss`` is NaN or infinite."""
    return all(math.isfinite(logs[k]) for k in ("train_loss", "val_loss") if k in logs)


def modules_with_nonfinite_weights(net: torch.nn.Module) -> list[str]:
    """The qualified names of the modules of ``net`` whose own parameters or buffers hold NaN or
    infinite values, in the net's order (``""``: the net itself)."""
    found = []
    for name, module in unwrap(net).named_modules():
        tensors = [*module.parameters(recurse=False), *module.buffers(recurse=False)]
        if any(t.is_floating_point() and not bool(torch.isfinite(t.detach()).all()) for t in tensors):
            found.append(name)
    return found


class TerminateOnNaN(Callback):
    """Stop training at the end of an epoch whose loss is NaN or infinite.

    The check reads the epoch's loss, which the loop already has as a float, so it adds
    no device sync (Keras looks at every batch's loss, which would cost one per step). The
    NaN epoch is never the best one, so the weights restored at the end are the last finite
    best. ``fit`` adds one of these to every run.

    When it stops, it notes what the run's report (``model.diagnose()``) says about the divergence:
    the epoch, the loss that was not finite, and, in a run of one process, the modules whose weights
    are NaN or infinite at that moment (before the best weights come back).

    ``raise_error=True`` (Keras's meaning) raises a ``RuntimeError`` instead of stopping
    gracefully, so the script fails loudly. Unlike Keras, the other callbacks' ``on_train_end``
    still runs, because that is where ``fit`` puts the best finite weights back; nothing a
    callback keeps on disk (the training state, checkpoints) is deleted at the end either way.

    Example::

        model.fit(dl_train, dl_val, epochs=3, callbacks=[kt.callbacks.TerminateOnNaN(raise_error=True)])
    """

    order = ORDER_WATCH_NAN

    def __init__(self, raise_error: bool = False, verbose: int = 1):
        if not isinstance(raise_error, bool):
            raise TypeError(
                f"raise_error={raise_error!r} must be True (raise a RuntimeError) or False (stop after the epoch)."
            )
        self.raise_error = raise_error
        if raise_error:
            self.order = ORDER_WATCH_NAN - 1  # raise before fit's own watcher prints that it stops gracefully
        self.verbose = verbose
        self.nan_epoch: Optional[int] = None
        self.nan_loss: Optional[str] = None  # "train_loss" or "val_loss": the first that was not finite
        # The modules holding NaN or infinite weights when it stopped (None: not looked at).
        self.broken_modules: Optional[list[str]] = None

    def on_train_begin(self, logs=None):
        self.nan_epoch, self.nan_loss, self.broken_modules = None, None, None

    def on_epoch_end(self, epoch, logs=None):
        bad = [k for k in ("train_loss", "val_loss") if k in logs and not math.isfinite(logs[k])]
        if not bad:
            return
        self.nan_epoch, self.nan_loss = epoch, bad[0]
        runtime = self.model.runtime
        if runtime is None or runtime.num_processes == 1:  # sharded weights are read whole by no process alone
            self.broken_modules = modules_with_nonfinite_weights(self.model.net)
        advice = "Try a lower learning rate, gradient_clip_val, or check the data for NaNs."
        if self.raise_error:
            raise RuntimeError(
                f"{bad[0]} is {logs[bad[0]]} at epoch {epoch}: TerminateOnNaN(raise_error=True) stops training. "
                "The net gets back the weights of the best epoch with a finite loss (or those from before "
                f"training). {advice}"
            )
        self.model.stop_training = True
        if self.verbose:
            self.model.print(
                f"Stopping: {bad[0]} is {logs[bad[0]]} at epoch {epoch}. "
                + ("The best finite weights are restored. " if epoch > 1 else "")
                + advice
            )
