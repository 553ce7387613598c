"""Progress bars (``verbose=1``) or one line per epoch (``verbose=2``)."""

from __future__ import annotations

import time
from typing import Optional

from tqdm.auto import tqdm

from .base import Callback


def format_logs(logs: dict) -> str:
    return ", ".join(f"{k}={v:.4g}" for k, v in logs.items() if k != "epoch")


class ProgressBar(Callback):
    """A tqdm.auto bar per epoch: a widget in Jupyter, text in a terminal or a CI log.

    The running loss and metrics are read from the device only when the bar redraws
    (every ``mininterval`` seconds), never per step.
    """

    def __init__(self, verbose: int = 1, mininterval: float = 0.5):
        self.verbose = verbose
        self.mininterval = mininterval
        self.bar: Optional[tqdm] = None
        self._unshown_steps = 0
        self._last_draw = 0.0

    def on_epoch_begin(self, epoch, logs=None):
        if self.verbose != 1:
            return
        self.bar = tqdm(total=self.params.get("steps"), desc=f"Epoch {epoch}/{self.params.get('epochs')}", leave=True, dynamic_ncols=True)
        self._unshown_steps = 0
        self._last_draw = time.monotonic()

    def on_train_batch_end(self, batch, logs=None):
        if self.bar is None:
            return
        self._unshown_steps += 1
        now = time.monotonic()
        if now - self._last_draw >= self.mininterval:
            self._last_draw = now
            self.bar.set_postfix_str(format_logs(logs), refresh=False)
            self.bar.update(self._unshown_steps)
            self._unshown_steps = 0

    def on_epoch_end(self, epoch, logs=None):
        if self.verbose == 2:
            self.model.print(f"Epoch {epoch}/{self.params.get('epochs')}: {format_logs(logs)}")
            return
        if self.bar is None:
            return
        self.bar.update(self._unshown_steps)
        self.bar.set_postfix_str(format_logs(logs), refresh=True)
        self.bar.close()
        self.bar = None

    def on_train_end(self, logs=None):
        if self.bar is not None:  # interrupted mid-epoch
            self.bar.close()
            self.bar = None
