"""Looking at the user's data without changing the run that follows: its length, and its first
batch, fetched with every random generator a pass may draw from put back afterwards."""

from __future__ import annotations

import contextlib
import random
from typing import Any, Callable, Iterable, Iterator, Optional, TypeVar

import numpy as np
import torch

from ..helpers.modes import eval_mode
from ..helpers.rng import data_generators, data_order_generators, generator_state, set_generator_state

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
    """Looking at a batch of ``loader`` must not change the data order or the random draws of the run
    that follows: torch's, python's and numpy's global generators, the loader's own (its shuffle) and
    those its dataset keeps (an augmentation's) come back as they were."""
    generators = [*data_order_generators(loader), *data_generators(loader)]
    saved = (torch.get_rng_state(), random.getstate(), np.random.get_state(), [generator_state(g) for g in generators])
    try:
        yield
    finally:
        torch.set_rng_state(saved[0])
        random.setstate(saved[1])
        np.random.set_state(saved[2])
        for generator, state in zip(generators, saved[3]):
            set_generator_state(generator, state)


@contextlib.contextmanager
def workers_as_they_were(loaders: Iterable[Any]) -> Iterator[None]:
    """A ``persistent_workers=True`` DataLoader starts its worker processes on its first pass and
    keeps them, with their random state, for every later pass. A loader that had none before the
    block has none after it: the next run starts them as it would have without the block."""
    fresh = [
        loader
        for loader in loaders
        if getattr(loader, "persistent_workers", False) and getattr(loader, "_iterator", False) is None
    ]
    try:
        yield
    finally:
        for loader in fresh:
            iterator, loader._iterator = loader._iterator, None
            if iterator is not None:
                iterator._shutdown_workers()


def first_batch(data: Any, name: str) -> Any:
    """The first batch of ``data``, with the data order left as it was (:func:`rng_untouched`) and a
    persistent loader's workers not started (:func:`workers_as_they_were`); :class:`NoBatchesError`
    naming ``name`` when there is none."""
    with rng_untouched(data), workers_as_they_were([data]):
        iterator = iter(data)
        try:
            return next(iterator)
        except StopIteration:
            raise NoBatchesError(
                f"{name} produced no batches. Check the dataset's size, batch_size and drop_last."
            ) from None
        finally:
            del iterator


def dry_run_first_batch(net: torch.nn.Module, data: Any, name: str, run: Callable[[Any], T]) -> T:
    """``run(first batch of data)`` in eval mode, without gradients, leaving the data order
    and the net's train/eval mode as they were. Errors from ``run`` propagate."""
    batch = first_batch(data, name)
    with eval_mode(net), torch.no_grad():
        return run(batch)


__all__ = [
    "NoBatchesError",
    "dry_run_first_batch",
    "first_batch",
    "num_batches",
    "rng_untouched",
    "workers_as_they_were",
]
