"""The processes of a job meet before they train: who is awaited, and for how long.

torch's ``env://`` rendezvous (what accelerate forms the process group with) waits for every rank
at ``MASTER_ADDR:MASTER_PORT`` for half an hour, saying nothing: a rank that was never started (a
typo in ``--ntasks``, a pod still pending, a script run by hand with a launcher's variables) leaves
the others silent for 30 minutes, then a message about clients and stores. So, in a job that SLURM,
an MPI, a Kubeflow ``PyTorchJob`` or plain ``RANK`` / ``WORLD_SIZE`` variables started, the ranks
first meet on the same store that torch's rendezvous uses next (its server, on rank 0, is shared:
``multi_tenant``), and:

- rank 0 counts who has come, and after :data:`SAY_AFTER_S` seconds (or half the limit, if
  shorter) says who is awaited (the ranks missing, where they should come); the other ranks say,
  after as long, that they wait for rank 0 at its address;
- every rank gives up after ``KERASTORCH_RENDEZVOUS_TIMEOUT`` seconds (:data:`DEFAULT_TIMEOUT_S`
  by default), with an error that says who came, who did not, what to check and what to set.

Once all have met, torch's own rendezvous follows at once, and the run's collective operations
keep torch's timeouts: the limit is the meeting's only. torchrun's and ``accelerate launch``'s
workers (and those ``fit(devices=k)`` starts) met in their launcher's rendezvous already, and Ray
Train's have their process group: they do not meet here.

Example: ``KERASTORCH_RENDEZVOUS_TIMEOUT=1800 srun python train.py`` waits up to half an hour.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import os
import sys
import time
from typing import Any, Callable, Iterator, Optional

import torch

from .cluster import ClusterEnvironment

TIMEOUT_VARIABLE = "KERASTORCH_RENDEZVOUS_TIMEOUT"
DEFAULT_TIMEOUT_S = 600.0  # pods of a Kubeflow job or nodes of a SLURM step may start minutes apart
SAY_AFTER_S = 10.0  # a meeting longer than this is said, with who is awaited
POLL_S = 0.05
MEETS_HERE = ("slurm", "mpi", "kubeflow", "env")  # launchers that leave the meeting to torch's rendezvous
_JOINED = "kerastorch/rendezvous/joined"
_RANK_JOINED = "kerastorch/rendezvous/rank{}"
_ALL_MET = "kerastorch/rendezvous/met"
_GAVE_UP = "kerastorch/rendezvous/gave_up"


class RendezvousTimeout(RuntimeError):
    """The processes of a job did not all meet within the time limit."""


def rendezvous_timeout(environ: Optional[dict] = None) -> float:
    """The meeting's time limit in seconds: ``KERASTORCH_RENDEZVOUS_TIMEOUT``, else :data:`DEFAULT_TIMEOUT_S`."""
    value = (os.environ if environ is None else environ).get(TIMEOUT_VARIABLE, "").strip()
    if not value:
        return DEFAULT_TIMEOUT_S
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise ValueError(
            f"{TIMEOUT_VARIABLE}={value!r}: give the seconds the processes of a job may take to meet, e.g. "
            f"{TIMEOUT_VARIABLE}=1800 (the default is {DEFAULT_TIMEOUT_S:.0f})."
        )
    return seconds


@contextlib.contextmanager
def processes_met(
    cluster: ClusterEnvironment, say: Callable[[str], Any] = functools.partial(print, file=sys.stderr, flush=True)
) -> Iterator[None]:
    """Meet the job's other processes (see the module's note), then let the process group form inside
    the block: rank 0 keeps the store's server open until then, for torch's rendezvous to use. The
    wait is said (``say``, on stderr by default: it goes to the job's log even while stdout is taken)."""
    if not cluster.is_job or cluster.name not in MEETS_HERE:
        yield
        return
    limit = rendezvous_timeout()
    store = _meet(cluster, limit, say)
    try:
        yield
    finally:
        del store  # torch's process group holds the server now (rank 0), or needs no client of ours


