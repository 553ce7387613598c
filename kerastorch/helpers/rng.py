"""Every random number generator a training run draws from, captured and put back.

A resumed run repeats the uninterrupted one only if its next epoch draws the same
random numbers: dropout masks (torch's generator on each device), the shuffle of the
data (the DataLoader's own ``generator`` if it has one, torch's global generator if
not), whatever the user's code draws from python's ``random`` or numpy, and the
generators a Dataset keeps as its own attributes (``self.rng = np.random.default_rng(0)``,
a ``random.Random``, a ``torch.Generator``, also inside its transforms and in the
datasets a ``Subset`` or ``ConcatDataset`` wraps).

A DataLoader worker process draws from its own copies of python's, numpy's and torch's
generators and of the Dataset's: :func:`worker_rng_state` captures them inside a worker
and :func:`restore_worker_rng_state` puts them back into one.

The captured state holds only tensors, numbers and tuples, so it can be stored in a
file that loads with ``torch.load(weights_only=True)``.

Example::

    state = capture_rng_state([dl_train])
    ...                                     # draws random numbers
    restore_rng_state(state, [dl_train])    # the same numbers come again
"""

from __future__ import annotations

import pickle
import random
import types
import warnings
from typing import Any, Iterable

import numpy as np
import torch

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


# Random generators a Dataset (or an object it holds, such as a transform) may keep as attributes.
_GENERATORS = (np.random.Generator, np.random.RandomState, random.Random, torch.Generator)
# How deep the search for them goes, and the longest list or dict it looks into (not the samples).
_SEARCH_DEPTH, _SEARCH_WIDTH = 4, 16


def data_generators(loader: Any) -> list[Any]:
    """The random generators the loader's Dataset and samplers keep as attributes, in a fixed order:
    the Dataset's own, its transforms', those of the datasets it wraps (``Subset``,
    ``ConcatDataset``) and a custom sampler's (the shuffle generators of
    :func:`data_order_generators` aside).

    Their states are part of :func:`capture_rng_state`, so that a Dataset drawing from
    ``self.rng`` repeats its draws in a resumed run as it does from the global generators.
    """
    found: list[Any] = []
    seen: set[int] = {id(g) for g in data_order_generators(loader)}

    def walk(obj: Any, depth_left: int) -> None:
        if id(obj) in seen or obj is None or isinstance(obj, (int, float, str, bytes, torch.Tensor, np.ndarray)):
            return
        seen.add(id(obj))
        if isinstance(obj, _GENERATORS):
            found.append(obj)
            return
        if not depth_left or isinstance(obj, (type, types.ModuleType, types.FunctionType, types.MethodType)):
            return
        if isinstance(obj, (list, tuple)):
            children = list(obj) if len(obj) <= _SEARCH_WIDTH else []
        elif isinstance(obj, dict):
            children = list(obj.values()) if len(obj) <= _SEARCH_WIDTH else []
        else:
            children = list(vars(obj).values()) if hasattr(obj, "__dict__") else []
        for child in children:
            walk(child, depth_left - 1)

    holders = _order_holders(loader)
    for holder in holders.values():
        walk(getattr(holder, "dataset", None), _SEARCH_DEPTH)
    for path, holder in holders.items():
        if path.endswith("sampler"):
            walk(holder, _SEARCH_DEPTH)
    return found


def host_random_states(generators: Iterable[Any]) -> list:
    """What python's and numpy's global generators and ``generators`` (the Dataset's own, from
    :func:`data_generators`) hold now, as values that compare with ``==``: any draw from one of them
    changes it. (torch's generators are compared as tensors by their users.)"""
    return [random.getstate(), _comparable_legacy(np.random.get_state()), *(_comparable_state(g) for g in generators)]


def _comparable_state(generator: Any) -> Any:
    if isinstance(generator, torch.Generator):
        return generator.get_state().numpy().tobytes()
    if isinstance(generator, random.Random):
        return generator.getstate()
    if isinstance(generator, np.random.RandomState):
        return _comparable_legacy(generator.get_state())
    return pickle.dumps(generator.bit_generator.state)  # ints, and arrays for some bit generators


def _comparable_legacy(state: Any) -> tuple:
    # numpy's legacy state: ("MT19937", key array, pos, has_gauss, cached_gaussian)
    return (state[1].tobytes(), *state[2:])


def generator_state(generator: Any) -> Any:
    """One generator's state as plain values (tensors, numbers, dicts) that a training state can hold."""
    if isinstance(generator, torch.Generator):
        return generator.get_state()
    if isinstance(generator, random.Random):
        return generator.getstate()
    if isinstance(generator, np.random.RandomState):
        return _plain_arrays(generator.get_state(legacy=False))
    return _plain_arrays(generator.bit_generator.state)


def set_generator_state(generator: Any, state: Any) -> None:
    """Put back what :func:`generator_state` returned."""
    if isinstance(generator, torch.Generator):
        generator.set_state(state)
    elif isinstance(generator, random.Random):
        generator.setstate(_as_tuples(state))
    elif isinstance(generator, np.random.RandomState):
        generator.set_state(_numpy_arrays(state))
    else:
        generator.bit_generator.state = _numpy_arrays(state)


