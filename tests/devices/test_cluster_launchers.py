"""Two processes started with each launcher's variables train as one job, like under torchrun.

Each launcher is imitated on this machine: two processes get the variables that srun,
Open MPI's mpirun, MPICH's mpiexec or a Kubeflow PyTorchJob would give them (and nothing
else: no RANK or WORLD_SIZE unless the launcher itself sets them), and run
``tests/cluster_train_script.py``, a plain script that calls ``fit``. Every rank must name
the launcher, train in a group of two on gloo, print the launcher and the rank layout first,
and end with the history that the same script gets under ``torchrun --nproc_per_node=2``.
One thread per process everywhere, so that the float sums happen in the same order and the
histories are equal, not just close. Missing variables stop fit before it trains, with a
message, never a silent run of one process.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import kerastorch as kt
from kerastorch.devices.environment import ClusterEnvironmentError

REPO_ROOT = Path(__file__).resolve().parents[2]
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


def start_two_ranks(out_dir: Path, variables_of_rank, *options: str) -> tuple[list[int], list[str]]:
    """Start the script twice, rank 0 and 1, with the launcher's variables; their exit codes and outputs."""
    out_dir.mkdir()
    processes = [
        subprocess.Popen(
            [sys.executable, SCRIPT, str(out_dir), *options],
            env={**clean_environment(), **variables_of_rank(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]
    outputs = [process.communicate(timeout=180)[0] for process in processes]
    return [process.returncode for process in processes], outputs


def run_two_ranks(out_dir: Path, variables_of_rank, *options: str) -> list[dict]:
    """Start the script twice, rank 0 and 1, with the launcher's variables; return what each saw."""
    codes, outputs = start_two_ranks(out_dir, variables_of_rank, *options)
    assert codes == [0, 0], "\n\n".join(outputs)
    return [json.loads((out_dir / f"rank{rank}.json").read_text()) for rank in (0, 1)]


def first_lines(ranks: list[dict]) -> list[str]:
    """fit's first printed line on each rank (only rank 0 prints)."""
    return [seen["first_line"] for seen in ranks]


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
    assert first_lines(ranks)[0].startswith("kerastorch: torchrun, rank 0 of 2 (local 0) on 1 node: training on 2")
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


@pytest.mark.slow
def test_two_srun_tasks_train_as_one_job(tmp_path, torchrun_history):
    job_id = slurm_job_id_with_a_free_port()
    ranks = run_two_ranks(tmp_path / "slurm", lambda rank: srun(rank, job_id))
    for rank, seen in enumerate(ranks):
        assert seen["described"] == f"SLURM job {job_id}, rank {rank} of 2 (local {rank}) on 1 node"
        assert (seen["environment"], seen["num_processes"], seen["backend"]) == ("slurm", 2, "gloo")
        assert seen["history"] == torchrun_history
    assert first_lines(ranks) == [
        f"kerastorch: SLURM job {job_id}, rank 0 of 2 (local 0) on 1 node: training on 2 processes (cpu, MULTI_CPU) in "
        "precision 32-true; best weights by val_loss (min, from its name)",
        "",
    ]


@pytest.mark.slow
def test_a_script_that_exports_the_rank_layout_itself_trains_the_same(tmp_path, torchrun_history):
    # What scripts did before fit read the launchers' variables: they keep working.
    job_id = slurm_job_id_with_a_free_port()
    ranks = run_two_ranks(tmp_path / "slurm", lambda rank: srun(rank, job_id), "--export")
    assert [seen["history"] for seen in ranks] == [torchrun_history, torchrun_history]


@pytest.mark.slow
def test_ranks_without_a_shared_disk_resume_together_from_rank_0s_state(tmp_path, torchrun_history):
    # Each rank keeps its files in a folder of its own, as on machines that share no disk: only rank 0
    # writes the training state, and rank 1's folder stays empty. Resuming, rank 0 reads it for both.
    job_id = slurm_job_id_with_a_free_port()
    ranks = run_two_ranks(
        tmp_path / "first", lambda rank: srun(rank, job_id), "--resume-in", str(tmp_path), "--epochs", "2"
    )
    assert [seen["begun"] for seen in ranks] == [[1, 2], [1, 2]]
    assert os.listdir(tmp_path / "rank0") and not os.path.exists(tmp_path / "rank1" / "best.safetensors.state")
    ranks = run_two_ranks(tmp_path / "again", lambda rank: srun(rank, job_id), "--resume-in", str(tmp_path))
    assert [seen["begun"] for seen in ranks] == [[3], [3]]
    assert "Resuming after epoch 2" in ranks[0]["printed"]
    assert [seen["history"] for seen in ranks] == [torchrun_history, torchrun_history]


@pytest.mark.slow
def test_a_state_that_rank_0_cannot_read_stops_every_rank_with_its_reason(tmp_path):
    (tmp_path / "rank0").mkdir()
    (tmp_path / "rank0" / "best.safetensors.state").write_bytes(b"not a training state")
    job_id = slurm_job_id_with_a_free_port()
    codes, outputs = start_two_ranks(tmp_path / "out", lambda rank: srun(rank, job_id), "--resume-in", str(tmp_path))
    assert codes[0] != 0 and codes[1] != 0, outputs
    assert "could not be read as a training state" in outputs[0]
    assert "The main process (rank 0) could not read" in outputs[1]
    assert "could not be read as a training state" in outputs[1]


@pytest.mark.slow
@pytest.mark.parametrize(
    "launcher, name", [(open_mpi, "Open MPI"), (mpich, "MPICH / Intel MPI")], ids=["open-mpi", "mpich"]
)
def test_two_mpi_ranks_on_one_machine_train_as_one_job(tmp_path, torchrun_history, launcher, name):
    port = str(free_port(29700))
    ranks = run_two_ranks(tmp_path / "mpi", lambda rank: {**launcher(rank), "MASTER_PORT": port})
    for rank, seen in enumerate(ranks):
        assert (seen["environment"], seen["rank"], seen["num_processes"], seen["backend"]) == ("mpi", rank, 2, "gloo")
        assert seen["history"] == torchrun_history
    assert first_lines(ranks)[0].startswith(f"kerastorch: {name}, rank 0 of 2 (local 0) on 1 node: training on 2")


@pytest.mark.slow
def test_two_kubeflow_pods_train_as_one_job(tmp_path, torchrun_history):
    pod = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "PET_NNODES": "2", "MASTER_ADDR": "127.0.0.1"}
    pod.update({"MASTER_PORT": str(free_port(29800)), "WORLD_SIZE": "2"})
    ranks = run_two_ranks(tmp_path / "kubeflow", lambda rank: {**pod, "RANK": str(rank), "PET_NODE_RANK": str(rank)})
    for rank, seen in enumerate(ranks):
        assert seen["described"] == f"Kubeflow PyTorchJob, rank {rank} of 2 (local 0) on 2 nodes"
        assert (seen["environment"], seen["num_processes"], seen["backend"]) == ("kubeflow", 2, "gloo")
        assert seen["history"] == torchrun_history
    assert first_lines(ranks)[0].startswith("kerastorch: Kubeflow PyTorchJob, rank 0 of 2 (local 0) on 2 nodes:")


# -- in this process: what fit does before any process group exists ----------------------------


@pytest.fixture
def no_launcher(monkeypatch):
    """This process's environment without any launcher's variables; set some with monkeypatch.setenv."""
    for name in list(os.environ):
        if name.startswith(LAUNCHER_PREFIXES) or name in LAUNCHER_NAMES:
            monkeypatch.delenv(name)
    return monkeypatch


def small_model() -> kt.KerasModel:
    torch.manual_seed(0)
    net = nn.Linear(64, 10)
    return kt.KerasModel(net, nn.CrossEntropyLoss(), {}, torch.optim.SGD(net.parameters(), lr=0.1))


@pytest.mark.parametrize(
    "variables, says",
    [
        ({**srun(1, "7"), "SLURM_LOCALID": ""}, "srun started this process as task 1 of 2, but SLURM_LOCALID"),
        ({"OMPI_COMM_WORLD_SIZE": "2"}, "Open MPI started this process, but OMPI_COMM_WORLD_RANK is not set"),
        ({"PMI_SIZE": "2", "PMI_RANK": "1"}, "no variable says its rank on this machine"),
        ({"KUBERNETES_SERVICE_HOST": "10.96.0.1", "WORLD_SIZE": "2", "RANK": "1"}, "MASTER_ADDR is not set"),
        ({"WORLD_SIZE": "2"}, "WORLD_SIZE=2 declares a job of 2 processes, but RANK is not set"),
    ],
    ids=["srun", "open-mpi", "mpich", "kubeflow", "world-size"],
)
def test_a_launchers_missing_variable_stops_fit_before_it_trains(no_launcher, loaders, variables, says):
    for name, value in variables.items():
        no_launcher.setenv(name, value)
    model = small_model()
    before = {k: v.clone() for k, v in model.net.state_dict().items()}
    with pytest.raises(ClusterEnvironmentError, match=says):
        model.fit(*loaders, epochs=1, verbose=0)
    assert all(torch.equal(before[k], v) for k, v in model.net.state_dict().items())
    assert not torch.distributed.is_initialized()


def test_a_slurm_batch_script_of_two_tasks_trains_alone_and_says_srun_is_missing(no_launcher, loaders, capsys):
    # What sbatch's script sees with --ntasks=2: its own batch step, not a task srun started.
    batch_script = {"SLURM_JOB_ID": "7", "SLURM_NTASKS": "2", "SLURM_PROCID": "0", "SLURM_STEP_ID": "4294967291"}
    for name, value in batch_script.items():
        no_launcher.setenv(name, value)
    model = small_model()
    with pytest.warns(UserWarning, match=r"SLURM job 7, which has 2 tasks, but srun did not start it"):
        history = model.fit(*loaders, epochs=1, accelerator="cpu", verbose=1)
    assert len(history) == 1 and model.runtime.num_processes == 1
    assert "kerastorch: training on cpu in precision 32-true" in capsys.readouterr().out


def test_python_typed_in_an_interactive_srun_shell_trains_alone_and_says_so_once(no_launcher, loaders, capsys):
    # srun --ntasks=2 --pty bash, then `python train.py`: task 0's variables of a step of two tasks. Read
    # as rank 0 of 2, fit waited for a rank 1 that never comes; the job's name says it is a shell.
    shell = {**srun(0, "77"), "SLURM_JOB_NAME": "bash", "SLURM_STEP_NUM_TASKS": "2", "SLURM_PTY_PORT": "40123"}
    for name, value in shell.items():
        no_launcher.setenv(name, value)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = small_model().fit(*loaders, epochs=1, accelerator="cpu", verbose=1)
    said = [str(w.message) for w in caught if "SLURM" in str(w.message)]
    assert len(said) == 1 and "named 'bash' (SLURM_JOB_NAME)" in said[0], said  # once a fit, not once a batch
    assert "trains alone, as a plain process" in said[0]
    assert len(history) == 1 and not torch.distributed.is_initialized()
    assert "kerastorch: training on cpu in precision 32-true" in capsys.readouterr().out


# -- a rendezvous that never completes: who is awaited, and a time limit ------------------------------


def start_one_rank(out_dir: Path, variables: dict[str, str]) -> subprocess.Popen:
    out_dir.mkdir(exist_ok=True)
    return subprocess.Popen(
        [sys.executable, SCRIPT, str(out_dir)],
        env={**clean_environment(), **variables},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_rank_0_of_a_job_whose_other_rank_never_comes_says_who_it_waits_for_and_gives_up(tmp_path):
    # srun's variables of task 0 of 2 (a job named otherwise than bash): task 1 is never started.
    job_id = slurm_job_id_with_a_free_port()
    port = 20000 + int(job_id) * 8
    alone = start_one_rank(tmp_path, {**srun(0, job_id), "KERASTORCH_RENDEZVOUS_TIMEOUT": "4"})
    output = alone.communicate(timeout=120)[0]
    assert alone.returncode != 0, output
    assert f"SLURM job {job_id}, rank 0 of 2 (local 0) on 1 node waits for rank 1 at localhost:{port}" in output
    assert "(1 of 2 came); giving up after 4 s (KERASTORCH_RENDEZVOUS_TIMEOUT)" in output
    assert "RendezvousTimeout" in output and f"did not all meet at localhost:{port} within 4 s" in output
    assert "1 of 2 came; rank 1 did not" in output and "that srun started every task" in output
    assert "set KERASTORCH_RENDEZVOUS_TIMEOUT to more seconds (now 4)" in output
    assert not (tmp_path / "rank0.json").exists()  # nothing trained


def test_a_rank_whose_rank_0_never_comes_says_it_waits_for_it_and_gives_up(tmp_path):
    port = str(free_port(29900))
    pod = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "PET_NNODES": "2", "MASTER_ADDR": "127.0.0.1"}
    variables = {**pod, "MASTER_PORT": port, "WORLD_SIZE": "2", "RANK": "1", "PET_NODE_RANK": "1"}
    alone = start_one_rank(tmp_path, {**variables, "KERASTORCH_RENDEZVOUS_TIMEOUT": "4"})
    output = alone.communicate(timeout=120)[0]
    assert alone.returncode != 0, output
    assert f"Kubeflow PyTorchJob, rank 1 of 2 (local 0) on 2 nodes waits for rank 0 at 127.0.0.1:{port}" in output
    assert f"rank 0 could not be reached at 127.0.0.1:{port} within 4 s" in output
    assert "that every pod of the PyTorchJob is running" in output


def test_a_rendezvous_time_limit_that_is_not_a_number_of_seconds_is_refused_before_training(no_launcher, loaders):
    for name in LAUNCHER_NAMES:  # fit exports the job's layout in torch's words: gone again after the test
        no_launcher.setenv(name, "")
    for name, value in {**srun(0, "7"), "KERASTORCH_RENDEZVOUS_TIMEOUT": "ten minutes"}.items():
        no_launcher.setenv(name, value)
    with pytest.raises(ValueError, match=r"KERASTORCH_RENDEZVOUS_TIMEOUT='ten minutes': give the seconds"):
        small_model().fit(*loaders, epochs=1, accelerator="cpu", verbose=0)
    assert not torch.distributed.is_initialized()
