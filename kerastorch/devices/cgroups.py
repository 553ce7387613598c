"""What the process may use of the machine: the CPUs and the memory its cgroups and its CPU affinity
leave it.

A container (``docker --cpus 2 --memory 4g``), a Kubernetes pod's limits and a SLURM job
(``--cpus-per-task``, ``--mem``) each run the process inside limits that the machine's own figures
(``os.cpu_count()``, the system's free memory) know nothing of. A process that passes its memory
cgroup's limit is killed, however much memory the machine has free; one process per core of a
128-core node, in a job given 4 of them, runs 32 to a core.

The kernel shows the process's cgroups in ``/proc/self/cgroup`` (a ``0::/path`` line for cgroup v2,
one line per hierarchy of controllers for v1), where each hierarchy is mounted in
``/proc/self/mountinfo``, and each cgroup's files in its folder there. The limits of every cgroup
above the process's own apply too, so each is read, up to the top of the mount. A mount may show
only part of a hierarchy (a container's own cgroup, at the top of its mount): its root is taken off
the process's path; a path outside the mount (``/..``, a cgroup namespace entered from outside) is
read at the mount's top alone. Without a readable mountinfo, the usual mounts under ``/sys/fs/cgroup``
are assumed.
"""

from __future__ import annotations

import math
import os
from typing import Iterator, Optional

# Which cgroups this process is in, where their hierarchies are mounted, and where they usually are.
PROC_CGROUP = "/proc/self/cgroup"
MOUNTINFO = "/proc/self/mountinfo"
CGROUP_ROOT = "/sys/fs/cgroup"
# A cgroup v1 memory limit at or above this is the kernel's "no limit" (2**63 rounded down to a page).
NO_V1_LIMIT = 1 << 62


def cgroup_free_memory(proc_cgroup: str = PROC_CGROUP, mountinfo: str = MOUNTINFO) -> Optional[int]:
    """The bytes this process's memory cgroups let it allocate: over its own cgroup and each above it
    that has a limit, the least of the limit less what the cgroup holds. What it holds leaves out its
    inactive file cache, which the kernel gives back before it kills (the working set, as the kubelet
    counts it). None where no cgroup limits memory, or none can be read.

    cgroup v2: the lower of ``memory.max`` and ``memory.high`` (past which the kernel throttles the
    cgroup and reclaims from it), ``memory.current`` and ``inactive_file``; v1: the lower of
    ``memory.limit_in_bytes`` and ``hierarchical_memory_limit`` (which holds the limits of the
    cgroups above that a container does not show), ``memory.usage_in_bytes`` and ``total_inactive_file``."""
    frees = []
    for version, folder in _cgroup_folders("memory", proc_cgroup, mountinfo):
        if version == 2:
            limits = [_read_number(folder, "memory.max"), _read_number(folder, "memory.high")]
            usage, inactive_key = _read_number(folder, "memory.current"), "inactive_file"
        else:
            limits = [_read_number(folder, "memory.limit_in_bytes"), _stat_value(folder, "hierarchical_memory_limit")]
            usage, inactive_key = _read_number(folder, "memory.usage_in_bytes"), "total_inactive_file"
        limit = min((value for value in limits if value is not None and value < NO_V1_LIMIT), default=None)
        if limit is None or usage is None:
            continue
        working_set = max(usage - (_stat_value(folder, inactive_key) or 0), 0)
        frees.append(max(limit - working_set, 0))
    return min(frees) if frees else None


def cgroup_cpu_limit(proc_cgroup: str = PROC_CGROUP, mountinfo: str = MOUNTINFO) -> Optional[int]:
    """The most CPUs this process's cgroups let it keep busy, rounded up (a quota of 1.5 CPUs is 2):
    the least over its own cgroup and each above it that has a quota. None where none has one.

    cgroup v2: ``cpu.max`` (``"quota period"``, or ``"max period"``); v1: ``cpu.cfs_quota_us`` (-1 for
    none) over ``cpu.cfs_period_us``."""
    limits = []
    for version, folder in _cgroup_folders("cpu", proc_cgroup, mountinfo):
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


