"""Where the training data is inside a pass over the loader, and going on from there in a new process.

A training state saved in the middle of an epoch must let a resumed run draw the rest of that
epoch's batches in the same order, with the same random augmentations. While a training state
is kept, :func:`resumable` puts a :class:`ResumableLoader` around this process's training loader
(inside accelerate's per-process loader, around the loader it iterates). At any batch it knows:

- the random state at the start of the current pass over the loader, where the shuffle is drawn;
- how many batches of the pass it handed out (and, with worker processes, each worker's random
  state after its last batch: the workers send it along with their batches).

A resumed pass puts the pass's starting random state back, builds the loader's iterator as the
saved run did, skips the batches already trained *at the sampler* (as accelerate's
``skip_first_batches`` does: their indices are drawn, their samples are not loaded), then puts
the saved run's current random state back. With W worker processes, batch i goes to worker
i % W; so that each worker goes on with its own random stream, the pass is rebuilt from the last
multiple of W at or below the position, each worker starts from the random state the saved run's
worker had there, and the at most W - 1 batches between are loaded again and dropped. Data that
is not a map-style DataLoader (an ``IterableDataset``, a generator) cannot be skipped without
loading: its already-trained batches are loaded again and dropped.

``persistent_workers=True`` is followed too: workers kept across epochs keep their random state,
so a resumed run starts its workers from the states the saved run's had. When ``fit`` returns,
persistent workers that sent their random states along are ended (the loader starts new ones
when it is next iterated).
"""

from __future__ import annotations

import collections
import itertools
from typing import Any, Iterator, Optional

from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from ..helpers.rng import capture_rng_state, restore_rng_state, restore_worker_rng_state, worker_rng_state


class WorkerTagged(tuple):
    """A batch from a worker process, with that worker's random state after it: ``(batch, tag)``.
    A tuple, so that the DataLoader's pin-memory thread pins the batch inside and keeps the type."""


class TagWithWorkerState:
    """The loader's ``collate_fn``, then the worker's id and random state attached to the batch."""

    def __init__(self, collate_fn: Any):
        self.collate_fn = collate_fn

    def __call__(self, samples: Any) -> Any:
        batch = self.collate_fn(samples)
        info = get_worker_info()
        if info is None:  # the main process: its random state is the training state's own
            return batch
        return WorkerTagged((batch, {"worker": info.id, "rng": worker_rng_state(info.dataset)}))


class StartWorkersFrom:
    """The loader's ``worker_init_fn``, then the random state the saved run's worker had."""

    def __init__(self, worker_init_fn: Any, states: dict[int, dict]):
        self.worker_init_fn = worker_init_fn
        self.states = states

    def __call__(self, worker_id: int) -> None:
        if self.worker_init_fn is not None:
            self.worker_init_fn(worker_id)
        state, info = self.states.get(worker_id), get_worker_info()
        if state is not None and info is not None:
            restore_worker_rng_state(state, info.dataset)


class PlannedIndices:
    """A DataLoader's index sampler whose next passes are planned: the first ``empty`` (start the
    persistent workers without drawing a shuffle), or skipping the first ``skip`` batches without
    loading them; every later pass is the sampler's own. A persistent iterator keeps this object
    for its later passes, so it must fall back to the sampler's own passes."""

    def __init__(self, indices: Any, plan: list[int]):
        self.indices = indices
        self.plan = list(plan)  # -1: an empty pass; k >= 0: skip k batches
        self.latest: Optional[SkippedIndices] = None

    def __iter__(self) -> Iterator[Any]:
        # A DataLoader's iterator may call iter() more than once before it draws (its __init__, then
        # its _reset): a planned step is used up by the pass that draws from it.
        if not self.plan:
            return iter(self.indices)
        self.latest = SkippedIndices(self.indices, self.plan[0], self.plan)
        return self.latest

    def draw_now(self) -> None:
        """Skip now (the shuffle is drawn), not when the first batch is asked for (see SkippedIndices)."""
        if self.latest is not None:
            self.latest.draw()

    def __len__(self) -> int:
        return len(self.indices)

    def __getattr__(self, name: str) -> Any:
        indices = self.__dict__.get("indices")
        if indices is None:
            raise AttributeError(name)
        return getattr(indices, name)


