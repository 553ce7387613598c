"""``LivePlot``: the history figure, redrawn at the end of each epoch of ``fit``."""

from __future__ import annotations

import os
import tempfile
from typing import Optional, Sequence

import pandas as pd

from ..helpers.notebook import in_notebook
from ..helpers.plots import bare_name, history_quantities, plot_history
from ..settings import MonitorSettings, OutputSettings
from ..training.callback import ORDER_DISPLAY, Callback


class LivePlot(Callback):
    """``fit(plot=True)``: the history figure, redrawn at the end of each epoch.

    It shows the train and val curves of the loss and of the monitored metric, the best
    epoch marked and the best score in the title. In Jupyter one image is updated in
    place; elsewhere the figure is written to ``path`` (a PNG, replaced atomically each
    epoch) and the path is printed once. It draws at epoch end only, so steps are never
    slowed, and it never opens a window.

    Example::

        model.fit(dl_train, dl_val, epochs=20, monitor="val_acc", mode="max", plot=True)
        model.fit(dl_train, dl_val, callbacks=[kt.LivePlot("val_acc", "max", path="run.png")])
    """

    order = ORDER_DISPLAY

    def __init__(
        self,
        monitor: Optional[str] = None,
        mode: str = "min",
        path: str = "kerastorch_history.png",
        metrics: Optional[Sequence[str]] = None,
        dpi: int = 80,
    ):
        self.monitor, self.mode, self.path = monitor, mode, path
        self.metrics = metrics
        self.dpi = dpi
        self.figure = None  # the latest drawing, a matplotlib Figure
        self._rows: list[dict] = []
        self._display = None  # the notebook's display handle, once the figure is shown
        self._announced = False

    @classmethod
    def for_fit(cls, output: OutputSettings, watch: MonitorSettings) -> LivePlot:
        """The plot ``fit(plot=True)`` adds: the monitored value's curves, its best epoch marked."""
        return cls(monitor=watch.monitor, mode=watch.mode)

    def on_train_begin(self, logs=None):
        self._rows = []
        self._display = None
        self._announced = False
        if self.metrics is not None:  # a typo should fail now, not after the first epoch
            known = ["loss", *getattr(self.model, "metrics_dict", {})]
            unknown = [m for m in self.metrics if bare_name(m) not in known]
            if unknown:
                raise ValueError(
                    f"LivePlot(metrics={list(self.metrics)!r}): {unknown} will not be logged; "
                    f"this model logs {known} (with the train_/val_ prefix)."
                )

    def on_epoch_end(self, epoch, logs=None):
        if not self.model.is_main_process:
            return
        self._rows.append(dict(logs))
        history = pd.DataFrame(self._rows)
        self.figure = plot_history(
            history, metrics=self._panels(history), monitor=self._monitor(history), mode=self.mode
        )
        if in_notebook():
            self._show_in_notebook(self.figure)
        else:
            self._save(self.figure)

    def _monitor(self, history: pd.DataFrame) -> Optional[str]:
        return self.monitor if self.monitor in history else None

    def _panels(self, history: pd.DataFrame) -> list[str]:
        """The loss and the monitored metric (or the metrics asked for)."""
        if self.metrics is not None:
            return list(self.metrics)
        panels = ["loss"]
        if self.monitor and bare_name(self.monitor) in history_quantities(list(history.columns)):
            panels.append(bare_name(self.monitor))
        return panels

    def _show_in_notebook(self, fig) -> None:
        from IPython.display import Image, display

        image = Image(data=fig.to_png(self.dpi), format="png")
        if self._display is None:
            self._display = display(image, display_id=True)
        else:
            self._display.update(image)

    def _save(self, fig) -> None:
        # Written beside the target and renamed over it, so an image viewer never reads half a file.
        target = os.path.abspath(self.path)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        handle, partial = tempfile.mkstemp(prefix=".kerastorch_plot_", suffix=".png", dir=os.path.dirname(target))
        try:
            with os.fdopen(handle, "wb") as file:
                file.write(fig.to_png(self.dpi))
            os.replace(partial, target)
        except BaseException:
            if os.path.exists(partial):
                os.remove(partial)
            raise
        if not self._announced:
            self._announced = True
            self.model.print(f"Live plot: {target} (redrawn every epoch)")


__all__ = ["LivePlot"]
