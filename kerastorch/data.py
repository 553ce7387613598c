"""The user's data: what kerastorch needs to know about it (its length, its first batch looked
at without changing the run that follows), and turning arrays, tensors, DataFrames and
Datasets into loaders the Keras way (``batch_size``, ``validation_split``, weights,
``steps_per_epoch``). A DataLoader the user made goes through untouched.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Mapping
from typing import Any, Callable, Iterator, Optional, TypeVar, Union

import numpy as np
import pandas as pd
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, Subset

from .batches import LABEL_KEYS, WeightedSample, split_batch, split_sample_weight
from .rng import data_order_generators
from .settings import DEFAULT_BATCH_SIZE, DataSettings
from .weights import ClassWeighted

T = TypeVar("T")


class NoBatchesError(ValueError):
    """Data that produced no batch at all."""


def num_batches(data: Any) -> Optional[int]:
    """``len(data)``, or None for data of unknown length (an iterable dataset, a generator).

    >>> num_batches([1, 2, 3]), num_batches(iter([1, 2, 3]))
    (3, None)
    """
    try:
        return len(data)
    except TypeError:
        return None


@contextlib.contextmanager
def rng_untouched(loader: Any) -> Iterator[None]:
    """Peeking at a batch must not change the data order of the run that follows: torch's global
    generator and every generator the loader, its sampler or batch sampler hold (a
    ``WeightedRandomSampler(generator=g)`` too) come back as they were."""
    generators = data_order_generators(loader)
    torch_state = torch.random.get_rng_state()
    states = [g.get_state() for g in generators]
    try:
        yield
    finally:
        torch.random.set_rng_state(torch_state)
        for generator, state in zip(generators, states):
            generator.set_state(state)


def dry_run_first_batch(net: torch.nn.Module, data: Any, name: str, run: Callable[[Any], T]) -> T:
    """``run(first batch of data)`` in eval mode, without gradients, leaving the data order
    and the net's train/eval mode as they were. Errors from ``run`` propagate."""
    with rng_untouched(data):
        iterator = iter(data)
        try:
            batch = next(iterator)
        except StopIteration:
            raise NoBatchesError(
                f"{name} produced no batches. Check the dataset's size, batch_size and drop_last."
            ) from None
        finally:
            del iterator
    was_training = net.training
    net.eval()
    try:
        with torch.no_grad():
            return run(batch)
    finally:
        net.train(was_training)


# -- the Keras way: arrays, tensors, DataFrames and Datasets become loaders -------------------


@dataclasses.dataclass
class FitData:
    """What ``fit`` was given to train and validate on, before it becomes loaders."""

    train: Any
    val: Any = None
    y: Any = None
    sample_weight: Any = None


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


def is_loader(obj: Any) -> bool:
    """Batches the user made (a DataLoader or any other re-iterable of batches): used as they are."""
    return not (obj is None or is_array(obj) or is_array_group(obj) or isinstance(obj, Dataset))


def keras_positional(train: Any, val: Any, y: Any) -> tuple[Any, Any]:
    """``fit(X, y)``: a bare array in ``val_data``'s place is the labels, never validation data
    (a bare array has no labels). Returns ``(y, val)``."""
    if y is None and is_array(val) and (is_array(train) or (is_array_group(train) and not isinstance(train, Mapping))):
        samples = len(train) if is_array(train) else len(train[0])
        if len(val) != samples:
            raise ValueError(
                f"fit(X, y): X has {samples} samples but y has {len(val)}; give one label per sample. (A bare array "
                "as the second argument is y, never validation data: pass validation_data=(X_val, y_val).)"
            )
        return val, None
    return y, val


def as_tensor(array: Any, name: str, keep_float64: bool = False) -> torch.Tensor:
    """A tensor from a tensor, NumPy array or pandas object: floating NumPy data as float32
    (as Keras does; float64 kept with ``precision="64-true"``), integers as int64."""
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
        array = array.to_numpy()
    array = np.asarray(array)
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


