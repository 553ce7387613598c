"""Each process's share of the data when k processes train together (DDP and FSDP alike).

- the training loader is sharded by accelerate (every process gets the same number of
  batches, which the gradient exchange needs; the last ones may repeat a few samples);
- the validation loader is sharded with ``even_batches=False``, so every validation
  sample is seen by exactly one process and none is repeated (a step that gathers at
  every batch gets even shards instead); an iterable one is dealt out batch by batch
  (:class:`DealtBatches`), with the same result;
- epoch values are sums over all processes: the loss and plain-function metrics
  through :class:`~kerastorch.training.meters.EpochMeters`' ``reduce_fn``, stateful metrics
  through :func:`~kerastorch.training.metric_sync.compute_metric`. Nothing gathers predictions
  per step.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import warnings
from typing import Any, Iterator

from torch import nn
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, IterableDataset

from ..helpers.protocols import RunRuntime, TrainableModel


def shard_loaders(
    runtime: RunRuntime, train_data: Any, val_data: Any, even_validation: bool = False
) -> tuple[Any, Any]:
    """This process's share of the training and validation loaders.

    ``even_validation`` shards the validation data like the training data, the same number of
    batches on every process: a step that gathers over the processes at every batch needs
    them to step together (its gathers drop the repeated samples again).
    """
    accelerator = runtime.accelerator
    train_loader = shard_evenly(accelerator, train_data, "train_data")
    shard_val = functools.partial(shard_evenly, name="val_data") if even_validation else shard_exactly
    val_loader = None if val_data is None else shard_val(accelerator, val_data)
    return train_loader, val_loader


@contextlib.contextmanager
def users_net_kept(model: TrainableModel, runtime: RunRuntime) -> Iterator[nn.Module]:
    """While a strategy puts its wrapped net in ``model.net``: the user's net, put back afterwards (also
    after an error), and accelerate made to forget the wrapped net and loaders."""
    users_net = model.net
    try:
        yield users_net
    finally:
        model.net = users_net
        runtime.accelerator.free_memory()


def bare_module(net: nn.Module) -> nn.Module:
    """The net a multi-process strategy wraps: DataParallel inside would spread each process over every GPU."""
    return net.module if isinstance(net, nn.DataParallel) else net


def _require_dataloader(data: Any, name: str) -> None:
    if not isinstance(data, DataLoader):
        raise TypeError(
            f"{name} is a {type(data).__name__}; with several processes it must be a torch.utils.data.DataLoader, "
            "so that each process can be given its own share of the batches."
        )


def shard_evenly(accelerator, loader: DataLoader, name: str):
    """Each process its share of the batches; the same number everywhere (DDP needs that)."""
    _require_dataloader(loader, name)
    if isinstance(loader.sampler, DistributedSampler):  # sharded by the user (a torchrun script)
        return SamplerEpochs(loader)
    return accelerator.prepare_data_loader(loader, device_placement=False)


def shard_exactly(accelerator, loader: DataLoader):
    """Each validation sample on exactly one process: uneven shards, no repeated samples."""
    _require_dataloader(loader, "val_data")
    if isinstance(loader.dataset, IterableDataset):
        # accelerate pads the shards of an iterable to equal lengths, so some samples would count twice.
        return DealtBatches(loader, accelerator.process_index, accelerator.num_processes)
    if isinstance(loader.sampler, DistributedSampler):
        warnings.warn(
            "val_data uses a DistributedSampler, which repeats samples so that every process gets as many, so "
            "val_loss and the metrics count a few samples twice. Pass a plain DataLoader: fit shards it exactly.",
            UserWarning,
            stacklevel=4,
        )
        return loader
    even_batches = accelerator.even_batches
    accelerator.even_batches = False
    try:
        return accelerator.prepare_data_loader(whole_batches_dealt(loader), device_placement=False)
    finally:
        accelerator.even_batches = even_batches


class AllBatches(BatchSampler):
    """A loader's own batches, its short last one already dropped (``drop_last=True``), saying
    ``drop_last=False``: accelerate then deals out every one of them. Told ``drop_last=True``, it
    also drops the full batches that do not make a whole round of the processes, so two processes
    would validate on fewer samples than one."""

    def __init__(self, batch_sampler: Any):
        self.batches = batch_sampler
        self.sampler = batch_sampler.sampler
        self.batch_size = batch_sampler.batch_size
        self.drop_last = False

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


def whole_batches_dealt(loader: DataLoader) -> DataLoader:
    """``loader`` as it is, or, with ``drop_last=True``, a copy whose batches are :class:`AllBatches`."""
    if loader.batch_sampler is None or not getattr(loader.batch_sampler, "drop_last", False):
        return loader
    dealt = copy.copy(loader)
    # A DataLoader refuses a new batch_sampler once built; the copy is only read by accelerate's
    # prepare_data_loader, which builds its own loader from these attributes.
    object.__setattr__(dealt, "batch_sampler", AllBatches(loader.batch_sampler))
    return dealt


class DealtBatches:
    """An iterable's validation batches dealt out over the processes: each process reads the stream
    whole and keeps every k-th batch, its rank's, so every sample is validated by exactly one process
    and none is padded in. (A stream that shards itself by rank would be dealt twice: validate it on
    one process, or give it whole.)"""

    def __init__(self, loader: DataLoader, rank: int, num_processes: int):
        self.loader = loader
        self.rank = rank
        self.num_processes = num_processes
        self.total = 0  # the batches the stream held, known once it has been read

    def __iter__(self) -> Iterator[Any]:
        self.total = 0
        for index, batch in enumerate(self.loader):
            self.total = index + 1
            if index % self.num_processes == self.rank:
                yield batch

    def most_per_process(self) -> int:
        """The most batches any process got from the last pass (the first ranks' share)."""
        return -(-self.total // self.num_processes)


class SamplerEpochs:
    """A loader with a user's DistributedSampler, told the epoch so that it shuffles anew each time."""

    def __init__(self, loader: DataLoader):
        self.loader = loader
        self.epoch = 0

    def __iter__(self):
        self.loader.sampler.set_epoch(self.epoch)
        self.epoch += 1
        return iter(self.loader)

    def __len__(self) -> int:
        return len(self.loader)
