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


def cpus_allowed() -> int:
    """The CPUs this process's affinity allows (1 where the system has no affinity)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1


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
from kerastorch.devices import host_memory
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
@pytest.mark.skipif(cpus_allowed() < 2, reason="needs two CPUs this process may run on")
def test_devices_minus_one_on_the_cpu_is_one_process_per_cpu_the_cgroup_s_quota_keeps_busy():
    read = run_in_new_cgroup(V1_CPU, {"cpu.cfs_period_us": 100_000, "cpu.cfs_quota_us": 100_000}, CPU_CHILD)
    assert read["machine"] >= 2
    assert read["usable"] == 1
    assert read["devices"] == [0]  # one process, not one per core of the machine


@pytest.mark.skipif(cpus_allowed() < 2, reason="needs two CPUs this process may run on")
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


def write_cgroup(folder, **files):
    """A cgroup's folder with ``files`` (``memory_max="..."`` is the file ``memory.max``)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name.replace("_", ".", 1)).write_text(text)


def fake_proc(tmp_path, cgroup: str, *mounts: tuple[str, str, str]) -> tuple[str, str]:
    """A ``/proc/self/cgroup`` holding ``cgroup`` and a ``/proc/self/mountinfo`` holding ``mounts``, each
    ``(type and super-options, root in the hierarchy, mount point)``: the two files' paths."""
    proc = tmp_path / "proc"
    proc.mkdir(exist_ok=True)
    (proc / "cgroup").write_text(cgroup)
    lines = [
        f"{30 + i} 23 0:{40 + i} {root} {point} rw,relatime shared:{i} - {kind}\n"
        for i, (kind, root, point) in enumerate(mounts)
    ]
    (proc / "mountinfo").write_text("22 1 8:1 / / rw,relatime - ext4 /dev/vda rw\n" + "".join(lines))
    return str(proc / "cgroup"), str(proc / "mountinfo")


def test_a_cgroup_v2_limit_is_read_for_the_process_s_cgroup_and_each_above_it(tmp_path):
    """cgroup v2 (a recent Kubernetes node, systemd, SLURM) does not run on this machine, so its files
    are laid out as the kernel shows them. The least room of any cgroup on the way up is the room."""
    fs = tmp_path / "cgroup2"
    files = fake_proc(tmp_path, "0::/slurm/job_7/step_0\n", ("cgroup2 cgroup2 rw", "/", str(fs)))
    # The job: 1000 MB, holding 700 MB of which 100 MB inactive file cache: 400 MB free.
    write_cgroup(fs / "slurm/job_7", memory_max=str(1000 * MB), memory_current=str(700 * MB),
                 memory_stat=f"anon {600 * MB}\ninactive_file {100 * MB}\nactive_file 0\n")  # fmt: skip
    # The step: no limit of its own.
    write_cgroup(fs / "slurm/job_7/step_0", memory_max="max", memory_high="max", memory_current=str(650 * MB))
    assert cgroups.cgroup_free_memory(*files) == 400 * MB
    # memory.high, past which the kernel throttles the job, is lower: 300 MB free up to it.
    write_cgroup(fs / "slurm/job_7", memory_high=str(900 * MB))
    assert cgroups.cgroup_free_memory(*files) == 300 * MB
    # The partition above it is nearly full: 100 MB free there is all there is.
    write_cgroup(fs / "slurm", memory_max=str(2048 * MB), memory_current=str(1948 * MB), memory_stat="")
    assert cgroups.cgroup_free_memory(*files) == 100 * MB
    # Over its limit (the kernel reclaiming): nothing free, not a negative number.
    write_cgroup(fs / "slurm/job_7", memory_current=str(1200 * MB), memory_stat="")
    assert cgroups.cgroup_free_memory(*files) == 0


def test_no_memory_cgroup_limit_reads_as_none(tmp_path):
    """A hybrid system: v1 controllers, and a v2 hierarchy without the memory controller."""
    v1, v2 = tmp_path / "memory", tmp_path / "unified"
    files = fake_proc(
        tmp_path,
        "12:cpu,cpuacct:/user.slice\n4:memory:/user.slice\n0::/user.slice\n",
        ("cgroup cgroup rw,memory", "/", str(v1)),
        ("cgroup2 cgroup2 rw", "/", str(v2)),
    )
    unlimited = "9223372036854771712"
    write_cgroup(v1 / "user.slice", memory_limit_in_bytes=unlimited, memory_usage_in_bytes=str(900 * MB),
                 memory_stat=f"hierarchical_memory_limit {unlimited}\ntotal_inactive_file 0\n")  # fmt: skip
    write_cgroup(v2 / "user.slice", cgroup_procs="")
    assert cgroups.cgroup_free_memory(*files) is None
    assert cgroups.cgroup_free_memory(str(tmp_path / "no-such-file"), files[1]) is None


