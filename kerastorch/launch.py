"""Several devices from a notebook or a plain ``python`` process.

Inside a job started by ``torchrun`` or ``accelerate launch``, ``fit`` simply runs as
one rank. From a notebook or a plain ``python`` process, ``fit(devices=k)`` with k > 1
lands here: accelerate's ``notebook_launcher`` forks k processes from this one, each of
them replays the same ``fit`` call as one rank of the job, and the main one hands back
the history, the best weights and the optimizer's state, which this process loads into
the caller's ``model``. So the caller gets what a one-process ``fit`` gives.

Forking is what lets the net, the loss, the metrics, the optimizer and the data reach
the workers without being pickled (a lambda or a notebook class works). Its one rule:
CUDA must not have been initialised in this process before the call; see
:data:`CUDA_BEFORE_FORK`.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import pickle
import signal
import socket
import sys
import tempfile
import time
import traceback
import warnings
from typing import Any

import torch

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


class NeedsProcesses(Exception):
    """Raised by :func:`~kerastorch.runtime.build_runtime` when ``fit`` must start
    ``len(devices)`` processes; ``KerasModel.fit`` catches it and calls :func:`fit_in_processes`."""

    def __init__(self, devices: list[int], device_type: str):
        super().__init__(f"fit needs {len(devices)} processes on {device_type} devices {devices}")
        self.devices = devices
        self.device_type = device_type


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


def check_job_formed(accelerator, device_type: str) -> None:
    """In a torchrun / accelerate launch job: refuse to train alone when the job has several processes."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if accelerator.num_processes != world_size:
        raise RuntimeError(
            f"This process is one of WORLD_SIZE={world_size} processes started by torchrun or accelerate launch, "
            f"but on {device_type!r} accelerate formed a group of {accelerator.num_processes}: every process would "
            "train alone on all of the data. Several processes run on CUDA GPUs or on the CPU (gloo): pass "
            "accelerator='cpu' or 'cuda' to fit, or start a single process."
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
    from accelerate.utils import patch_environment

    from .cuda_devices import cuda_visible_devices

    # Indices as this process numbers them; the previous value comes back afterwards.
    with patch_environment(CUDA_VISIBLE_DEVICES=cuda_visible_devices(devices)):
        yield


def fit_in_processes(model, request: NeedsProcesses, fit_arguments: dict) -> Any:
    """Run ``model.fit(**fit_arguments)`` in ``len(request.devices)`` forked processes.

    When they finish, ``model.net`` holds the trained best weights (on the CPU, so
    that a later multi-process fit can fork again), the optimizer and the learning-rate
    scheduler hold the state the run left them in, and the history is returned. An
    error in a worker is raised here, with the worker's traceback as its cause.
    """
    from accelerate import notebook_launcher

    from .model_parallel import check_one_process
    from .runtime import reset_accelerate_state

    num_processes = len(request.devices)
    check_one_process(model.net, num_processes)
    check_can_fork(num_processes, request.device_type)
    reset_accelerate_state()  # the launcher refuses to fork an initialised accelerate state
    with tempfile.TemporaryDirectory(prefix="kerastorch-processes-") as folder:
        try:
            with contextlib.ExitStack() as stack:
                stack.enter_context(visible_cuda_devices(request.devices, request.device_type))
                # A worker's error reaches the caller as the exception below; torch's launcher would log it too.
                stack.enter_context(_logger_quiet("torch.distributed.elastic"))
                stack.enter_context(_logger_quiet("torch.multiprocessing"))
                # accelerate's "Launching training on 2 CUDAs." says CUDA even on a CPU; the workers say where they run.
                stack.enter_context(contextlib.redirect_stdout(_WithoutLaunchLine(sys.stdout)))
                notebook_launcher(run_one_process, args=(model, fit_arguments, folder),
                                  num_processes=num_processes, use_port=str(free_port()))
        except Exception as launch_error:
            raise worker_failure(folder, launch_error, num_processes)  # the cause shown is the worker's traceback
        results = torch.load(os.path.join(folder, RESULTS_FILE), map_location="cpu",
                             weights_only=False)  # written a moment ago by our own worker, in a private folder
    return take_results(model, results)


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


def run_one_process(model, fit_arguments: dict, folder: str) -> None:
    """What each forked process runs: the same fit, as one rank; the main one writes the results."""
    rank = int(os.environ.get("RANK", "0"))
    # accelerate gives each CPU process its share of the cores and says so; that is the plan, not news.
    warnings.filterwarnings("ignore", message="OMP_NUM_THREADS/MKL_NUM_THREADS unset")
    try:
        history = model.fit(**fit_arguments)
        if rank == 0:
            torch.save(results_of(model, history), os.path.join(folder, RESULTS_FILE))
    except BaseException as error:
        record_failure(folder, rank, error)
        raise
    finally:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def results_of(model, history) -> dict:
    from .checkpoint import cpu_state_dict

    return {
        "history": history.to_dict("records"),
        "weights": cpu_state_dict(model.net),
        "optimizer": model.optimizer.state_dict(),
        "lr_scheduler": model.lr_scheduler.state_dict() if model.lr_scheduler is not None else None,
        "stop_training": model.stop_training,
    }


def take_results(model, results: dict):
    """Load what the main worker sent back into the caller's model; return the history."""
    from .checkpoint import unwrap
    from .model import history_frame

    unwrap(model.net).load_state_dict(results["weights"])
    model.optimizer.load_state_dict(results["optimizer"])
    if results["lr_scheduler"] is not None:
        model.lr_scheduler.load_state_dict(results["lr_scheduler"])
    model.stop_training = results["stop_training"]
    model.runtime = None
    model.history = history_frame(results["history"])
    return model.history


def record_failure(folder: str, rank: int, error: BaseException) -> None:
    """Leave the worker's exception and traceback where the caller will look for them."""
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    try:
        pickled = pickle.dumps(error)
        pickle.loads(pickled)
    except Exception:  # not every exception survives pickling; the text always does
        pickled = None
    record = {"rank": rank, "time": time.time(), "traceback": text, "error": pickled}
    with contextlib.suppress(OSError):
        with open(os.path.join(folder, FAILURE_FILE.format(rank=rank)), "wb") as f:
            pickle.dump(record, f)


def worker_failure(folder: str, launch_error: Exception, num_processes: int) -> BaseException:
    """The caller's exception for a failed launch: the first worker's own error, with its traceback as cause."""
    from torch.distributed.elastic.multiprocessing.api import SignalException

    if isinstance(launch_error, SignalException):  # Ctrl-C (or a kill) reached this process: workers were stopped
        stopped = (f"Training in {num_processes} processes was stopped by {launch_error.sigval.name}; the processes "
                   "have ended and the model keeps the weights it had before this fit.")
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
        error = pickle.loads(first["error"]) if first["error"] is not None else RuntimeError(
            f"The training process with rank {first['rank']} failed; its traceback is above.")
    error.__cause__ = cause
    return error


def _is_cuda_fork_error(text: str) -> bool:
    return ("Cannot re-initialize CUDA in forked subprocess" in text
            or "CUDA error: initialization error" in text
            or "CUDA driver initialization failed" in text)
