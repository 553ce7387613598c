"""The forms of data ``fit``, ``evaluate`` and ``predict`` take, one adapter class each.

| form | adapter | becomes |
| --- | --- | --- |
| arrays: a tensor, NumPy array or pandas object ``X`` with ``y``; ``(X1, X2)`` with ``y``; ``(X, y)``, ``(X, y, w)``, ``((X1, X2), y)``; a dict of arrays | :class:`Arrays` | a DataLoader kerastorch builds |
| a map-style torch ``Dataset`` | :class:`MapDataset` | a DataLoader kerastorch builds |
| an ``IterableDataset`` | :class:`IterableData` | a DataLoader kerastorch builds |
| a generator or other one-shot iterator of batches (``predict`` only) | :class:`OneShot` | itself, NumPy arrays made tensors |
| a DataLoader, or any other re-iterable of batches the user made | :class:`Batches` | itself, untouched (a Python list's NumPy arrays made tensors) |

Each adapter knows what applies to its form (``batch_size``, ``y``, ``sample_weight``,
Keras's ``validation_split``), refuses what does not with a message saying what to do,
and makes the loader. :func:`adapt` picks the adapter; a new form is one more class in
:data:`FORMS`. The batches they yield are read by :func:`~kerastorch.data.batches.unpack`.
A loader the user made is used as given; the loaders built here over arrays read each batch with one
index per array instead of one per sample (:func:`~kerastorch.data.loaders.loader_for`).

Arrays are read as Keras reads them (:func:`~kerastorch.data.arrays.array_dataset`): beside
``y``, and in ``predict``, a tuple or list is the net's inputs; alone, it is ``(x, y)`` or
``(x, y, sample_weight)``. Without ``batch_size``, Keras's ``steps`` (``steps_per_epoch``,
``validation_steps``, ``evaluate(steps=)``) size the batches of the data kerastorch batches so
that that many cover it: ``ceil(samples / steps)``.
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

from .arrays import array_dataset, as_tensor, is_array, is_array_group, is_label_group, num_samples
from .batches import LABEL_KEYS
from .loaders import loader_for
from .peek import num_batches


@dataclasses.dataclass
class FitData:
    """What ``fit`` was given to train and validate on, before it becomes loaders."""

    train: Any
    val: Any = None
    y: Any = None
    sample_weight: Any = None


@dataclasses.dataclass
class EvalData:
    """What ``evaluate`` or ``predict`` was given, before it becomes a loader."""

    data: Any
    y: Any = None
    sample_weight: Any = None


class DataForm:
    """One form of data: what applies to it, how it splits off validation samples, its loader.

    ``name`` is the argument the user passed it as (``"train_data"``, ``"val_data"``, ``"data"``),
    for messages; ``y`` and ``sample_weight`` are the labels and weights given beside it.
    ``needs_labels`` is False for ``predict``, and ``one_pass`` True: it goes over the data once.
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
        one_pass: bool = False,
    ):
        self.data, self.name = data, name
        self.y, self.sample_weight = y, sample_weight
        self.keep_float64, self.needs_labels, self.one_pass = keep_float64, needs_labels, one_pass

    @classmethod
    def accepts(cls, data: Any) -> bool:
        """True when ``data`` is of this form."""
        raise NotImplementedError

    def dataset(self) -> Dataset:
        """The samples, as a torch Dataset (forms whose batches kerastorch builds)."""
        raise NotImplementedError

    def split(self, fraction: float) -> tuple[DataForm, DataForm]:
        """Keras's ``validation_split``: the first ``floor(samples * (1 - fraction))`` samples for
        training, the **last** ones for validation, taken before any shuffling (34 samples and 0.2:
        the first 27 train, the last 7 validate)."""
        dataset = self.dataset()
        total = num_batches(dataset)
        if isinstance(dataset, IterableDataset) or total is None:
            raise ValueError(
                "validation_split needs data with a length to split; an iterable dataset has none. "
                "Pass val_data=... instead."
            )
        split_at = math.floor(total * (1.0 - fraction))  # Keras's train_validation_split, to the sample
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

    def loader(self, batch_size: Optional[int], shuffle: bool, pin_memory: bool, steps: Optional[int] = None) -> Any:
        """The batches: a DataLoader of :meth:`dataset` (``batch_size`` 32 by default; without one,
        ``steps`` batches that cover the samples, as Keras sizes them)."""
        dataset = self.dataset()
        if batch_size is None and steps is not None and (total := num_batches(dataset)):
            batch_size = math.ceil(total / steps)
        return loader_for(dataset, batch_size, shuffle=shuffle, pin_memory=pin_memory)