def test_in_a_v1_container_its_own_cgroup_at_the_top_of_the_mount_is_read_and_the_limits_above_it(tmp_path):
    """A container without a cgroup namespace lists the host's path in /proc/self/cgroup, while its
    mount shows its own cgroup at the top (the mount's root is that path). The limits of the cgroups
    above it, which it does not show, are in its hierarchical_memory_limit."""
    fs = tmp_path / "memory"
    files = fake_proc(tmp_path, "4:memory:/docker/3f2a9c\n", ("cgroup cgroup rw,memory", "/docker/3f2a9c", str(fs)))
    write_cgroup(fs, memory_limit_in_bytes=str(512 * MB), memory_usage_in_bytes=str(300 * MB),
                 memory_stat=f"cache {50 * MB}\ntotal_inactive_file {40 * MB}\nhierarchical_memory_limit {512 * MB}\n")  # fmt: skip
    assert cgroups.cgroup_free_memory(*files) == 252 * MB
    # The container has no limit of its own; the pod's, above it, is 400 MB.
    write_cgroup(fs, memory_limit_in_bytes="9223372036854771712",
                 memory_stat=f"total_inactive_file {40 * MB}\nhierarchical_memory_limit {400 * MB}\n")  # fmt: skip
    assert cgroups.cgroup_free_memory(*files) == 140 * MB
    # A job cgroup made inside the container, of 100 MB holding 60: its 40 MB are the room.
    files = fake_proc(tmp_path, "4:memory:/docker/3f2a9c/job\n", ("cgroup cgroup rw,memory", "/docker/3f2a9c", str(fs)))
    write_cgroup(fs / "job", memory_limit_in_bytes=str(100 * MB), memory_usage_in_bytes=str(60 * MB))
    assert cgroups.cgroup_free_memory(*files) == 40 * MB


def test_a_path_outside_the_mount_is_read_at_the_mount_s_top_only(tmp_path):
    """A cgroup namespace entered from outside shows the process's cgroup as /../other: not a cgroup the
    mount shows, so none below its top is taken for it."""
    fs = tmp_path / "cgroup2"
    files = fake_proc(tmp_path, "0::/../other\n", ("cgroup2 cgroup2 rw", "/", str(fs)))
    write_cgroup(fs, memory_max=str(1000 * MB), memory_current=str(100 * MB))
    write_cgroup(fs / "other", memory_max=str(10 * MB), memory_current=str(0))
    assert cgroups.cgroup_free_memory(*files) == 900 * MB


def test_without_a_mount_table_the_usual_mounts_are_read(tmp_path, monkeypatch):
    monkeypatch.setattr(cgroups, "CGROUP_ROOT", str(tmp_path / "fs"))
    proc = tmp_path / "cgroup"
    proc.write_text("4:memory:/job\n")
    write_cgroup(tmp_path / "fs/memory/job", memory_limit_in_bytes=str(100 * MB), memory_usage_in_bytes=str(30 * MB))
    assert cgroups.cgroup_free_memory(str(proc), str(tmp_path / "no-mountinfo")) == 70 * MB


def test_a_cpu_quota_is_read_rounded_up_for_v2_and_for_v1_s_joined_hierarchy(tmp_path):
    # cgroup v2: 1.5 CPUs for the pod keeps two busy; the node above it has no quota.
    fs = tmp_path / "cgroup2"
    files = fake_proc(tmp_path, "0::/kubepods/pod1/c1\n", ("cgroup2 cgroup2 rw", "/", str(fs)))
    write_cgroup(fs / "kubepods", cpu_max="max 100000")
    write_cgroup(fs / "kubepods/pod1", cpu_max="150000 100000")
    write_cgroup(fs / "kubepods/pod1/c1", cpu_max="max 100000")
    assert cgroups.cgroup_cpu_limit(*files) == 2
    # cgroup v1, cpu and cpuacct mounted together: a quota of 4 CPUs on the job, -1 (none) on its step.
    v1 = tmp_path / "cpu,cpuacct"
    files = fake_proc(
        tmp_path,
        "5:cpu,cpuacct:/slurm/job_7/step_0\n4:memory:/slurm/job_7/step_0\n",
        ("cgroup cgroup rw,cpu,cpuacct", "/", str(v1)),
    )
    write_cgroup(v1 / "slurm/job_7", cpu_cfs_quota_us="400000", cpu_cfs_period_us="100000")
    write_cgroup(v1 / "slurm/job_7/step_0", cpu_cfs_quota_us="-1", cpu_cfs_period_us="100000")
    assert cgroups.cgroup_cpu_limit(*files) == 4
    # No quota anywhere.
    files = fake_proc(tmp_path, "0::/user.slice\n", ("cgroup2 cgroup2 rw", "/", str(fs)))
    write_cgroup(fs / "user.slice", cpu_max="max 100000")
    assert cgroups.cgroup_cpu_limit(*files) is None
