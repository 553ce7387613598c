"""Data held in memory the Keras way: tensors, NumPy arrays and pandas objects, one row per sample.

``fit(X, y)``, ``fit((X1, X2), y)``, ``fit((X, y, w))``, a dict of arrays or ``predict([X1, X2])``
become an :class:`ArrayDataset`, after checking that every array has one row per sample and holds
numbers: floating NumPy data as float32 (as Keras does; float64 kept with ``precision="64-true"``),
integers as int64. Tuples are read as Keras reads them: beside ``y``, or in ``predict``, a tuple is
the net's inputs; alone, a tuple is a whole data set, ``(x, y)`` or ``(x, y, sample_weight)``
(:func:`keras_parts`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional, Union

import numpy as np
import pandas as pd
import torch
from torch.utils.data import Dataset

from .batches import LABEL_KEYS, Inputs, WeightedSample


def is_array(obj: Any) -> bool:
    """A tensor, a NumPy array or a pandas Series / DataFrame: samples along the first dimension."""
    return isinstance(obj, (torch.Tensor, np.ndarray, pd.Series, pd.DataFrame))


def is_array_group(obj: Any) -> bool:
    """A whole data set or several inputs in memory: ``(X, y)``, ``(X, y, w)`` (``w`` may be None, as in
    Keras), ``((X1, X2), y)``, ``[X1, X2]`` or a dict of arrays. Only the first item of a tuple or list
    may itself be a group (the inputs of a net with several: Keras's ``((X1, X2), y)``)."""
    if isinstance(obj, (tuple, list)) and not isinstance(obj, (WeightedSample, Inputs)):
        if not obj:
            return False
        if len(obj) == 3 and obj[2] is None:  # Keras's (x, y, None): no sample weights
            obj = obj[:2]
        first_is_inputs = is_array(obj[0]) if len(obj) == 1 else is_array(obj[0]) or is_flat_group(obj[0])
        # (x, (y1, y2)): the labels of a net with several outputs may be a group too
        labels_fit = len(obj) == 1 or is_array(obj[1]) or is_label_group(obj[1])
        return first_is_inputs and labels_fit and all(is_array(o) for o in obj[2:])
    return is_flat_group(obj)


def is_label_group(obj: Any, samples: Optional[int] = None) -> bool:
    """The labels of a net with several outputs, as Keras takes them: a tuple or list of two or more
    arrays, or a dict of arrays, one per output. A list as long as the data's ``samples`` is the rows
    of one array instead (``[np.array([0, 1]), ...]``, one-hot rows), as it was read before."""
    if isinstance(obj, Mapping):
        columns = list(obj.values())
    elif isinstance(obj, (tuple, list)) and len(obj) >= 2 and not isinstance(obj, (WeightedSample, Inputs)):
        if samples is not None and len(obj) == samples:
            return False
        columns = list(obj)
    else:
        return False
    # Each an array with a row per sample (a 0-d array is one value: a list of them is one array's rows).
    return bool(columns) and all(is_array(column) and getattr(column, "ndim", 1) >= 1 for column in columns)


class LabelGroup:
    """The labels of a net with several outputs (``fit(X, [y1, y2])``, ``y={"a": y1, "b": y2}``), one
    tensor per output. A sample's labels are one row of each, as a tuple or a dict, which the
    DataLoader batches into a tuple or a dict of tensors: the structure of the net's outputs, which
    the loss gets beside them."""

    def __init__(self, labels: Union[tuple, dict]):
        self.labels = labels

    def __len__(self) -> int:
        first = next(iter(self.labels.values())) if isinstance(self.labels, dict) else self.labels[0]
        return len(first)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(self.labels, dict):
            return {key: value[index] for key, value in self.labels.items()}
        return tuple(value[index] for value in self.labels)


def _samples_or_none(data: Any) -> Optional[int]:
    try:
        return num_samples(data)
    except (StopIteration, IndexError, KeyError, TypeError):  # no array to count (refused later, by name)
        return None


def as_labels(y: Any, name: str, keep_float64: bool, samples: Optional[int]) -> Union[torch.Tensor, LabelGroup]:
    """``y`` as a tensor, or, for a net with several outputs (one array per output), a :class:`LabelGroup`."""
    if not is_label_group(y, samples):
        return as_tensor(y, name, keep_float64, labels=True)
    if isinstance(y, Mapping):
        return LabelGroup({str(k): as_tensor(v, f"{name}[{k!r}]", keep_float64, labels=True) for k, v in y.items()})
    return LabelGroup(tuple(as_tensor(v, f"{name}[{i}]", keep_float64, labels=True) for i, v in enumerate(y)))


def is_flat_group(obj: Any) -> bool:
    """A tuple, list or dict of arrays (not of groups)."""
    if isinstance(obj, (tuple, list)) and not isinstance(obj, (WeightedSample, Inputs)):
        return len(obj) >= 1 and all(is_array(o) for o in obj)
    if isinstance(obj, Mapping):
        return len(obj) >= 1 and all(is_array(o) for o in obj.values())
    return False


def num_samples(arrays: Any) -> int:
    """The number of samples of an array or a group: the length of its first array."""
    while not is_array(arrays):
        arrays = next(iter(arrays.values())) if isinstance(arrays, Mapping) else arrays[0]
    return len(arrays)


def keras_parts(data: Union[tuple, list], sample_weight: Any, name: str) -> tuple[Any, Any, Any]:
    """``(x, y, sample_weight)`` from a tuple of arrays given as a whole data set, read as Keras reads
    ``validation_data``: ``(x, y)`` or ``(x, y, sample_weight)``, where ``x`` is an array, or a tuple,
    list or dict of arrays for a net with several inputs.

    >>> x, y, w = keras_parts((np.zeros((4, 2)), np.zeros(4), np.ones(4)), None, "val_data")
    >>> x.shape, y.shape, w.shape
    ((4, 2), (4,), (4,))
    """
    if len(data) > 3:
        raise ValueError(
            f"{name} is a tuple of {len(data)} arrays. A tuple of arrays is read as Keras reads validation_data: "
            "(x, y) or (x, y, sample_weight). For a net with several inputs, group the inputs: ((X1, X2, X3), y), "
            "or pass them with y: fit((X1, X2, X3), y)."
        )
    x, y, weight = (*data, None, None)[:3]
    if weight is not None:
        if sample_weight is not None:
            raise ValueError(
                f"{name} holds sample weights (its third array) and sample_weight= was given too; pass them once."
            )
        kind = np.asarray(weight).dtype.kind if not isinstance(weight, torch.Tensor) else None
        if (kind is not None and kind in "iub") or (
            isinstance(weight, torch.Tensor) and not (weight.is_floating_point() or weight.is_complex())
        ):
            raise ValueError(
                f"{name} is a tuple of 3 arrays, read as Keras reads it: (x, y, sample_weight); its third array "
                "holds integers, which look like labels, not weights. For a net with two inputs, group them: "
                "((X1, X2), y). For integer weights, pass them as floats (w.astype('float32'))."
            )
        sample_weight = weight
    return x, y, sample_weight


def as_tensor(array: Any, name: str, keep_float64: bool = False, labels: Optional[bool] = None) -> torch.Tensor:
    """A tensor from a tensor, NumPy array or pandas object: floating NumPy data as float32
    (as Keras does; float64 kept with ``precision="64-true"``), integers as int64, booleans
    (``pd.get_dummies``' columns) as float32 0/1. ``labels`` says whether the array holds labels (for
    the message about text; by default, when ``name`` is y's)."""
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
            if (name.startswith("y") if labels is None else labels)
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
    """In-memory arrays as samples: ``(x1, ..., xn, y)``, a dict, or inputs alone (one array, or
    :class:`~kerastorch.data.batches.Inputs` for several); with per-sample weights, each sample is
    a :class:`~kerastorch.data.batches.WeightedSample`."""

    def __init__(self, arrays: Union[tuple, dict], weight: Optional[torch.Tensor] = None, inputs_only: bool = False):
        self.arrays = arrays
        self.weight = weight
        self.inputs_only = inputs_only  # no labels among the arrays: every one is an input of the net
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
            elif self.inputs_only:
                sample = Inputs(sample)
        return sample if self.weight is None else WeightedSample(sample, self.weight[index])

    def __getitems__(self, indices: list[int]) -> Any:
        """The batch of the samples at ``indices``, read with one index per array instead of one per
        sample: what torch's ``default_collate`` makes of ``[self[i] for i in indices]``, to the bit and
        in the same memory layout (a tuple of samples collates into a list, a named tuple and a dict keep
        their type, tensors are stacked), in about a tenth of the time for small rows.

        torch's fetcher calls a dataset's ``__getitems__`` with a batch's indices; the loaders kerastorch
        builds over arrays hand the batch on as it is (:func:`~kerastorch.data.loaders.loader_for`), as
        Keras does for the arrays it batches."""
        rows = torch.as_tensor(indices, dtype=torch.int64)
        if isinstance(self.arrays, dict):
            batch: Any = {key: _rows(value, rows) for key, value in self.arrays.items()}
        else:
            columns = [_rows(value, rows) for value in self.arrays]
            if len(columns) == 1:
                batch = columns[0]
            else:
                batch = Inputs(columns) if self.inputs_only else columns  # type: ignore[arg-type]  # collate's list
        return batch if self.weight is None else WeightedSample(batch, _rows(self.weight, rows))


def batch_as_read(batch: Any) -> Any:
    """The ``collate_fn`` of a loader over an :class:`ArrayDataset`: its ``__getitems__`` made the batch."""
    return batch


def _rows(column: Any, indices: torch.Tensor) -> Any:
    if isinstance(column, LabelGroup):  # a sample's labels are a tuple (collated into a list) or a dict
        labels = column.labels
        if isinstance(labels, dict):
            return {key: _rows(value, indices) for key, value in labels.items()}
        return [_rows(value, indices) for value in labels]
    # Laid out row by row, as a stack of rows is (an index keeps a channels-last or transposed layout);
    # contiguous() hands back the very tensor when it already is.
    return column[indices].contiguous()


def array_dataset(
    data: Any, y: Any, sample_weight: Any, name: str, keep_float64: bool, needs_labels: bool = True
) -> ArrayDataset:
    """Check and convert arrays: every one the same length, numbers only, labels where needed.

    ``data`` is the inputs (an array; a tuple or list of arrays for a net with several; a dict of
    arrays, the net's keyword arguments, which may hold the labels under a ``labels`` key) with
    ``y`` beside it. Without ``y``, for data with labels (fit, evaluate), a tuple or list is a
    whole data set, ``(x, y)`` or ``(x, y, sample_weight)`` (see :func:`keras_parts`); without
    labels (predict) every array is an input.
    """
    x_name, y_name, weight_name = name, "y", "sample_weight"
    if needs_labels and y is None and isinstance(data, (tuple, list)):
        data, y, in_tuple = keras_parts(data, sample_weight, name)
        x_name, y_name = f"{name}[0]", f"{name}[1]"
        weight_name = f"{name}[2]" if in_tuple is not sample_weight else weight_name
        sample_weight = in_tuple
    labels = None if y is None else as_labels(y, y_name, keep_float64, _samples_or_none(data))
    if isinstance(data, Mapping):
        columns: dict[str, Any] = {str(k): as_tensor(v, f"{x_name}[{k!r}]", keep_float64) for k, v in data.items()}
        has_labels = any(k in LABEL_KEYS for k in columns)
        if labels is not None:
            if has_labels:
                raise ValueError(
                    f"{name} is a dict of arrays with a labels key, and y was given too; pass the labels once."
                )
            columns["labels"] = labels
        elif needs_labels and not has_labels:
            raise ValueError(
                f"{name} is a dict of arrays without labels: give it a 'labels' key (or 'label', 'y'), or pass y=..."
            )
        named = list(columns.items())
        arrays: Union[tuple, dict] = columns
    else:
        grouped = isinstance(data, (tuple, list))
        inputs = list(data) if grouped else [data]
        if not all(is_array(a) for a in inputs):
            raise ValueError(
                f"{name} holds a group inside a group of inputs; give a net's several inputs as one tuple, list "
                "or dict of arrays: (X1, X2) or {'a': X1, 'b': X2}."
            )
        names = [f"{x_name}[{i}]" for i in range(len(inputs))] if grouped else [x_name]
        if labels is None and needs_labels:
            raise ValueError(f"{name} is a single array: its labels are missing. Pass fit(X, y), or a tuple (X, y).")
        converted: list[Any] = [as_tensor(a, label, keep_float64, labels=False) for a, label in zip(inputs, names)]
        if labels is not None:
            converted.append(labels)
            names.append(y_name)
        arrays = tuple(converted)
        named = list(zip(names, arrays))
    if isinstance(labels, LabelGroup):  # each output's labels counted on their own
        group = labels.labels
        columns_of_y = group.items() if isinstance(group, dict) else enumerate(group)
        named = [item for item in named if item[1] is not labels]
        named += [(f"{y_name}[{key!r}]", column) for key, column in columns_of_y]
    weight: Optional[torch.Tensor] = None
    if sample_weight is not None:
        weight = as_tensor(sample_weight, weight_name).float().reshape(-1)
        named.append((weight_name, weight))
    lengths = {label: len(a) for label, a in named}
    if len(set(lengths.values())) > 1:
        listed = ", ".join(f"{label} has {n}" for label, n in lengths.items())
        raise ValueError(
            f"The arrays of {name} differ in length ({listed} samples); every array needs one row per sample."
        )
    if not lengths or next(iter(lengths.values())) == 0:
        raise ValueError(f"{name} has no samples.")
    return ArrayDataset(arrays, weight, inputs_only=y is None and not isinstance(arrays, dict))


__all__ = [
    "ArrayDataset",
    "LabelGroup",
    "array_dataset",
    "as_labels",
    "batch_as_read",
    "as_tensor",
    "is_array",
    "is_array_group",
    "is_flat_group",
    "is_label_group",
    "keras_parts",
    "num_samples",
]
