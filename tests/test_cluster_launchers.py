"""Two processes started with each launcher's variables train as one job, like under torchrun.

Each launcher is imitated on this machine: two processes get the variables that srun,
Open MPI's mpirun, MPICH's mpiexec or a Kubeflow PyTorchJob would give them, and run
``tests/cluster_train_script.py``. Every rank must name the launcher, train in a group of
two on gloo, and end with the history that the same script gets under
``torchrun --nproc_per_node=2``. One thread per process everywhere, so that the float
sums happen in the same order and the histories are equal, not just close.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parent.parent
SCRIPT = str(REPO_ROOT / "tests" / "cluster_train_script.py")
LAUNCHER_PREFIXES = ("SLURM_", "OMPI_", "PMI_", "MPI_LOCAL", "MV2_", "PET_", "TORCHELASTIC_", "RAY_", "KUBERNETES_")
LAUNCHER_NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK")


def port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port(lowest: int) -> int:
    """A port nobody listens on now, from ``lowest`` up."""
    return next(port for port in range(lowest, 65536) if port_is_free(port))


def clean_environment() -> dict[str, str]:
    """This process's environment without any launcher's variables (a test may run under one)."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(LAUNCHER_PREFIXES) and name not in LAUNCHER_NAMES
    }
    return {**env, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}


def run_two_ranks(out_dir: Path, variables_of_rank) -> list[dict]:
    """Start the script twice, rank 0 and 1, with the launcher's variables; return what each saw."""
    out_dir.mkdir()
    processes = [
        subprocess.Popen(
            [sys.executable, SCRIPT, str(out_dir)],
            env={**clean_environment(), **variables_of_rank(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]
    outputs = [process.communicate(timeout=180)[0] for process in processes]
    assert [process.returncode for process in processes] == [0, 0], "\n\n".join(outputs)
    return [json.loads((out_dir / f"rank{rank}.json").read_text()) for rank in (0, 1)]


@pytest.fixture(scope="module")
def torchrun_history(tmp_path_factory) -> dict:
    out_dir = tmp_path_factory.mktemp("torchrun")
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port(29600)}"]
    result = subprocess.run(
        [*command, SCRIPT, str(out_dir)], env=clean_environment(), capture_output=True, text=True, timeout=180
    )
    assert result.returncode == 0, result.stdout + result.stderr
    ranks = [json.loads((out_dir / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert [seen["environment"] for seen in ranks] == ["torchrun", "torchrun"]
    assert ranks[0]["history"] == ranks[1]["history"]
    return ranks[0]["history"]


def slurm_job_id_with_a_free_port() -> str:
    """A job id whose port under the documented rule (step 0: 20000 + id * 8) is free here."""
    return str(next(job_id for job_id in range(1, 1250) if port_is_free(20000 + job_id * 8)))


def srun(rank: int, job_id: str) -> dict[str, str]:
    # What srun --ntasks=2 gives each task on one node (a pretend node: localhost).
    variables = {"SLURM_JOB_ID": job_id, "SLURM_STEP_ID": "0", "SLURM_NODELIST": "localhost", "SLURM_NTASKS": "2"}
    return {**variables, "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank), "SLURM_NODEID": "0"}


def open_mpi(rank: int) -> dict[str, str]:
    variables = {"OMPI_COMM_WORLD_RANK": rank, "OMPI_COMM_WORLD_SIZE": 2}
    variables.update({"OMPI_COMM_WORLD_LOCAL_RANK": rank, "OMPI_COMM_WORLD_LOCAL_SIZE": 2})
    return {name: str(value) for name, value in variables.items()}


def mpich(rank: int) -> dict[str, str]:
    return {"PMI_RANK": str(rank), "PMI_SIZE": "2", "MPI_LOCALRANKID": str(rank), "MPI_LOCALNRANKS": "2"}


def test_two_srun_tasks_train_as_one_job(tmp_path, torchrun_history):
    job_id = slurm_job_id_with_a_free_port()
    ranks = run_two_ranks(tmp_path / "slurm", lambda rank: srun(rank, job_id))
    for rank, seen in enumerate(ranks):
        assert seen["described"] == f"SLURM job {job_id}, rank {rank} of 2 (local {rank}) on 1 node"
        assert (seen["environment"], seen["num_processes"], seen["backend"]) == ("slurm", 2, "gloo")
        assert seen["history"] == torchrun_history


@pytest.mark.parametrize("launcher", [open_mpi, mpich], ids=["open-mpi", "mpich"])
def test_two_mpi_ranks_on_one_machine_train_as_one_job(tmp_path, torchrun_history, launcher):
    port = str(free_port(29700))
    ranks = run_two_ranks(tmp_path / "mpi", lambda rank: {**launcher(rank), "MASTER_PORT": port})
    for rank, seen in enumerate(ranks):
        assert (seen["environment"], seen["rank"], seen["num_processes"], seen["backend"]) == ("mpi", rank, 2, "gloo")
        assert seen["history"] == torchrun_history


def test_two_kubeflow_pods_train_as_one_job(tmp_path, torchrun_history):
    pod = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "PET_NNODES": "2", "MASTER_ADDR": "127.0.0.1"}
    pod.update({"MASTER_PORT": str(free_port(29800)), "WORLD_SIZE": "2"})
    ranks = run_two_ranks(tmp_path / "kubeflow", lambda rank: {**pod, "RANK": str(rank), "PET_NODE_RANK": str(rank)})
    for rank, seen in enumerate(ranks):
        assert seen["described"] == f"Kubeflow PyTorchJob, rank {rank} of 2 (local 0) on 2 nodes"
        assert (seen["environment"], seen["num_processes"], seen["backend"]) == ("kubeflow", 2, "gloo")
        assert seen["history"] == torchrun_history
