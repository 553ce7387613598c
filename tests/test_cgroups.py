"""What the process may use of the machine (``kerastorch.devices.cgroups``): inside a cgroup (a
container's, a Kubernetes pod's, a SLURM job's), its memory limit less what it holds, and the CPUs
its quota keeps busy, however much the machine has; with a CPU affinity, the CPUs it allows. The
training state's copy beside training is sized by the first, ``devices=-1`` on the CPU by the second."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest

from kerastorch.devices import cgroups

MB = 1 << 20
V1_MEMORY = "/sys/fs/cgroup/memory"
V1_CPU = "/sys/fs/cgroup/cpu"


def can_make_v1_cgroups(hierarchy: str) -> bool:
    return sys.platform == "linux" and os.geteuid() == 0 and os.access(hierarchy, os.W_OK)


def run_in_new_cgroup(hierarchy: str, settings: dict, child: str) -> dict:
    """Run ``child`` (Python source that moves itself into the cgroup named by its argument, then prints
    one JSON line) in a new cgroup of ``hierarchy`` with ``settings`` written to its files; its JSON."""
    cgroup = os.path.join(hierarchy, f"kerastorch-test-{uuid.uuid4().hex[:8]}")
    os.mkdir(cgroup)
    try:
        for name, value in settings.items():
            with open(os.path.join(cgroup, name), "w") as setting:
                setting.write(str(value))
        done = subprocess.run(
            [sys.executable, "-c", child, cgroup], capture_output=True, text=True, timeout=120, check=True
        )
    finally:
        os.rmdir(cgroup)  # its one process has ended
    return json.loads(done.stdout.strip().splitlines()[-1])


# Run in a cgroup of its own: it moves itself there before importing torch, so that all it allocates
# from then on is charged to that cgroup; then takes 200 MB and reads again.
MEMORY_CHILD = """
import json, os, sys
with open(os.path.join(sys.argv[1], "cgroup.procs"), "w") as procs:
    procs.write(str(os.getpid()))
import torch
from kerastorch.devices import cgroups, plan
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


@pytest.mark.skipif(not can_make_v1_cgroups(V1_MEMORY), reason="needs root and cgroup v1's memory controller")
def test_free_memory_inside_a_memory_cgroup_is_its_limit_less_what_the_process_holds():
    limit = 768 * MB
    read = run_in_new_cgroup(V1_MEMORY, {"memory.limit_in_bytes": limit}, MEMORY_CHILD)
    # The machine has more free than the limit: the cgroup's figure is the one taken.
    assert read["system"] > limit
    assert 0 < read["before"] < limit - 100 * MB  # torch and its libraries hold a few hundred MB of it
    # The 200 MB the process took are 200 MB less free (give or take what else it allocated meanwhile).
    assert read["before"] - read["after"] == pytest.approx(200 * MB, abs=20 * MB)
    # A copy of more than half of that is written in the loop; one of less, beside training.
    assert "more than half of the free host memory" in read["refused"]
    assert read["allowed"] is None


# In a cgroup whose quota keeps one CPU busy, on a machine of two or more.
CPU_CHILD = """
import json, os, sys
with open(os.path.join(sys.argv[1], "cgroup.procs"), "w") as procs:
    procs.write(str(os.getpid()))
from kerastorch.devices import plan
print(json.dumps({"machine": os.cpu_count(), "usable": plan.cpu_count(), "devices": plan.choose_devices(-1, "cpu")}))
"""


@pytest.mark.skipif(not can_make_v1_cgroups(V1_CPU), reason="needs root and cgroup v1's cpu controller")
@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs a machine of two CPUs or more")
def test_devices_minus_one_on_the_cpu_is_one_process_per_cpu_the_cgroup_s_quota_keeps_busy():
    read = run_in_new_cgroup(V1_CPU, {"cpu.cfs_period_us": 100_000, "cpu.cfs_quota_us": 100_000}, CPU_CHILD)
    assert read["machine"] >= 2
    assert read["usable"] == 1
    assert read["devices"] == [0]  # one process, not one per core of the machine


@pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or (os.cpu_count() or 1) < 2, reason="needs CPU affinity, 2 CPUs"
)
def test_devices_minus_one_on_the_cpu_is_one_process_per_cpu_the_affinity_allows():
    """As ``taskset -c 0`` or a SLURM job given one core of the node runs the process."""
    child = (
        "import json, os\n"
        "os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\n"
        "from kerastorch.devices import plan\n"
        "print(json.dumps({'machine': os.cpu_count(), 'usable': plan.cpu_count(), 'devices': plan.choose_devices(-1, 'cpu')}))\n"
    )
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120, check=True)
    read = json.loads(done.stdout.strip().splitlines()[-1])
    assert read["machine"] >= 2
    assert (read["usable"], read["devices"]) == (1, [0])


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
    assert cgroups.cgroup_free_memory(str(root), str(proc)) == 400 * MB
    # The partition above it is nearly full: 100 MB free there is all there is.
    write_cgroup(root, "/slurm", memory_max=str(2048 * MB), memory_current=str(1948 * MB), memory_stat="")
    assert cgroups.cgroup_free_memory(str(root), str(proc)) == 100 * MB
    # Over its limit (the kernel reclaiming): nothing free, not a negative number.
    write_cgroup(root, "/slurm/job_7", memory_current=str(1200 * MB), memory_stat="")
    assert cgroups.cgroup_free_memory(str(root), str(proc)) == 0


def test_no_memory_cgroup_limit_leaves_the_system_s_figure(tmp_path):
    proc = tmp_path / "cgroup"
    proc.write_text("12:cpu,cpuacct:/user.slice\n4:memory:/user.slice\n0::/user.slice\n")
    root = tmp_path / "fs"
    write_cgroup(
        root, "/memory/user.slice", memory_limit_in_bytes="9223372036854771712", memory_usage_in_bytes=str(900 * MB)
    )
    write_cgroup(root, "/user.slice", memory_max="max", memory_current=str(900 * MB))
    assert cgroups.cgroup_free_memory(str(root), str(proc)) is None
    assert cgroups.cgroup_free_memory(str(root), str(tmp_path / "no-such-file")) is None


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
    assert cgroups.cgroup_free_memory(str(root), str(proc)) == 252 * MB


def test_a_cpu_quota_is_read_rounded_up_for_v2_and_for_v1_s_joined_hierarchy(tmp_path):
    proc = tmp_path / "cgroup"
    root = tmp_path / "fs"
    # cgroup v2: 1.5 CPUs for the pod keeps two busy; the node above it has no quota.
    proc.write_text("0::/kubepods/pod1/c1\n")
    write_cgroup(root, "/kubepods", cpu_max="max 100000")
    write_cgroup(root, "/kubepods/pod1", cpu_max="150000 100000")
    write_cgroup(root, "/kubepods/pod1/c1", cpu_max="max 100000")
    assert cgroups.cgroup_cpu_limit(str(root), str(proc)) == 2
    # cgroup v1, cpu and cpuacct mounted together (no link under "cpu" alone): a quota of 4 CPUs on the
    # job, -1 (none) on its step.
    proc.write_text("5:cpu,cpuacct:/slurm/job_7/step_0\n4:memory:/slurm/job_7/step_0\n")
    write_cgroup(root, "/cpu,cpuacct/slurm/job_7", cpu_cfs_quota_us="400000", cpu_cfs_period_us="100000")
    write_cgroup(root, "/cpu,cpuacct/slurm/job_7/step_0", cpu_cfs_quota_us="-1", cpu_cfs_period_us="100000")
    assert cgroups.cgroup_cpu_limit(str(root), str(proc)) == 4
    # No quota anywhere.
    proc.write_text("0::/user.slice\n")
    write_cgroup(root, "/user.slice", cpu_max="max 100000")
    assert cgroups.cgroup_cpu_limit(str(root), str(proc)) is None