class SkippedIndices:
    """A pass of an index sampler without its first ``skip`` batches. The sampler draws its shuffle
    at its first index: :meth:`draw` makes that happen when the saved run's did (after the loader's
    iterator drew its worker seed), before the random state goes on to where the saved run was."""

    def __init__(self, indices: Any, skip: int, plan: list[int]):
        self.indices = iter(indices)  # a generator: nothing is drawn yet
        self.skip = skip  # -1: an empty pass
        self.plan = plan
        self.first: Optional[list] = None

    def draw(self) -> None:
        if self.first is None:
            self.plan.pop(0)  # this pass uses its step up
            self.first = [] if self.skip < 0 else list(itertools.islice(self.indices, self.skip, self.skip + 1))

    def __iter__(self) -> SkippedIndices:
        return self

    def __next__(self) -> Any:
        self.draw()
        if self.first:
            return self.first.pop()
        if self.skip < 0:
            raise StopIteration
        return next(self.indices)


class ResumableLoader:
    """The training loader of one process, followed batch by batch so that a training state can
    say where its data is, and a resumed run can go on from there (see the module docstring).

    ``looks_ahead``: its consumer (accelerate's per-process loader) pulls one batch ahead of the
    batch being trained.
    """

    def __init__(self, loader: Any, looks_ahead: bool = False):
        self.loader = loader  # named so that rng.py finds the data order inside
        self.looks_ahead = looks_ahead
        self.torch_loader = innermost_dataloader(loader)
        self.num_workers = getattr(self.torch_loader, "num_workers", 0) if self.torch_loader is not None else 0
        self.persistent = self.num_workers > 0 and bool(getattr(self.torch_loader, "persistent_workers", False))
        self.live: Optional[dict] = None  # the latest pass: how many batches it handed out, whether it ended
        self.passes = 0
        # Each worker's latest random states, with the pass and batch they followed: (pass, batch, state).
        self.worker_history: dict[int, collections.deque] = collections.defaultdict(lambda: collections.deque(maxlen=2))
        self.workers_started_tagging = False
        self.resume: Optional[dict] = None

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:
        # accelerate's loader asks the loader it wraps for its sampler, dataset, batch size ... The
        # epoch counters are not passed on: rng.py sets them where they live, not on this wrapper.
        loader = self.__dict__.get("loader")
        if loader is None or name in ("epoch", "iteration"):
            raise AttributeError(name)
        return getattr(loader, name)

    # -- a pass --------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        # Not a generator: a resumed pass is rebuilt (and a new one begins) when iter() is called,
        # at the start of the epoch, before anything else draws from the random state it restores.
        resume, self.resume = self.resume, None
        self.passes += 1
        live = {"id": self.passes, "pulled": 0, "ended": False}
        if resume is not None and resume["pass"] is not None:
            batches, held = self._continue_pass(resume, live)
        else:
            if resume is not None and resume["workers"]:  # persistent workers at an epoch's boundary
                self._start_persistent_workers(resume["workers"])
                restore_rng_state(resume["now"], resume["loaders"])
            batches, held = self._pulled(self._start_pass(live), live), []
        self.live = live
        return itertools.chain(held, batches)

    def _start_pass(self, live: dict) -> Iterator[Any]:
        live["rng"] = capture_rng_state([self.loader])
        live["reset"] = self.persistent and getattr(self.torch_loader, "_iterator", None) is not None
        return self._iterator_of_loader()

    def _pulled(self, iterator: Iterator[Any], live: dict) -> Iterator[Any]:
        pre_load = self.looks_ahead and self.num_workers == 0
        while True:
            if pre_load:  # the batch pulled ahead is loaded before the step that precedes it trains
                live["before_pull"] = capture_rng_state([self.loader])
            try:
                batch = next(iterator)
            except StopIteration:
                live["ended"] = True
                return
            if type(batch) is WorkerTagged:
                batch, tag = batch
                self.worker_history[tag["worker"]].append((live["id"], live["pulled"], tag["rng"]))
            live["pulled"] += 1
            yield batch

    def _iterator_of_loader(self, workers_from: Optional[dict] = None, plan: Optional[list[int]] = None) -> Any:
        """``iter(loader)`` with the workers tagging their batches (and starting from ``workers_from``),
        and the index sampler following ``plan`` (see :class:`PlannedIndices`)."""
        torch_loader = self.torch_loader
        if torch_loader is None:
            return iter(self.loader)
        collate_fn, init_fn = torch_loader.collate_fn, torch_loader.worker_init_fn
        sampler_name = "batch_sampler" if torch_loader.batch_sampler is not None else "sampler"
        indices = getattr(torch_loader, sampler_name)
        try:
            if self.num_workers:
                torch_loader.collate_fn = TagWithWorkerState(collate_fn)
                self.workers_started_tagging = True
                if workers_from:
                    torch_loader.worker_init_fn = StartWorkersFrom(init_fn, workers_from)
            planned = PlannedIndices(indices, plan) if plan else None
            if planned is not None:
                # A DataLoader refuses a new sampler once built; only the iterator made now reads this one.
                object.__setattr__(torch_loader, sampler_name, planned)
            iterator = iter(self.loader)
            if planned is not None:
                planned.draw_now()
            return iterator
        finally:
            torch_loader.collate_fn, torch_loader.worker_init_fn = collate_fn, init_fn
            object.__setattr__(torch_loader, sampler_name, indices)

    # -- where it is, and going on from there ----------------------------------------------------

    def position(self, in_use: bool) -> dict:
        """Where the data is: the pass its consumer is in (None between passes) and the workers'
        random states a resumed pass starts them from. ``in_use``: the consumer goes on with the
        latest pass (in the middle of an epoch, or across epochs with ``steps_per_epoch``)."""
        live = self.live
        if not in_use or live is None or (live["ended"] and not self.looks_ahead):
            workers = self._latest_worker_states() if self.persistent else {}
            return {"pass": None, "workers": workers}
        pulled = live["pulled"]
        ahead = int(self.looks_ahead and not live["ended"] and pulled > 0)
        trained = pulled - ahead
        restart = self._restart_point(trained)
        saved = {"rng": live["rng"], "reset": live["reset"], "trained": trained, "restart": restart}
        if ahead and self.num_workers == 0:
            saved["before_pull"] = live["before_pull"]
        return {"pass": saved, "workers": self._worker_states_at(live["id"], restart)}

    def continue_from(self, position: dict, now: dict, loaders: list) -> None:
        """Make the next pass go on from ``position``; ``now`` is the saved run's current random
        state (as :func:`~kerastorch.helpers.rng.capture_rng_state` of ``loaders`` gave it)."""
        self.resume = {**position, "now": now, "loaders": loaders}

    def _restart_point(self, trained: int) -> int:
        """The batch a resumed pass is rebuilt from: skipped at the sampler up to there."""
        if self.torch_loader is None or isinstance(self.torch_loader.dataset, IterableDataset):
            return 0  # nothing to skip without loading: an iterable dataset or other iterable
        return trained - trained % self.num_workers if self.num_workers else trained

    def _continue_pass(self, resume: dict, live: dict) -> tuple[Iterator[Any], list]:
        saved = resume["pass"]
        live["rng"], live["reset"] = saved["rng"], saved["reset"]
        restart, trained = saved["restart"], saved["trained"]
        if saved["reset"]:  # the saved run's persistent workers were running when this pass began
            self._start_persistent_workers(resume["workers"], then_skip=restart)
            restore_rng_state(saved["rng"], [self.loader])
            iterator = self._iterator_of_loader()  # the workers' iterator keeps its planned indices
        else:
            restore_rng_state(saved["rng"], [self.loader])
            iterator = self._iterator_of_loader(workers_from=resume["workers"], plan=[restart])
        live["pulled"] = restart
        pulled = self._pulled(iterator, live)
        for _ in range(trained - restart):  # loaded by the workers that loaded them in the saved run
            next(pulled, None)
        held = []
        if "before_pull" in saved:  # the batch pulled ahead was loaded before the last step trained
            restore_rng_state(saved["before_pull"], [self.loader])
            held = list(itertools.islice(pulled, 1))
        restore_rng_state(resume["now"], resume["loaders"])
        return pulled, held

    def _start_persistent_workers(self, states: dict, then_skip: int = 0) -> None:
        """Start the loader's persistent workers from ``states`` without drawing a pass's shuffle; the
        next pass skips ``then_skip`` batches."""
        for _ in self._iterator_of_loader(workers_from=states, plan=[-1, then_skip]):
            pass

    def _latest_worker_states(self) -> dict[int, dict]:
        return {worker: history[-1][2] for worker, history in self.worker_history.items() if history}

    def _worker_states_at(self, pass_id: int, restart: int) -> dict[int, dict]:
        """Each worker's random state after its last batch before batch ``restart`` of this pass
        (a persistent worker's from an earlier pass; a new worker's: none, it starts afresh)."""
        states = {}
        for worker, history in self.worker_history.items():
            for seen_pass, batch, state in reversed(history):
                if (seen_pass == pass_id and batch < restart) or (seen_pass < pass_id and self.persistent):
                    states[worker] = state
                    break
        return states

    def release(self) -> None:
        """End persistent workers that tag their batches: the loader's later passes get plain batches."""
        if self.persistent and self.workers_started_tagging and self.torch_loader is not None:
            iterator, self.torch_loader._iterator = self.torch_loader._iterator, None
            if iterator is not None:  # a multi-process iterator (persistent workers)
                iterator._shutdown_workers()  # type: ignore[attr-defined]
            self.workers_started_tagging = False


