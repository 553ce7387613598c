"""What kerastorch needs to know about the user's data: its length, and its first batch
looked at without changing the run that follows."""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Optional, TypeVar

import torch

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
    """Peeking at a batch must not change the data order of the run that follows."""
    generator = getattr(loader, "generator", None)
    if not isinstance(generator, torch.Generator):
        generator = None
    torch_state = torch.random.get_rng_state()
    gen_state = generator.get_state() if generator is not None else None
    try:
        yield
    finally:
        torch.random.set_rng_state(torch_state)
        if generator is not None and gen_state is not None:
            generator.set_state(gen_state)


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


__all__ = ["NoBatchesError", "dry_run_first_batch", "num_batches", "rng_untouched"]
