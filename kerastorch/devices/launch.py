"""k worker processes from a notebook or a plain ``python`` process, and results back.

Inside a job started by ``torchrun`` or ``accelerate launch``, ``fit`` simply runs as
one rank. From a notebook or a plain ``python`` process, a plan that runs in
``"workers"`` (``fit(devices=k)`` with k > 1) comes here: accelerate's
``notebook_launcher`` forks k processes from this one, each runs the work it was
given (the same fit, as one rank of the job), and what the main one returns comes
back to the caller (:mod:`kerastorch.run` loads it into the caller's model).

Forking is what lets the net, the loss, the metrics, the optimizer and the data reach
the workers without being pickled (a lambda or a notebook class works). Its one rule:
CUDA must not have been initialised in this process before the call; see
:data:`CUDA_BEFORE_FORK`.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import multiprocessing
import os
import pickle
import random
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
import warnings
from typing import Any, Callable, Optional

import torch
from accelerate import notebook_launcher
from accelerate.utils import patch_environment
from torch.distributed.elastic.multiprocessing.api import SignalException

from ..strategies import cpu_state_dict, unwrap
from .cuda import cuda_visible_devices
from .plan import Plan
from .runtime import reset_accelerate_state

RESULTS_FILE = "results.pt"
FAILURE_FILE = "failure-rank{rank}.pkl"

CUDA_BEFORE_FORK = (
    "fit(devices={k}) starts {k} processes by forking this one, and CUDA was already initialised here, which a "
    "forked process cannot use. Something ran on the GPU before this call: a tensor or net moved with .cuda() or "
    ".to('cuda'), a torch.cuda call such as torch.cuda.is_available() or get_device_name(), or an earlier "
    "fit on one GPU. Restart the kernel (or the python process) and, before fit(devices={k}), keep the net and "
    "the data on the CPU (fit moves them), and ask for GPUs only through NVML: set "
    "os.environ['PYTORCH_NVML_BASED_CUDA_CHECK'] = '1' before calling torch.cuda.is_available(). Or put the code "
    "in a script and run `accelerate launch --num_processes {k} train.py`."
)


class WorkerTraceback(Exception):
    """The traceback of a failure in a training process, shown as the cause of the caller's error."""

    def __str__(self) -> str:
        return "\n\n" + self.args[0]


def several_devices_error(chosen: list[int], device_type: str) -> Exception:
    """Why several devices cannot be used from this process, and what to do instead."""
    return RuntimeError(
        f"devices={chosen} asks for {len(chosen)} {device_type} devices, which needs {len(chosen)} processes, and "
        "this platform cannot fork them from here. Start the script with `accelerate launch --num_processes "
        f"{len(chosen)} script.py` or `torchrun --nproc_per_node {len(chosen)} script.py`, or pass devices=1."
    )


