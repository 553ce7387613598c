"""History plots: ``plot_history`` for a finished run and ``LivePlot`` during ``fit``.

Figures are made with matplotlib's object API (no pyplot), so nothing opens a window
or blocks, in a terminal, a script or a notebook, and figures are freed as soon as
they are no longer used (pyplot would keep every one of them alive).
"""

from __future__ import annotations

import functools
import io
import os
import tempfile
from typing import Optional, Sequence

import pandas as pd

from .callbacks.base import Callback
from .notebook import in_notebook

PREFIXES = ("train_", "val_")


@functools.lru_cache(maxsize=None)
def _figure_class():
    """``HistoryFigure``, defined on first use: importing matplotlib costs half a second,
    which ``import kerastorch`` should not pay when nothing is plotted."""
    from matplotlib.figure import Figure

    class HistoryFigure(Figure):
        """A matplotlib ``Figure`` that Jupyter shows as an image even if pyplot was never imported."""

        def to_png(self, dpi: int = 80) -> bytes:
            buffer = io.BytesIO()
            self.savefig(buffer, format="png", dpi=dpi)
            return buffer.getvalue()

        def _repr_png_(self) -> bytes:
            return self.to_png()

    return HistoryFigure


def history_quantities(columns: Sequence[str]) -> list[str]:
    """Bare names of the quantities in a history, in column order: ``["loss", "acc"]``."""
    found: list[str] = []
    for col in columns:
        for prefix in PREFIXES:
            if col.startswith(prefix) and col[len(prefix):] not in found:
                found.append(col[len(prefix):])
    return found


def bare_name(column: str) -> str:
    """``"val_acc"`` -> ``"acc"``; a name without a prefix is returned as it is."""
    for prefix in PREFIXES:
        if column.startswith(prefix):
            return column[len(prefix):]
    return column


def best_epoch(dfhistory: pd.DataFrame, monitor: Optional[str], mode: str = "min") -> Optional[tuple[int, float]]:
    """``(epoch, score)`` of the best row for ``monitor``; NaN scores are never best."""
    if not monitor or monitor not in dfhistory or dfhistory[monitor].isna().all():
        return None
    scores = dfhistory[monitor]
    index = scores.idxmax() if mode == "max" else scores.idxmin()  # both skip NaN
    return int(dfhistory.loc[index, "epoch"]), float(scores.loc[index])


def plot_history(dfhistory: pd.DataFrame, metrics: Optional[Sequence[str]] = None, monitor: Optional[str] = None,
                 mode: str = "min") -> "matplotlib.figure.Figure":
    """A figure with one panel per quantity (loss, then each metric), train and val curves
    together, the best epoch of ``monitor`` marked and the best score in the title.

    ``metrics`` picks the panels by name, with or without the prefix (``["loss", "acc"]``
    or ``["val_acc"]``); the default is every quantity in the history. ``monitor``
    defaults to ``val_loss`` (or ``train_loss`` without validation); pass the one ``fit``
    monitored, with its ``mode``, to mark the epoch whose weights ``fit`` kept.

    Returns a matplotlib ``Figure``: Jupyter shows it when it ends a cell, and
    ``fig.savefig("history.png")`` writes it to a file.

    >>> fig = kt.plot_history(dfhistory, monitor="val_acc", mode="max")   # doctest: +SKIP
    """
    if not isinstance(dfhistory, pd.DataFrame) or "epoch" not in dfhistory:
        raise ValueError("plot_history takes the DataFrame that fit returns (it has an 'epoch' column); "
                         f"got a {type(dfhistory).__name__}.")
    if len(dfhistory) == 0:
        raise ValueError("plot_history got a history with no epochs: train for at least one epoch first.")
    if mode not in ("min", "max"):
        raise ValueError(f"mode={mode!r}; use 'min' (lower is better, e.g. a loss) or 'max' (e.g. accuracy).")
    available = history_quantities(list(dfhistory.columns))
    quantities = _chosen_quantities(metrics, available)
    if monitor is None:
        monitor = "val_loss" if "val_loss" in dfhistory else "train_loss"
    elif monitor not in dfhistory:
        raise ValueError(f"monitor={monitor!r} is not a column of this history; its columns are "
                         f"{list(dfhistory.columns)}.")

    fig = _figure_class()(figsize=(4.6 * len(quantities), 3.4), layout="constrained")
    axes = fig.subplots(1, len(quantities), squeeze=False)[0]
    epochs = dfhistory["epoch"]
    best = best_epoch(dfhistory, monitor, mode)
    for ax, name in zip(axes, quantities):
        for prefix, style in (("train_", "o-"), ("val_", "s--")):
            col = prefix + name
            if col in dfhistory:
                ax.plot(epochs, dfhistory[col], style, markersize=3, label=col)
        if best is not None:
            ax.axvline(best[0], color="gray", linestyle=":", linewidth=1)
            if bare_name(monitor) == name:
                ax.plot([best[0]], [best[1]], "*", color="crimson", markersize=12, label=f"best {monitor}")
        ax.set_xlabel("epoch")
        ax.set_title(name)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
        ax.xaxis.get_major_locator().set_params(integer=True)
    if best is not None:
        fig.suptitle(f"best {monitor} = {best[1]:.4g} at epoch {best[0]}")
    return fig


def _chosen_quantities(metrics: Optional[Sequence[str]], available: list[str]) -> list[str]:
    if not available:
        raise ValueError("This history has no train_ or val_ columns to plot.")
    if metrics is None:
        return available
    if isinstance(metrics, str):
        metrics = [metrics]
    chosen = []
    for name in metrics:
        bare = bare_name(name)
        if bare not in available:
            raise ValueError(f"plot_history has no {name!r} to plot; this history has {available} "
                             "(with or without the train_/val_ prefix).")
        if bare not in chosen:
            chosen.append(bare)
    return chosen or available


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

    def __init__(self, monitor: Optional[str] = None, mode: str = "min", path: str = "kerastorch_history.png",
                 metrics: Optional[Sequence[str]] = None, dpi: int = 80):
        self.monitor, self.mode, self.path = monitor, mode, path
        self.metrics = metrics
        self.dpi = dpi
        self.figure = None  # the latest drawing, a matplotlib Figure
        self._rows: list[dict] = []
        self._display = None  # the notebook's display handle, once the figure is shown
        self._announced = False

    def on_train_begin(self, logs=None):
        self._rows = []
        self._display = None
        self._announced = False
        if self.metrics is not None:  # a typo should fail now, not after the first epoch
            known = ["loss", *getattr(self.model, "metrics_dict", {})]
            unknown = [m for m in self.metrics if bare_name(m) not in known]
            if unknown:
                raise ValueError(f"LivePlot(metrics={list(self.metrics)!r}): {unknown} will not be logged; "
                                 f"this model logs {known} (with the train_/val_ prefix).")

    def on_epoch_end(self, epoch, logs=None):
        if not self.model.is_main_process:
            return
        self._rows.append(dict(logs))
        history = pd.DataFrame(self._rows)
        self.figure = plot_history(history, metrics=self._panels(history), monitor=self._monitor(history),
                                   mode=self.mode)
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


__all__ = ["plot_history", "LivePlot", "best_epoch"]
