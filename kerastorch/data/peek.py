"""Looking at the user's data without changing the run that follows: its length, and its first
batch run through a function with the data order and the net's mode left as they were."""

from __future__ import annotations

import contextlib
import itertools
from typing import Any, Callable, Iterator, Optional, TypeVar

import torch
from torch.utils._pytree import tree_flatten
from torch.utils.data import ConcatDataset, DataLoader, Subset, TensorDataset, default_collate

from ..training.modes import eval_mode
from ..training.rng import data_generators, data_order_generators, host_random_states
from .arrays import ArrayDataset

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


class RandomStates:
    """The random states a loader's data order draws from: torch's global generator and every
    generator the loader, its sampler or batch sampler hold (a ``WeightedRandomSampler(generator=g)``
    too), read and written together."""

    def __init__(self, loader: Any):
        self.generators = data_order_generators(loader)

    def read(self) -> list[torch.Tensor]:
        return [torch.random.get_rng_state(), *(g.get_state() for g in self.generators)]

    def write(self, states: list[torch.Tensor]) -> None:
        torch.random.set_rng_state(states[0])
        for generator, state in zip(self.generators, states[1:]):
            generator.set_state(state)


@contextlib.contextmanager
def rng_untouched(loader: Any) -> Iterator[None]:
    """Peeking at a batch must not change the data order of the run that follows: the loader's
    :class:`RandomStates` come back as they were."""
    states = RandomStates(loader)
    before = states.read()
    try:
        yield
    finally:
        states.write(before)


def first_batch(data: Any, name: str) -> Any:
    """The first batch of ``data``, leaving the data order as it was (the random state the loader
    draws its shuffle from is put back); :class:`NoBatchesError` naming ``name`` when there is none."""
    with rng_untouched(data):
        iterator = iter(data)
        try:
            return _next_batch(iterator, name)
        finally:
            del iterator


def _next_batch(iterator: Iterator, name: str) -> Any:
    try:
        return next(iterator)
    except StopIteration:
        raise NoBatchesError(
            f"{name} produced no batches. Check the dataset's size, batch_size and drop_last."
        ) from None


class FirstPass:
    """A pass over a ``DataLoader`` whose first batch was fetched for the checks before training:
    iterating it hands out that batch and then the rest of the same pass, so the batch is not
    fetched twice (a whole collate of one batch, the largest part of a one-batch run's checks).

    Kept only where that pass is the pass a fresh ``iter(loader)`` would give, later:
    :func:`peek_first_pass` and :func:`dry_run_first_pass` say when. Iterating it makes the one
    random draw that creating the pass's iterator makes (the seed DataLoader gives its workers),
    at that moment, so the random numbers the rest of the run draws are the same as without it.
    Once only; afterwards it is the loader's own fresh pass.
    """

    def __init__(self, loader: DataLoader, batch: Any, rest: Iterator):
        self.loader = loader
        self._kept: Optional[tuple[Any, Iterator]] = (batch, rest)

    def __iter__(self) -> Iterator:
        kept, self._kept = self._kept, None
        if kept is None:
            return iter(self.loader)
        draw_pass_seed(self.loader)
        batch, rest = kept
        return itertools.chain([batch], rest)


def peek_first_pass(data: Any, name: str) -> tuple[Any, Optional[FirstPass]]:
    """The first batch of ``data`` as :func:`first_batch` gives it, and the pass it began, kept
    (:class:`FirstPass`) when handing it out later gives what a fresh pass would:

    * ``data`` is a ``DataLoader`` without worker processes (a kept pass with workers would keep
      them, and the batches they fetch ahead, through the training epoch);
    * the only random number the first batch took is the pass's seed: a shuffling sampler, or a
      dataset that draws from torch's, python's or numpy's generators or its own, takes more, which
      the kept pass could not draw again in the same place. torch's states after the fetch are
      compared with those after the seed's draw alone, the others with those before the fetch.
    """
    if not (isinstance(data, DataLoader) and data.num_workers == 0):
        return first_batch(data, name), None
    # Reading python's and numpy's states costs a fifth of a small batch's fetch: not for tensors
    # read by index, which draw nothing.
    watch_elsewhere = not _draws_nothing(data)
    states, datasets_own = RandomStates(data), data_generators(data) if watch_elsewhere else []
    before, elsewhere = states.read(), host_random_states(datasets_own) if watch_elsewhere else None
    try:
        iterator = iter(data)
        batch = _next_batch(iterator, name)
        drew_elsewhere = watch_elsewhere and host_random_states(datasets_own) != elsewhere
        fetched = states.read()
        states.write(before)
        draw_pass_seed(data)
        seed_alone = states.read()
    finally:
        states.write(before)
    same_draws = not drew_elsewhere and all(map(torch.equal, fetched, seed_alone))
    return batch, (FirstPass(data, batch, iterator) if same_draws else None)


