"""Data held in memory the Keras way: tensors, NumPy arrays and pandas objects, one row per sample.

``fit(X, y)``, ``fit((X1, X2, y))`` or a dict of arrays become an :class:`ArrayDataset`, after
checking that every array has one row per sample and holds numbers: floating NumPy data as
float32 (as Keras does; float64 kept with ``precision="64-true"``), integers as int64.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional, Union

import numpy as np
import pandas as pd
import torch
from torch.utils.data import Dataset

from .batches import LABEL_KEYS, WeightedSample


def is_array(obj: Any) -> bool:
    """A tensor, a NumPy array or a pandas Series / DataFrame: samples along the first dimension."""
    return isinstance(obj, (torch.Tensor, np.ndarray, pd.Series, pd.DataFrame))


def is_array_group(obj: Any) -> bool:
    """``(X, y)``, ``(X1, ..., Xn, y)`` or a dict of arrays: a whole data set in memory."""
    if isinstance(obj, (tuple, list)) and not isinstance(obj, WeightedSample):
        return len(obj) >= 1 and all(is_array(o) for o in obj)
    if isinstance(obj, Mapping):
        return len(obj) >= 1 and all(is_array(o) for o in obj.values())
    return False


def as_tensor(array: Any, name: str, keep_float64: bool = False) -> torch.Tensor:
    """A tensor from a tensor, NumPy array or pandas object: floating NumPy data as float32
    (as Keras does; float64 kept with ``precision="64-true"``), integers as int64, booleans
    (``pd.get_dummies``' columns) as float32 0/1."""
    if isinstance(array, torch.Tensor):
        return array
    if isinstance(array, (pd.Series, pd.DataFrame)):
        if isinstance(array, pd.DataFrame):
            bad = [str(c) for c, kind in zip(array.columns, array.dtypes) if getattr(kind, "kind", "O") in "OUSVM"]
            if bad:
                raise TypeError(
                    f"{name} has columns that are not numbers: {bad}. Encode them first (e.g. "
                    "pd.get_dummies(df) or df['col'].astype('category').cat.codes), or drop them."
                )
        array = pandas_numbers(array)
    array = np.asarray(array)
    if array.dtype.kind == "b":
        array = array.astype(np.float32)
    if array.dtype.kind in "OUSVM":
        hint = (
            "map the labels to integers first: y, classes = pandas.factorize(y)"
            if name.startswith("y")
            else "encode text or categories as numbers first (e.g. pd.get_dummies or sklearn's OrdinalEncoder)"
        )
        raise TypeError(f"{name} holds {array.dtype} values, not numbers; {hint}.")
    if array.dtype.kind == "f" and not (keep_float64 and array.dtype == np.float64):
        array = array.astype(np.float32)
    elif array.dtype.kind in "iu":
        array = array.astype(np.int64)
    return torch.from_numpy(np.ascontiguousarray(array))


def pandas_numbers(data: Union[pd.Series, pd.DataFrame]) -> np.ndarray:
    """A pandas object's numbers as one NumPy array. Each column counts by its NumPy type: pandas'
    nullable ``Int64`` / ``Float32`` / ``boolean`` by theirs (a missing value makes a column float,
    with NaN), bool (``pd.get_dummies``) as float32; mixed columns meet in a type that holds them all."""
    columns = [data] if isinstance(data, pd.Series) else [data[c] for c in data.columns]
    dtypes = [_numpy_type(column) for column in columns]
    # A copy: under copy-on-write pandas hands out read-only views, which torch will not share.
    return data.to_numpy(dtype=np.result_type(*dtypes) if dtypes else None, na_value=np.nan, copy=True)


def _numpy_type(column: pd.Series) -> np.dtype:
    dtype = column.dtype
    if dtype.kind in "OUSVM":
        return np.dtype(object)  # text, categories, dates: refused by the caller with what to do
    if dtype.kind == "b":
        return np.dtype(np.float32)
    numpy_dtype = getattr(dtype, "numpy_dtype", dtype)  # a nullable type's NumPy counterpart
    if numpy_dtype.kind in "iu" and bool(column.isna().any()):
        return np.dtype(np.float64)  # a missing integer is a NaN: only floats hold one
    return np.dtype(numpy_dtype)


class ArrayDataset(Dataset):
    """In-memory arrays as samples: ``(x1, ..., xn, y)``, a dict, or inputs alone; with
    per-sample weights, each sample is a :class:`~kerastorch.data.batches.WeightedSample`."""

    def __init__(self, arrays: Union[tuple, dict], weight: Optional[torch.Tensor] = None):
        self.arrays = arrays
        self.weight = weight
        columns = list(arrays.values()) if isinstance(arrays, dict) else list(arrays)
        self.length = len(columns[0])

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> Any:
        if isinstance(self.arrays, dict):
            sample: Any = {key: value[index] for key, value in self.arrays.items()}
        else:
            sample = tuple(value[index] for value in self.arrays)
            if len(sample) == 1:
                sample = sample[0]
        return sample if self.weight is None else WeightedSample(sample, self.weight[index])


def array_dataset(
    data: Any, y: Any, sample_weight: Any, name: str, keep_float64: bool, needs_labels: bool = True
) -> ArrayDataset:
    """Check and convert arrays: every one the same length, numbers only, labels where needed."""
    if isinstance(data, Mapping):
        columns = {str(k): as_tensor(v, f"{name}[{k!r}]", keep_float64) for k, v in data.items()}
        if y is not None:
            columns["labels"] = as_tensor(y, "y", keep_float64)
        named = list(columns.items())
        arrays: Union[tuple, dict] = columns
        if needs_labels and not any(k in LABEL_KEYS for k in columns):
            raise ValueError(
                f"{name} is a dict of arrays without labels: give it a 'labels' key (or 'label', 'y'), or pass y=..."
            )
    else:
        grouped = isinstance(data, (tuple, list))
        inputs = list(data) if grouped else [data]
        names = [f"{name}[{i}]" for i in range(len(inputs))] if grouped else [name]
        if y is not None:
            inputs.append(y)
            names.append("y")
        elif needs_labels and len(inputs) < 2:
            raise ValueError(f"{name} is a single array: its labels are missing. Pass fit(X, y), or a tuple (X, y).")
        arrays = tuple(as_tensor(a, label, keep_float64) for a, label in zip(inputs, names))
        named = list(zip(names, arrays))
    weight = None
    if sample_weight is not None:
        weight = as_tensor(sample_weight, "sample_weight").float().reshape(-1)
        named.append(("sample_weight", weight))
    lengths = {label: len(a) for label, a in named}
    if len(set(lengths.values())) > 1:
        listed = ", ".join(f"{label} has {n}" for label, n in lengths.items())
        raise ValueError(
            f"The arrays of {name} differ in length ({listed} samples); every array needs one row per sample."
        )
    if not lengths or next(iter(lengths.values())) == 0:
        raise ValueError(f"{name} has no samples.")
    return ArrayDataset(arrays, weight)


__all__ = ["ArrayDataset", "array_dataset", "as_tensor", "is_array", "is_array_group"]
