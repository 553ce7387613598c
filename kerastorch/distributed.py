"""One rank of a k-process run: this process's share of the data, DDP, exact epoch values.

When ``fit`` runs as one of k processes (started by ``torchrun``, ``accelerate launch``
or :mod:`kerastorch.launch`):

- the training loader is sharded by accelerate (every process gets the same number of
  batches, which DDP needs; the last ones may repeat a few samples);
- the validation loader is sharded with ``even_batches=False``, so every validation
  sample is seen by exactly one process and none is repeated;
- the net is wrapped in ``DistributedDataParallel`` (``accelerator.prepare_model``),
  which starts every process from the main process's weights and averages gradients;
- epoch values are sums over all processes: the loss and plain-function metrics
  through :class:`~kerastorch.meters.EpochMeters`' ``reduce_fn``, stateful metrics
  through :func:`compute_metric` here. Nothing gathers predictions per step.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, Callable, Iterator, Optional

import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler


@contextlib.contextmanager
def process_share(model, runtime, train_data, val_data) -> Iterator[tuple[Any, Any]]:
    """Yield ``(train_loader, val_loader)`` for this process, with ``model.net`` in DDP meanwhile.

    In a single process both loaders and the net are yielded untouched.
    """
    if runtime.num_processes == 1:
        yield train_data, val_data
        return
    from .model_parallel import check_one_process

    check_one_process(model.net, runtime.num_processes)
    accelerator = runtime.accelerator
    train_loader = shard_for_training(accelerator, train_data)
    val_loader = None if val_data is None else shard_exactly(accelerator, val_data)
    users_net = model.net
    # DDP wraps the bare module: DataParallel inside DDP would spread each process over every GPU.
    bare = users_net.module if isinstance(users_net, nn.DataParallel) else users_net
    model.net = accelerator.prepare_model(bare, device_placement=False)
    try:
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


def shard_for_training(accelerator, loader: DataLoader):
    """Each process its share of the batches; the same number everywhere (DDP needs that)."""
    _require_dataloader(loader, "train_data")
    if isinstance(loader.sampler, DistributedSampler):  # sharded by the user (a torchrun script)
        return SamplerEpochs(loader)
    return accelerator.prepare_data_loader(loader, device_placement=False)


def shard_exactly(accelerator, loader: DataLoader):
    """Each validation sample on exactly one process: uneven shards, no repeated samples."""
    _require_dataloader(loader, "val_data")
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
        return accelerator.prepare_data_loader(loader, device_placement=False)
    finally:
        accelerator.even_batches = even_batches


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


# -- stateful metrics over several processes --------------------------------------------


def is_torchmetrics(metric: Any) -> bool:
    try:
        from torchmetrics import Metric
    except ImportError:
        return False
    return isinstance(metric, Metric)


def several_processes() -> bool:
    """True inside a process group of more than one process."""
    dist = torch.distributed
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def prepare_metric_for_processes(metric: Any) -> None:
    """A torchmetrics Metric must not hand back a cached local value when asked for the synced one."""
    if is_torchmetrics(metric) and several_processes():
        metric.compute_with_cache = False


def compute_metric(metric: Any, reduce_fn: Optional[Callable] = None, device: Optional[torch.device] = None) -> Any:
    """``metric.compute()`` over every process's updates when ``reduce_fn`` is given, else over this process's.

    Every process must make the synced call (it is a collective). A torchmetrics Metric
    gathers its states with its own reductions. Any other metric (torchkeras's pattern,
    e.g. ``correct``/``total`` tensors) has its tensor states summed over processes and
    its list-of-tensors states concatenated, for the ``compute``, then put back.
    """
    if reduce_fn is None or not several_processes():
        with _torchmetrics_sync_off(metric):
            return metric.compute()
    if is_torchmetrics(metric):
        return metric.compute()
    with _states_combined(metric, reduce_fn, device):
        return metric.compute()


@contextlib.contextmanager
def _torchmetrics_sync_off(metric: Any):
    """torchmetrics syncs inside ``compute`` whenever a process group exists; a local read must not
    (the progress bar reads on the main process alone and would wait forever)."""
    if not (is_torchmetrics(metric) and several_processes()):
        yield
        return
    previous = metric.distributed_available_fn
    metric.distributed_available_fn = lambda: False
    try:
        yield
    finally:
        metric.distributed_available_fn = previous


def state_tensors(metric: Any) -> list[torch.Tensor]:
    """A metric's tensor states: parameters, buffers and tensor attributes (each once)."""
    found: dict[int, torch.Tensor] = {}
    if isinstance(metric, nn.Module):
        for tensor in [*metric.parameters(), *metric.buffers()]:
            found.setdefault(id(tensor), tensor)
    for value in vars(metric).values():
        if isinstance(value, torch.Tensor):
            found.setdefault(id(value), value)
    return list(found.values())


def state_lists(metric: Any) -> dict[str, list]:
    """A metric's list states: attributes that are lists of tensors (e.g. stored predictions)."""
    return {name: value for name, value in vars(metric).items()
            if isinstance(value, list) and all(isinstance(v, torch.Tensor) for v in value)}


@contextlib.contextmanager
def _states_combined(metric: Any, reduce_fn: Callable, device: Optional[torch.device]):
    tensors = state_tensors(metric)
    local_values = [t.detach().clone() for t in tensors]
    if tensors:
        where = device or tensors[0].device
        sum_dtype = torch.float32 if where.type == "mps" else torch.float64
        flat = torch.cat([t.detach().reshape(-1).to(where, sum_dtype) for t in tensors])
        summed = reduce_fn(flat)
        offset = 0
        with torch.no_grad():
            for tensor in tensors:
                tensor.copy_(summed[offset:offset + tensor.numel()].view(tensor.shape).to(tensor.device, tensor.dtype))
                offset += tensor.numel()
    local_lists = state_lists(metric)
    gathered: list = [None] * torch.distributed.get_world_size()
    # One collective for all list states, whatever each process holds; once per epoch, not per step.
    torch.distributed.all_gather_object(gathered, {k: [t.detach().cpu() for t in v] for k, v in local_lists.items()})
    for name, items in local_lists.items():
        where = items[0].device if items else (device or torch.device("cpu"))
        setattr(metric, name, [t.to(where) for part in gathered for t in part.get(name, [])])
    try:
        yield
    finally:
        with torch.no_grad():
            for tensor, value in zip(tensors, local_values):
                tensor.copy_(value)
        for name, items in local_lists.items():
            setattr(metric, name, items)
