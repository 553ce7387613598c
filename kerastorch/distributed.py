"""One rank of a k-process run: this process's share of the data, DDP, exact epoch values.

When ``fit`` runs as one of k processes (started by ``torchrun``, ``accelerate launch``
or :mod:`kerastorch.launch`):

- the training loader is sharded by accelerate (every process gets the same number of
  batches, which DDP needs; the last ones may repeat a few samples);
- the validation loader is sharded with ``even_batches=False``, so every validation
  sample is seen by exactly one process and none is repeated (a torchkeras program's
  StepRunner, which gathers at every batch, gets even shards instead);
- the net is wrapped in ``DistributedDataParallel`` (``accelerator.prepare_model``),
  which starts every process from the main process's weights and averages gradients —
  or, with ``strategy="fsdp"``, a copy of it is sharded over the processes
  (:mod:`kerastorch.fsdp`);
- epoch values are sums over all processes: the loss and plain-function metrics
  through :class:`~kerastorch.meters.EpochMeters`' ``reduce_fn``, stateful metrics
  through :func:`~kerastorch.metric_sync.compute_metric`. Nothing gathers predictions
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

from .fsdp import lockstep_validation, sharded_training
from .model_parallel import check_one_process


@contextlib.contextmanager
def process_share(model, runtime, train_data, val_data, even_validation: bool = False) -> Iterator[tuple[Any, Any]]:
    """Yield ``(train_loader, val_loader)`` for this process, with ``model.net`` in DDP meanwhile.

    In a single process both loaders and the net are yielded untouched. ``even_validation``
    shards the validation data like the training data, the same number of batches on every
    process: a torchkeras program's StepRunner gathers over the processes at every batch, so
    they must step together (its gathers drop the repeated samples again: see
    :class:`~kerastorch.torchkeras_runners.RunnerAccelerator`).
    """
    if runtime.num_processes == 1:
        yield train_data, val_data
        return
    check_one_process(model.net, runtime.num_processes)
    accelerator = runtime.accelerator
    train_loader = shard_evenly(accelerator, train_data, "train_data")
    shard_val = functools.partial(shard_evenly, name="val_data") if even_validation else shard_exactly
    val_loader = None if val_data is None else shard_val(accelerator, val_data)
    users_net = model.net
    # DDP and FSDP wrap the bare module: DataParallel inside would spread each process over every GPU.
    bare = users_net.module if isinstance(users_net, nn.DataParallel) else users_net
    try:
        if runtime.shards:
            model.net = bare
            if val_loader is not None:
                val_loader = lockstep_validation(val_loader, val_data, model, runtime)
            with sharded_training(model, runtime.precision, runtime.fsdp_wrap):
                yield train_loader, val_loader
        else:
            model.net = accelerator.prepare_model(bare, device_placement=False)
            yield train_loader, val_loader
    finally:
        model.net = users_net
        accelerator.free_memory()  # accelerate forgets the wrapped net and loaders


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
        raise ValueError(
            "val_data reads an IterableDataset, which cannot be split exactly over several processes: the shards "
            "are padded with repeated samples, so val_loss and the metrics would be off. Validate on a map-style "
            "Dataset (with __len__ and __getitem__: e.g. a TensorDataset, or arrays), or train with devices=1."
        )
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
