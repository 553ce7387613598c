"""cluster_environment(): which launcher started this process, read from fake environments.

Each environment below is what the launcher really sets (trimmed to the variables that
matter): torchrun's and Ray Train's were printed from real processes on this machine;
SLURM's, MPI's and Kubeflow's follow their sources and documentation.
"""

from __future__ import annotations

import dataclasses

import pytest

import kerastorch as kt
from kerastorch.devices.environment import NAMES, ClusterEnvironmentError, cluster_environment, expand_slurm_nodelist

# torchrun --nproc_per_node=2 (rank 1), as printed by a real process.
TORCHRUN = {
    "GROUP_RANK": "0",
    "GROUP_WORLD_SIZE": "1",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "2",
    "MASTER_ADDR": "localhost",
    "MASTER_PORT": "38905",
    "RANK": "1",
    "ROLE_RANK": "1",
    "ROLE_WORLD_SIZE": "2",
    "TORCHELASTIC_RESTART_COUNT": "0",
    "TORCHELASTIC_RUN_ID": "c6056bb8-a940-46b5-8304-063cd5efcadb",
    "WORLD_SIZE": "2",
}

# A worker of TorchTrainer(scaling_config=ScalingConfig(num_workers=2)) (rank 1), as printed by Ray 2.60.
RAY_TRAIN = {
    "ACCELERATE_TORCH_DEVICE": "cpu",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "2",
    "MASTER_ADDR": "192.0.2.2",
    "MASTER_PORT": "47197",
    "NODE_RANK": "0",
    "RANK": "1",
    "RAY_JOB_ID": "01000000",
    "RAY_RAYLET_PID": "12783",
    "WORLD_SIZE": "2",
}

# srun --nodes=2 --ntasks-per-node=4 python train.py: task 5 (the second on gpu08).
SRUN = {
    "SLURM_JOB_ID": "1234",
    "SLURM_JOB_NODELIST": "gpu[07-08]",
    "SLURM_NODELIST": "gpu[07-08]",
    "SLURM_STEP_NODELIST": "gpu[07-08]",
    "SLURM_STEP_ID": "0",
    "SLURM_STEPID": "0",
    "SLURM_STEP_NUM_TASKS": "8",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_STEP_TASKS_PER_NODE": "4(x2)",
    "SLURM_NTASKS": "8",
    "SLURM_PROCID": "5",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
}

# The batch script of `sbatch --nodes=2 --ntasks-per-node=4` (Slurm runs it once, on the first node).
SBATCH_SHELL = {
    "ENVIRONMENT": "BATCH",
    "SLURM_JOB_ID": "1234",
    "SLURM_JOB_NODELIST": "gpu[07-08]",
    "SLURM_NODELIST": "gpu[07-08]",
    "SLURM_NTASKS": "8",
    "SLURM_TASKS_PER_NODE": "4(x2)",
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "0",
    "SLURM_STEP_ID": "-5",  # the batch step (Slurm 24+ prints it signed; older ones 4294967291)
}

# A pod of a PyTorchJob with a Master and 2 Workers (operator v1.7+): Worker 1 has rank 2.
KUBEFLOW = {
    "KUBERNETES_SERVICE_HOST": "10.96.0.1",
    "MASTER_ADDR": "mnist-master-0",
    "MASTER_PORT": "23456",
    "PET_MASTER_ADDR": "mnist-master-0",
    "PET_MASTER_PORT": "23456",
    "PET_NNODES": "3",
    "PET_NODE_RANK": "2",
    "PYTHONUNBUFFERED": "1",
    "RANK": "2",
    "WORLD_SIZE": "3",
}


def test_no_launcher_is_one_local_process():
    env = cluster_environment({"HOME": "/root", "PATH": "/usr/bin"})
    assert (env.name, env.rank, env.world_size, env.local_rank, env.is_job) == ("local", 0, 1, 0, False)
    assert env.describe() == "one process"
    assert env.torch_env() == {}
    assert env.warning is None


def test_the_default_environment_is_the_process_one(monkeypatch):
    for name, value in TORCHRUN.items():
        monkeypatch.setenv(name, value)
    env = cluster_environment()
    assert (env.name, env.rank, env.world_size) == ("torchrun", 1, 2)