def capture_rng_state(loaders: Iterable[Any] = ()) -> dict:
    """The state of python's, numpy's and torch's generators (CPU, CUDA, MPS), of the
    loaders' own shuffle generators and of the generators their Datasets keep."""
    loaders = list(loaders)
    state = {
        "python": random.getstate(),
        "numpy": _numpy_global_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "mps": torch.mps.get_rng_state() if torch.backends.mps.is_available() else None,
        "data_order": [[g.get_state() for g in data_order_generators(loader)] for loader in loaders],
        "data_counters": [data_order_counters(loader) for loader in loaders],
        "data_generators": [[generator_state(g) for g in data_generators(loader)] for loader in loaders],
    }
    return state


def restore_rng_state(state: dict, loaders: Iterable[Any] = ()) -> None:
    """Put back what :func:`capture_rng_state` returned, for the same loaders."""
    random.setstate(_as_tuples(state["python"]))
    _set_numpy_global_state(state["numpy"])
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
    if state.get("mps") is not None and torch.backends.mps.is_available():
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
        for generator, saved_state in zip(generators, saved):
            generator.set_state(saved_state)
    for loader, saved in zip(loaders, state.get("data_generators", [])):
        _restore_data_generators(loader, saved)


def worker_rng_state(dataset: Any) -> dict:
    """Inside a DataLoader worker: the state of its python, numpy and torch generators and of its
    copy of the Dataset's own generators. Sent with every batch, so held as bytes: a tensor would
    travel through shared memory."""
    version, words, gauss = random.getstate()
    _, key, pos, has_gauss, numpy_gauss = np.random.get_state()  # the legacy tuple form
    return {
        "python": (version, np.asarray(words, dtype=np.uint32).tobytes(), gauss),
        "numpy": (np.asarray(key, dtype=np.uint32).tobytes(), int(pos), int(has_gauss), float(numpy_gauss)),
        "torch": torch.get_rng_state().numpy().tobytes(),
        "dataset": [generator_state(g) for g in data_generators(_DatasetHolder(dataset))],
    }


def restore_worker_rng_state(state: dict, dataset: Any) -> None:
    """Inside a DataLoader worker: put back what :func:`worker_rng_state` returned."""
    version, words, gauss = state["python"]
    random.setstate((version, tuple(int(w) for w in np.frombuffer(words, dtype=np.uint32)), gauss))
    key, pos, has_gauss, numpy_gauss = state["numpy"]
    np.random.set_state(("MT19937", np.frombuffer(key, dtype=np.uint32).copy(), pos, has_gauss, numpy_gauss))
    torch.set_rng_state(torch.frombuffer(bytearray(state["torch"]), dtype=torch.uint8))
    _restore_data_generators(_DatasetHolder(dataset), state["dataset"])


class _DatasetHolder:
    """A dataset seen as a loader's is, so that :func:`data_generators` finds the same generators."""

    def __init__(self, dataset: Any):
        self.dataset = dataset


def _restore_data_generators(loader: Any, saved: list) -> None:
    generators = data_generators(loader)
    if len(generators) != len(saved):
        warnings.warn(
            f"The data keeps {len(generators)} random generator(s) of its own (in its Dataset or sampler) where "
            f"the saved run's kept {len(saved)}; they are not restored, so its random draws may differ from the "
            "saved run's.",
            stacklevel=3,
        )
        return
    for generator, generator_saved in zip(generators, saved):
        set_generator_state(generator, generator_saved)


def _numpy_global_state() -> dict:
    _, key, pos, has_gauss, gauss = np.random.get_state()
    return {
        "key": torch.from_numpy(np.asarray(key, dtype=np.int64)),
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "gauss": float(gauss),
    }


def _set_numpy_global_state(state: dict) -> None:
    np.random.set_state(
        ("MT19937", state["key"].numpy().astype(np.uint32), state["pos"], state["has_gauss"], state["gauss"])
    )


def _plain_arrays(obj: Any) -> Any:
    # numpy's generator states hold arrays (MT19937's key, Philox's counter): stored as bytes in a
    # tensor, with their dtype and shape, so that a state file holds only plain values.
    if isinstance(obj, np.ndarray):
        return {
            "ndarray": torch.frombuffer(bytearray(obj.tobytes()), dtype=torch.uint8),
            "dtype": obj.dtype.str,
            "shape": list(obj.shape),
        }
    if isinstance(obj, dict):
        return {key: _plain_arrays(value) for key, value in obj.items()}
    return obj


def _numpy_arrays(obj: Any) -> Any:
    if isinstance(obj, dict) and set(obj) == {"ndarray", "dtype", "shape"}:
        return np.frombuffer(obj["ndarray"].numpy().tobytes(), dtype=np.dtype(obj["dtype"])).reshape(obj["shape"])
    if isinstance(obj, dict):
        return {key: _numpy_arrays(value) for key, value in obj.items()}
    return obj


def _as_tuples(obj: Any) -> Any:
    # random.setstate wants tuples all the way down.
    if isinstance(obj, (list, tuple)):
        return tuple(_as_tuples(o) for o in obj)
    return obj


__all__ = [
    "capture_rng_state",
    "data_order_counters",
    "data_order_generators",
    "data_generators",
    "host_random_states",
    "restore_rng_state",
    "restore_worker_rng_state",
    "worker_rng_state",
]
