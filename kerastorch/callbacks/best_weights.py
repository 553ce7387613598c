"""Keep the best epoch's weights and put them back in the net when training ends."""

from __future__ import annotations

import os
from typing import Optional, Union

from ..training.callback import ORDER_BEST_WEIGHTS
from .kept_weights import KeptWeights
from .monitor import MonitorCallback
from .terminate_on_nan import losses_are_finite


class RestoreBestWeights(MonitorCallback):
    """Remember the weights of the epoch with the best ``monitor`` value and load them back
    into the net when ``fit`` returns: after the last epoch, after early stopping, after
    Ctrl-C and after a NaN loss.

    The copy lives in host memory, so no file is left in your folder. With ``ckpt_path``
    the best weights are also written there (safetensors, atomically: a crash never leaves
    a half-written file). ``fit`` adds one of these to every run.

    When no epoch could be the best because training broke first — a NaN loss in the first
    epoch, Ctrl-C before the first epoch ended — the weights from before training come back
    (never the half-trained or NaN ones), and it says so.

    ``restore=False`` (what ``EarlyStopping(restore_best_weights=True or False)`` among the
    callbacks asks of ``fit``) still keeps and writes the best weights but leaves the last
    ones in the net — except after a NaN loss, whose weights are never kept.

    The file is written while the next epoch trains; ``write_while_training=False`` (what ``fit``
    chooses when callbacks of the user's may read it) writes it before this epoch's later callbacks.
    """

    order = ORDER_BEST_WEIGHTS

    def __init__(
        self,
        monitor: str = "val_loss",
        mode: str = "min",
        min_delta: float = 0.0,
        ckpt_path: Optional[Union[str, os.PathLike]] = None,
        verbose: int = 0,
        stale_state: Optional[str] = None,
        restore: bool = True,
        write_while_training: bool = True,
    ):
        super().__init__(monitor, mode, min_delta)
        self.restore = restore
        # The weights from before training, and the file.
        self.kept = KeptWeights(ckpt_path, stale_state, write_while_training)
        self.verbose = verbose
        self.broke = False  # a NaN or infinite loss was seen
        # The run's early stoppings: why the run stopped is said before which weights the net ends with.
        self.stoppers: list = []

    @property
    def ckpt_path(self) -> Optional[Union[str, os.PathLike]]:
        return self.kept.ckpt_path

    @property
    def best_weights(self) -> Optional[dict]:
        """The best epoch's weights, in host memory (None until an epoch is kept)."""
        return self.kept.weights

    def on_train_begin(self, logs=None):
        self.kept.begin(self.model)
        self.best, self.best_epoch, self.broke = None, None, False

    def on_epoch_end(self, epoch, logs=None):
        # An epoch with a NaN or infinite loss is never the best, whatever the monitored metric says.
        if not losses_are_finite(logs):
            self.broke = True
            return
        if not self.watches(logs) or not self.update_best(epoch, logs):
            return
        self.kept.keep(self.model)
        if self.verbose:
            self.model.print(f"New best {self.monitor}={self.best:.6g} at epoch {epoch}.")

    def on_train_end(self, logs=None):
        # The last row's loss too: a callback that raised on it (TerminateOnNaN(raise_error=True)) kept
        # this callback from seeing that epoch.
        broke = self.broke or not losses_are_finite(logs or {})
        says = bool((self.params or {}).get("verbose"))
        for stopper in self.stoppers:
            stopper.say_stopped()
        if self.best_weights is not None and (self.restore or broke):
            self.kept.put_back(self.model, self.best_weights)
            # Said once, so a reader knows which weights the net holds now (not the last epoch's).
            if says:
                self.model.print(
                    f"Restored the weights of epoch {self.best_epoch} ({self.monitor} {self.best:.4f}, the best)."
                )
        elif says and self.restore and not broke and self.best_epoch is None and self.monitor in (logs or {}):
            self.model.print(f"No epoch had a finite {self.monitor}: the net keeps the last epoch's weights.")
        self.kept.end(self.model, logs, self.params, broke)

    def state_dict(self):
        # A training state that holds these weights is written only once ckpt_path holds them too:
        # a run killed after it must not resume with an older file at ckpt_path.
        self.kept.wait_written()
        return {**super().state_dict(), "best_weights": self.best_weights}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.kept.weights = state["best_weights"]
        # ckpt_path holds the best weights when fit returns: a file deleted since the saved run is
        # written again now, not only at the next better epoch (which may never come).
        if self.kept.write_if_missing(self.model) and (self.params or {}).get("verbose"):
            self.model.print(
                f"{os.fspath(self.kept.ckpt_path)!r} was missing: the weights of epoch {self.best_epoch} (the best "
                "so far) are written to it again."
            )


__all__ = ["RestoreBestWeights"]
