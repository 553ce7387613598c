"""History plots: ``plot_history`` for a finished run and ``LivePlot`` during ``fit``.

Figures are made with matplotlib's object API (no pyplot), so nothing opens a window
or blocks, in a terminal, a script or a notebook.
"""

from __future__ import annotations

import os
from typing import Optional, Sequence

import pandas as pd

from .callbacks.base import Callback


def _quantities(columns: Sequence[str], metrics: Optional[Sequence[str]]) -> list[str]:
    if metrics:
        return list(metrics)
    found = []
    for col in columns:
        for prefix in ("train_", "val_"):
            if col.startswith(prefix) and col[len(prefix):] not in found:
                found.append(col[len(prefix):])
    return found


def plot_history(dfhistory: pd.DataFrame, metrics: Optional[Sequence[str]] = None, monitor: Optional[str] = None,
                 mode: str = "min"):
    """A figure with one panel per quantity (loss, then each metric), train and val curves
    together, and the best epoch of ``monitor`` marked. Returns a ``matplotlib.figure.Figure``.

    ``metrics`` picks quantities by bare name (``["loss", "acc"]``); the default is all.
    """
    from matplotlib.figure import Figure

    if "epoch" not in dfhistory:
        raise ValueError("plot_history takes the DataFrame that fit returns (it has an 'epoch' column).")
    quantities = _quantities(list(dfhistory.columns), metrics)
    fig = Figure(figsize=(5 * max(len(quantities), 1), 3.6), layout="constrained")
    axes = fig.subplots(1, max(len(quantities), 1), squeeze=False)[0]
    epochs = dfhistory["epoch"]
    best = _best_epoch(dfhistory, monitor, mode)
    for ax, name in zip(axes, quantities):
        for prefix, style in (("train_", "o-"), ("val_", "s--")):
            col = prefix + name
            if col in dfhistory:
                ax.plot(epochs, dfhistory[col], style, markersize=3, label=col)
        if best is not None:
            ax.axvline(best[0], color="gray", linestyle=":", linewidth=1)
        ax.set_xlabel("epoch")
        ax.set_title(name)
        ax.grid(alpha=0.3)
        ax.legend()
    if best is not None:
        fig.suptitle(f"best {monitor} = {best[1]:.4g} at epoch {best[0]}")
    return fig


def _best_epoch(dfhistory: pd.DataFrame, monitor: Optional[str], mode: str):
    if not monitor or monitor not in dfhistory or dfhistory[monitor].isna().all():
        return None
    index = dfhistory[monitor].idxmax() if mode == "max" else dfhistory[monitor].idxmin()
    return int(dfhistory.loc[index, "epoch"]), float(dfhistory.loc[index, monitor])


def in_notebook() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and shell.__class__.__name__ == "ZMQInteractiveShell"


class LivePlot(Callback):
    """``fit(plot=True)``: the history figure, redrawn at the end of each epoch.

    In Jupyter one figure is updated in place; elsewhere it is saved as a PNG (the
    path is printed once). It draws at epoch end only, so steps are never slowed.
    """

    def __init__(self, monitor: Optional[str] = None, mode: str = "min", path: str = "kerastorch_history.png"):
        self.monitor, self.mode, self.path = monitor, mode, path
        self._handle = None
        self._rows: list[dict] = []

    def on_train_begin(self, logs=None):
        self._rows = []
        self._handle = None

    def on_epoch_end(self, epoch, logs=None):
        if not self.model.is_main_process:
            return
        self._rows.append(dict(logs))
        fig = plot_history(pd.DataFrame(self._rows), monitor=self.monitor, mode=self.mode)
        if in_notebook():
            from IPython.display import display

            if self._handle is None:
                self._handle = display(fig, display_id=True)
            else:
                self._handle.update(fig)
        else:
            fig.savefig(self.path, dpi=90)
            if self._handle is None:
                self._handle = os.path.abspath(self.path)
                self.model.print(f"Live plot: {self._handle} (redrawn every epoch)")


__all__ = ["plot_history", "LivePlot"]
