"""History plots: ``plot_history`` draws a history (``LivePlot`` redraws it during ``fit``).

Figures are made with matplotlib's object API (no pyplot), so nothing opens a window
or blocks, in a terminal, a script or a notebook, and figures are freed as soon as
they are no longer used (pyplot would keep every one of them alive).
"""

from __future__ import annotations

import functools
import io
from typing import TYPE_CHECKING, Any, Optional, Sequence

import pandas as pd

if TYPE_CHECKING:  # matplotlib itself is imported on first use
    from matplotlib.figure import Figure

PREFIXES = ("train_", "val_")


@functools.cache
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


def new_figure(**kwargs: Any) -> Figure:
    """A matplotlib ``Figure`` (no pyplot) that Jupyter shows as an image when it ends a cell."""
    return _figure_class()(**kwargs)


def history_quantities(columns: Sequence[str]) -> list[str]:
    """Bare names of the quantities in a history, in column order: ``["loss", "acc"]``."""
    found: list[str] = []
    for col in columns:
        for prefix in PREFIXES:
            if col.startswith(prefix) and col[len(prefix) :] not in found:
                found.append(col[len(prefix) :])
    return found


def bare_name(column: str) -> str:
    """``"val_acc"`` -> ``"acc"``; a name without a prefix is returned as it is."""
    for prefix in PREFIXES:
        if column.startswith(prefix):
            return column[len(prefix) :]
    return column


def best_epoch(dfhistory: pd.DataFrame, monitor: Optional[str], mode: str = "min") -> Optional[tuple[int, float]]:
    """``(epoch, score)`` of the best row for ``monitor``; NaN scores are never best."""
    if not monitor or monitor not in dfhistory or dfhistory[monitor].isna().all():
        return None
    scores = dfhistory[monitor]
    index = scores.idxmax() if mode == "max" else scores.idxmin()  # both skip NaN
    return int(dfhistory.loc[index, "epoch"]), float(scores.loc[index])


def plot_history(
    dfhistory: pd.DataFrame, metrics: Optional[Sequence[str]] = None, monitor: Optional[str] = None, mode: str = "min"
) -> Figure:
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
        raise ValueError(
            "plot_history takes the DataFrame that fit returns (it has an 'epoch' column); "
            f"got a {type(dfhistory).__name__}."
        )
    if len(dfhistory) == 0:
        raise ValueError("plot_history got a history with no epochs: train for at least one epoch first.")
    if mode not in ("min", "max"):
        raise ValueError(f"mode={mode!r}; use 'min' (lower is better, e.g. a loss) or 'max' (e.g. accuracy).")
    available = history_quantities(list(dfhistory.columns))
    quantities = _chosen_quantities(metrics, available)
    if monitor is None:
        monitor = "val_loss" if "val_loss" in dfhistory else "train_loss"
    elif monitor not in dfhistory:
        raise ValueError(
            f"monitor={monitor!r} is not a column of this history; its columns are {list(dfhistory.columns)}."
        )

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
            raise ValueError(
                f"plot_history has no {name!r} to plot; this history has {available} "
                "(with or without the train_/val_ prefix)."
            )
        if bare not in chosen:
            chosen.append(bare)
    return chosen or available


__all__ = ["best_epoch", "plot_history"]
