"""The host memory free for a copy beside training (``kerastorch.files.host_memory``) is what the
process may allocate: inside a memory cgroup (a container's, a pod's, a SLURM job's) its limit less
what it holds, however much the machine has free."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest

from kerastorch.files import host_memory

MB = 1 << 20
V1_MEMORY = "/sys/fs/cgroup/memory"


def can_make_v1_memory_cgroups() -> bool:
    return sys.platform == "linux" and os.geteuid() == 0 and os.access(V1_MEMORY, os.W_OK)


# Run in a cgroup of its own: it moves itself there before importing torch, so that all it allocates
# from then on is charged to that cgroup; then takes 200 MB and reads again.
CHILD = """
import json, os, sys
with open(os.path.join(sys.argv[1], "cgroup.procs"), "w") as procs:
    procs.write(str(os.getpid()))
import torch
from kerastorch.files import host_memory
before = host_memory.available_host_memory()
ballast = torch.ones(200 * (1 << 20) // 4)  # 200 MB, every page touched
after = host_memory.available_host_memory()
print(json.dumps({
    "before": before,
    "after": after,
    "system": host_memory.system_free_memory(),
    "refused": host_memory.copy_too_large(int(after * 0.6)),
    "allowed": host_memory.copy_too_large(int(after * 0.4)),
}))
"""


@pytest.mark.skipif(not can_make_v1_memory_cgroups(), reason="needs root and cgroup v1's memory controller")
def test_free_memory_inside_a_memory_cgroup_is_its_limit_less_what_the_process_holds(tmp_path):
    limit = 768 * MB
    cgroup = os.path.join(V1_MEMORY, f"kerastorch-test-{uuid.uuid4().hex[:8]}")
    os.mkdir(cgroup)
    try:
        with open(os.path.join(cgroup, "memory.limit_in_bytes"), "w") as limit_file:
            limit_file.write(str(limit))
        done = subprocess.run(
            [sys.executable, "-c", CHILD, cgroup], capture_output=True, text=True, timeout=120, check=True
        )
    finally:
        os.rmdir(cgroup)  # its one process has ended
    read = json.loads(done.stdout.strip().splitlines()[-1])
    # The machine has more free than the limit: the cgroup's figure is the one taken.
    assert read["system"] > limit
    assert 0 < read["before"] < limit - 100 * MB  # torch and its libraries hold a few hundred MB of it
    # The 200 MB the process took are 200 MB less free (give or take what else it allocated meanwhile).
    assert read["before"] - read["after"] == pytest.approx(200 * MB, abs=20 * MB)
    # A copy of more than half of that is written in the loop; one of less, beside training.
    assert "more than half of the free host memory" in read["refused"]
    assert read["allowed"] is None


def write_cgroup(root, path, **files):
    folder = root.joinpath(*[part for part in path.split("/") if part])
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name.replace("_", ".", 1)).write_text(text)


def test_a_cgroup_v2_limit_is_read_for_the_process_s_cgroup_and_each_above_it(tmp_path):
    """cgroup v2 (a recent Kubernetes node, systemd, SLURM) does not run on this machine, so its files
    are laid out as the kernel shows them. The least room of any cgroup on the way up is the room."""
    proc = tmp_path / "cgroup"
    proc.write_text("0::/slurm/job_7/step_0\n")
    root = tmp_path / "fs"
    # The job: 1000 MB, holding 700 MB of which 100 MB inactive file cache: 400 MB free.
    write_cgroup(
        root,
        "/slurm/job_7",
        memory_max=str(1000 * MB),
        memory_current=str(700 * MB),
        memory_stat=f"anon {600 * MB}\ninactive_file {100 * MB}\nactive_file 0\n",
    )
    # The step: no limit of its own.
    write_cgroup(root, "/slurm/job_7/step_0", memory_max="max", memory_current=str(650 * MB))
    assert host_memory.cgroup_free_memory(str(root), str(proc)) == 400 * MB
    # The partition above it is nearly full: 100 MB free there is all there is.
    write_cgroup(root, "/slurm", memory_max=str(2048 * MB), memory_current=str(1948 * MB), memory_stat="")
    assert host_memory.cgroup_free_memory(str(root), str(proc)) == 100 * MB
    # Over its limit (the kernel reclaiming): nothing free, not a negative number.
    write_cgroup(root, "/slurm/job_7", memory_current=str(1200 * MB), memory_stat="")
    assert host_memory.cgroup_free_memory(str(root), str(proc)) == 0


def test_no_memory_cgroup_limit_leaves_the_system_s_figure(tmp_path):
    proc = tmp_path / "cgroup"
    proc.write_text("12:cpu,cpuacct:/user.slice\n4:memory:/user.slice\n0::/user.slice\n")
    root = tmp_path / "fs"
    write_cgroup(
        root, "/memory/user.slice", memory_limit_in_bytes="9223372036854771712", memory_usage_in_bytes=str(900 * MB)
    )
    write_cgroup(root, "/user.slice", memory_max="max", memory_current=str(900 * MB))
    assert host_memory.cgroup_free_memory(str(root), str(proc)) is None
    assert host_memory.cgroup_free_memory(str(root), str(tmp_path / "no-such-file")) is None


def test_in_a_container_the_cgroup_at_the_top_of_the_mount_is_read(tmp_path):
    """A container without a cgroup namespace lists the host's path in /proc/self/cgroup, while its
    mount shows its own cgroup at the top."""
    proc = tmp_path / "cgroup"
    proc.write_text("4:memory:/docker/3f2a9c\n")
    root = tmp_path / "fs"
    write_cgroup(
        root,
        "/memory",
        memory_limit_in_bytes=str(512 * MB),
        memory_usage_in_bytes=str(300 * MB),
        memory_stat=f"cache {50 * MB}\ntotal_inactive_file {40 * MB}\n",
    )
    assert host_memory.cgroup_free_memory(str(root), str(proc)) == 252 * MB
