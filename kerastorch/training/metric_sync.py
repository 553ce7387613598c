"""Stateful metrics over several processes: ``compute`` over every process's updates.

Each process updates its own copy of a metric with its share of the batches. At
epoch end every process makes the same synced call, and all get the value over all
samples: a torchmetrics ``Metric`` gathers its states with its own reductions; any
other metric with tensor states (torchkeras's ``correct``/``total`` pattern) has them
summed over the processes for the ``compute``, then put back.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Callable, Optional

import torch
from torch import nn


def exact_sum_dtype(device: torch.device) -> torch.dtype:
    """float64 where the device has it, so that long epochs add up exactly (MPS has no float64)."""
    return torch.float32 if device.type == "mps" else torch.float64


def is_torchmetrics(metric: Any) -> bool:
    """True for a torchmetrics ``Metric``. Asked without importing torchmetrics, which imports
    matplotlib's pyplot: a metric can only be one if the user's code imported torchmetrics."""
    torchmetrics = sys.modules.get("torchmetrics")
    return torchmetrics is not None and isinstance(metric, torchmetrics.Metric)


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
    if not several_processes():
        return metric.compute()
    if reduce_fn is None:
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
    return {
        name: value
        for name, value in vars(metric).items()
        if isinstance(value, list) and all(isinstance(v, torch.Tensor) for v in value)
    }


@contextlib.contextmanager
def _states_combined(metric: Any, reduce_fn: Callable, device: Optional[torch.device]):
    tensors = state_tensors(metric)
    local_values = [t.detach().clone() for t in tensors]
    if tensors:
        where = device or tensors[0].device
        flat = torch.cat([t.detach().reshape(-1).to(where, exact_sum_dtype(where)) for t in tensors])
        summed = reduce_fn(flat)
        offset = 0
        with torch.no_grad():
            for tensor in tensors:
                tensor.copy_(
                    summed[offset : offset + tensor.numel()].view(tensor.shape).to(tensor.device, tensor.dtype)
                )
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
