"""Every random number generator a training run draws from, captured and put back.

A resumed run repeats the uninterrupted one only if its next epoch draws the same
random numbers: dropout masks (torch's generator on each device), the shuffle of the
data (the DataLoader's own ``generator`` if it has one, torch's global generator if
not), and whatever the user's code draws from python's ``random`` or numpy.

The captured state holds only tensors, numbers and tuples, so it can be stored in a
file that loads with ``torch.load(weights_only=True)``.

Example::

    state = capture_rng_state([dl_train])
    ...                                     # draws random numbers
    restore_rng_state(state, [dl_train])    # the same numbers come again
"""

from __future__ import annotations

import random
import warnings
from typing import Any, Iterable

import numpy as np
import torch

from ..devices.cuda import mps_available

# Where a loader keeps what decides its data order: the loader itself, its sampler and
# batch sampler, and the loaders and samplers that wrappers (accelerate's prepared
# loaders, a loader that calls DistributedSampler.set_epoch) hold inside.
_INNER = ("sampler", "batch_sampler", "loader", "base_dataloader")
# Epoch counters that samplers shuffle by: DistributedSampler.epoch, accelerate's
# SeedableRandomSampler.epoch and DataLoaderShard.iteration.
_COUNTERS = ("epoch", "iteration")


def _order_holders(loader: Any, depth: int = 3) -> dict[str, Any]:
    """The objects inside ``loader`` that may hold its data order, by attribute path ("", "sampler", ...)."""
    found: dict[str, Any] = {}
    seen: set[int] = set()

    def walk(obj: Any, path: str, depth_left: int) -> None:
        if obj is None or id(obj) in seen or isinstance(obj, (int, float, str, torch.Tensor)):
            return
        seen.add(id(obj))
        found[path] = obj
        if depth_left:
            for name in _INNER:
                walk(getattr(obj, name, None), f"{path}.{name}" if path else name, depth_left - 1)

    walk(loader, "", depth)
    return found


def data_order_generators(loader: Any) -> list[torch.Generator]:
    """The ``torch.Generator`` objects that decide a loader's shuffle, in a fixed order.

    ``DataLoader(shuffle=True, generator=g)`` hands ``g`` to its sampler; a custom
    sampler or batch sampler may hold its own. A loader without one shuffles with
    torch's global generator, which :func:`capture_rng_state` saves anyway.
    """
    found: list[torch.Generator] = []
    for holder in _order_holders(loader).values():
        generator = getattr(holder, "generator", None)
        if isinstance(generator, torch.Generator) and all(generator is not g for g in found):
            found.append(generator)
    return found


def data_order_counters(loader: Any) -> dict[str, int]:
    """The epoch counters inside ``loader`` that its shuffle depends on, as ``{"sampler.epoch": 3}``."""
    counters = {}
    for path, holder in _order_holders(loader).items():
        for name in _COUNTERS:
            value = getattr(holder, name, None)
            if type(value) is int:
                counters[f"{path}.{name}" if path else name] = value
    return counters


def _set_counter(loader: Any, dotted: str, value: int) -> bool:
    *path, name = dotted.split(".")
    holder = _order_holders(loader).get(".".join(path))
    if holder is None or type(getattr(holder, name, None)) is not int:
        return False
    setattr(holder, name, value)
    return True


def capture_rng_state(loaders: Iterable[Any] = ()) -> dict:
    """The state of python's, numpy's and torch's generators (CPU, CUDA, MPS) and of the
    loaders' own shuffle generators."""
    _, key, pos, has_gauss, gauss = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": {
            "key": torch.from_numpy(np.asarray(key, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "gauss": float(gauss),
        },
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "mps": torch.mps.get_rng_state() if mps_available() else None,
        "data_order": [[g.get_state() for g in data_order_generators(loader)] for loader in loaders],
        "data_counters": [data_order_counters(loader) for loader in loaders],
    }
    return state


def restore_rng_state(state: dict, loaders: Iterable[Any] = ()) -> None:
    """Put back what :func:`capture_rng_state` returned, for the same loaders."""
    random.setstate(_as_tuples(state["python"]))
    numpy_state = state["numpy"]
    np.random.set_state(
        (
            "MT19937",
            numpy_state["key"].numpy().astype(np.uint32),
            numpy_state["pos"],
            numpy_state["has_gauss"],
            numpy_state["gauss"],
        )
    )
    torch.set_rng_state(state["torch"])
    cuda_states = state.get("cuda") or []
    if cuda_states:
        if torch.cuda.is_available() and torch.cuda.device_count() == len(cuda_states):
            torch.cuda.set_rng_state_all(cuda_states)
        else:
            warnings.warn(
                "The saved run used a different number of CUDA devices; their random state is not restored, "
                "so dropout on the GPU will not repeat the saved run exactly.",
                stacklevel=2,
            )
    if state.get("mps") is not None and mps_available():
        torch.mps.set_rng_state(state["mps"])
    loaders = list(loaders)
    for loader, counters in zip(loaders, state.get("data_counters", [])):
        if not all(_set_counter(loader, dotted, value) for dotted, value in counters.items()):
            warnings.warn(
                "A DataLoader is built differently from the saved run's (its sampler's epoch counter is "
                "missing); its data order may differ from the saved run's.",
                stacklevel=2,
            )
    for loader, saved in zip(loaders, state.get("data_order", [])):
        generators = data_order_generators(loader)
        if len(generators) != len(saved):
            warnings.warn(
                "A DataLoader has a different number of shuffle generators than in the saved run; its data "
                "order is not restored.",
                stacklevel=2,
            )
            continue
        for generator, generator_state in zip(generators, saved):
            generator.set_state(generator_state)


def _as_tuples(obj: Any) -> Any:
    # random.setstate wants tuples all the way down.
    if isinstance(obj, (list, tuple)):
        return tuple(_as_tuples(o) for o in obj)
    return obj


__all__ = ["capture_rng_state", "data_order_counters", "data_order_generators", "restore_rng_state"]
