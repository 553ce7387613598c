"""The forms of data ``fit``, ``evaluate`` and ``predict`` take, one adapter class each.

| form | adapter | becomes |
| --- | --- | --- |
| arrays: a tensor, NumPy array or pandas object ``X`` with ``y``; ``(X, y)``, ``(X1, ..., Xn, y)``; a dict of arrays | :class:`Arrays` | a DataLoader kerastorch builds |
| a map-style torch ``Dataset`` | :class:`MapDataset` | a DataLoader kerastorch builds |
| an ``IterableDataset`` | :class:`IterableData` | a DataLoader kerastorch builds |
| a DataLoader, or any other re-iterable of batches the user made | :class:`Batches` | itself, untouched |

Each adapter knows what applies to its form (``batch_size``, ``y``, ``sample_weight``,
Keras's ``validation_split``), refuses what does not with a message saying what to do,
and makes the loader. :func:`adapt` picks the adapter; a new form is one more class in
:data:`FORMS`. The batches they yield are read by :func:`~kerastorch.data.batches.unpack`.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import math
import numbers
from collections.abc import Mapping
from typing import Any, ClassVar, Optional

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, Subset

from .arrays import array_dataset, is_array, is_array_group
from .loaders import loader_for
from .peek import num_batches


@dataclasses.dataclass
class FitData:
    """What ``fit`` was given to train and validate on, before it becomes loaders."""

    train: Any
    val: Any = None
    y: Any = None
    sample_weight: Any = None


class DataForm:
    """One form of data: what applies to it, how it splits off validation samples, its loader.

    ``name`` is the argument the user passed it as (``"train_data"``, ``"val_data"``, ``"data"``),
    for messages; ``y`` and ``sample_weight`` are the labels and weights given beside it.
    """

    #: True for data kerastorch turns into batches itself (so ``batch_size=`` applies).
    builds_batches: ClassVar[bool] = True

    def __init__(
        self,
        data: Any,
        name: str,
        y: Any = None,
        sample_weight: Any = None,
        keep_float64: bool = False,
        needs_labels: bool = True,
    ):
        self.data, self.name = data, name
        self.y, self.sample_weight = y, sample_weight
        self.keep_float64, self.needs_labels = keep_float64, needs_labels

    @classmethod
    def accepts(cls, data: Any) -> bool:
        """True when ``data`` is of this form."""
        raise NotImplementedError

    def dataset(self) -> Dataset:
        """The samples, as a torch Dataset (forms whose batches kerastorch builds)."""
        raise NotImplementedError

    def split(self, fraction: float) -> tuple[DataForm, DataForm]:
        """Keras's ``validation_split``: the first samples for training, the **last** ``fraction`` for
        validation, taken before any shuffling."""
        dataset = self.dataset()
        total = num_batches(dataset)
        if isinstance(dataset, IterableDataset) or total is None:
            raise ValueError(
                "validation_split needs data with a length to split; an iterable dataset has none. "
                "Pass val_data=... instead."
            )
        split_at = math.ceil(total * (1.0 - fraction))
        if split_at == total or split_at == 0:
            raise ValueError(
                f"validation_split={fraction} of {total} samples leaves "
                f"{'no validation' if split_at == total else 'no training'} sample; use a fraction that "
                "keeps at least one sample on each side."
            )
        return (
            MapDataset(Subset(dataset, range(split_at)), self.name),
            MapDataset(Subset(dataset, range(split_at, total)), "val_data"),
        )

    def loader(self, batch_size: Optional[int], shuffle: bool, pin_memory: bool) -> Any:
        """The batches: a DataLoader of :meth:`dataset` (``batch_size`` 32 by default)."""
        return loader_for(self.dataset(), batch_size, shuffle=shuffle, pin_memory=pin_memory)


class Arrays(DataForm):
    """Arrays in memory: ``X`` with ``y``, ``(X, y)``, ``(X1, ..., Xn, y)`` or a dict of arrays."""

    @classmethod
    def accepts(cls, data: Any) -> bool:
        return is_array(data) or is_array_group(data)

    def dataset(self) -> Dataset:
        return array_dataset(
            self.data, self.y, self.sample_weight, self.name, self.keep_float64, needs_labels=self.needs_labels
        )


class MapDataset(DataForm):
    """A map-style torch ``Dataset`` (``__len__`` and ``__getitem__``) returning ``(x, y)`` or dicts."""

    @classmethod
    def accepts(cls, data: Any) -> bool:
        return isinstance(data, Dataset) and not isinstance(data, IterableDataset)

    def dataset(self) -> Dataset:
        if self.y is not None or self.sample_weight is not None:
            raise ValueError(
                f"{self.name} is a {type(self.data).__name__}; y= and sample_weight= go beside arrays, not a "
                "Dataset. Let the Dataset return (x, y), or a dict with 'labels' and 'sample_weight'."
            )
        return self.data


class IterableData(MapDataset):
    """An ``IterableDataset``: a stream of samples of unknown length, batched by kerastorch."""

    @classmethod
    def accepts(cls, data: Any) -> bool:
        return isinstance(data, IterableDataset)


class Batches(DataForm):
    """Batches the user made: a DataLoader, or any other re-iterable of batches, used as it is."""

    builds_batches = False

    @classmethod
    def accepts(cls, data: Any) -> bool:
        return data is not None

    def check(self, batch_size: Optional[int], split: float) -> None:
        """What cannot apply to batches already made, and a one-shot iterator."""
        given = [
            word
            for word, value in (
                ("batch_size", batch_size),
                ("validation_split", split or None),
                ("sample_weight", self.sample_weight),
                ("y", self.y),
            )
            if value is not None
        ]
        if given:
            raise ValueError(
                f"{self.name} is a {type(self.data).__name__}, which already makes its batches, so {given[0]}= cannot "
                f"apply to it. Drop {given[0]}=, or pass the arrays or the Dataset instead (fit(X, y, batch_size=32, "
                "validation_split=0.2)). Per-sample weights in your own batches go in a dict with a "
                "'sample_weight' key."
            )
        check_loader(self.data, self.name)

    def split(self, fraction: float) -> tuple[DataForm, DataForm]:
        self.check(None, fraction)
        raise AssertionError("unreachable: check refuses validation_split")

    def loader(self, batch_size: Optional[int], shuffle: bool, pin_memory: bool) -> Any:
        self.check(batch_size, 0.0)
        return self.data


#: The forms, in the order they are tried: the first whose ``accepts`` is true adapts the data.
FORMS: tuple[type[DataForm], ...] = (Arrays, IterableData, MapDataset, Batches)


def adapt(data: Any, name: str, **options: Any) -> DataForm:
    """The adapter for ``data`` (see :data:`FORMS`), with the options of :class:`DataForm`."""
    if data is None:
        raise ValueError("fit needs training data: fit(X, y), fit((X, y)), fit(dataset) or fit(dataloader).")
    if is_number_list(data) or (isinstance(data, list) and data and all(is_number_list(row) for row in data[:100])):
        what = "numbers" if is_number_list(data) else "rows"
        raise TypeError(
            f"{name} is a list of {len(data)} {what}; kerastorch takes the samples as one array (a Python list "
            f"is read as batches). Pass np.asarray({name}) or torch.tensor({name}), with the labels beside it: "
            "fit(np.asarray(rows), y)."
        )
    form = next(form for form in FORMS if form.accepts(data))
    return form(data, name, **options)


def check_loader(data: Any, name: str) -> None:
    """Batches that can be iterated again, epoch after epoch, and are not empty."""
    if data is None or isinstance(data, (torch.Tensor, str, bytes, dict)) or not hasattr(data, "__iter__"):
        raise TypeError(
            f"{name} is a {type(data).__name__}, but it must be an iterable of batches, such as "
            "torch.utils.data.DataLoader(TensorDataset(x, y), batch_size=32)."
        )
    if isinstance(data, collections.abc.Iterator):
        raise TypeError(
            f"{name} is a {type(data).__name__}, a one-shot iterator: it would be used up by the first epoch (and by "
            "the check of its first batch), and the next epoch would find no batches. Pass something that can be "
            "iterated again: a DataLoader, a Dataset, or arrays. For an endless stream, wrap it in an "
            "IterableDataset and pass steps_per_epoch=..."
        )
    if num_batches(data) == 0:
        raise ValueError(f"{name} is empty (0 batches). Check the dataset's size, batch_size and drop_last.")


def keras_positional(train: Any, val: Any, y: Any) -> tuple[Any, Any]:
    """``fit(X, y)``: a bare array in ``val_data``'s place is the labels, never validation data
    (a bare array has no labels). Returns ``(y, val)``."""
    if (
        y is None
        and (is_array(val) or is_number_list(val))
        and (is_array(train) or (is_array_group(train) and not isinstance(train, Mapping)))
    ):
        samples = len(train) if is_array(train) else len(train[0])
        if len(val) != samples:
            raise ValueError(
                f"fit(X, y): X has {samples} samples but y has {len(val)}; give one label per sample. (A bare array "
                "as the second argument is y, never validation data: pass validation_data=(X_val, y_val).)"
            )
        return val, None
    return y, val


def is_number_list(obj: Any) -> bool:
    """A Python list or tuple of plain numbers (``y.tolist()``): labels, or one row."""
    return (
        isinstance(obj, (list, tuple))
        and len(obj) > 0
        and all(isinstance(v, (numbers.Number, np.generic)) and not isinstance(v, np.ndarray) for v in obj)
    )


def prepare_data(
    data: FitData,
    batch_size: Optional[int],
    shuffle: bool,
    validation_split: float,
    keep_float64: bool,
    pin_memory: bool,
) -> tuple[Any, Any]:
    """``(train loader, val loader or None)`` from whatever ``fit`` was given. Batches the user
    made go through untouched; arrays, tensors, DataFrames and Datasets become DataLoaders."""
    train = adapt(data.train, "train_data", y=data.y, sample_weight=data.sample_weight, keep_float64=keep_float64)
    val = None if data.val is None else adapt(data.val, "val_data", keep_float64=keep_float64)
    if validation_split:
        train, val = train.split(validation_split)
    train_loader = train.loader(batch_size, shuffle=shuffle, pin_memory=pin_memory)
    if val is None:
        return train_loader, None
    # A validation loader the user made keeps its own batches, whatever batch_size says.
    val_batch_size = batch_size if val.builds_batches else None
    return train_loader, val.loader(val_batch_size, shuffle=False, pin_memory=pin_memory)


def eval_loader(data: Any, y: Any, batch_size: Optional[int], needs_labels: bool, name: str = "data") -> Any:
    """The loader ``evaluate(X, y)`` or ``predict(X)`` runs over (data order kept)."""
    form = adapt(data, name, y=y, needs_labels=needs_labels)
    if not form.builds_batches and (batch_size is not None or y is not None):
        raise ValueError(
            f"{name} is a {type(data).__name__}, which already makes its batches: drop batch_size= "
            "and y=, or pass the arrays."
        )
    return form.loader(batch_size, shuffle=False, pin_memory=False)


__all__ = [
    "FORMS",
    "Arrays",
    "Batches",
    "DataForm",
    "FitData",
    "IterableData",
    "MapDataset",
    "adapt",
    "check_loader",
    "eval_loader",
    "keras_positional",
    "prepare_data",
]
