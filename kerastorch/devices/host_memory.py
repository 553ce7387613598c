"""Whether a copy in host memory fits beside training.

A file written on a thread of its own while training goes on (:mod:`.background`) is written from a
copy of the tensors that training changes in place, held until the disk has taken it. For the
training state on the CPU that copy is the optimizer's state and the best weights kept: three times
the net's size with Adam. A copy that would take more than half of the host memory free is not
made: the file is written before training goes on instead, from the tensors themselves, which
pauses training for the write but never runs the machine out of memory (the rest of the run, the
next batches and the data loader's workers, needs room too).

The free memory is the least of what the system says (psutil) and what the process's memory
cgroups let it allocate (:mod:`kerastorch.devices.cgroups`): a container's limit, a Kubernetes pod's,
a SLURM job's. A process that passes its cgroup's limit is killed, however much memory the machine
has free, and the system's own figure knows nothing of that limit.
"""

from __future__ import annotations

from typing import Any, Optional

import psutil
import torch

from .cgroups import cgroup_free_memory

# The most of the free host memory a copy for a write beside training may take.
SHARE_OF_FREE_MEMORY = 0.5


def host_tensor_bytes(obj: Any) -> int:
    """The bytes of the tensors in host memory in a nest of dicts, lists and tuples: what copying
    them takes (tensors on a GPU come to host memory whichever way the file is written)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size() if obj.device.type == "cpu" else 0
    if isinstance(obj, dict):
        return sum(host_tensor_bytes(value) for value in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(host_tensor_bytes(value) for value in obj)
    return 0


def available_host_memory() -> Optional[int]:
    """The bytes of host memory free for new allocations now: the least of the system's figure and
    the process's memory cgroups' (None where neither says)."""
    figures = [free for free in (system_free_memory(), cgroup_free_memory()) if free is not None]
    return min(figures) if figures else None


def system_free_memory() -> Optional[int]:
    """What the system says is free for new allocations (psutil's ``available``)."""
    try:
        return int(psutil.virtual_memory().available)
    except (OSError, RuntimeError, AttributeError):
        return None


def copy_too_large(nbytes: int) -> Optional[str]:
    """None when a copy of ``nbytes`` fits beside training; else why not, in words for the user."""
    free = available_host_memory()
    if free is None or nbytes <= free * SHARE_OF_FREE_MEMORY:
        return None
    return f"a copy of it ({_gb(nbytes)}) would take more than half of the free host memory ({_gb(free)})"


def _gb(nbytes: int) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6)):
        if nbytes >= size:
            return f"{nbytes / size:.1f} {unit}"
    return f"{nbytes / 1e3:.1f} kB"


__all__ = ["SHARE_OF_FREE_MEMORY", "available_host_memory", "copy_too_large", "host_tensor_bytes", "system_free_memory"]
