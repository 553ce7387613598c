"""What the process may use of the machine: the CPUs and the memory its cgroups and its CPU affinity
leave it.

A container (``docker --cpus 2 --memory 4g``), a Kubernetes pod's limits and a SLURM job
(``--cpus-per-task``, ``--mem``) each run the process inside limits that the machine's own figures
(``os.cpu_count()``, the system's free memory) know nothing of. A process that passes its memory
cgroup's limit is killed, however much memory the machine has free; one process per core of a
128-core node, in a job given 4 of them, runs 32 to a core.

The kernel shows the process's cgroups in ``/proc/self/cgroup`` (a ``0::/path`` line for cgroup v2,
one line per controller for v1) and each cgroup's files under ``/sys/fs/cgroup``. The limits of
every cgroup above the process's own apply too, so each is read, up to the top. In a container the
listed path may be the host's while the mount shows the container's own cgroup at the top: folders
that are not there are skipped, and the top is read.
"""

from __future__ import annotations

import math
import os
from typing import Iterator, Optional

# Where the kernel shows the cgroups, and which of them this process is in.
CGROUP_ROOT = "/sys/fs/cgroup"
PROC_CGROUP = "/proc/self/cgroup"
# A cgroup v1 memory limit at or above this is the kernel's "no limit" (2**63 rounded down to a page).
NO_V1_LIMIT = 1 << 62


def cgroup_free_memory(root: str = CGROUP_ROOT, proc_cgroup: str = PROC_CGROUP) -> Optional[int]:
    """The bytes this process's memory cgroups let it allocate: over its own cgroup and each above it
    that has a limit, the least of the limit less what the cgroup holds. What it holds leaves out its
    inactive file cache, which the kernel gives back before it kills (the working set, as the kubelet
    counts it). None where no cgroup limits memory, or none can be read.

    cgroup v2: ``memory.max``, ``memory.current`` and ``inactive_file``; v1: ``memory.limit_in_bytes``,
    ``memory.usage_in_bytes`` and ``total_inactive_file``."""
    frees = []
    for version, folder in _cgroup_folders("memory", root, proc_cgroup):
        if version == 2:
            limit, usage = _read_number(folder, "memory.max"), _read_number(folder, "memory.current")
            inactive_key = "inactive_file"
        else:
            limit, usage = _read_number(folder, "memory.limit_in_bytes"), _read_number(folder, "memory.usage_in_bytes")
            inactive_key = "total_inactive_file"
        if limit is None or usage is None or limit >= NO_V1_LIMIT:
            continue
        working_set = max(usage - _stat_value(folder, inactive_key), 0)
        frees.append(max(limit - working_set, 0))
    return min(frees) if frees else None


def cgroup_cpu_limit(root: str = CGROUP_ROOT, proc_cgroup: str = PROC_CGROUP) -> Optional[int]:
    """The most CPUs this process's cgroups let it keep busy, rounded up (a quota of 1.5 CPUs is 2):
    the least over its own cgroup and each above it that has a quota. None where none has one.

    cgroup v2: ``cpu.max`` (``"quota period"``, or ``"max period"``); v1: ``cpu.cfs_quota_us`` (-1 for
    none) over ``cpu.cfs_period_us``."""
    limits = []
    for version, folder in _cgroup_folders("cpu", root, proc_cgroup):
        if version == 2:
            quota, period = _read_pair(os.path.join(folder, "cpu.max"))
        else:
            quota, period = _read_number(folder, "cpu.cfs_quota_us"), _read_number(folder, "cpu.cfs_period_us")
        if quota is not None and period and quota > 0:
            limits.append(max(math.ceil(quota / period), 1))
    return min(limits) if limits else None


def usable_cpu_count() -> int:
    """The CPUs this process may run on: those its affinity allows (``taskset``, a SLURM job's cores, a
    container's ``--cpuset-cpus``), no more than its cgroups' CPU quota keeps busy (a container's
    ``--cpus``, a Kubernetes CPU limit). At least 1."""
    try:
        allowed = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity on this system (macOS, Windows)
        allowed = os.cpu_count() or 1
    quota = cgroup_cpu_limit()
    return max(min(allowed, quota) if quota is not None else allowed, 1)


def _cgroup_folders(controller: str, root: str, proc_cgroup: str) -> Iterator[tuple[int, str]]:
    """``(cgroup version, folder)`` for the process's cgroup of ``controller`` and each above it, its own first."""
    try:
        with open(proc_cgroup) as lines:
            memberships = [line.rstrip("\n").split(":", 2) for line in lines if line.count(":") >= 2]
    except OSError:
        return
    for hierarchy, controllers, path in memberships:
        if hierarchy == "0" and not controllers:
            version, top = 2, root
        elif controller in controllers.split(","):
            # v1 mounts a hierarchy under the names of its controllers ("cpu,cpuacct"), often with a link
            # under each name alone.
            version, top = 1, os.path.join(root, controller)
            if not os.path.isdir(top):
                top = os.path.join(root, controllers)
        else:
            continue
        parts = [part for part in path.split("/") if part and part != ".."]
        for n in range(len(parts), -1, -1):
            yield version, os.path.join(top, *parts[:n])


def _read_number(folder: str, name: str) -> Optional[int]:
    """The integer a cgroup file holds; None for ``max`` (no limit), or a file that is not there."""
    try:
        with open(os.path.join(folder, name)) as file:
            text = file.read().strip()
        return None if text == "max" else int(text)
    except (OSError, ValueError):
        return None


def _read_pair(path: str) -> tuple[Optional[int], Optional[int]]:
    """cgroup v2's ``cpu.max``: the quota (None for ``max``) and the period, in microseconds."""
    try:
        with open(path) as file:
            quota, period = file.read().split()
        return (None if quota == "max" else int(quota)), int(period)
    except (OSError, ValueError):
        return None, None


def _stat_value(folder: str, key: str) -> int:
    """One value of a cgroup's ``memory.stat`` (0 where it is not there)."""
    try:
        with open(os.path.join(folder, "memory.stat")) as stat:
            for line in stat:
                name, _, value = line.partition(" ")
                if name == key:
                    return int(value)
    except (OSError, ValueError):
        pass
    return 0


__all__ = ["cgroup_cpu_limit", "cgroup_free_memory", "usable_cpu_count"]
