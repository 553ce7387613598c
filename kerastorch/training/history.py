"""The history's names and frames: one row per epoch, known column names before the first batch."""

from __future__ import annotations

import math
from typing import Iterable, Optional

import pandas as pd


def history_columns(metric_names: Iterable[str], has_val_data: bool) -> list[str]:
    """The columns a run will produce after ``epoch``, known before the first batch.

    >>> history_columns(["acc"], has_val_data=True)
    ['train_loss', 'train_acc', 'lr', 'val_loss', 'val_acc']
    """
    metric_names = list(metric_names)
    names = ["train_loss", *(f"train_{m}" for m in metric_names), "lr"]
    if has_val_data:
        names += ["val_loss", *(f"val_{m}" for m in metric_names)]
    return names


def history_frame(rows: list[dict], columns: Optional[list[str]] = None) -> pd.DataFrame:
    """One row per epoch; a fresh frame, so later epochs never change one already returned.

    ``columns`` puts the run's own columns first, in their order, with NaN where a row has no
    value (the ``val_*`` cells of an epoch that was not validated); anything callbacks
    added to the logs follows.
    """
    if not rows:
        return pd.DataFrame()
    # Built from whole columns at once: a frame made row by row and then reindexed costs several
    # times more, which a fit of one short epoch pays in full.
    names = dict.fromkeys(columns or ())
    for row in rows:
        names.update(dict.fromkeys(row))
    data = {name: [row.get(name, math.nan) for row in rows] for name in names}
    if "epoch" in data:
        data["epoch"] = [int(epoch) for epoch in data["epoch"]]
    return pd.DataFrame(data)


__all__ = ["history_columns", "history_frame"]
