"""Batches of tensors in memory read with one index per tensor, not one per sample.

A ``DataLoader`` over a ``TensorDataset`` fetches a batch sample by sample: ``dataset[i]`` for each
index of the batch, each a tuple of rows, then ``default_collate`` stacks the rows. For 64 rows of
32 numbers that is about 150 µs on a 2-core CPU, as much as a small net's whole training step.
Indexing each tensor once with the batch's indices gives the same batch, to the bit and in the same
memory layout, in about a tenth of the time. Keras reads arrays this way (a slice per batch); here
it applies to the user's own DataLoader too, so ``fit``, ``evaluate`` and ``predict`` over
``DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True)`` spend less on their data than a
hand-written loop over the same loader.

:func:`read_by_index` takes a loader only where nothing but the speed can change:

* a ``torch.utils.data.DataLoader`` itself (a subclass may iterate its own way), with no worker
  processes, automatic batching and torch's ``default_collate``;
* over a ``TensorDataset``, the dataset kerastorch makes of arrays, or a ``Subset`` of one
  (``random_split``, ``validation_split``), whose tensors are torch's own (not a subclass), dense
  and laid out row by row (a row of another layout is stacked into a contiguous batch, which one
  index might not give);
* unpinned, or pinned on CUDA (the batch is pinned as torch's loader pins it).

A pass draws the random numbers torch's own makes, in the same order: the sampler's (the shuffle,
drawn at the first batch) and the seed torch draws for worker processes when the pass begins. So the
data order, and every random number the run draws after it, are those of the loader as given.
Indices other than Python ints (a sampler of the user's own may give NumPy integers, tensors, bools)
are fetched sample by sample, as torch fetches them, errors and all. A batch of tensors that require
gradients comes from an index, not a stack: the same values and gradients, another ``grad_fn``.

The loader comes back as another face of the given one: an object of a subclass that only changes
how a pass fetches, sharing the given loader's attributes (its ``__dict__``), so a change made to
either, during ``fit`` too (a callback setting ``loader.collate_fn``), is seen by both. Each pass
asks again whether it can read by index, and leaves the pass to torch when it no longer can (a
``collate_fn`` set since, the dataset's tensors replaced by others). Under torch's profiler each batch
is recorded as torch's loader records it, as an ``enumerate(DataLoader)`` event.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Optional

import numpy as np
import torch
from torch.utils.data import DataLoader, Subset, TensorDataset, default_collate

from .arrays import ArrayDataset
from .peek import draw_pass_seed

_pin_batch: Optional[Callable[..., Any]]
try:  # what torch's own single-process iterator pins a batch with
    from torch.utils.data._utils.pin_memory import pin_memory as _pin_batch
except ImportError:  # pragma: no cover - a torch that moved it: pinned loaders keep torch's way
    _pin_batch = None


RowsReader = Callable[[torch.Tensor], Any]


def read_by_index(loader: Any) -> Any:
    """``loader`` made to read each batch with one index per tensor where that changes nothing but
    the speed (see the module's note), else ``loader`` itself."""
    if type(loader) is not DataLoader or not _fetches_as_indexed_can(loader):
        return loader
    indexed = IndexedLoader.__new__(IndexedLoader)
    # The same attributes, not a copy of them: what is set on either is set on both (see the module's note).
    object.__setattr__(indexed, "__dict__", loader.__dict__)
    return indexed


class IndexedLoader(DataLoader):
    """A ``DataLoader`` whose passes read each batch by index (:func:`read_by_index` makes one)."""

    def _get_iterator(self) -> Any:
        if not _fetches_as_indexed_can(self):  # changed since (a collate_fn set, other tensors): torch's pass
            return super()._get_iterator()
        return IndexedPass(self)


class IndexedPass:
    """One pass over an :class:`IndexedLoader`'s batches."""

    def __init__(self, loader: DataLoader):
        # In the order torch's single-process iterator takes them: the sampler's iterator (a generator,
        # which draws the shuffle at the first batch), then the seed it would give worker processes.
        self._indices: Iterator = iter(loader.batch_sampler)  # type: ignore[arg-type]
        draw_pass_seed(loader)
        self._dataset = loader.dataset
        read = rows_reader(loader.dataset)
        assert read is not None, "read_by_index took a loader whose dataset it cannot read by index"
        self._read: RowsReader = read
        self._pin_device = _pin_device(loader) if loader.pin_memory else None
        self._batch_sampler = loader.batch_sampler

    def __iter__(self) -> IndexedPass:
        return self

    def __len__(self) -> int:
        return len(self._batch_sampler)  # type: ignore[arg-type]  # asked when asked for, as torch's pass does

    def __next__(self) -> Any:
        if _profiler_is_on():
            with torch.autograd.profiler.record_function(_PROFILE_NAME):
                return self._next_batch()
        return self._next_batch()

    def _next_batch(self) -> Any:
        indices = next(self._indices)
        rows = _as_rows(indices)
        if rows is not None:
            batch = self._read(rows)
        else:  # what a sampler of the user's own gave: fetched as torch fetches it
            batch = default_collate([self._dataset[i] for i in indices])
        if self._pin_device is not None:
            batch = _pin_batch(batch, self._pin_device)  # type: ignore[misc]
        return batch


# The name of the event torch's profiler records for each batch of a pass: the prefix is torch's own,
# which the profiler's views count as time spent on data.
_PROFILE_NAME = "enumerate(DataLoader)#IndexedPass.__next__"


def _profiler_is_on() -> bool:
    # torch's own loader records an event at every batch; kept off the fast path while nobody profiles.
    return bool(getattr(torch.autograd.profiler, "_is_profiler_enabled", True))


def _as_rows(indices: Any) -> Optional[torch.Tensor]:
    """A batch's indices as an int64 tensor, or None for anything but a non-empty list of Python ints
    (a bool is an int to Python, and a mask to torch's fetch; a NumPy integer or a tensor is left to torch too)."""
    if type(indices) is not list or not indices or not all(type(index) is int for index in indices):
        return None
    return _int64_or_none(indices)


def _int64_or_none(indices: list | tuple) -> Optional[torch.Tensor]:
    try:
        return torch.tensor(indices, dtype=torch.int64)
    except (OverflowError, RuntimeError):  # an int beyond int64: torch's fetch says what of it
        return None


def rows_reader(dataset: Any) -> Optional[RowsReader]:
    """A function of a batch's indices that gives the batch ``default_collate`` makes of the samples
    there, for a dataset of contiguous tensors read by index; None for any other dataset."""
    if type(dataset) is TensorDataset:
        tensors = dataset.tensors
        if not _all_contiguous(tensors):
            return None
        return lambda rows: [tensor[rows] for tensor in tensors]  # a tuple of samples collates into a list
    if type(dataset) is ArrayDataset:
        return dataset.rows if _all_contiguous(dataset.tensors()) else None
    if type(dataset) is Subset:
        inner = rows_reader(dataset.dataset)
        positions = _positions(dataset.indices)
        if inner is None or positions is None:
            return None
        return lambda rows: inner(positions[rows])
    return None


def _positions(indices: Any) -> Optional[torch.Tensor]:
    """A ``Subset``'s indices as an int64 tensor, or None for indices torch's fetch may read otherwise
    than as one row each: anything but a range, Python ints (not bools), or a 1-D tensor or NumPy
    array of signed integers (an element of a uint8 or bool tensor is a mask to torch)."""
    if isinstance(indices, range):
        return torch.arange(indices.start, indices.stop, indices.step)
    if isinstance(indices, (list, tuple)):
        return _int64_or_none(indices) if all(type(i) is int for i in indices) else None
    if isinstance(indices, np.ndarray) and indices.dtype.kind == "i":
        indices = torch.from_numpy(indices)
    if isinstance(indices, torch.Tensor) and indices.dim() == 1 and indices.dtype in _SIGNED_INTEGERS:
        return indices.long()
    return None


_SIGNED_INTEGERS = (torch.int64, torch.int32, torch.int16, torch.int8)


def _fetches_as_indexed_can(loader: DataLoader) -> bool:
    """A loader whose batches reading by index gives unchanged (see the module's note)."""
    return (
        loader.num_workers == 0
        and loader.batch_sampler is not None  # automatic batching (batch_size=None hands out samples)
        and loader.collate_fn is default_collate
        and loader.timeout == 0
        and (not loader.pin_memory or _pin_device(loader) is not None)
        and rows_reader(loader.dataset) is not None
    )


def _pin_device(loader: DataLoader) -> Optional[str]:
    """Where torch's loader pins this loader's batches, when reading by index can pin them the same
    way: CUDA, no ``pin_memory_device`` (deprecated; torch warns of it at each pass)."""
    if _pin_batch is None or loader.pin_memory_device or not torch.cuda.is_available():
        return None
    accelerator = torch.accelerator.current_accelerator()
    return "cuda" if accelerator is not None and accelerator.type == "cuda" else None


def _all_contiguous(tensors: Any) -> bool:
    """Dense tensors of torch's own class (a subclass may index a row and a batch of rows its own ways)
    laid out row by row, every stride that of a contiguous tensor (``is_contiguous`` overlooks those of
    dimensions of size 1, which a stack of rows and an index of them set differently)."""
    return all(
        type(tensor) is torch.Tensor
        and not tensor.is_nested
        and tensor.layout == torch.strided
        and tensor.stride() == _row_major_strides(tensor.shape)
        for tensor in tensors
    )


def _row_major_strides(shape: torch.Size) -> tuple[int, ...]:
    """The strides of a contiguous tensor of ``shape``, as ``torch.empty(shape)`` has them."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


__all__ = ["IndexedLoader", "read_by_index", "rows_reader"]