def _draws_nothing(loader: DataLoader) -> bool:
    """Tensors or arrays read by index (``TensorDataset``, the dataset kerastorch makes of arrays, a
    ``Subset`` or ``ConcatDataset`` of them) put together by torch's ``default_collate``: a fetch
    that draws no random number (its sampler's are torch's, which are compared anyway)."""
    if loader.collate_fn is not default_collate:
        return False
    datasets = [loader.dataset]
    while datasets:
        dataset = datasets.pop()
        if type(dataset) is Subset:
            datasets.append(dataset.dataset)
        elif type(dataset) is ConcatDataset:
            datasets.extend(dataset.datasets)
        elif type(dataset) not in (TensorDataset, ArrayDataset):
            return False
    return True


def draw_pass_seed(loader: DataLoader) -> None:
    # What torch's DataLoader draws when a pass begins (its iterator's _base_seed): peek_first_pass
    # compares the states after a real fetch with those after this draw, so a change to it in torch
    # turns the kept pass off, it does not skew the random numbers.
    torch.empty((), dtype=torch.int64).random_(generator=loader.generator)


def dry_run_first_pass(
    net: torch.nn.Module, data: Any, name: str, run: Callable[[Any], T]
) -> tuple[T, Optional[FirstPass]]:
    """:func:`dry_run_first_batch`, and the pass it began, kept when it is fit to hand out as the
    next pass over ``data`` (:func:`peek_first_pass`) and ``run`` left the batch as the loader gave
    it: the same objects in the same layout, no tensor written in place (which needs every object in
    the batch to be one torch's pytree utilities see into)."""
    batch, kept = peek_first_pass(data, name)
    given = _contents(batch) if kept is not None else None
    with eval_mode(net), torch.no_grad():
        result = run(batch)
    return result, (kept if given is not None and _same_contents(given, _contents(batch)) else None)


def _contents(batch: Any) -> Optional[tuple[list, Any, list[int]]]:
    """The batch's objects, layout and tensor versions; None when it holds an object whose insides
    torch's pytree utilities do not see (an in-place change there would go unseen)."""
    leaves, layout = tree_flatten(batch)
    if not all(isinstance(leaf, (torch.Tensor, int, float, str, bytes, type(None))) for leaf in leaves):
        return None
    return leaves, layout, [t._version for t in leaves if isinstance(t, torch.Tensor)]


def _same_contents(given: tuple[list, Any, list[int]], now: Optional[tuple[list, Any, list[int]]]) -> bool:
    return (
        now is not None
        and now[1] == given[1]
        and len(now[0]) == len(given[0])
        and all(a is b for a, b in zip(now[0], given[0]))
        and now[2] == given[2]
    )


def dry_run_first_batch(net: torch.nn.Module, data: Any, name: str, run: Callable[[Any], T]) -> T:
    """``run(first batch of data)`` in eval mode, without gradients, leaving the data order
    and the net's train/eval mode as they were. Errors from ``run`` propagate."""
    batch = first_batch(data, name)
    with eval_mode(net), torch.no_grad():
        return run(batch)


__all__ = [
    "FirstPass",
    "NoBatchesError",
    "dry_run_first_batch",
    "dry_run_first_pass",
    "num_batches",
    "peek_first_pass",
    "rng_untouched",
]
