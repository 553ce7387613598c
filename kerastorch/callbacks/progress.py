"""Progress during ``fit``: bars (``verbose=1``) or one line per epoch (``verbose=2``).

With ``verbose=1`` the form follows where the output goes (see :mod:`kerastorch.notebook`):

- Jupyter: two widgets, an epoch bar over the whole run and a step bar that is reset
  at each epoch (not one new bar per epoch), so a 100-epoch run stays two lines tall.
- a terminal: one text bar per epoch, left on screen with the epoch's results.
- anything else (CI logs, pipes, files): one line per epoch, since every redraw of a
  text bar would be a new line there.
"""

from __future__ import annotations

import time
from typing import Optional, TextIO

from tqdm.std import tqdm as text_tqdm

from ..notebook import output_style
from .base import ORDER_PROGRESS, Callback


def format_logs(logs) -> str:
    return ", ".join(f"{k}={v:.4g}" for k, v in logs.items() if k != "epoch")


class ProgressBar(Callback):
    """tqdm bars that read the running loss and metrics only when they redraw.

    The loop hands per-step logs that stay on the device until looked at; this
    callback looks every ``mininterval`` seconds at most, never per step.

    ``style`` is ``"auto"`` (the default: see the module docstring), ``"notebook"``,
    ``"terminal"`` or ``"lines"``; ``file`` is where text bars go (default ``sys.stderr``).

    Example::

        model.fit(dl_train, dl_val, verbose=0,
                  callbacks=[kt.callbacks.ProgressBar(style="lines")])
    """

    STYLES = ("auto", "notebook", "terminal", "lines")
    order = ORDER_PROGRESS

    def __init__(self, verbose: int = 1, mininterval: float = 0.5, style: str = "auto", file: Optional[TextIO] = None):
        if style not in self.STYLES:
            raise ValueError(f"style={style!r}; use one of {', '.join(repr(s) for s in self.STYLES)}.")
        self.verbose = verbose
        self.mininterval = mininterval
        self.style = style
        self.file = file
        self.epoch_bar = None  # notebook only: one bar over the epochs
        self.step_bar = None  # the steps of the current epoch
        self._active_style: Optional[str] = None
        self._unshown_steps = 0
        self._last_draw = 0.0
        self._epoch_start = 0.0

    # -- choosing the form ----------------------------------------------------------------

    def _choose_style(self) -> Optional[str]:
        if not self.verbose or not self.model.is_main_process:
            return None
        if self.verbose == 2:
            return "lines"
        if self.style != "auto":
            return self.style
        return output_style(self.file)

    def _new_bar(self, **kwargs):
        if self._active_style == "notebook":
            try:
                from tqdm.notebook import tqdm as notebook_tqdm

                return notebook_tqdm(**kwargs)
            except ImportError:  # no ipywidgets: text bars, which Jupyter redraws fine
                self._active_style = "terminal"
        return text_tqdm(file=self.file, dynamic_ncols=True, **kwargs)

    # -- hooks ------------------------------------------------------------------------------

    def on_train_begin(self, logs=None):
        self._close_bars()
        self._active_style = self._choose_style()
        if self._active_style == "notebook":
            self.epoch_bar = self._new_bar(total=self.params.get("epochs"), desc="Epochs", unit="epoch", leave=True)
        if self._active_style == "notebook":  # still a notebook: the widgets imported
            self.step_bar = self._new_bar(
                total=self.params.get("steps"), desc="Epoch 1", unit="step", leave=True, mininterval=self.mininterval
            )

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_start = time.monotonic()
        self._unshown_steps = 0
        self._last_draw = self._epoch_start
        description = f"Epoch {epoch}/{self.params.get('epochs')}"
        if self._active_style == "notebook":
            self.step_bar.reset(total=self.params.get("steps"))
            self.step_bar.set_description(description, refresh=False)
        elif self._active_style == "terminal":
            self.step_bar = self._new_bar(
                total=self.params.get("steps"), desc=description, unit="step", leave=True, mininterval=self.mininterval
            )

    def on_train_batch_end(self, batch, logs=None):
        if self.step_bar is None:
            return
        self._unshown_steps += 1
        now = time.monotonic()
        if now - self._last_draw >= self.mininterval:
            self._last_draw = now
            # Reading logs here is the only device-to-host copy the bar makes.
            self.step_bar.set_postfix_str(format_logs(logs), refresh=False)
            self.step_bar.update(self._unshown_steps)
            self._unshown_steps = 0

    def on_epoch_end(self, epoch, logs=None):
        if self._active_style is None:
            return
        if self._active_style == "lines":
            seconds = time.monotonic() - self._epoch_start
            self.model.print(f"Epoch {epoch}/{self.params.get('epochs')} ({seconds:.2f}s): {format_logs(logs)}")
            return
        self.step_bar.update(self._unshown_steps)
        self._unshown_steps = 0
        if self._active_style == "notebook":
            train_logs = {k: v for k, v in logs.items() if k.startswith("train_")}
            self.step_bar.set_postfix_str(format_logs(train_logs), refresh=True)
            self.epoch_bar.update(1)
            self.epoch_bar.set_postfix_str(format_logs(logs), refresh=True)
        else:
            self.step_bar.set_postfix_str(format_logs(logs), refresh=True)
            self.step_bar.close()
            self.step_bar = None

    def on_train_end(self, logs=None):
        stopped_early = self.model is not None and self.model.stop_training
        if self.epoch_bar is not None and stopped_early:
            # Ending early on purpose is a finished run: show a full (green) bar, not a failed one.
            self.epoch_bar.total = self.epoch_bar.n
            container = getattr(self.epoch_bar, "container", None)
            if container is not None:
                container.children[1].max = self.epoch_bar.n
        self._close_bars()

    def _close_bars(self) -> None:
        for bar in (self.step_bar, self.epoch_bar):
            if bar is not None:
                bar.close()
        self.step_bar = self.epoch_bar = None