def _meet(cluster: ClusterEnvironment, limit: float, say) -> torch.distributed.TCPStore:
    where = f"{cluster.master_addr}:{cluster.master_port}"
    job = cluster.describe()
    started = time.monotonic()
    timeout = datetime.timedelta(seconds=limit)
    store = _store(cluster, timeout, min(SAY_AFTER_S, limit / 2), started, say)
    store.add(_JOINED, 1)
    store.set(_RANK_JOINED.format(cluster.rank), "1")
    said, say_after = False, min(SAY_AFTER_S, limit / 2)
    while True:
        waited = time.monotonic() - started
        if cluster.rank == 0 and int(store.add(_JOINED, 0)) >= cluster.world_size:
            store.set(_ALL_MET, "1")
            return store
        if cluster.rank != 0 and store.check([_ALL_MET]):
            return store
        if cluster.rank != 0 and store.check([_GAVE_UP]):
            raise RendezvousTimeout(
                f"{job}: rank 0 gave up waiting for the job's other processes at {where} ({_missing(store, cluster)} "
                f"did not come). {_what_to_check(cluster, limit)}"
            )
        if waited > limit:
            if cluster.rank == 0:
                store.set(_GAVE_UP, "1")
                joined = int(store.add(_JOINED, 0))
                raise RendezvousTimeout(
                    f"{job}: the job's {cluster.world_size} processes did not all meet at {where} within "
                    f"{limit:.0f} s: {joined} of {cluster.world_size} came; {_missing(store, cluster)} did not. "
                    + _what_to_check(cluster, limit)
                )
            raise RendezvousTimeout(
                f"{job}: rank 0 did not say that all {cluster.world_size} processes met at {where} within {limit:.0f} "
                "s. " + _what_to_check(cluster, limit)
            )
        if not said and waited > say_after:
            said = True
            if cluster.rank == 0:
                say(
                    f"kerastorch: {job} waits for {_missing(store, cluster)} at {where} "
                    f"({int(store.add(_JOINED, 0))} of {cluster.world_size} came); giving up after {limit:.0f} s "
                    f"({TIMEOUT_VARIABLE})."
                )
        time.sleep(POLL_S)


def _store(
    cluster: ClusterEnvironment, timeout: datetime.timedelta, say_after: float, started: float, say
) -> torch.distributed.TCPStore:
    """Rank 0 serves the store (shared with torch's rendezvous that follows); the others connect, saying
    after a while that they wait for rank 0."""
    use_libuv = os.environ.get("USE_LIBUV", "1") == "1"  # as torch's env:// rendezvous reads it
    host, port = cluster.master_addr, cluster.master_port
    if cluster.rank == 0:
        return torch.distributed.TCPStore(
            host,
            port,
            cluster.world_size,
            True,
            timeout,
            wait_for_workers=False,
            multi_tenant=True,
            use_libuv=use_libuv,
        )
    first_try = datetime.timedelta(seconds=say_after)
    try:
        return torch.distributed.TCPStore(host, port, cluster.world_size, False, first_try, use_libuv=use_libuv)
    except RuntimeError:
        left = timeout.total_seconds() - (time.monotonic() - started)
        say(
            f"kerastorch: {cluster.describe()} waits for rank 0 at {host}:{port}; giving up after "
            f"{timeout.total_seconds():.0f} s ({TIMEOUT_VARIABLE})."
        )
    try:
        return torch.distributed.TCPStore(
            host, port, cluster.world_size, False, datetime.timedelta(seconds=max(left, 1.0)), use_libuv=use_libuv
        )
    except RuntimeError as error:
        raise RendezvousTimeout(
            f"{cluster.describe()}: rank 0 could not be reached at {host}:{port} within {timeout.total_seconds():.0f} "
            f"s ({type(error).__name__}). " + _what_to_check(cluster, timeout.total_seconds())
        ) from None


def _missing(store: torch.distributed.TCPStore, cluster: ClusterEnvironment) -> str:
    """The ranks that have not come yet, in words: ``rank 1``, ``ranks 1, 2, 5 and 12 more``."""
    missing = [rank for rank in range(cluster.world_size) if not store.check([_RANK_JOINED.format(rank)])]
    if not missing:
        return "no rank"
    shown = ", ".join(str(rank) for rank in missing[:8])
    more = f" and {len(missing) - 8} more" if len(missing) > 8 else ""
    return f"rank{'s' if len(missing) > 1 else ''} {shown}{more}"


def _what_to_check(cluster: ClusterEnvironment, limit: float) -> str:
    started_by = {
        "slurm": "that srun started every task (srun --ntasks), and that a script typed into an interactive shell "
        "is not read as one task of its step (a job named bash or interactive trains alone)",
        "mpi": "that mpirun started every rank, and exported MASTER_ADDR to all of them",
        "kubeflow": "that every pod of the PyTorchJob is running (a pending pod has not started its process)",
        "env": "that every process was started with its own RANK, and the same WORLD_SIZE, MASTER_ADDR and MASTER_PORT",
    }.get(cluster.name, "that every process of the job was started")
    return (
        f"Check {started_by}, and that {cluster.master_addr}:{cluster.master_port} is reachable from every process. "
        f"If they only need longer to start, set {TIMEOUT_VARIABLE} to more seconds (now {limit:.0f})."
    )


__all__ = ["DEFAULT_TIMEOUT_S", "TIMEOUT_VARIABLE", "RendezvousTimeout", "processes_met", "rendezvous_timeout"]
