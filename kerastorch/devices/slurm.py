"""SLURM's words: which process ``srun`` started as a task of a job, and where the tasks meet.

- **Only a task that ``srun`` started is a rank.** ``SLURM_PROCID`` with ``SLURM_STEP_ID`` or
  ``SLURM_STEP_NUM_TASKS``. ``SLURM_PROCID``, ``SLURM_STEP_NUM_TASKS`` (else ``SLURM_NTASKS``),
  ``SLURM_LOCALID``, ``SLURM_NODEID``, ``SLURM_STEP_TASKS_PER_NODE`` place it in the job.
- **A batch script is not a rank.** The batch script of ``sbatch`` (and an ``salloc`` shell)
  runs once, whatever ``--ntasks`` says: it trains alone, and when the job has several tasks,
  :attr:`~kerastorch.devices.cluster.ClusterEnvironment.warning` says that ``srun`` is missing.
  Slurm marks its batch, interactive and extern steps with special step ids (``SLURM_STEP_ID`` of
  -5, -6, -4, or 4294967291, 4294967290, 4294967292), which are not ranks either.
- **An interactive shell is not a rank.** ``srun --ntasks=2 --pty bash`` gives the shell task 0's
  variables, and a ``python train.py`` typed there would wait for a task 1 that never comes. A job
  named ``bash`` or ``interactive`` (``SLURM_JOB_NAME``, as Lightning reads it; ``srun --pty bash``
  names its job ``bash``) is an interactive session: the process trains alone, as a plain process,
  and says so once when the step has several tasks. To train as a job of several tasks from such
  a shell, start them with srun: ``srun python train.py`` (a job named otherwise).
- **Where the tasks meet.** ``MASTER_ADDR`` is the environment's, else the first host of the
  step's node list (``SLURM_STEP_NODELIST``, else ``SLURM_JOB_NODELIST``, else ``SLURM_NODELIST``),
  expanded from Slurm's compressed form by :func:`expand_slurm_nodelist`. ``MASTER_PORT`` is the
  environment's, else the first port Slurm reserved for the step (``SLURM_STEP_RESV_PORTS``, with
  ``srun --resv-ports``), else ``20000 + (SLURM_JOB_ID % 1250) * 8 + SLURM_STEP_ID % 8`` -- the
  same number on every task of a step, a different one for each of up to 8 steps of a job running
  at once, and below Linux's ephemeral ports (32768 and up).
"""

from __future__ import annotations

import re
from typing import Optional

from .cluster import DEFAULT_PORT, ClusterEnvironment, ClusterEnvironmentError, EnvironmentReader

SLURM_MAX_NORMAL_STEP_ID = 0xFFFFFFF0  # Slurm's special steps (batch, interactive, extern) have ids above it
SLURM_MAX_NODES = 65536  # Slurm's own limit (MAX_SLURM_NODES): a longer list is a typo
INTERACTIVE_JOB_NAMES = ("bash", "interactive")  # Lightning's: a session typed into, not a launched job


def srun_task(env: EnvironmentReader) -> Optional[ClusterEnvironment]:
    """This process as a task of an ``srun`` step, or None (no SLURM, or a batch / salloc shell)."""
    if env.get("SLURM_PROCID") is None:
        return None  # an salloc shell, or not SLURM at all
    if interactive_session(env):
        return None  # a shell of srun --pty bash: what is typed there is not one of the step's tasks
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
    local_world_size = tasks_on_node(tasks_per_node, node_rank)
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
        master_port=slurm_port(env),
        job_id=env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID"),
        hosts=hosts,
    )


def slurm_port(env: EnvironmentReader) -> int:
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


def tasks_on_node(tasks_per_node: Optional[str], node_rank: Optional[int]) -> Optional[int]:
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


def interactive_session(env: EnvironmentReader) -> bool:
    """A job named ``bash`` or ``interactive`` (``srun --pty bash``'s): a shell typed into, not a launched job."""
    return (env.get("SLURM_JOB_NAME") or "") in INTERACTIVE_JOB_NAMES


def slurm_job_alone(env: EnvironmentReader) -> Optional[str]:
    """Why this process of a SLURM job trains alone although its job or step has several tasks (said
    once, as a warning), or None: no SLURM, or a job of one task."""
    job_id = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    if job_id is None:
        return None
    step_tasks = env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS") or ""
    if interactive_session(env) and env.get("SLURM_PROCID") is not None and step_tasks.isdigit():
        if int(step_tasks) > 1:
            name = env.get("SLURM_JOB_NAME")
            return (
                f"This process runs in SLURM job {job_id} with task {env.get('SLURM_PROCID')}'s variables of a step "
                f"of {step_tasks} tasks, but the job is named {name!r} (SLURM_JOB_NAME), which marks an interactive "
                "session (an `srun --pty bash` shell, as Lightning reads it), not a job that srun launched: it "
                f"trains alone, as a plain process. To train as one job of {step_tasks} processes, start them with "
                f"srun under another job name: `srun --ntasks={step_tasks} --job-name=train python train.py`."
            )
        return None
    tasks = env.get("SLURM_NTASKS") or ""
    if tasks.isdigit() and int(tasks) > 1:
        return (
            f"This process runs in SLURM job {job_id}, which has {tasks} tasks, but srun did not start it (it is "
            "the job's batch script or an salloc shell), so it trains alone. To train as one job of "
            f"{tasks} processes, start the script with srun: `srun python train.py`."
        )
    return None


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


__all__ = ["expand_slurm_nodelist", "interactive_session", "slurm_job_alone", "srun_task"]
