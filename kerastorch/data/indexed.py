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
  (``random_split``, ``validation_split``), whose tensors are torch's own (not a subclass) and
  contiguous (a row of another layout is stacked into a contiguous batch, which one index might not
  give);
* unpinned, or pinned on CUDA (the batch is pinned as torch's loader pins it).

A pass draws the random numbers torch's own makes, in the same order: the sampler's (the shuffle,
drawn at the first batch) and the seed torch draws for worker processes when the pass begins. So the
data order, and every random number the run draws after it, are those of the loader as given.
Indices that are not whole numbers (a sampler of the user's own) are fetched sample by sample, as
torch would, errors and all.

The loader comes back as a shallow copy of the given one, of a subclass that only changes how a pass
fetches: its sampler, generator and dataset are the user's objects.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Iterator, Optional

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
    indexed = copy.copy(loader)
    indexed.__class__ = IndexedLoader  # a class of its own: DataLoader's attributes and checks stay as they are
    return indexed


class IndexedLoader(DataLoader):
    """A ``DataLoader`` whose passes read each batch by index (:func:`read_by_index` makes one)."""

    def _get_iterator(self) -> Any:
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
        self._length = len(loader)

    def __iter__(self) -> IndexedPass:
        return self

    def __len__(self) -> int:
        return self._length

    def __next__(self) -> Any:
        indices = next(self._indices)
        rows = _as_rows(indices)
        if rows is not None:
            batch = self._read(rows)
        else:  # what a sampler of the user's own gave: fetched as torch fetches it
            batch = default_collate([self._dataset[i] for i in indices])
        if self._pin_device is not None:
            batch = _pin_batch(batch, self._pin_device)  # type: ignore[misc]
        return batch


def _as_rows(indices: Any) -> Optional[torch.Tensor]:
    """A batch's indices as an int64 tensor, or None for anything but a non-empty list of whole numbers."""
    if not isinstance(indices, list) or not indices:
        return None
    try:
        rows = torch.as_tensor(indices)
    except (TypeError, ValueError, RuntimeError):
        return None
    return rows if rows.dtype == torch.int64 and rows.dim() == 1 else None


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
    """A ``Subset``'s indices as an int64 tensor, or None when they are not whole numbers."""
    if isinstance(indices, range):
        return torch.arange(indices.start, indices.stop, indices.step)
    try:
        positions = torch.as_tensor(indices)
    except (TypeError, ValueError, RuntimeError):
        return None
    if positions.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8) or positions.dim() != 1:
        return None
    return positions.long()


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
    # torch's own tensors only: a subclass may index a row and a batch of rows its own ways.
    return all(type(tensor) is torch.Tensor and tensor.is_contiguous() for tensor in tensors)


__all__ = ["IndexedLoader", "read_by_index", "rows_reader"]
