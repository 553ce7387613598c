"""Validation samples that are also training samples, found by a hash of each sample's bytes.

A sample counts by its first input (the net's ``x``; the first of several): two samples are the same
when that input holds the same bytes. For data held in memory (tensors, NumPy arrays and DataFrames,
a ``TensorDataset``, the arrays ``fit(X, y)`` batches, a ``Subset`` of them, a ``DataLoader`` over
any of these) every row is compared, read straight from the arrays: 60,000 rows of 784 floats take
about half a second. Other data is compared only when asked, by reading the first ``limit`` samples
of a pass over its loader (its data order left as it was).

Example::

    overlap = count_overlap(dl_train, dl_val)
    overlap.count, overlap.fraction     # (0, 0.0) for a clean split
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Optional

import numpy as np
import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    RandomSampler,
    SequentialSampler,
    Subset,
    SubsetRandomSampler,
    TensorDataset,
)

from .arrays import ArrayDataset, as_tensor, is_array
from .batches import LABEL_KEYS, unpack
from .peek import rng_untouched

# Validation rows found in the training data up to this much more often than the training rows repeat
# each other are duplicates, as tabular data with few distinct values has; more often, a leak.
DUPLICATES_MARGIN = 0.1


@dataclasses.dataclass(frozen=True)
class Overlap:
    """How many validation samples are also training samples.

    Attributes:
        count: validation samples whose input is also a training sample's (a repeated one counts
            each time).
        compared: validation samples compared.
        train_compared: training samples compared.
        train_repeated: the share of the training samples compared that repeat another training
            sample (tabular data with few distinct values repeats rows: a split then puts copies
            of training rows in the validation set about this often, without any leak).
        every_sample: True when every sample was compared (data in memory), False when only the
            first ``limit`` of each set were.
    """

    count: int
    compared: int
    train_compared: int
    train_repeated: float
    every_sample: bool

    @property
    def fraction(self) -> float:
        """``count / compared``: the share of the validation samples also in the training data."""
        return self.count / self.compared if self.compared else 0.0

    @property
    def leak(self) -> bool:
        """More validation samples in the training data than repeated rows explain: a split made
        after copying, or the same data passed twice. Rows that repeat in the training data about as
        often as they turn up in the validation data are duplicates, not a leak."""
        if self.count == 0:
            return False
        return not (self.train_repeated > 0 and self.fraction <= self.train_repeated + DUPLICATES_MARGIN)


def count_overlap(train: Any, val: Any, limit: Optional[int] = None) -> Optional[Overlap]:
    """Count the validation samples of ``val`` that are also in ``train``.

    Data held in memory is compared whole. Other data is read through its loader, the first ``limit``
    samples of each set, when ``limit`` is given; without it, None. None too when the samples have no
    tensor input to compare.
    """
    train_rows, val_rows = memory_rows(train), memory_rows(val)
    if train_rows is not None and val_rows is not None:
        train_hashes, val_hashes, every_sample = row_hashes(train_rows), row_hashes(val_rows), True
    elif limit is not None:
        train_hashes, val_hashes, every_sample = loader_hashes(train, limit), loader_hashes(val, limit), False
    else:
        return None
    if not len(train_hashes) or not len(val_hashes):
        return None
    _, inverse, counts = np.unique(train_hashes, return_inverse=True, return_counts=True)
    return Overlap(
        count=int(np.isin(val_hashes, train_hashes).sum()),
        compared=len(val_hashes),
        train_compared=len(train_hashes),
        train_repeated=float((counts[inverse.reshape(-1)] > 1).mean()),
        every_sample=every_sample,
    )


def row_hashes(rows: torch.Tensor) -> np.ndarray:
    """One 64-bit hash of the bytes of each row (the first dimension) of ``rows``: equal rows hash
    alike, different rows differently but by a chance of about one in 10^19 a pair.

    Python's own hash of each row's bytes: faster here than hashing every row at once with NumPy's or
    torch's integer arithmetic, which needs several passes over the data.
    """
    if rows.dim() == 0 or len(rows) == 0:
        return np.zeros(0, dtype=np.int64)
    as_bytes = rows.detach().cpu().reshape(len(rows), -1).contiguous().view(torch.uint8).numpy()
    return np.fromiter((hash(row.tobytes()) for row in as_bytes), dtype=np.int64, count=len(as_bytes))


def memory_rows(data: Any) -> Optional[torch.Tensor]:
    """The first input of every sample of data held in memory, as one tensor (a row per sample);
    None for any other data, and for a loader whose sampler reads another selection of its dataset
    than all of it or a ``SubsetRandomSampler``'s indices."""
    if isinstance(data, DataLoader):
        return _loader_rows(data)
    if isinstance(data, Subset):
        rows = memory_rows(data.dataset)
        return None if rows is None else _picked(rows, data.indices)
    if isinstance(data, TensorDataset):
        return data.tensors[0] if data.tensors else None
    if isinstance(data, ArrayDataset):
        columns = data.arrays.items() if isinstance(data.arrays, Mapping) else enumerate(data.arrays)
        return next((column for key, column in columns if key not in LABEL_KEYS), None)
    if is_array(data):
        try:
            return as_tensor(data, "data", keep_float64=True)
        except (TypeError, ValueError):  # text, objects: no rows of numbers to compare
            return None
    return None


def _loader_rows(loader: DataLoader) -> Optional[torch.Tensor]:
    batch_sampler = loader.batch_sampler
    if batch_sampler is None:  # batch_size=None: the sampler's samples one by one
        sampler = loader.sampler
    elif type(batch_sampler) is BatchSampler:
        sampler = batch_sampler.sampler
    else:  # a batch sampler of the user's own may pick any samples
        return None
    rows = memory_rows(loader.dataset)
    if rows is None:
        return None
    if type(sampler) in (SequentialSampler, RandomSampler):
        return rows
    if type(sampler) is SubsetRandomSampler:  # one dataset, two samplers: the usual split by indices
        return _picked(rows, sampler.indices)
    return None


def _picked(rows: torch.Tensor, indices: Any) -> torch.Tensor:
    """The rows at ``indices``: a view for a range with a positive step (validation_split's), else a copy."""
    if isinstance(indices, range) and indices.start >= 0 and indices.step > 0:
        return rows[indices.start : indices.stop : indices.step]
    return rows[torch.as_tensor(np.asarray(indices, dtype=np.int64))]


def loader_hashes(loader: Any, limit: int) -> np.ndarray:
    """:func:`row_hashes` of the first input of the first ``limit`` samples a pass over ``loader``
    hands out, in order; the loader's data order is left as it was."""
    found: list[np.ndarray] = []
    seen = 0
    with rng_untouched(loader):
        for batch in loader:
            args, kwargs, _ = unpack(batch)[:3]
            inputs = next((t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor)), None)
            if inputs is None or inputs.dim() == 0:
                break
            found.append(row_hashes(inputs[: limit - seen]))
            seen += len(found[-1])
            if seen >= limit:
                break
    return np.concatenate(found) if found else np.zeros(0, dtype=np.int64)


__all__ = ["DUPLICATES_MARGIN", "Overlap", "count_overlap", "loader_hashes", "memory_rows", "row_hashes"]