class Arrays(DataForm):
    """Arrays in memory: ``X`` with ``y``, ``(X1, X2)`` with ``y``, ``(X, y)``, ``(X, y, w)``,
    ``((X1, X2), y)`` or a dict of arrays; in ``predict``, ``X`` or ``[X1, X2]`` (every array an input)."""

    _converted: Optional[Dataset] = None

    @classmethod
    def accepts(cls, data: Any) -> bool:
        return is_array(data) or is_array_group(data)

    def dataset(self) -> Dataset:
        if self._converted is None:  # converted once: splitting and sizing batches look at it too
            self._converted = array_dataset(
                self.data, self.y, self.sample_weight, self.name, self.keep_float64, needs_labels=self.needs_labels
            )
        return self._converted


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
        if num_batches(self.data) == 0:  # len(dataset); an IterableDataset has none
            raise ValueError(
                empty_data_message(
                    self.name,
                    f"a {type(self.data).__name__} of 0 samples",
                    "how the dataset was built: its len() is 0 (a wrong folder or file path, a filter that kept nothing?)",
                )
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
        """What cannot apply to batches already made, and batches that cannot be iterated again."""
        self.refuse_given(batch_size, split)
        check_loader(self.data, self.name)

    def refuse_given(self, batch_size: Optional[int], split: float) -> None:
        """Keras's words that make batches (``batch_size``, ``validation_split``, ``y``,
        ``sample_weight``) cannot apply to batches already made."""
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

    def split(self, fraction: float) -> tuple[DataForm, DataForm]:
        self.check(None, fraction)
        raise AssertionError("unreachable: check refuses validation_split")

    def loader(self, batch_size: Optional[int], shuffle: bool, pin_memory: bool, steps: Optional[int] = None) -> Any:
        self.check(batch_size, 0.0)
        if isinstance(self.data, (list, tuple)) and any(holds_arrays(batch) for batch in self.data):
            # A list of NumPy batches (a Keras user's): made tensors once, as predict makes a generator's.
            return [arrays_as_tensors(batch, self.keep_float64) for batch in self.data]
        return self.data


class OneShot(Batches):
    """A generator, or any other iterator of batches that can be gone through only once: ``predict``
    takes it (one pass over the data, as Keras's ``predict(generator)``), with NumPy arrays in its
    batches made tensors. ``fit`` and ``evaluate`` refuse it, saying what to pass instead: fit goes over
    its data every epoch, and evaluate of a net spread over several devices looks at a first batch
    before its pass."""

    @classmethod
    def accepts(cls, data: Any) -> bool:
        return isinstance(data, collections.abc.Iterator)

    def check(self, batch_size: Optional[int], split: float) -> None:
        self.refuse_given(batch_size, split)
        if not self.one_pass:
            raise TypeError(
                f"{self.name} is a {type(self.data).__name__}, a one-shot iterator: it can be gone through only once. "
                "fit goes over its data every epoch (and over a first batch before training), so the second epoch "
                "would find no batches left; predict goes over its data once and takes a generator as it is. "
                "Pass data that can be iterated again: a DataLoader, a Dataset, arrays, or list(batches) for a few "
                "batches. For an endless stream to train on, wrap it in an IterableDataset and pass "
                "steps_per_epoch=..."
            )

    def loader(self, batch_size: Optional[int], shuffle: bool, pin_memory: bool, steps: Optional[int] = None) -> Any:
        self.check(batch_size, 0.0)
        return (arrays_as_tensors(batch) for batch in self.data)


def arrays_as_tensors(batch: Any, keep_float64: bool = False) -> Any:
    """A batch with its NumPy arrays and pandas objects as tensors (what a Keras generator yields),
    floats as float32 unless ``keep_float64``, as :func:`~kerastorch.data.arrays.as_tensor` makes them."""
    if is_array(batch):
        return as_tensor(batch, "a batch", keep_float64)
    if isinstance(batch, Mapping):
        return {key: arrays_as_tensors(value, keep_float64) for key, value in batch.items()}
    if isinstance(batch, (tuple, list)) and not hasattr(batch, "_fields"):
        return type(batch)(arrays_as_tensors(value, keep_float64) for value in batch)
    return batch


def holds_arrays(batch: Any) -> bool:
    """A batch with a NumPy array or a pandas object in it (tensors aside)."""
    if is_array(batch):
        return not isinstance(batch, torch.Tensor)
    if isinstance(batch, Mapping):
        return any(holds_arrays(value) for value in batch.values())
    if isinstance(batch, (tuple, list)) and not hasattr(batch, "_fields"):
        return any(holds_arrays(value) for value in batch)
    return False


#: The forms, in the order they are tried: the first whose ``accepts`` is true adapts the data.
FORMS: tuple[type[DataForm], ...] = (Arrays, IterableData, MapDataset, OneShot, Batches)


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
    """Batches that can be iterated again, epoch after epoch (one-shot iterators are :class:`OneShot`'s),
    and are not empty."""
    if data is None or isinstance(data, (torch.Tensor, str, bytes, dict)) or not hasattr(data, "__iter__"):
        raise TypeError(
            f"{name} is a {type(data).__name__}, but it must be an iterable of batches, such as "
            "torch.utils.data.DataLoader(TensorDataset(x, y), batch_size=32)."
        )
    if num_batches(data) == 0:
        raise ValueError(empty_data_message(name, "0 batches"))


def empty_data_message(name: str, what: str, check: str = "the dataset's size, batch_size and drop_last") -> str:
    """What kerastorch says of data with nothing in it: a DataLoader of no batches, a Dataset of no samples."""
    return f"{name} is empty ({what}). Check {check}."


def keras_positional(train: Any, val: Any, y: Any) -> tuple[Any, Any]:
    """``fit(X, y)``, ``fit((X1, X2), y)``, ``fit({"a": X1, "b": X2}, y)``: a bare array in ``val_data``'s
    place is the labels, never validation data (a bare array has no labels). Returns ``(y, val)``."""
    if y is None and is_array(train) and is_label_group(val, num_samples(train)):
        return val, None  # Keras's fit(X, [y1, y2]): a bare X has no labels, so these are its labels, one per output
    if y is None and (is_array(val) or is_number_list(val)) and (is_array(train) or is_array_group(train)):
        if isinstance(train, Mapping) and any(str(key) in LABEL_KEYS for key in train):
            raise ValueError(
                f"fit(data, y): the dict of arrays has a labels key ({', '.join(k for k in LABEL_KEYS if k in train)}) "
                "and a bare array follows it as y; pass the labels once. (A bare array as the second argument is "
                "y, never validation data: pass validation_data=(X_val, y_val).)"
            )
        samples = num_samples(train)
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
    steps_per_epoch: Optional[int] = None,
    validation_batch_size: Optional[int] = None,
    validation_steps: Optional[int] = None,
) -> tuple[Any, Any]:
    """``(train loader, val loader or None)`` from whatever ``fit`` was given. Batches the user
    made go through untouched (a Python list's NumPy arrays made tensors); arrays, tensors, DataFrames and
    Datasets become DataLoaders (validation batches of ``validation_batch_size``, else ``batch_size``, as in
    Keras). A loader the user made is the very loader returned; those built over arrays read each batch with
    one index per array (:func:`~kerastorch.data.loaders.loader_for`)."""
    train = adapt(data.train, "train_data", y=data.y, sample_weight=data.sample_weight, keep_float64=keep_float64)
    val = None if data.val is None else adapt(data.val, "val_data", keep_float64=keep_float64)
    if validation_split:
        train, val = train.split(validation_split)
    train_loader = train.loader(batch_size, shuffle=shuffle, pin_memory=pin_memory, steps=steps_per_epoch)
    if val is None:
        return train_loader, None
    if validation_batch_size is not None and not val.builds_batches:
        raise ValueError(
            f"validation_batch_size={validation_batch_size}, but val_data is a {type(val.data).__name__}, which already "
            "makes its batches. Drop validation_batch_size=, or pass the validation arrays or Dataset instead."
        )
    # A validation loader the user made keeps its own batches, whatever batch_size says.
    val_batch_size = validation_batch_size or (batch_size if val.builds_batches else None)
    val_loader = val.loader(val_batch_size, shuffle=False, pin_memory=pin_memory, steps=validation_steps)
    return train_loader, val_loader


def eval_loader(
    data: Any,
    y: Any,
    batch_size: Optional[int],
    needs_labels: bool,
    name: str = "data",
    sample_weight: Any = None,
    steps: Optional[int] = None,
) -> Any:
    """The loader ``evaluate(X, y)`` or ``predict(X)`` runs over (data order kept); ``predict``
    (``needs_labels=False``) also takes a generator. ``steps`` sizes the batches kerastorch makes
    when ``batch_size`` is None (the caller takes that many batches)."""
    form = adapt(data, name, y=y, sample_weight=sample_weight, needs_labels=needs_labels, one_pass=not needs_labels)
    return form.loader(batch_size, shuffle=False, pin_memory=False, steps=steps)


__all__ = [
    "FORMS",
    "Arrays",
    "Batches",
    "DataForm",
    "EvalData",
    "FitData",
    "IterableData",
    "MapDataset",
    "OneShot",
    "adapt",
    "arrays_as_tensors",
    "check_loader",
    "eval_loader",
    "keras_positional",
    "prepare_data",
]
