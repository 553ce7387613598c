"""Whether a copy in host memory fits beside training.

A file written on a thread of its own while training goes on (:mod:`.background`) is written from a
copy of the tensors that training changes in place, held until the disk has taken it. For the
training state on the CPU that copy is the optimizer's state and the best weights kept: three times
the net's size with Adam. A copy that would take more than half of the host memory free is not
made: the file is written before training goes on instead, from the tensors themselves, which
pauses training for the write but never runs the machine out of memory (the rest of the run, the
next batches and the data loader's workers, needs room too).

The free memory is the least of what the system says (psutil) and what the process's memory
cgroups let it allocate: a container's limit, a Kubernetes pod's, a SLURM job's. A process that
passes its cgroup's limit is killed, however much memory the machine has free, and the system's own
figure knows nothing of that limit.
"""

from __future__ import annotations

import os
from typing import Any, Optional

import psutil
import torch

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


# Where the kernel shows the cgroups, and which of them this process is in.
CGROUP_ROOT = "/sys/fs/cgroup"
PROC_CGROUP = "/proc/self/cgroup"
# A cgroup v1 limit at or above this is the kernel's "no limit" (2**63 rounded down to a page).
NO_V1_LIMIT = 1 << 62


def available_host_memory() -> Optional[int]:
    """The bytes of host memory free for new allocations now: the least of the system's figure and
    the process's cgroups' (None where neither says)."""
    figures = [free for free in (system_free_memory(), cgroup_free_memory()) if free is not None]
    return min(figures) if figures else None


def system_free_memory() -> Optional[int]:
    """What the system says is free for new allocations (psutil's ``available``)."""
    try:
        return int(psutil.virtual_memory().available)
    except (OSError, RuntimeError, AttributeError):
        return None


def cgroup_free_memory(root: str = CGROUP_ROOT, proc_cgroup: str = PROC_CGROUP) -> Optional[int]:
    """The bytes this process's memory cgroups let it allocate: over its own cgroup and each above it
    that has a limit, the least of the limit less what the cgroup holds. What it holds leaves out its
    inactive file cache, which the kernel gives back before it kills (the working set, as the kubelet
    counts it). None where no cgroup limits memory, or none can be read.

    cgroup v2 (the ``0::/path`` line): ``memory.max``, ``memory.current``, ``inactive_file``; v1 (the
    line that names the ``memory`` controller): ``memory.limit_in_bytes``, ``memory.usage_in_bytes``,
    ``total_inactive_file``. In a container the process's path may be the host's while the mount shows
    the container's own cgroup at the top: folders that are not there are skipped, the top is read."""
    try:
        with open(proc_cgroup) as lines:
            memberships = [line.rstrip("\n").split(":", 2) for line in lines if line.count(":") >= 2]
    except OSError:
        return None
    frees = []
    for hierarchy, controllers, path in memberships:
        if hierarchy == "0" and not controllers:
            top, files = root, ("memory.max", "memory.current", "inactive_file")
        elif "memory" in controllers.split(","):
            top, files = (
                os.path.join(root, "memory"),
                ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"),
            )
        else:
            continue
        for folder in _this_and_above(top, path):
            free = _cgroup_free(folder, *files)
            if free is not None:
                frees.append(free)
    return min(frees) if frees else None


def _this_and_above(top: str, path: str) -> list[str]:
    """``top/a/b/c``, ``top/a/b``, ``top/a``, ``top`` for the path ``/a/b/c``."""
    parts = [part for part in path.split("/") if part and part != ".."]
    return [os.path.join(top, *parts[:n]) for n in range(len(parts), -1, -1)]


def _cgroup_free(folder: str, limit_file: str, usage_file: str, inactive_key: str) -> Optional[int]:
    """One cgroup's limit less its working set; None where it has no limit, or no such files."""
    limit, usage = _read_number(os.path.join(folder, limit_file)), _read_number(os.path.join(folder, usage_file))
    if limit is None or usage is None or limit >= NO_V1_LIMIT:
        return None
    inactive = 0
    try:
        with open(os.path.join(folder, "memory.stat")) as stat:
            for line in stat:
                key, _, value = line.partition(" ")
                if key == inactive_key:
                    inactive = int(value)
                    break
    except (OSError, ValueError):
        pass
    return max(limit - max(usage - inactive, 0), 0)


def _read_number(path: str) -> Optional[int]:
    """The integer a cgroup file holds; None for ``max`` (no limit), or a file that is not there."""
    try:
        with open(path) as file:
            text = file.read().strip()
        return None if text == "max" else int(text)
    except (OSError, ValueError):
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


__all__ = [
    "SHARE_OF_FREE_MEMORY",
    "available_host_memory",
    "cgroup_free_memory",
    "copy_too_large",
    "host_tensor_bytes",
    "system_free_memory",
]
