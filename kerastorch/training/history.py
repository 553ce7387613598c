"""The history's names and frames: one row per epoch, known column names before the first batch."""

from __future__ import annotations

import functools
import math
from typing import Any, Iterable, Optional

import numpy as np
import pandas as pd

try:  # pandas 2.3 and later: a frame from blocks made beforehand, taken as they are
    from pandas.api.internals import create_dataframe_from_blocks
except ImportError:  # older pandas: the dict constructor
    create_dataframe_from_blocks = None


def history_columns(metric_names: Iterable[str], has_val_data: bool, lr_groups: int = 1) -> list[str]:
    """The columns a run will produce after ``epoch``, known before the first batch (``lr_groups``: the
    optimizer's parameter groups, one learning-rate column each, see :func:`lr_columns`).

    >>> history_columns(["acc"], has_val_data=True)
    ['train_loss', 'train_acc', 'lr', 'val_loss', 'val_acc']
    """
    metric_names = list(metric_names)
    names = ["train_loss", *(f"train_{m}" for m in metric_names), *lr_columns(lr_groups)]
    if has_val_data:
        names += ["val_loss", *(f"val_{m}" for m in metric_names)]
    return names


def lr_columns(groups: int) -> list[str]:
    """The learning-rate columns of an optimizer with ``groups`` parameter groups: ``lr`` for the first,
    ``lr_1``, ``lr_2``... for the others.

    >>> lr_columns(1), lr_columns(3)
    (['lr'], ['lr', 'lr_1', 'lr_2'])
    """
    return ["lr", *(f"lr_{i}" for i in range(1, groups))]


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
    if columns and "lr" in names:
        names = _lr_columns_together(names)
    data: dict[str, Any] = {}
    for name in names:
        values = [row.get(name, math.nan) for row in rows]
        # A column of Python floats (nearly all of them) as the array pandas would make of it, which
        # pandas takes without inferring the type value by value.
        data[name] = np.array(values, dtype=np.float64) if all(type(v) is float for v in values) else values
    if "epoch" in data:
        data["epoch"] = np.array([int(epoch) for epoch in data["epoch"]], dtype=np.int64)
    # Named with labels made once per set of names: pandas reads the type of string labels value by
    # value, which costs more than the rest of a one-row frame. A copy of them, so that renaming one
    # frame's columns leaves the others' alone.
    labels = _column_labels(tuple(data)).copy()
    arrays = list(data.values())
    floats_and_epoch = all(_is_float_array(a) for a in arrays if a is not data.get("epoch"))
    if create_dataframe_from_blocks is not None and arrays and floats_and_epoch:
        return _frame_of_floats(arrays, labels, epoch_at=list(data).index("epoch") if "epoch" in data else None)
    # Keyed by position, then named: new arrays nobody else holds, so no copy.
    frame = pd.DataFrame(dict(enumerate(arrays)), copy=False)
    frame.columns = labels
    return frame


def _lr_columns_together(names: dict) -> dict:
    """A parameter group's learning rate that a callback added during the run (its column is not among
    those known beforehand) beside the other ``lr`` columns, not after the validation values."""
    rates = [name for name in names if name == "lr" or (name.startswith("lr_") and name[3:].isdigit())]
    ordered: dict = {}
    for name in names:
        if name == "lr":
            ordered.update(dict.fromkeys(rates))
        elif name not in rates:
            ordered[name] = None
    return ordered


def _is_float_array(values: Any) -> bool:
    return isinstance(values, np.ndarray) and values.dtype == np.float64


def _frame_of_floats(arrays: list, labels: pd.Index, epoch_at: Optional[int]) -> pd.DataFrame:
    """The frame of float64 columns and an int64 epoch column as the two blocks pandas would consolidate
    them into, handed to pandas as they are: a sixth of the calls of the dict constructor (which first
    makes a block per column), the frame being the same."""
    at_float = [i for i in range(len(arrays)) if i != epoch_at]
    blocks = [(np.stack([arrays[i] for i in at_float]), np.array(at_float, dtype=np.intp))] if at_float else []
    if epoch_at is not None:
        blocks.append((arrays[epoch_at].reshape(1, -1), np.array([epoch_at], dtype=np.intp)))
    return create_dataframe_from_blocks(blocks, index=pd.RangeIndex(len(arrays[0])), columns=labels)


@functools.lru_cache(maxsize=64)
def _column_labels(names: tuple[str, ...]) -> pd.Index:
    return pd.Index(names)


__all__ = ["history_columns", "history_frame", "lr_columns"]