def _cgroup_folders(controller: str, proc_cgroup: str, mountinfo: str) -> Iterator[tuple[int, str]]:
    """``(cgroup version, folder)`` for the process's cgroup of ``controller`` and each above it up to
    the top of its mount, its own first."""
    try:
        with open(proc_cgroup) as lines:
            memberships = [line.rstrip("\n").split(":", 2) for line in lines if line.count(":") >= 2]
    except OSError:
        return
    mounts = _cgroup_mounts(mountinfo)
    for hierarchy, controllers, path in memberships:
        version = 2 if hierarchy == "0" and not controllers else 1
        if version == 1 and controller not in controllers.split(","):
            continue
        mount = _mount_of(mounts, version, controller, controllers)
        if mount is None:
            continue
        mount_root, mount_point = mount
        parts = _path_inside(path, mount_root)
        for n in range(len(parts), -1, -1):
            yield version, os.path.join(mount_point, *parts[:n])


def _path_inside(path: str, mount_root: str) -> list[str]:
    """The folders from a mount's top down to the cgroup at ``path`` in its hierarchy; none (the top
    alone) for a path outside the mount or through ``..`` (a cgroup the mount does not show)."""
    parts, root = [part for part in path.split("/") if part], [part for part in mount_root.split("/") if part]
    if ".." in parts or parts[: len(root)] != root:
        return []
    return parts[len(root) :]


def _cgroup_mounts(mountinfo: str) -> Optional[list[tuple[int, frozenset, str, str]]]:
    """``(version, controllers, root in the hierarchy, mount point)`` for each cgroup mount; None where
    ``mountinfo`` cannot be read. A line: ``id parent dev root point options [tags] - type source super-options``."""
    try:
        with open(mountinfo) as lines:
            rows = [line.split() for line in lines]
    except OSError:
        return None
    mounts = []
    for fields in rows:
        if "-" not in fields[6:]:
            continue
        after = fields[fields.index("-", 6) + 1 :]
        if not after or after[0] not in ("cgroup", "cgroup2"):
            continue
        root, point = (_unescape(field) for field in fields[3:5])
        controllers = frozenset(after[2].split(",")) if after[0] == "cgroup" and len(after) > 2 else frozenset()
        mounts.append((2 if after[0] == "cgroup2" else 1, controllers, root, point))
    return mounts


def _mount_of(mounts: Optional[list], version: int, controller: str, controllers: str) -> Optional[tuple[str, str]]:
    """``(root in the hierarchy, mount point)`` of the hierarchy holding ``controller``; without a mount
    table, the usual place under ``/sys/fs/cgroup`` (v1: the folder named after the controller, else
    after the joined controllers, as ``cpu,cpuacct``)."""
    if mounts is None:
        if version == 2:
            return "/", CGROUP_ROOT
        usual = os.path.join(CGROUP_ROOT, controller)
        return "/", usual if os.path.isdir(usual) else os.path.join(CGROUP_ROOT, controllers)
    for mount_version, mount_controllers, root, point in mounts:
        if mount_version == version and (version == 2 or controller in mount_controllers):
            return root, point
    return None


def _unescape(field: str) -> str:
    """A mountinfo path, whose spaces, tabs, newlines and backslashes are written as octal escapes."""
    for escaped, character in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(escaped, character)
    return field


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


def _stat_value(folder: str, key: str) -> Optional[int]:
    """One value of a cgroup's ``memory.stat`` (None where it is not there)."""
    try:
        with open(os.path.join(folder, "memory.stat")) as stat:
            for line in stat:
                name, _, value = line.partition(" ")
                if name == key:
                    return int(value)
    except (OSError, ValueError):
        pass
    return None


__all__ = ["cgroup_cpu_limit", "cgroup_free_memory", "usable_cpu_count"]
