"""Progress during ``fit``: bars (``verbose=1``) or one line per epoch (``verbose=2``).

Whatever the form, each finished epoch leaves one summary line with every value in full
and the monitored value marked when it improved::

    Epoch 3/20 (1.21s): train_loss=0.3707, train_acc=0.9223, lr=0.001, val_loss=0.3271, val_acc=0.9287 ★ best

During an epoch a compact bar shows the running training values (short names, so it
fits 80 columns). With ``verbose=1`` the form follows where the output goes (see
:mod:`kerastorch.tools.notebook`):

- Jupyter: one output updated in place (:mod:`~kerastorch.callbacks.notebook_progress`):
  the finished epochs' lines, then the running epoch's bar. No widgets needed.
- a terminal: a text bar during the epoch, replaced by the epoch's line when it ends
  (wrapped at the terminal's width, never cut).
- anything else (CI logs, pipes, files): the epoch's line alone, since every redraw of a
  text bar would be a new line there.
"""

from __future__ import annotations

import math
import os
import shutil
import time
from typing import Any, Optional, TextIO

from tqdm.std import tqdm as text_tqdm

from ..helpers.notebook import output_style
from ..settings import OutputSettings
from ..training.callback import ORDER_PROGRESS, Callback
from .monitor import improves
from .notebook_progress import NotebookProgress

BEST_MARK = " ★ best"


def format_logs(logs, mark: Optional[str] = None) -> str:
    """``name=value, ...`` for every value but the epoch; ``mark`` follows the value it names."""
    return ", ".join(f"{k}={v:.4g}{BEST_MARK if k == mark else ''}" for k, v in logs.items() if k != "epoch")


def running_values(logs) -> str:
    """The running training values, short: ``loss=0.4123, acc=0.8711``."""
    return ", ".join(f"{k.removeprefix('train_')}={v:.4g}" for k, v in logs.items() if k != "epoch")


def wrap_items(line: str, width: int, indent: str = "    ") -> str:
    """``line`` broken after ``", "`` so that no piece is wider than ``width`` (a terminal wraps,
    but mid-number; tqdm would cut it)."""
    if len(line) <= width:
        return line
    pieces, current = [], ""
    for item in line.split(", "):
        candidate = f"{current}, {item}" if current else item
        if current and len(candidate) > width:
            pieces.append(current + ",")
            current = indent + item
        else:
            current = candidate
    pieces.append(current)
    return "\n".join(pieces)


