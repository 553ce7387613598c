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

- **SLURM** (:mod:`~kerastorch.devices.slurm`). Only a task that ``srun`` started is a rank:
  the batch script of ``sbatch``, an ``salloc`` shell and a shell of ``srun --pty bash`` (a job
  named ``bash`` or ``interactive``, as Lightning reads it) train alone, and say so once when the
  job has several tasks. The tasks meet at the first host of the node list, on a port derived
  from the job and step ids unless Slurm reserved one or ``MASTER_PORT`` is set.
- **MPI inside SLURM.** ``mpirun`` in a SLURM job starts its ranks through daemons that
  ``srun`` launched, so each rank also carries the daemon's ``SLURM_PROCID``: MPI's
  variables win. When ``srun`` starts the ranks itself (``srun --mpi=pmi2``), both agree,
  and the job is ``"slurm"``.
- **MPI's meeting point.** ``MASTER_ADDR`` must be exported to every rank (``mpirun -x``,
  ``mpiexec -genv``) unless all ranks run on this one machine (then ``127.0.0.1``).
- **Ports.** Where nothing says which port, it is ``29500`` (torchrun's default).

A job whose variables are missing or contradict each other (a world size of 8 but no
rank, a rank of 8 in a job of 8) raises :class:`ClusterEnvironmentError`, which says what
was seen, what was expected and what to set: never a silent run of one process. What a
cluster environment is lives in :mod:`~kerastorch.devices.cluster`; how the ranks then meet,
and how long they wait for each other, in :mod:`~kerastorch.devices.rendezvous`.

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

import os
from collections.abc import Mapping
from typing import Optional

from .cluster import ONE_PROCESS, ClusterEnvironment, ClusterEnvironmentError, EnvironmentReader, env_port
from .slurm import expand_slurm_nodelist, slurm_job_alone, srun_task

NAMES = ("local", "torchrun", "slurm", "mpi", "kubeflow", "ray", "env")


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
    kerastorch.devices.cluster.ClusterEnvironmentError: WORLD_SIZE=4 declares a job of 4 processes, but RANK is not set, so this process does not know which one it is. A launcher sets both (torchrun, accelerate launch, a Kubeflow PyTorchJob); if you set WORLD_SIZE yourself, set RANK (0 to 3) too, or unset WORLD_SIZE to train in one process.
    """
    env = EnvironmentReader(os.environ if environ is None else environ)
    for detect in (_ray, _torchrun, _mpi, srun_task, _kubeflow_or_env):
        found = detect(env)
        if found is not None:
            return _checked(found, env)
    job_id = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    return ClusterEnvironment(name="local", job_id=job_id, warning=slurm_job_alone(env))


def _checked(found: ClusterEnvironment, env: EnvironmentReader) -> ClusterEnvironment:
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


def _ray(env: EnvironmentReader) -> Optional[ClusterEnvironment]:
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
        master_port=env_port(env),
    )


def _torchrun(env: EnvironmentReader) -> Optional[ClusterEnvironment]:
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
        master_port=env_port(env),
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


def _mpi(env: EnvironmentReader) -> Optional[ClusterEnvironment]:
    flavour = next((f for f in _MPI_FLAVOURS if env.get(f[1]) is not None), None)
    if flavour is None:
        return None
    launcher, size_name, rank_name, local_rank_names, local_size_names = flavour
    world_size = env.integer(size_name) or 0
    fix = f"mpirun / mpiexec sets {rank_name} with {size_name}; start the script with it (or unset {size_name})."
    rank = env.required_int(rank_name, launcher, fix)
    try:
        srun = srun_task(env)
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
        master_port=env_port(env),
    )


def _kubeflow_or_env(env: EnvironmentReader) -> Optional[ClusterEnvironment]:
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
        master_port=env_port(env),
    )


__all__ = [
    "ONE_PROCESS",
    "ClusterEnvironment",
    "ClusterEnvironmentError",
    "cluster_environment",
    "expand_slurm_nodelist",
]
