"""Who started this process: the cluster environment, read from environment variables only.

``fit`` runs as one rank of a job when a launcher started several copies of the script.
Each launcher says so in its own words; :func:`cluster_environment` reads them and returns
one :class:`ClusterEnvironment` (the launcher's name, this process's rank, the job's size,
where the processes meet). It reads only the mapping it is given (``os.environ`` by
default): it never touches ``torch.distributed`` or the network, so it is cheap, and the
same answer comes back every time.

The launchers, in the order they are recognised (the first that matches wins):

- ``"ray"``: a Ray Train worker: ``RAY_RAYLET_PID`` (every process Ray starts has it)
  with ``WORLD_SIZE``. Ray also sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
  ``MASTER_ADDR`` and ``MASTER_PORT``, as torchrun does, so it is looked for first; its
  process group already exists.
- ``"torchrun"``: ``TORCHELASTIC_RUN_ID``: torchrun, ``accelerate launch``, and the
  workers that ``fit(devices=k)`` starts. ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
  ``LOCAL_WORLD_SIZE``, ``GROUP_RANK`` (the node), ``GROUP_WORLD_SIZE`` (the nodes).
- ``"mpi"``: Open MPI's ``OMPI_COMM_WORLD_RANK`` / ``_SIZE`` / ``_LOCAL_RANK`` /
  ``_LOCAL_SIZE``; MPICH's, Intel MPI's and Cray's ``PMI_RANK``, ``PMI_SIZE`` with
  ``MPI_LOCALRANKID`` / ``MPI_LOCALNRANKS`` or ``PMI_LOCAL_RANK`` / ``PMI_LOCAL_SIZE``;
  MVAPICH's ``MV2_COMM_WORLD_*``.
- ``"slurm"``: a task that ``srun`` started: ``SLURM_PROCID`` with ``SLURM_STEP_ID`` or
  ``SLURM_STEP_NUM_TASKS``. ``SLURM_PROCID``, ``SLURM_STEP_NUM_TASKS`` (else
  ``SLURM_NTASKS``), ``SLURM_LOCALID``, ``SLURM_NODEID``, ``SLURM_STEP_TASKS_PER_NODE``.
- ``"kubeflow"``: a pod of a Kubeflow ``PyTorchJob`` (``PET_NNODES`` or
  ``KUBERNETES_SERVICE_HOST``) with ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
  ``MASTER_PORT`` and none of torchrun's variables: one process per pod.
- ``"env"``: ``RANK`` and ``WORLD_SIZE`` set by anything else (PyTorch's ``env://``
  convention, with ``MASTER_ADDR``, ``MASTER_PORT``, optionally ``LOCAL_RANK``).
- ``"local"``: none of the above: this process runs alone (``fit(devices=k)`` may still
  start its own workers).

Rules worth knowing:

- **SLURM.** Only a task that ``srun`` started is a rank. The batch script of ``sbatch``
  (and an ``salloc`` shell) runs once, whatever ``--ntasks`` says: it is ``"local"``, and
  when the job has several tasks, :attr:`ClusterEnvironment.warning` says that ``srun`` is
  missing. Slurm marks its batch, interactive and extern steps with special step ids
  (``SLURM_STEP_ID`` of -5, -6, -4, or 4294967291, 4294967290, 4294967292), which are not
  ranks either. ``MASTER_ADDR`` is the environment's, else the first host of the step's
  node list (``SLURM_STEP_NODELIST``, else ``SLURM_JOB_NODELIST``, else ``SLURM_NODELIST``),
  expanded from Slurm's compressed form by :func:`expand_slurm_nodelist`. ``MASTER_PORT``
  is the environment's, else the first port Slurm reserved for the step
  (``SLURM_STEP_RESV_PORTS``, with ``srun --resv-ports``), else
  ``20000 + (SLURM_JOB_ID % 1250) * 8 + SLURM_STEP_ID % 8`` -- the same number on every
  task of a step, a different one for each of up to 8 steps of a job running at once,
  and below Linux's ephemeral ports (32768 and up).
- **MPI inside SLURM.** ``mpirun`` in a SLURM job starts its ranks through daemons that
  ``srun`` launched, so each rank also carries the daemon's ``SLURM_PROCID``: MPI's
  variables win. When ``srun`` starts the ranks itself (``srun --mpi=pmi2``), both agree,
  and the job is ``"slurm"``.
- **MPI's meeting point.** ``MASTER_ADDR`` must be exported to every rank (``mpirun -x``,
  ``mpiexec -genv``) unless all ranks run on this one machine (then ``127.0.0.1``).
- **Ports.** Where nothing says which port, it is ``29500`` (torchrun's default).

A job whose variables are missing or contradict each other (a world size of 8 but no
rank, a rank of 8 in a job of 8) raises :class:`ClusterEnvironmentError`, which says what
was seen, what was expected and what to set: never a silent run of one process.

>>> env = cluster_environment({"SLURM_JOB_ID": "1234", "SLURM_STEP_ID": "0", "SLURM_PROCID": "5",
...     "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NODEID": "1", "SLURM_NODELIST": "gpu[07-08]",
...     "SLURM_STEP_TASKS_PER_NODE": "4(x2)"})
>>> env.describe()
'SLURM job 1234, rank 5 of 8 (local 1) on 2 nodes'
>>> env.master_addr, env.master_port, env.local_world_size
('gpu07', 29872, 4)
>>> cluster_environment({}).describe()
'one process'
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from typing import Optional

NAMES = ("local", "torchrun", "slurm", "mpi", "kubeflow", "ray", "env")
DEFAULT_PORT = 29500  # torchrun's, when nothing says which port
SLURM_MAX_NORMAL_STEP_ID = 0xFFFFFFF0  # Slurm's special steps (batch, interactive, extern) have ids above it
SLURM_MAX_NODES = 65536  # Slurm's own limit (MAX_SLURM_NODES): a longer list is a typo


class ClusterEnvironmentError(RuntimeError):
    """The launcher's variables are missing or contradict each other."""