class ArrayDataset(Dataset):
    """In-memory arrays as samples: ``(x1, ..., xn, y)``, a dict, or inputs alone; with
    per-sample weights, each sample is a :class:`~kerastorch.batches.WeightedSample`."""

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


def split_off_validation(dataset: Dataset, fraction: float) -> tuple[Dataset, Dataset]:
    """The first part for training, the **last** ``fraction`` of the samples for validation, taken
    before any shuffling, exactly as Keras's ``validation_split`` does."""
    total = len(dataset)  # type: ignore[arg-type]
    split_at = math.ceil(total * (1.0 - fraction))
    if split_at == total or split_at == 0:
        raise ValueError(
            f"validation_split={fraction} of {total} samples leaves "
            f"{'no validation' if split_at == total else 'no training'} sample; use a fraction that "
            "keeps at least one sample on each side."
        )
    return Subset(dataset, range(split_at)), Subset(dataset, range(split_at, total))


def prepare_data(data: FitData, settings: DataSettings, keep_float64: bool, pin_memory: bool) -> tuple[Any, Any]:
    """``(train loader, val loader or None)`` from whatever ``fit`` was given. A DataLoader goes
    through untouched; arrays, tensors, DataFrames and Datasets become DataLoaders."""
    train, val = data.train, data.val
    split = settings.validation_split
    if not isinstance(split, (int, float)) or isinstance(split, bool) or not 0 <= split < 1:
        raise ValueError(f"validation_split={split!r}; use a fraction in [0, 1), e.g. 0.2 for the last 20 %.")
    if split and val is not None:
        raise ValueError("Both validation_split and val_data/validation_data were given; pass only one of them.")
    if settings.batch_size is not None and (
        not isinstance(settings.batch_size, int) or settings.batch_size < 1 or isinstance(settings.batch_size, bool)
    ):
        raise ValueError(f"batch_size={settings.batch_size!r}; use a whole number of samples >= 1, e.g. 32.")
    if is_loader(train):
        given = [
            w
            for w, v in (
                ("batch_size", settings.batch_size),
                ("validation_split", split or None),
                ("sample_weight", data.sample_weight),
                ("y", data.y),
            )
            if v is not None
        ]
        if given:
            raise ValueError(
                f"train_data is a {type(train).__name__}, which already makes its batches, so {given[0]}= cannot "
                f"apply to it. Drop {given[0]}=, or pass the arrays or the Dataset instead (fit(X, y, batch_size=32, "
                "validation_split=0.2)). Per-sample weights in your own batches go in a dict with a "
                "'sample_weight' key."
            )
        return train, _val_loader(val, settings, keep_float64, pin_memory)
    if isinstance(train, Dataset):
        if data.y is not None or data.sample_weight is not None:
            raise ValueError(
                f"train_data is a {type(train).__name__}; y= and sample_weight= go beside arrays, not a "
                "Dataset. Let the Dataset return (x, y), or a dict with 'labels' and 'sample_weight'."
            )
        dataset: Dataset = train
    else:
        if train is None:
            raise ValueError("fit needs training data: fit(X, y), fit((X, y)), fit(dataset) or fit(dataloader).")
        dataset = array_dataset(train, data.y, data.sample_weight, "train_data", keep_float64)
    if split:
        if isinstance(dataset, IterableDataset) or num_batches(dataset) is None:
            raise ValueError(
                "validation_split needs data with a length to split; an iterable dataset has none. "
                "Pass val_data=... instead."
            )
        dataset, val = split_off_validation(dataset, split)
    return loader_for(dataset, settings, shuffle=settings.shuffle, pin_memory=pin_memory), _val_loader(
        val, settings, keep_float64, pin_memory
    )