def innermost_dataloader(loader: Any) -> Optional[DataLoader]:
    """The torch DataLoader whose iterator a loader builds (inside wrappers such as accelerate's), or None."""
    seen = 0
    while loader is not None and seen < 6:
        if issubclass(type(loader), DataLoader):  # type(): accelerate's wrappers pretend to be DataLoaders
            return loader
        loader, seen = wrapped_loader(loader), seen + 1
    return None


def wrapped_loader(loader: Any) -> Any:
    """The loader a wrapper iterates, or None: accelerate's per-process loader keeps it as its public
    ``base_dataloader``, kerastorch's wrappers (steps per epoch, class weights, this module's) as ``loader``."""
    inner = getattr(loader, "base_dataloader", None)
    return inner if inner is not None else getattr(loader, "loader", None)


def resumable(loader: Any) -> Any:
    """``loader`` with a :class:`ResumableLoader` inside: around the loader accelerate's per-process
    loader iterates (which pulls one batch ahead), or around ``loader`` itself."""
    inner = getattr(loader, "base_dataloader", None)
    if inner is not None and not issubclass(type(loader), DataLoader):
        loader.base_dataloader = ResumableLoader(inner, looks_ahead=True)
        return loader
    return ResumableLoader(loader)


def resumable_inside(loader: Any) -> Optional[ResumableLoader]:
    """The :class:`ResumableLoader` inside a training loader (its wrappers followed), or None."""
    seen = 0
    while loader is not None and seen < 6:
        if isinstance(loader, ResumableLoader):
            return loader
        loader, seen = wrapped_loader(loader), seen + 1
    return None


__all__ = ["ResumableLoader", "innermost_dataloader", "resumable", "resumable_inside"]