def test_the_environment_is_a_frozen_value_exported_from_the_package():
    env = kt.cluster_environment({})
    assert isinstance(env, kt.devices.ClusterEnvironment)
    assert "cluster_environment" in kt.__all__ and "ClusterEnvironment" in kt.devices.__all__
    assert {cluster_environment(fake).name for fake in (TORCHRUN, RAY_TRAIN, SRUN, SBATCH_SHELL, KUBEFLOW)} <= set(
        NAMES
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        env.rank = 3  # type: ignore[misc]


# torchrun ------------------------------------------------------------------------------------


def test_torchrun():
    env = cluster_environment(TORCHRUN)
    assert env.name == "torchrun"
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size) == (1, 2, 1, 2)
    assert (env.node_rank, env.num_nodes, env.master_addr, env.master_port) == (0, 1, "localhost", 38905)
    assert env.describe() == "torchrun, rank 1 of 2 (local 1) on 1 node"


def test_torchrun_on_two_machines():
    second_machine = {**TORCHRUN, "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2", "RANK": "3", "WORLD_SIZE": "4"}
    env = cluster_environment(second_machine)
    assert (env.rank, env.world_size, env.node_rank, env.num_nodes) == (3, 4, 1, 2)
    assert env.describe() == "torchrun, rank 3 of 4 (local 1) on 2 nodes"


def test_torchrun_without_its_rank_is_a_clear_error():
    with pytest.raises(ClusterEnvironmentError, match="torchrun started this process, but RANK is not set"):
        cluster_environment({k: v for k, v in TORCHRUN.items() if k != "RANK"})


# SLURM -----------------------------------------------------------------------------------------


def test_a_task_started_by_srun():
    env = cluster_environment(SRUN)
    assert env.name == "slurm"
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size) == (5, 8, 1, 4)
    assert (env.node_rank, env.num_nodes, env.job_id, env.hosts) == (1, 2, "1234", ("gpu07", "gpu08"))
    assert env.master_addr == "gpu07"  # the first host of the step: task 0 runs there
    assert env.master_port == 20000 + 1234 * 8 + 0  # the documented rule, the same on every task
    assert env.describe() == "SLURM job 1234, rank 5 of 8 (local 1) on 2 nodes"


def test_srun_takes_master_addr_and_port_from_the_environment_when_set():
    env = cluster_environment({**SRUN, "MASTER_ADDR": "10.0.0.7", "MASTER_PORT": "29400"})
    assert (env.master_addr, env.master_port) == ("10.0.0.7", 29400)


def test_srun_uses_the_port_slurm_reserved_for_the_step():
    env = cluster_environment({**SRUN, "SLURM_STEP_RESV_PORTS": "12001-12004"})
    assert env.master_port == 12001


def test_the_derived_port_differs_between_steps_and_stays_below_the_ephemeral_ports():
    ports = {cluster_environment({**SRUN, "SLURM_STEP_ID": str(step)}).master_port for step in range(8)}
    assert len(ports) == 8
    highest = cluster_environment({**SRUN, "SLURM_JOB_ID": "1249", "SLURM_STEP_ID": "7"}).master_port
    assert highest == 29999 < 32768
    assert cluster_environment({**SRUN, "SLURM_JOB_ID": "2484"}).master_port == 20000 + 1234 * 8


def test_the_step_node_list_wins_over_the_job_one():
    # srun -w gpu08 in a job on gpu[07-08]: task 0 runs on gpu08.
    step_on_one_node = {**SRUN, "SLURM_STEP_NODELIST": "gpu08", "SLURM_STEP_NUM_NODES": "1"}
    step_on_one_node.update({"SLURM_STEP_TASKS_PER_NODE": "8", "SLURM_NODEID": "0"})
    env = cluster_environment(step_on_one_node)
    assert (env.master_addr, env.num_nodes, env.local_world_size) == ("gpu08", 1, 8)