def _val_loader(val: Any, settings: DataSettings, keep_float64: bool, pin_memory: bool) -> Any:
    if val is None or is_loader(val):
        return val
    dataset = val if isinstance(val, Dataset) else array_dataset(val, None, None, "val_data", keep_float64)
    return loader_for(dataset, settings, shuffle=False, pin_memory=pin_memory)


def eval_loader(data: Any, y: Any, batch_size: Optional[int], needs_labels: bool, name: str = "data") -> Any:
    """The loader ``evaluate(X, y)`` or ``predict(X)`` runs over (data order kept)."""
    if is_loader(data):
        if batch_size is not None or y is not None:
            raise ValueError(
                f"{name} is a {type(data).__name__}, which already makes its batches: drop batch_size= "
                "and y=, or pass the arrays."
            )
        return data
    if not isinstance(data, Dataset):
        data = array_dataset(data, y, None, name, keep_float64=False, needs_labels=needs_labels)
    return loader_for(data, DataSettings(batch_size=batch_size), shuffle=False, pin_memory=False)


def loader_for(dataset: Dataset, settings: DataSettings, shuffle: bool, pin_memory: bool) -> DataLoader:
    """The DataLoader kerastorch builds: ``batch_size`` (default 32), shuffled for training.

    No worker processes: for data already in memory they only add copying; when loading a
    sample does real work (files, augmentation), pass your own
    ``DataLoader(dataset, num_workers=...)`` instead.
    """
    iterable = isinstance(dataset, IterableDataset)
    return DataLoader(
        dataset,
        batch_size=settings.batch_size or DEFAULT_BATCH_SIZE,
        shuffle=shuffle and not iterable,
        pin_memory=pin_memory,
    )


class EpochSteps:
    """``steps_per_epoch`` batches per epoch from one iterator that the next epoch continues,
    as Keras does; a finite loader that runs out starts a new pass."""

    def __init__(self, loader: Any, steps: int):
        self.loader = loader  # named so that rng.py finds the data order inside
        self.steps = steps
        self._iterator: Optional[Iterator] = None

    def __iter__(self) -> Iterator:
        for _ in range(self.steps):
            if self._iterator is None:
                self._iterator = iter(self.loader)
            try:
                yield next(self._iterator)
            except StopIteration:
                self._iterator = iter(self.loader)
                try:
                    yield next(self._iterator)
                except StopIteration:
                    return  # an empty loader: the loop says so

    def __len__(self) -> int:
        return self.steps


def training_labels(loader: Any) -> torch.Tensor:
    """Every training label, for class weights: read from the arrays when kerastorch built the
    loader, else by one pass over the loader (its data order left as it was)."""
    dataset = getattr(loader, "dataset", None)
    indices: Any = slice(None)
    if isinstance(dataset, Subset):
        dataset, indices = dataset.dataset, list(dataset.indices)  # type: ignore[attr-defined]
    if isinstance(dataset, ArrayDataset):
        arrays = dataset.arrays
        labels = next(v for k, v in arrays.items() if k in LABEL_KEYS) if isinstance(arrays, dict) else arrays[-1]
        return labels[indices]
    found = []
    with rng_untouched(loader):
        for batch in loader:
            _, _, labels = split_batch(split_sample_weight(batch)[0])
            found.append(torch.as_tensor(labels).reshape(-1).cpu())
    return torch.cat(found) if found else torch.zeros(0, dtype=torch.long)


def per_process_training_data(loader: Any, settings: DataSettings, class_weights: Optional[torch.Tensor]) -> Any:
    """What wraps this process's share of the training loader: class weights, then steps per epoch."""
    if class_weights is not None:
        loader = ClassWeighted(loader, class_weights)
    if settings.steps_per_epoch is not None:
        loader = EpochSteps(loader, settings.steps_per_epoch)
    return loader


__all__ = [
    "FitData",
    "NoBatchesError",
    "dry_run_first_batch",
    "eval_loader",
    "num_batches",
    "prepare_data",
    "rng_untouched",
]