class ProgressBar(Callback):
    """Progress bars that read the running loss and metrics only when they redraw.

    The loop hands per-step logs that stay on the device until looked at; this
    callback looks every ``mininterval`` seconds at most, never per step.

    ``style`` is ``"auto"`` (the default: see the module docstring), ``"notebook"``,
    ``"terminal"`` or ``"lines"``; ``file`` is where text goes (default ``sys.stderr``
    for the terminal's bar, the model's printing for the epochs' lines).

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
        self.step_bar: Any = None  # the terminal's bar over the current epoch's steps
        self.notebook: Optional[NotebookProgress] = None
        self._active_style: Optional[str] = None
        self._best: Optional[float] = None
        self._label = ""
        self._done = 0
        self._unshown_steps = 0
        self._last_draw = 0.0
        self._epoch_start = 0.0

    @classmethod
    def for_fit(cls, output: OutputSettings) -> ProgressBar:
        """The bar ``fit(verbose=...)`` adds, as fit's display settings ask for it."""
        return cls(verbose=output.verbose)

    # -- choosing the form ----------------------------------------------------------------

    def _choose_style(self) -> Optional[str]:
        if not self.verbose or not self.model.is_main_process:
            return None
        if self.verbose == 2:
            return "lines"
        if self.style != "auto":
            return self.style
        return output_style(self.file)

    def set_model(self, model):
        super().set_model(model)
        self._active_style = self._choose_style()
        # Only a drawn bar needs a call at every step; the epoch's line alone (CI logs, pipes, verbose=2)
        # needs none, and the loop then makes none: a hook set to None on the instance is one the
        # callback list does not call (see training.callback.hooks_of). A subclass's own hook stays.
        vars(self).pop("on_train_batch_end", None)
        drawn = self._active_style in ("terminal", "notebook")
        if not drawn and type(self).on_train_batch_end is ProgressBar.on_train_batch_end:
            self.on_train_batch_end = None

    # -- hooks ------------------------------------------------------------------------------

    def on_train_begin(self, logs=None):
        self._close()
        self._best = None
        if self._active_style == "notebook":
            self.notebook = NotebookProgress()

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_start = time.monotonic()
        self._unshown_steps = self._done = 0
        self._last_draw = self._epoch_start
        self._label = f"Epoch {epoch}/{self.params.get('epochs')}"
        if self.notebook is not None:
            self.notebook.show(self._label, 0, self.params.get("steps"))
        elif self._active_style == "terminal":
            self.step_bar = text_tqdm(
                total=self.params.get("steps"),
                desc=self._label,
                unit="step",
                leave=False,  # replaced by the epoch's line when it ends
                file=self.file,
                dynamic_ncols=True,
                mininterval=self.mininterval,
            )

    def on_train_batch_end(self, batch, logs=None):
        if self.step_bar is None and self.notebook is None:
            return
        self._unshown_steps += 1
        now = time.monotonic()
        if now - self._last_draw >= self.mininterval:
            self._last_draw = now
            # Reading logs here is the only device-to-host copy the bar makes.
            values = running_values(logs)
            self._done += self._unshown_steps
            if self.notebook is not None:
                self.notebook.show(self._label, self._done, self.params.get("steps"), values)
            else:
                self.step_bar.set_postfix_str(values, refresh=False)
                self.step_bar.update(self._unshown_steps)
            self._unshown_steps = 0

    def on_epoch_end(self, epoch, logs=None):
        if self._active_style is None:
            return
        seconds = time.monotonic() - self._epoch_start
        line = f"{self._label} ({seconds:.2f}s): {format_logs(logs, self._improved(epoch, logs))}"
        if self._active_style == "lines":
            self.model.print(line)
        elif self.notebook is not None:
            self.notebook.add_line(line)
            self.notebook.show(self._label, self.params.get("steps") or self._done, self.params.get("steps"))
        else:
            if self.step_bar is not None:
                self.step_bar.close()  # leave=False: the bar is erased, the line takes its place
                self.step_bar = None
            text_tqdm.write(wrap_items(line, terminal_width(self.file) - 1), file=self.file)

    def on_train_end(self, logs=None):
        self._close()

    # -- helpers ------------------------------------------------------------------------------

    def _improved(self, epoch: int, logs) -> Optional[str]:
        """The monitored name when this epoch's value is the best so far, else None: fit's own decision
        (``params["best"]``, the callback that keeps its best weights) when there is one."""
        monitor, mode = self.params.get("monitor"), self.params.get("mode", "min")
        best = self.params.get("best")
        if best is not None:
            return monitor if best.best_epoch == epoch else None
        value = logs.get(monitor)
        if value is None or (isinstance(value, float) and not math.isfinite(value)):
            return None
        if not improves(value, self._best, mode):
            return None
        self._best = value
        return monitor

    def _close(self) -> None:
        if self.step_bar is not None:
            self.step_bar.close()
        # The notebook's output stays as last drawn: every finished epoch's line, and the
        # bar of the last epoch (full, or where Ctrl-C stopped it).
        self.step_bar, self.notebook = None, None


def terminal_width(file: Optional[TextIO]) -> int:
    """The width of the terminal ``file`` (default: standard output) is shown on; 80 if unknown."""
    try:
        return os.get_terminal_size(file.fileno()).columns if file is not None else shutil.get_terminal_size().columns
    except (AttributeError, OSError, ValueError):
        return 80