def test_srun_with_only_the_basic_variables():
    # What a hand-made simulation of srun sets: SLURM_NODELIST, SLURM_NTASKS, the ids.
    simulated = {"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "SLURM_NODELIST": "localhost"}
    simulated.update({"SLURM_NTASKS": "2", "SLURM_PROCID": "1", "SLURM_LOCALID": "1"})
    env = cluster_environment(simulated)
    assert (env.name, env.rank, env.world_size, env.local_rank) == ("slurm", 1, 2, 1)
    assert (env.master_addr, env.num_nodes, env.local_world_size, env.node_rank) == ("localhost", 1, 2, None)
    two_nodes = cluster_environment({**simulated, "SLURM_NODELIST": "n[1-2]"})
    assert (two_nodes.num_nodes, two_nodes.local_world_size) == (2, None)  # how many tasks per node is unknown


def test_srun_with_one_task_is_slurm_but_not_a_job():
    env = cluster_environment({**SRUN, "SLURM_STEP_NUM_TASKS": "1", "SLURM_NTASKS": "1", "SLURM_PROCID": "0"})
    assert (env.name, env.world_size, env.is_job) == ("slurm", 1, False)


@pytest.mark.parametrize("step_id", ["-5", "4294967291"])
def test_the_batch_script_of_a_job_with_several_tasks_is_local_with_a_warning(step_id):
    env = cluster_environment({**SBATCH_SHELL, "SLURM_STEP_ID": step_id})
    assert (env.name, env.world_size, env.job_id) == ("local", 1, "1234")
    assert "srun did not start it" in env.warning
    assert "srun python train.py" in env.warning
    assert env.describe() == "one process in SLURM job 1234"


def test_the_batch_script_of_a_one_task_job_is_local_without_a_warning():
    env = cluster_environment({**SBATCH_SHELL, "SLURM_NTASKS": "1", "SLURM_TASKS_PER_NODE": "1"})
    assert (env.name, env.warning) == ("local", None)


def test_an_older_slurms_batch_script_without_a_step_id_is_local():
    env = cluster_environment({k: v for k, v in SBATCH_SHELL.items() if k != "SLURM_STEP_ID"})
    assert env.name == "local"
    assert env.warning is not None


def test_an_salloc_shell_and_its_interactive_step_are_local():
    salloc_shell = {"SLURM_JOB_ID": "99", "SLURM_NODELIST": "n[1-2]", "SLURM_NTASKS": "2"}
    assert cluster_environment(salloc_shell).name == "local"
    # With LaunchParameters=use_interactive_step, salloc's shell is a step of its own, with one task.
    interactive_step = {**salloc_shell, "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_STEP_ID": "4294967290"}
    interactive_step.update({"SLURM_STEP_NUM_TASKS": "1", "SLURM_TASKS_PER_NODE": "2"})
    assert cluster_environment(interactive_step).name == "local"


# srun --ntasks=2 --pty bash: the shell gets task 0's variables of a step of 2 tasks, in a job srun
# named after its command. A `python train.py` typed there is not one of the step's tasks.
PTY_SHELL = {
    "SLURM_JOB_ID": "77",
    "SLURM_JOB_NAME": "bash",
    "SLURM_NODELIST": "localhost",
    "SLURM_STEP_ID": "0",
    "SLURM_STEP_NUM_TASKS": "2",
    "SLURM_NTASKS": "2",
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "0",
    "SLURM_PTY_PORT": "40123",
}


@pytest.mark.parametrize("job_name", ["bash", "interactive"])
def test_an_interactive_srun_shell_is_one_process_that_says_so(job_name):
    env = cluster_environment({**PTY_SHELL, "SLURM_JOB_NAME": job_name})
    assert (env.name, env.world_size, env.is_job, env.job_id) == ("local", 1, False, "77")
    assert f"the job is named {job_name!r} (SLURM_JOB_NAME), which marks an interactive session" in env.warning
    assert "trains alone, as a plain process" in env.warning
    assert "srun --ntasks=2 --job-name=train python train.py" in env.warning
    # The same step under another job name is a job of two tasks (rank 0 here), as before.
    assert cluster_environment({**PTY_SHELL, "SLURM_JOB_NAME": "train"}).world_size == 2
    # A shell of one task says nothing: it would train alone anyway.
    one = {**PTY_SHELL, "SLURM_JOB_NAME": job_name, "SLURM_STEP_NUM_TASKS": "1", "SLURM_NTASKS": "1"}
    assert (cluster_environment(one).name, cluster_environment(one).warning) == ("local", None)


def test_an_exported_rank_that_contradicts_srun_is_a_clear_error():
    # A batch script that ran `export RANK=$SLURM_PROCID` before srun gives every task rank 0.
    with pytest.raises(ClusterEnvironmentError, match=r"rank 5 of 8 .*but RANK=0 is also set"):
        cluster_environment({**SRUN, "RANK": "0", "WORLD_SIZE": "8"})
    same = cluster_environment({**SRUN, "RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1"})
    assert same.rank == 5


def test_the_torch_variables_of_a_srun_task_resolve_to_the_same_job():
    env = cluster_environment(SRUN)
    exported = env.torch_env()
    assert exported == {
        "RANK": "5",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "4",
        "MASTER_ADDR": "gpu07",
        "MASTER_PORT": str(env.master_port),
    }
    assert cluster_environment({**SRUN, **exported}) == env  # exporting them before accelerate changes nothing


def test_a_srun_task_beyond_the_tasks_is_a_clear_error():
    with pytest.raises(ClusterEnvironmentError, match=r"rank 8 in a job of 8 processes; ranks run from 0 to 7"):
        cluster_environment({**SRUN, "SLURM_PROCID": "8"})


def test_a_srun_task_without_its_local_id_is_a_clear_error():
    with pytest.raises(ClusterEnvironmentError, match="SLURM_LOCALID .* is not set"):
        cluster_environment({k: v for k, v in SRUN.items() if k != "SLURM_LOCALID"})


def test_a_srun_task_without_a_task_count_is_a_clear_error():
    without = {k: v for k, v in SRUN.items() if k not in ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")}
    with pytest.raises(ClusterEnvironmentError, match="srun started this process, but SLURM_NTASKS is not set"):
        cluster_environment(without)


def test_a_srun_task_without_node_list_or_master_addr_is_a_clear_error():
    without = {k: v for k, v in SRUN.items() if "NODELIST" not in k}
    with pytest.raises(ClusterEnvironmentError, match="Export MASTER_ADDR"):
        cluster_environment(without)
    assert cluster_environment({**without, "MASTER_ADDR": "gpu07"}).master_addr == "gpu07"


def test_a_broken_node_list_is_a_clear_error_naming_it():
    with pytest.raises(ClusterEnvironmentError, match=r"SLURM_STEP_NODELIST='gpu\[07-' is not a Slurm node list"):
        cluster_environment({**SRUN, "SLURM_STEP_NODELIST": "gpu[07-"})


def test_a_slurm_number_that_is_not_a_number_is_a_clear_error():
    with pytest.raises(ClusterEnvironmentError, match=r"SLURM_PROCID='five' is not a whole number"):
        cluster_environment({**SRUN, "SLURM_PROCID": "five"})


# SLURM's compressed node lists ----------------------------------------------------------------


@pytest.mark.parametrize(
    "nodelist, hosts",
    [
        ("localhost", ["localhost"]),
        ("node[01-04,07]", ["node01", "node02", "node03", "node04", "node07"]),
        ("a[1-2],b3", ["a1", "a2", "b3"]),
        ("n[8-11]", ["n8", "n9", "n10", "n11"]),  # padded to the first number's width: none
        ("n[08-11]", ["n08", "n09", "n10", "n11"]),
        ("n[007]", ["n007"]),
        ("gpu[1-2]-ib", ["gpu1-ib", "gpu2-ib"]),  # text after the brackets
        ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),  # the last varies fastest
        ("host1,host2 host3", ["host1", "host2", "host3"]),
        ("c[1-2],gpu[10-11,20],login", ["c1", "c2", "gpu10", "gpu11", "gpu20", "login"]),
        ("node1-5", ["node1-5"]),  # a dash outside brackets is part of the name
        ("", []),
    ],
)
def test_slurm_node_lists_expand_as_slurm_expands_them(nodelist, hosts):
    assert expand_slurm_nodelist(nodelist) == hosts


@pytest.mark.parametrize(
    "nodelist, why",
    [
        ("n[1-", "without its"),
        ("n1]", "without its"),
        ("n[3-1]", "runs backwards"),
        ("n[a-b]", "neither a number nor a range"),
        ("n[1-2[3]]", "inside brackets"),
        ("n[0-99999]", "more than 65536 hosts"),
        ("a[0-999]b[0-999]", "more than 65536 hosts"),
    ],
)
def test_a_node_list_slurm_would_refuse_is_refused(nodelist, why):
    with pytest.raises(ValueError, match=why):
        expand_slurm_nodelist(nodelist)


# MPI -------------------------------------------------------------------------------------------


def open_mpi(rank: int, size: int, local_rank: int, local_size: int, **more: str) -> dict[str, str]:
    variables = {"OMPI_COMM_WORLD_RANK": rank, "OMPI_COMM_WORLD_SIZE": size}
    variables.update({"OMPI_COMM_WORLD_LOCAL_RANK": local_rank, "OMPI_COMM_WORLD_LOCAL_SIZE": local_size})
    return {**{k: str(v) for k, v in variables.items()}, **more}


def test_open_mpi_on_one_machine_meets_on_loopback():
    env = cluster_environment(open_mpi(1, 2, 1, 2))
    assert (env.name, env.rank, env.world_size, env.local_rank, env.local_world_size) == ("mpi", 1, 2, 1, 2)
    assert (env.master_addr, env.master_port, env.num_nodes) == ("127.0.0.1", 29500, 1)
    assert env.describe() == "Open MPI, rank 1 of 2 (local 1) on 1 node"


def test_open_mpi_on_two_machines_needs_master_addr():
    with pytest.raises(ClusterEnvironmentError, match=r"MASTER_ADDR is not set.*mpirun -x MASTER_ADDR="):
        cluster_environment(open_mpi(3, 4, 1, 2))
    env = cluster_environment(open_mpi(3, 4, 1, 2, MASTER_ADDR="host0", MASTER_PORT="29400"))
    assert (env.rank, env.world_size, env.master_addr, env.master_port, env.num_nodes) == (3, 4, "host0", 29400, None)
    assert env.describe() == "Open MPI, rank 3 of 4 (local 1)"


def test_mpich_and_intel_mpi():
    hydra = {"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2", "MASTER_ADDR": "h0"}
    env = cluster_environment(hydra)
    assert (env.name, env.launcher, env.rank, env.world_size, env.local_rank, env.local_world_size) == (
        "mpi",
        "MPICH / Intel MPI",
        2,
        4,
        0,
        2,
    )


def test_cray_pmi_gives_the_local_rank_its_own_way():
    cray = {"PMI_RANK": "3", "PMI_SIZE": "4", "PMI_LOCAL_RANK": "1", "PMI_LOCAL_SIZE": "2", "MASTER_ADDR": "nid1"}
    env = cluster_environment(cray)
    assert (env.rank, env.local_rank, env.local_world_size) == (3, 1, 2)


def test_pmi_without_a_local_rank_is_a_clear_error():
    with pytest.raises(ClusterEnvironmentError, match="export LOCAL_RANK"):
        cluster_environment({"PMI_RANK": "1", "PMI_SIZE": "2", "MASTER_ADDR": "h0"})
    env = cluster_environment({"PMI_RANK": "1", "PMI_SIZE": "2", "MASTER_ADDR": "h0", "LOCAL_RANK": "1"})
    assert env.local_rank == 1


def test_mvapich():
    mvapich = {"MV2_COMM_WORLD_RANK": "1", "MV2_COMM_WORLD_SIZE": "2"}
    mvapich.update({"MV2_COMM_WORLD_LOCAL_RANK": "1", "MV2_COMM_WORLD_LOCAL_SIZE": "2"})
    assert cluster_environment(mvapich).describe() == "MVAPICH, rank 1 of 2 (local 1) on 1 node"


def test_mpi_size_without_a_rank_is_a_clear_error():
    with pytest.raises(ClusterEnvironmentError, match="but OMPI_COMM_WORLD_RANK is not set"):
        cluster_environment({"OMPI_COMM_WORLD_SIZE": "2"})


def test_mpirun_inside_a_slurm_job_is_mpi():
    # mpirun starts one daemon per node with srun; the ranks inherit the daemon's SLURM_PROCID (the node's).
    daemon = {"SLURM_JOB_ID": "5", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_NTASKS": "2"}
    daemon.update({"SLURM_STEP_NUM_TASKS": "2", "SLURM_LOCALID": "0", "SLURM_NODELIST": "n[1-2]"})
    env = cluster_environment({**daemon, **open_mpi(3, 4, 1, 2, MASTER_ADDR="n1")})
    assert (env.name, env.rank, env.world_size) == ("mpi", 3, 4)
    # The daemons' variables are not this rank's: a flaw in them is no reason to refuse MPI's.
    without_localid = {k: v for k, v in daemon.items() if k != "SLURM_LOCALID"}
    assert cluster_environment({**without_localid, **open_mpi(3, 4, 1, 2, MASTER_ADDR="n1")}).rank == 3


def test_srun_starting_mpi_ranks_itself_is_slurm():
    # srun --mpi=pmi2 sets PMI_RANK / PMI_SIZE equal to its own ids: srun is the launcher, MASTER_ADDR comes for free.
    env = cluster_environment({**SRUN, "PMI_RANK": "5", "PMI_SIZE": "8"})
    assert (env.name, env.rank, env.master_addr) == ("slurm", 5, "gpu07")


# Kubeflow, and RANK / WORLD_SIZE set by anything else -----------------------------------------


def test_a_kubeflow_pytorchjob_pod():
    env = cluster_environment(KUBEFLOW)
    assert (env.name, env.rank, env.world_size, env.local_rank, env.local_world_size) == ("kubeflow", 2, 3, 0, 1)
    assert (env.node_rank, env.num_nodes, env.master_addr, env.master_port) == (2, 3, "mnist-master-0", 23456)
    assert env.describe() == "Kubeflow PyTorchJob, rank 2 of 3 (local 0) on 3 nodes"


def test_an_older_operator_without_the_pet_variables_is_still_kubeflow():
    older = {k: v for k, v in KUBEFLOW.items() if not k.startswith("PET_")}
    env = cluster_environment(older)
    assert (env.name, env.node_rank, env.num_nodes) == ("kubeflow", 2, 3)


def test_a_pytorchjob_with_several_processes_per_pod_needs_torchrun():
    with pytest.raises(ClusterEnvironmentError, match="nprocPerNode=4.*Start the container's command with torchrun"):
        cluster_environment({**KUBEFLOW, "PET_NPROC_PER_NODE": "4", "WORLD_SIZE": "12"})


def test_torchrun_in_a_pytorchjob_is_torchrun():
    pod_running_torchrun = {**KUBEFLOW, **TORCHRUN, "PET_NPROC_PER_NODE": "2"}
    assert cluster_environment(pod_running_torchrun).name == "torchrun"


def test_kubeflow_without_master_addr_is_a_clear_error():
    with pytest.raises(ClusterEnvironmentError, match="Kubeflow PyTorchJob declare a job of 3 processes"):
        cluster_environment({k: v for k, v in KUBEFLOW.items() if k != "MASTER_ADDR"})


def test_rank_and_world_size_set_by_anything_else():
    env = cluster_environment({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "1234"})
    assert (env.name, env.rank, env.world_size, env.master_addr, env.master_port) == ("env", 1, 2, "10.0.0.1", 1234)
    assert env.describe() == "environment variables (RANK, WORLD_SIZE), rank 1 of 2 (local 0)"


def test_a_world_size_without_a_rank_is_a_clear_error():
    with pytest.raises(ClusterEnvironmentError, match=r"WORLD_SIZE=2 declares a job of 2 processes, but RANK is not"):
        cluster_environment({"WORLD_SIZE": "2", "MASTER_ADDR": "localhost"})


def test_a_rank_without_a_world_size_is_a_clear_error():
    with pytest.raises(ClusterEnvironmentError, match=r"RANK=1 is set, but WORLD_SIZE is not"):
        cluster_environment({"RANK": "1"})


def test_rank_zero_of_one_is_local():
    assert cluster_environment({"RANK": "0"}).name == "local"
    assert cluster_environment({"WORLD_SIZE": "1"}).name == "local"


@pytest.mark.parametrize(
    "variables, message",
    [
        ({"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "h"}, r"rank 2 in a job of 2 processes"),
        ({"RANK": "-1", "WORLD_SIZE": "2", "MASTER_ADDR": "h"}, r"rank -1 in a job of 2 processes"),
        ({"RANK": "0", "WORLD_SIZE": "0", "MASTER_ADDR": "h"}, r"the job has 0 processes"),
        ({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "70000"}, r"MASTER_PORT=70000"),
        ({"RANK": "1", "WORLD_SIZE": "2"}, r"MASTER_ADDR is not set"),
        ({"RANK": "1", "WORLD_SIZE": "two"}, r"WORLD_SIZE='two' is not a whole number"),
        ({**TORCHRUN, "LOCAL_RANK": "2"}, r"local rank 2 of 2 processes on this machine"),
    ],
)
def test_contradictory_variables_are_a_clear_error(variables, message):
    with pytest.raises(ClusterEnvironmentError, match=message):
        cluster_environment(variables)


# Ray Train, and the order launchers are recognised in ------------------------------------------


def test_a_ray_train_worker():
    env = cluster_environment(RAY_TRAIN)
    assert (env.name, env.rank, env.world_size, env.local_rank, env.local_world_size) == ("ray", 1, 2, 1, 2)
    assert (env.node_rank, env.master_addr, env.master_port) == (0, "192.0.2.2", 47197)
    assert env.describe() == "Ray Train, rank 1 of 2 (local 1)"


def test_ray_is_recognised_before_kubeflow_on_kuberay():
    # A KubeRay pod is a Kubernetes pod: without Ray first its worker would look like a PyTorchJob's.
    env = cluster_environment({**RAY_TRAIN, "KUBERNETES_SERVICE_HOST": "10.96.0.1", "PET_NNODES": "2"})
    assert env.name == "ray"


def test_ray_is_recognised_before_slurm():
    # `ray start` under srun: the Ray workers inherit the raylet's SLURM variables.
    env = cluster_environment({**SRUN, **RAY_TRAIN})
    assert (env.name, env.rank, env.world_size) == ("ray", 1, 2)


def test_a_ray_worker_without_its_rank_is_a_clear_error():
    with pytest.raises(ClusterEnvironmentError, match="Ray Train started this process, but RANK is not set"):
        cluster_environment({k: v for k, v in RAY_TRAIN.items() if k != "RANK"})


def test_a_ray_task_that_is_not_a_train_worker_is_local():
    assert cluster_environment({"RAY_RAYLET_PID": "12783", "RAY_JOB_ID": "01000000"}).name == "local"


def test_torchrun_started_from_a_ray_task_is_torchrun():
    assert cluster_environment({"RAY_RAYLET_PID": "12783", **TORCHRUN}).name == "torchrun"


def test_torchrun_is_recognised_before_slurm_and_mpi():
    # srun --ntasks-per-node=1 torchrun ...: each worker has its srun task's variables too.
    srun_then_torchrun = {**SRUN, "SLURM_STEP_NUM_TASKS": "2", "SLURM_NTASKS": "2", "SLURM_PROCID": "1"}
    srun_then_torchrun.update({"SLURM_LOCALID": "0", **TORCHRUN})
    assert cluster_environment(srun_then_torchrun).name == "torchrun"
    assert cluster_environment({**open_mpi(0, 2, 0, 2), **TORCHRUN}).name == "torchrun"


def test_the_workers_fit_forks_inside_a_srun_task_are_torchrun():
    # srun --ntasks=1 python train.py with fit(devices=2): the forked workers carry torchrun's variables.
    one_task = {**SRUN, "SLURM_STEP_NUM_TASKS": "1", "SLURM_NTASKS": "1", "SLURM_PROCID": "0", "SLURM_LOCALID": "0"}
    assert cluster_environment({**one_task, **TORCHRUN}).name == "torchrun"
