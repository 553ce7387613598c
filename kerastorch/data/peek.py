"""Looking at the user's data without changing the run that follows: its length, and its first
batch run through a function with the data order and the net's mode left as they were."""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Optional, TypeVar

import torch

from ..training.modes import eval_mode
from ..training.rng import data_order_generators

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


def first_batch(data: Any, name: str) -> Any:
    """The first batch of ``data``, leaving the data order as it was (the random state the loader
    draws its shuffle from is put back); :class:`NoBatchesError` naming ``name`` when there is none."""
    with rng_untouched(data):
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


__all__ = ["NoBatchesError", "dry_run_first_batch", "num_batches", "rng_untouched"]