def free_port() -> int:
    """A TCP port no one listens on now (the OS picks it), for the processes to meet on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def check_can_fork(num_processes: int, device_type: str) -> None:
    """Fail before anything starts when forking k workers cannot work here."""
    if "fork" not in multiprocessing.get_all_start_methods():
        raise several_devices_error(list(range(num_processes)), device_type)
    if device_type == "cuda" and torch.cuda.is_initialized():
        raise RuntimeError(CUDA_BEFORE_FORK.format(k=num_processes))


@contextlib.contextmanager
def visible_cuda_devices(devices: list[int], device_type: str):
    """Show the workers only the chosen GPUs (``devices=[1, 3]``): worker i uses the i-th of them."""
    if device_type != "cuda" or devices == list(range(len(devices))):
        yield
        return
    # Indices as this process numbers them; the previous value comes back afterwards.
    with patch_environment(CUDA_VISIBLE_DEVICES=cuda_visible_devices(devices)):
        yield


def run_in_workers(plan: Plan, work: Callable[[], Any]) -> Any:
    """Run ``work()`` in ``len(plan.devices)`` forked processes; return what the main one's returned.

    ``work`` reaches the workers by forking, not pickling, so it may hold anything a
    notebook defined. An error in a worker is raised here, with the worker's traceback
    as its cause; Ctrl-C stops every worker and raises ``KeyboardInterrupt``.
    """
    num_processes = len(plan.devices)
    check_can_fork(num_processes, plan.device_type)
    reset_accelerate_state()  # the launcher refuses to fork an initialised accelerate state
    with tempfile.TemporaryDirectory(prefix="kerastorch-processes-") as folder:
        try:
            with contextlib.ExitStack() as stack:
                stack.enter_context(callers_signal_handlers())
                stack.enter_context(garbage_left_here())
                stack.enter_context(visible_cuda_devices(list(plan.devices), plan.device_type))
                # A worker's error reaches the caller as the exception below; torch's launcher would log it too.
                stack.enter_context(_logger_quiet("torch.distributed.elastic"))
                stack.enter_context(_logger_quiet("torch.multiprocessing"))
                # accelerate's "Launching training on 2 CUDAs." says CUDA even on a CPU; the workers say where they run.
                stack.enter_context(contextlib.redirect_stdout(_WithoutLaunchLine(sys.stdout)))
                notebook_launcher(
                    run_one_process,
                    args=(work, folder, random.getstate()),
                    num_processes=num_processes,
                    use_port=str(free_port()),
                )
        except Exception as launch_error:
            # A SIGTERM to this process reaches the workers through torch's launcher, which then raises
            # here; workers that stopped as preempted have sent their results all the same.
            preempted = results_in(folder) if isinstance(launch_error, SignalException) else None
            if preempted is not None and preempted["preempted"] is not None:
                return preempted
            failure = worker_failure(folder, launch_error, num_processes)
            raise failure from failure.__cause__  # the cause shown is the worker's traceback
        results = results_in(folder)
        if results is None:
            raise RuntimeError(f"The {num_processes} training processes ended without sending their results back.")
        return results


def results_in(folder: str) -> Optional[dict]:
    """What the main worker sent back, or None if it sent nothing. Written a moment ago by our own
    worker, in a private folder, under another name first: a file of that name is whole."""
    path = os.path.join(folder, RESULTS_FILE)
    if not os.path.exists(path):
        return None
    return torch.load(path, map_location="cpu", weights_only=False)


@contextlib.contextmanager
def garbage_left_here():
    """Fork the workers from a process without garbage, and keep them from collecting what they inherit.

    An earlier launch leaves garbage behind (after an error, in reference cycles through its
    traceback): torch elastic's agent and its TCP store, whose server thread runs in this process
    only. A worker that collected its copy would wait forever for that thread to stop (a second
    ``fit(devices=k)`` after a failed one hung). So the garbage is collected here first, where its
    threads run, and what exists when the workers fork is frozen out of their collections."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@contextlib.contextmanager
def callers_signal_handlers():
    """torch elastic installs its own handlers for SIGINT, SIGTERM, SIGHUP and SIGQUIT while the
    workers run (Ctrl-C stops them all) and leaves them: a later fit in this process would raise its
    ``SignalException`` on Ctrl-C instead of returning the history so far. The caller's come back."""
    names = os.environ.get("TORCHELASTIC_SIGNALS_TO_HANDLE", "SIGTERM,SIGINT,SIGHUP,SIGQUIT").split(",")
    signals = [getattr(signal, name.strip(), None) for name in names]
    saved = {sig: signal.getsignal(sig) for sig in signals if sig is not None}
    try:
        yield
    finally:
        if threading.current_thread() is threading.main_thread():  # where handlers can be set (and were)
            for sig, handler in saved.items():
                if handler is not None:  # None: a handler not set from Python, which cannot be put back
                    signal.signal(sig, handler)


class _WithoutLaunchLine:
    """stdout, minus accelerate's launch announcement (``print`` writes the line and its newline apart)."""

    def __init__(self, stream):
        self._stream = stream
        self._drop_newline = False

    def write(self, text: str) -> int:
        if text.startswith("Launching training on"):
            self._drop_newline = True
            return len(text)
        if self._drop_newline and text == "\n":
            self._drop_newline = False
            return len(text)
        self._drop_newline = False
        return self._stream.write(text)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


@contextlib.contextmanager
def _logger_quiet(name: str):
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def run_one_process(work: Callable[[], Any], folder: str, python_random: Any = None) -> None:
    """What each forked process runs: the work, as one rank; the main one writes what it returned."""
    rank = int(os.environ.get("RANK", "0"))
    if python_random is not None:  # python reseeds `random` in a forked child; keep the caller's (seed_everything's)
        random.setstate(python_random)
    # accelerate gives each CPU process its share of the cores and says so; that is the plan, not news.
    warnings.filterwarnings("ignore", message="OMP_NUM_THREADS/MKL_NUM_THREADS unset")
    try:
        result = work()
        if rank == 0:  # written whole, then named: the caller reads a whole file or none
            torch.save(result, os.path.join(folder, RESULTS_FILE + ".partial"))
            os.replace(os.path.join(folder, RESULTS_FILE + ".partial"), os.path.join(folder, RESULTS_FILE))
    except BaseException as error:
        record_failure(folder, rank, error)
        if type(error).__name__ == "Preempted":  # an ending, not a failure: the caller raises it once, from the record
            raise SystemExit(1) from None  # (an exception would have each worker print its traceback)
        raise
    finally:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def record_failure(folder: str, rank: int, error: BaseException) -> None:
    """Leave the worker's exception and traceback where the caller will look for them."""
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    try:
        pickled = pickle.dumps(error)
        pickle.loads(pickled)
    except Exception:  # not every exception survives pickling; the text always does
        pickled = None
    record = {"rank": rank, "time": time.time(), "traceback": text, "error": pickled}
    with contextlib.suppress(OSError), open(os.path.join(folder, FAILURE_FILE.format(rank=rank)), "wb") as f:
        pickle.dump(record, f)