@dataclasses.dataclass(frozen=True)
class ClusterEnvironment:
    """Who started this process and where it sits in the job: see :func:`cluster_environment`.

    ``local_world_size`` (processes on this machine), ``node_rank`` and ``num_nodes`` are
    None where the launcher does not say. ``hosts`` is the job's node list, expanded
    (SLURM only). ``warning`` is set when the process runs alone although the launcher
    allocated more (a SLURM batch script with several tasks, not started by ``srun``).
    """

    name: str
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: Optional[int] = 1
    node_rank: Optional[int] = 0
    num_nodes: Optional[int] = 1
    master_addr: str = "127.0.0.1"
    master_port: int = DEFAULT_PORT
    launcher: str = "no launcher"
    job_id: Optional[str] = None
    hosts: tuple[str, ...] = ()
    warning: Optional[str] = None

    @property
    def is_job(self) -> bool:
        """True when this process is one rank of a job of several processes."""
        return self.world_size > 1

    def describe(self) -> str:
        """The short text ``fit``'s first line prints: the launcher and the rank layout."""
        if self.name == "local":
            return f"one process in SLURM job {self.job_id}" if self.job_id else "one process"
        who = f"SLURM job {self.job_id}" if self.name == "slurm" and self.job_id else self.launcher
        text = f"{who}, rank {self.rank} of {self.world_size} (local {self.local_rank})"
        if self.num_nodes is not None:
            text += f" on {self.num_nodes} node" + ("s" if self.num_nodes != 1 else "")
        return text

    def torch_env(self) -> dict[str, str]:
        """The variables ``torch.distributed``'s ``env://`` and accelerate read, with this job's values.

        Export them before accelerate builds its state, and a job that SLURM or MPI started
        forms its process group as one that torchrun started. Empty for ``"local"``.
        """
        if self.name == "local":
            return {}
        env = {
            "RANK": str(self.rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(self.local_rank),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
        }
        if self.local_world_size is not None:
            env["LOCAL_WORLD_SIZE"] = str(self.local_world_size)
        return env


ONE_PROCESS = ClusterEnvironment(name="local")  # no launcher: this process runs alone


def cluster_environment(environ: Optional[Mapping[str, str]] = None) -> ClusterEnvironment:
    """Read which launcher started this process, and its rank layout, from ``environ``.

    ``environ`` defaults to ``os.environ``; nothing else is read. The module docstring
    lists the launchers, the order they are recognised in, and the rules for SLURM's
    node list and port. Raises :class:`ClusterEnvironmentError` when the variables are
    missing or contradict each other.

    >>> env = cluster_environment({"TORCHELASTIC_RUN_ID": "x", "RANK": "1", "WORLD_SIZE": "2",
    ...     "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "localhost", "MASTER_PORT": "29400"})
    >>> env.name, env.rank, env.world_size, env.is_job
    ('torchrun', 1, 2, True)
    >>> cluster_environment({"WORLD_SIZE": "4"})
    Traceback (most recent call last):
    ...
    kerastorch.devices.environment.ClusterEnvironmentError: WORLD_SIZE=4 declares a job of 4 processes, but RANK is not set, so this process does not know which one it is. A launcher sets both (torchrun, accelerate launch, a Kubeflow PyTorchJob); if you set WORLD_SIZE yourself, set RANK (0 to 3) too, or unset WORLD_SIZE to train in one process.
    """
    env = _Reader(os.environ if environ is None else environ)
    for detect in (_ray, _torchrun, _mpi, _srun_task, _kubeflow_or_env):
        found = detect(env)
        if found is not None:
            return _checked(found, env)
    return _local(env)


class _Reader:
    """The environment, with integer parsing that names the variable when a value is not a number."""

    def __init__(self, environ: Mapping[str, str]):
        self.environ = environ

    def __contains__(self, name: str) -> bool:
        return name in self.environ

    def get(self, name: str) -> Optional[str]:
        value = self.environ.get(name)
        return None if value is None or value.strip() == "" else value.strip()

    def first(self, *names: str) -> Optional[str]:
        """The name of the first of ``names`` that is set."""
        return next((name for name in names if self.get(name) is not None), None)

    def integer(self, name: str, default: Optional[int] = None) -> Optional[int]:
        value = self.get(name)
        if value is None:
            return default
        try:
            return int(value)
        except ValueError:
            raise ClusterEnvironmentError(
                f"{name}={value!r} is not a whole number. {name} is read to place this process in its job; "
                f"unset it or give it a whole number."
            ) from None

    def required_int(self, name: str, launcher: str, fix: str) -> int:
        value = self.integer(name)
        if value is None:
            raise ClusterEnvironmentError(f"{launcher} started this process, but {name} is not set. {fix}")
        return value


def _checked(found: ClusterEnvironment, env: _Reader) -> ClusterEnvironment:
    """Refuse a layout that cannot be right: every rank would wait for ones that never come."""
    if found.world_size < 1:
        raise ClusterEnvironmentError(
            f"{found.launcher} says the job has {found.world_size} processes; a job has at least one. "
            "Check the launcher's variables (WORLD_SIZE, SLURM_NTASKS, OMPI_COMM_WORLD_SIZE, PMI_SIZE)."
        )
    if not 0 <= found.rank < found.world_size:
        raise ClusterEnvironmentError(
            f"{found.launcher} says this process has rank {found.rank} in a job of {found.world_size} processes; "
            f"ranks run from 0 to {found.world_size - 1}. The rank and the world size come from different "
            "launchers or a stale variable: unset the variables you exported by hand, or start the script with "
            "the launcher alone."
        )
    if found.local_world_size is not None and not 0 <= found.local_rank < found.local_world_size:
        raise ClusterEnvironmentError(
            f"{found.launcher} says this process has local rank {found.local_rank} of {found.local_world_size} "
            f"processes on this machine; local ranks run from 0 to {found.local_world_size - 1}. Unset the "
            "variables you exported by hand, or start the script with the launcher alone."
        )
    if found.name in ("slurm", "mpi"):
        # Variables exported by hand (or left over) that torch and accelerate would read instead.
        for name, value in (("RANK", found.rank), ("WORLD_SIZE", found.world_size), ("LOCAL_RANK", found.local_rank)):
            seen = env.integer(name)
            if seen is not None and seen != value:
                raise ClusterEnvironmentError(
                    f"{found.launcher} started this process as rank {found.rank} of {found.world_size} (local "
                    f"{found.local_rank}), but {name}={seen} is also set, and torch would read that instead. Do not "
                    f"export {name} yourself (it is set for you from {found.launcher}'s variables), or give each "
                    "process its own value."
                )
    if not 0 < found.master_port < 65536:
        raise ClusterEnvironmentError(
            f"MASTER_PORT={found.master_port} is not a TCP port; set MASTER_PORT to a free port from 1024 to 65535."
        )
    return found


def _port(env: _Reader) -> int:
    port = env.integer("MASTER_PORT")
    return DEFAULT_PORT if port is None else port


def _ray(env: _Reader) -> Optional[ClusterEnvironment]:
    # Every process Ray starts has RAY_RAYLET_PID; a Ray Train worker also has the torchrun-style
    # variables (and a process group already made). A torchrun started from a Ray task is torchrun's.
    if "RAY_RAYLET_PID" not in env or env.get("WORLD_SIZE") is None or "TORCHELASTIC_RUN_ID" in env:
        return None
    fix = "Ray Train sets it for each worker of a TorchTrainer; call fit inside train_loop_per_worker."
    return ClusterEnvironment(
        name="ray",
        launcher="Ray Train",
        rank=env.required_int("RANK", "Ray Train", fix),
        world_size=env.required_int("WORLD_SIZE", "Ray Train", fix),
        local_rank=env.integer("LOCAL_RANK", 0) or 0,
        local_world_size=env.integer("LOCAL_WORLD_SIZE"),
        node_rank=env.integer("NODE_RANK"),
        num_nodes=None,
        master_addr=env.get("MASTER_ADDR") or "127.0.0.1",
        master_port=_port(env),
    )


def _torchrun(env: _Reader) -> Optional[ClusterEnvironment]:
    if "TORCHELASTIC_RUN_ID" not in env:
        return None
    fix = "torchrun sets it for each process it starts; start the script with torchrun or accelerate launch."
    return ClusterEnvironment(
        name="torchrun",
        launcher="torchrun",
        rank=env.required_int("RANK", "torchrun", fix),
        world_size=env.required_int("WORLD_SIZE", "torchrun", fix),
        local_rank=env.required_int("LOCAL_RANK", "torchrun", fix),
        local_world_size=env.integer("LOCAL_WORLD_SIZE"),
        node_rank=env.integer("GROUP_RANK"),
        num_nodes=env.integer("GROUP_WORLD_SIZE"),
        master_addr=env.get("MASTER_ADDR") or "127.0.0.1",
        master_port=_port(env),
    )


# Each MPI's variables: (launcher, size, rank, local ranks, local sizes).
_MPI_FLAVOURS = (
    (
        "Open MPI",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_RANK",
        ("OMPI_COMM_WORLD_LOCAL_RANK",),
        ("OMPI_COMM_WORLD_LOCAL_SIZE",),
    ),
    (
        "MPICH / Intel MPI",
        "PMI_SIZE",
        "PMI_RANK",
        ("MPI_LOCALRANKID", "PMI_LOCAL_RANK"),
        ("MPI_LOCALNRANKS", "PMI_LOCAL_SIZE"),
    ),
    (
        "MVAPICH",
        "MV2_COMM_WORLD_SIZE",
        "MV2_COMM_WORLD_RANK",
        ("MV2_COMM_WORLD_LOCAL_RANK",),
        ("MV2_COMM_WORLD_LOCAL_SIZE",),
    ),
)


def _mpi(env: _Reader) -> Optional[ClusterEnvironment]:
    flavour = next((f for f in _MPI_FLAVOURS if env.get(f[1]) is not None), None)
    if flavour is None:
        return None
    launcher, size_name, rank_name, local_rank_names, local_size_names = flavour
    world_size = env.integer(size_name) or 0
    fix = f"mpirun / mpiexec sets {rank_name} with {size_name}; start the script with it (or unset {size_name})."
    rank = env.required_int(rank_name, launcher, fix)
    try:
        srun = _srun_task(env)
    except ClusterEnvironmentError:  # the srun daemons' variables of mpirun in a SLURM job: not ours
        srun = None
    if srun is not None and (srun.rank, srun.world_size) == (rank, world_size):
        return None  # srun started the ranks itself (srun --mpi=pmi2): a SLURM job
    local_rank_name = env.first(*local_rank_names, "LOCAL_RANK")
    if local_rank_name is None and world_size > 1:
        raise ClusterEnvironmentError(
            f"{launcher} started this process as rank {rank} of {world_size} ({rank_name}, {size_name}), but no "
            f"variable says its rank on this machine ({' or '.join(local_rank_names)}); each process needs it to "
            "pick its own GPU. Your MPI does not set it: export LOCAL_RANK to each process."
        )
    local_size_name = env.first(*local_size_names, "LOCAL_WORLD_SIZE")
    local_world_size = env.integer(local_size_name) if local_size_name else None
    master_addr = env.get("MASTER_ADDR")
    if master_addr is None:
        if world_size > 1 and local_world_size != world_size:
            raise ClusterEnvironmentError(
                f"{launcher} started this process as rank {rank} of {world_size}, but MASTER_ADDR is not set, and "
                "the processes do not all run on this machine, so they cannot know where to meet. Export the "
                "address of the machine that runs rank 0 to every process: `mpirun -x MASTER_ADDR=host0 "
                "-x MASTER_PORT=29500 ...` (Open MPI) or `mpiexec -genv MASTER_ADDR host0 -genv MASTER_PORT 29500 "
                "...` (MPICH, Intel MPI)."
            )
        master_addr = "127.0.0.1"  # every rank runs here
    return ClusterEnvironment(
        name="mpi",
        launcher=launcher,
        rank=rank,
        world_size=world_size,
        local_rank=(env.integer(local_rank_name) or 0) if local_rank_name else 0,
        local_world_size=local_world_size,
        node_rank=None,
        num_nodes=1 if local_world_size == world_size else None,
        master_addr=master_addr,
        master_port=_port(env),
    )


def _srun_task(env: _Reader) -> Optional[ClusterEnvironment]:
    """This process as a task of an ``srun`` step, or None (no SLURM, or a batch / salloc shell)."""
    if env.get("SLURM_PROCID") is None:
        return None  # an salloc shell, or not SLURM at all
    step_id = env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID")
    if step_id is None and env.get("SLURM_STEP_NUM_TASKS") is None:
        return None  # the batch script of an older Slurm, which sets neither
    if step_id is not None and not (step_id.isdigit() and int(step_id) < SLURM_MAX_NORMAL_STEP_ID):
        return None  # the batch script, the interactive step of salloc, the extern step
    size_name = "SLURM_STEP_NUM_TASKS" if env.get("SLURM_STEP_NUM_TASKS") is not None else "SLURM_NTASKS"
    fix = "srun sets it for each task; start the script with srun."
    world_size = env.required_int(size_name, "srun", fix)
    rank = env.required_int("SLURM_PROCID", "srun", fix)
    local_rank = env.integer("SLURM_LOCALID")
    if local_rank is None:
        if world_size > 1:
            raise ClusterEnvironmentError(
                f"srun started this process as task {rank} of {world_size}, but SLURM_LOCALID (its rank on this "
                "machine, which picks its GPU) is not set. srun sets it for each task: start the script with srun."
            )
        local_rank = 0
    node_rank = env.integer("SLURM_NODEID")
    nodelist_name = env.first("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
    hosts: tuple[str, ...] = ()
    if nodelist_name is not None:
        try:
            hosts = tuple(expand_slurm_nodelist(env.get(nodelist_name) or ""))
        except ValueError as error:
            raise ClusterEnvironmentError(
                f"{nodelist_name}={env.get(nodelist_name)!r} is not a Slurm node list: {error}. Set MASTER_ADDR to "
                "the host of the task with rank 0 to skip reading it."
            ) from None
    master_addr = env.get("MASTER_ADDR")
    if master_addr is None:
        if not hosts and world_size > 1:
            raise ClusterEnvironmentError(
                f"srun started this process as task {rank} of {world_size}, but neither MASTER_ADDR nor a node list "
                "(SLURM_STEP_NODELIST, SLURM_JOB_NODELIST, SLURM_NODELIST) says where the tasks meet. Export "
                "MASTER_ADDR (the host of task 0) before srun."
            )
        master_addr = hosts[0] if hosts else "127.0.0.1"
    tasks_per_node = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    num_nodes = env.integer("SLURM_STEP_NUM_NODES") or (len(hosts) if hosts else None)
    local_world_size = _tasks_on_node(tasks_per_node, node_rank)
    if local_world_size is None and num_nodes == 1:
        local_world_size = world_size  # one node: every task is here
    return ClusterEnvironment(
        name="slurm",
        launcher="SLURM srun",
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        local_world_size=local_world_size,
        node_rank=node_rank,
        num_nodes=num_nodes,
        master_addr=master_addr,
        master_port=_slurm_port(env),
        job_id=env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID"),
        hosts=hosts,
    )


def _slurm_port(env: _Reader) -> int:
    """MASTER_PORT, else the step's first reserved port, else one derived from the job and step ids."""
    port = env.integer("MASTER_PORT")
    if port is not None:
        return port
    reserved = re.match(r"\d+", env.get("SLURM_STEP_RESV_PORTS") or "")
    if reserved:
        return int(reserved.group())
    job_id = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or ""
    if not job_id.isdigit():
        return DEFAULT_PORT
    step_id = env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID") or "0"
    step = int(step_id) if step_id.isdigit() else 0
    return 20000 + (int(job_id) % 1250) * 8 + step % 8


def _tasks_on_node(tasks_per_node: Optional[str], node_rank: Optional[int]) -> Optional[int]:
    """The number of tasks on node ``node_rank`` from Slurm's ``2(x3),1`` form; None when unknown."""
    if not tasks_per_node or node_rank is None:
        return None
    counts: list[int] = []
    for part in tasks_per_node.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if match is None:
            return None
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts[node_rank] if node_rank < len(counts) else None


def _kubeflow_or_env(env: _Reader) -> Optional[ClusterEnvironment]:
    world_size = env.integer("WORLD_SIZE")
    rank = env.integer("RANK")
    if world_size is None:
        if rank is not None and rank > 0:
            raise ClusterEnvironmentError(
                f"RANK={rank} is set, but WORLD_SIZE is not, so this process does not know how many others to wait "
                "for. A launcher sets both; if you set RANK yourself, set WORLD_SIZE too, or unset RANK to train in "
                "one process."
            )
        return None
    if rank is None:
        if world_size > 1:
            raise ClusterEnvironmentError(
                f"WORLD_SIZE={world_size} declares a job of {world_size} processes, but RANK is not set, so this "
                "process does not know which one it is. A launcher sets both (torchrun, accelerate launch, a Kubeflow "
                f"PyTorchJob); if you set WORLD_SIZE yourself, set RANK (0 to {world_size - 1}) too, or unset "
                "WORLD_SIZE to train in one process."
            )
        return None
    kubeflow = "PET_NNODES" in env or "KUBERNETES_SERVICE_HOST" in env
    launcher = "Kubeflow PyTorchJob" if kubeflow else "environment variables (RANK, WORLD_SIZE)"
    # nprocPerNode: the operator counts that many processes per pod in WORLD_SIZE, for torchrun to start.
    procs_per_pod = env.get("PET_NPROC_PER_NODE") or "1"
    if kubeflow and procs_per_pod.isdigit() and int(procs_per_pod) > 1:
        raise ClusterEnvironmentError(
            f"This pod of a Kubeflow PyTorchJob is meant to run {procs_per_pod} processes (nprocPerNode="
            f"{procs_per_pod}; WORLD_SIZE={world_size} counts them all), but this process was not started by "
            "torchrun, so it would train alone. Start the container's command with torchrun: "
            "`torchrun train.py` reads the PET_* variables the operator sets."
        )
    master_addr = env.get("MASTER_ADDR")
    if master_addr is None:
        if world_size > 1:
            raise ClusterEnvironmentError(
                f"{launcher} declare a job of {world_size} processes (this is rank {rank}), but MASTER_ADDR is not "
                "set, so the processes cannot know where to meet. Set MASTER_ADDR to the address of the process "
                "with rank 0 (a Kubeflow PyTorchJob sets it when the job has a Master replica)."
            )
        master_addr = "127.0.0.1"
    return ClusterEnvironment(
        name="kubeflow" if kubeflow else "env",
        launcher=launcher,
        rank=rank,
        world_size=world_size,
        local_rank=env.integer("LOCAL_RANK", 0) or 0,
        local_world_size=env.integer("LOCAL_WORLD_SIZE", 1 if kubeflow else None),
        node_rank=env.integer("PET_NODE_RANK", rank) if kubeflow else None,
        num_nodes=env.integer("PET_NNODES", world_size) if kubeflow else None,
        master_addr=master_addr,
        master_port=_port(env),
    )


def _local(env: _Reader) -> ClusterEnvironment:
    job_id = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    warning = None
    tasks = env.integer("SLURM_NTASKS") if (env.get("SLURM_NTASKS") or "").isdigit() else None
    if job_id is not None and tasks is not None and tasks > 1:
        warning = (
            f"This process runs in SLURM job {job_id}, which has {tasks} tasks, but srun did not start it (it is "
            "the job's batch script or an salloc shell), so it trains alone. To train as one job of "
            f"{tasks} processes, start the script with srun: `srun python train.py`."
        )
    return ClusterEnvironment(name="local", job_id=job_id, warning=warning)


def expand_slurm_nodelist(nodelist: str) -> list[str]:
    """Expand Slurm's compressed host list into host names, in order.

    Follows Slurm's own rules (its ``hostlist.c``): hosts are separated by commas or
    spaces (not those inside brackets); ``[...]`` holds numbers and ``lo-hi`` ranges,
    comma-separated, each padded with zeros to the width of its first number as
    written; text may follow the brackets; and several bracket groups in one name
    multiply out, the last one varying fastest.

    >>> expand_slurm_nodelist("node[01-04,07]")
    ['node01', 'node02', 'node03', 'node04', 'node07']
    >>> expand_slurm_nodelist("a[1-2],b3")
    ['a1', 'a2', 'b3']
    >>> expand_slurm_nodelist("rack[1-2]-gpu[8-10]")
    ['rack1-gpu8', 'rack1-gpu9', 'rack1-gpu10', 'rack2-gpu8', 'rack2-gpu9', 'rack2-gpu10']
    """
    hosts: list[str] = []
    for name in _split_outside_brackets(nodelist):
        hosts += _expand_name(name)
    return hosts


def _split_outside_brackets(text: str) -> list[str]:
    names, current, depth = [], "", 0
    for char in text:
        if char == "[":
            if depth:
                raise ValueError("a '[' inside brackets")
            depth = 1
        elif char == "]":
            if not depth:
                raise ValueError("a ']' without its '['")
            depth = 0
        if char in ", \t\n" and not depth:
            if current:
                names.append(current)
            current = ""
        else:
            current += char
    if depth:
        raise ValueError("a '[' without its ']'")
    if current:
        names.append(current)
    return names


def _expand_name(name: str) -> list[str]:
    """One name, its bracket groups multiplied out (``rack[1-2]n[1-3]``: 6 names)."""
    open_at = name.find("[")
    if open_at < 0:
        return [name]
    close_at = name.index("]", open_at)
    prefix = name[:open_at]
    numbers = _expand_numbers(name[open_at + 1 : close_at])
    tails = _expand_name(name[close_at + 1 :])
    if len(numbers) * len(tails) > SLURM_MAX_NODES:
        raise ValueError(f"{name!r} names more than {SLURM_MAX_NODES} hosts, more than a Slurm cluster has")
    return [f"{prefix}{number}{tail}" for number in numbers for tail in tails]


def _expand_numbers(numbers: str) -> list[str]:
    """``01-04,07`` -> ``01 02 03 04 07``: each range padded to the width of its first number."""
    expanded = []
    for part in numbers.split(","):
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", part.strip())
        if match is None:
            raise ValueError(f"{part!r} in brackets is neither a number nor a range lo-hi")
        low, high = int(match.group(1)), int(match.group(2) or match.group(1))
        if high < low:
            raise ValueError(f"the range {part!r} runs backwards")
        if high - low >= SLURM_MAX_NODES:
            raise ValueError(
                f"the range {part!r} names more than {SLURM_MAX_NODES} hosts, more than a Slurm cluster has"
            )
        width = len(match.group(1))
        expanded += [str(number).zfill(width) for number in range(low, high + 1)]
    return expanded


__all__ = [
    "ONE_PROCESS",
    "ClusterEnvironment",
    "ClusterEnvironmentError",
    "cluster_environment",
    "expand_slurm_nodelist",
]
