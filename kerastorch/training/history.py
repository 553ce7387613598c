"""The history's names and frames: one row per epoch, known column names before the first batch."""

from __future__ import annotations

import functools
import math
from typing import Any, Iterable, Optional

import numpy as np
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
    data: dict[str, Any] = {}
    for name in names:
        values = [row.get(name, math.nan) for row in rows]
        # A column of Python floats (nearly all of them) as the array pandas would make of it, which
        # pandas takes without inferring the type value by value.
        data[name] = np.array(values, dtype=np.float64) if all(type(v) is float for v in values) else values
    if "epoch" in data:
        data["epoch"] = np.array([int(epoch) for epoch in data["epoch"]], dtype=np.int64)
    # Keyed by position, then named with labels made once per set of names: pandas reads the type of
    # string labels value by value, which costs more than the rest of a one-row frame. A copy of
    # them, so that renaming one frame's columns leaves the others' alone.
    frame = pd.DataFrame(dict(enumerate(data.values())), copy=False)  # new arrays nobody else holds: no copy
    frame.columns = _column_labels(tuple(data)).copy()
    return frame


@functools.lru_cache(maxsize=64)
def _column_labels(names: tuple[str, ...]) -> pd.Index:
    return pd.Index(names)


__all__ = ["history_columns", "history_frame"]