def worker_failure(folder: str, launch_error: Exception, num_processes: int) -> BaseException:
    """The caller's exception for a failed launch: the first worker's own error, with its traceback as cause."""
    preempted = preempted_worker(folder)
    if preempted is not None:  # the workers stopped as preempted (their state written): say so, as one process would
        return preempted
    if isinstance(launch_error, SignalException):  # Ctrl-C (or a kill) reached this process: workers were stopped
        stopped = (
            f"Training in {num_processes} processes was stopped by {launch_error.sigval.name}; the processes "
            "have ended and the model keeps the weights it had before this fit."
        )
        return KeyboardInterrupt(stopped) if launch_error.sigval == signal.SIGINT else RuntimeError(stopped)
    records = []
    for name in os.listdir(folder):
        if name.startswith("failure-rank"):
            with open(os.path.join(folder, name), "rb") as f:
                records.append(pickle.load(f))
    if not records:  # killed without a Python exception (out of memory, a signal) or failed to start
        return RuntimeError(
            f"The {num_processes} training processes did not finish: {launch_error}. A process that dies without "
            "a Python error was usually killed for memory; try a smaller batch_size or fewer devices."
        )
    first = min(records, key=lambda r: r["time"])  # the others usually fail because it did
    cause = WorkerTraceback(f"Traceback of the training process with rank {first['rank']}:\n{first['traceback']}")
    if _is_cuda_fork_error(first["traceback"]):
        error: BaseException = RuntimeError(CUDA_BEFORE_FORK.format(k=num_processes))
    else:
        error = (
            pickle.loads(first["error"])
            if first["error"] is not None
            else RuntimeError(f"The training process with rank {first['rank']} failed; its traceback is above.")
        )
    error.__cause__ = cause
    return error


def preempted_worker(folder: str) -> BaseException | None:
    """The ``kerastorch.Preempted`` a worker ended with, or None (known by name: launching needs nothing of training)."""
    for name in sorted(os.listdir(folder)):
        if name.startswith("failure-rank"):
            with open(os.path.join(folder, name), "rb") as f:
                record = pickle.load(f)
            error = pickle.loads(record["error"]) if record["error"] is not None else None
            if type(error).__name__ == "Preempted":
                return error
    return None


def _is_cuda_fork_error(text: str) -> bool:
    return (
        "Cannot re-initialize CUDA in forked subprocess" in text
        or "CUDA error: initialization error" in text
        or "CUDA driver initialization failed" in text
    )


# -- the results a run in workers sends back ------------------------------------------------------


def results_of(model: Any, history_rows: list[dict], preempted: Optional[BaseException] = None) -> dict:
    """What the main worker sends back: the history's rows, the best weights, the optimizer's and
    scheduler's states, whether it stopped, the ``Preempted`` it stopped with, if any, and the run's
    report (``model.diagnose()``)."""
    return {
        "history": history_rows,
        "weights": cpu_state_dict(model.net),
        "optimizer": model.optimizer.state_dict(),
        "lr_scheduler": model.lr_scheduler.state_dict() if model.lr_scheduler is not None else None,
        "stop_training": model.stop_training,
        "preempted": preempted,
        "report": getattr(model, "fit_report", None),
    }


def take_results(model: Any, results: dict) -> list[dict]:
    """Load what the main worker sent back into the caller's model; return the history's rows (the
    caller raises ``results["preempted"]``, when set, once it has them)."""
    unwrap(model.net).load_state_dict(results["weights"])
    model.optimizer.load_state_dict(results["optimizer"])
    if model.lr_scheduler is not None and results["lr_scheduler"] is not None:
        model.lr_scheduler.load_state_dict(results["lr_scheduler"])
    model.stop_training = results["stop_training"]
    model.fit_report = results.get("report")
    model.runtime = None
    return results["history"]
