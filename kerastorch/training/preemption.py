"""Preemption: a SIGTERM during ``fit`` (a cluster taking the machine back, ``docker stop``, a spot
instance ending), or a SIGUSR1 under SLURM (its ``--signal=USR1@seconds`` habit), ends the run like
a checkpoint, not like a crash.

While ``fit`` runs (from before the trial of a ``train_step`` of the user's own to its return) those
signals only set a flag. The loop reads it after
each training batch (a Python attribute: no device sync, nothing else per step) and, at the first
batch that ends an optimizer step (an accumulation group is finished first), writes the training
state when one is kept (``fit(resume=True, ckpt_path=...)`` or
:class:`~kerastorch.callbacks.BackupAndRestore`), puts the best weights back into the net and
raises :class:`Preempted`. Running the same command again continues from that batch, exactly. A
signal that arrives between batches (during validation) stops at the end of that epoch.

Under SLURM (``SLURM_JOB_ID`` set) with ``scontrol`` on the PATH, a SIGUSR1 requeues the job
(``scontrol requeue $SLURM_JOB_ID``, or the array task) once the state is on disk. A SIGTERM does
not requeue: ``scancel`` sends one, and requeuing would undo it (SLURM requeues jobs it preempts
itself when its ``PreemptMode`` says so). The caller's own handlers come back when fit returns;
outside the main thread (where Python cannot set handlers) nothing is installed.

Several processes must stop at the same batch, or the others would wait forever in the next
gradient exchange. They agree without a device sync: at an optimizer-step boundary every so many
batches (adapted so that it happens about twice a second), each process puts its flag into a
non-blocking all-reduce over a CPU (gloo) process group and reads the previous one's result,
which every process reads at the same batch; at the end of each epoch they agree once more,
blocking. A signal reaches a stop within about a second and one accumulation group.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import shutil
import signal
import subprocess
import threading
import time
from typing import Any, Iterator, Optional

import torch

from .callback import Callback

# How often several processes compare their flags, in seconds between checks (the batches between
# checks adapt to it).
CHECK_EVERY_SECONDS = 0.5
# What the processes' all-reduce carries for each signal (the largest wins: SIGUSR1 asks for a requeue).
SIGTERM_CODE, SIGUSR1_CODE = 1, 2
SIGNAL_NAMES = {SIGTERM_CODE: "SIGTERM", SIGUSR1_CODE: "SIGUSR1"}


def signal_code(signum: int) -> int:
    return SIGUSR1_CODE if signum == getattr(signal, "SIGUSR1", None) else SIGTERM_CODE


class Preempted(BaseException):
    """``fit`` was stopped by SIGTERM (or SIGUSR1 under SLURM): the training state, if one is kept,
    is on disk; running the same command again continues where it stopped.

    Like ``KeyboardInterrupt``, it is not an ``Exception``: ``except Exception`` blocks do not
    swallow it, and a script ends with a non-zero status. In a notebook it shows as one line.

    Example::

        try:
            model.fit(dl_train, dl_val, epochs=20, callbacks=[kt.callbacks.BackupAndRestore("backup")])
        except kt.Preempted as stop:
            print(stop)   # where the state is; exit, and run the same script again later
            raise
    """

    def _render_traceback_(self) -> list[str]:  # IPython shows this instead of a traceback
        return [f"{type(self).__name__}: {self}", *getattr(self, "__notes__", [])]


Preempted.__module__ = "kerastorch"  # where it is imported from (and pickled by name, between processes)


def preemption_signals() -> list[signal.Signals]:
    """SIGTERM, and SIGUSR1 when the process runs in a SLURM job."""
    watched = [signal.SIGTERM]
    if os.environ.get("SLURM_JOB_ID") and hasattr(signal, "SIGUSR1"):
        watched.append(signal.SIGUSR1)
    return watched


class Preemption(Callback):
    """Turns the preemption signals into a stop at an optimizer-step boundary (see the module docstring).

    ``fit`` adds one to every run; the loop reads :attr:`requested` after each training batch and
    calls :meth:`stop`. A training state registers itself with :meth:`keep_state_with`.
    """

    # Last: the processes agree on a stop after every other callback's batch end.
    order = 120

    def __init__(self, runtime: Any):
        self.runtime = runtime
        self.requested = False  # the loop stops at the next optimizer-step boundary
        self.signal_code = 0  # this process's signal: 0 (none), SIGTERM_CODE or SIGUSR1_CODE
        self.agreed_code = 0  # the processes' agreed signal
        self.state: Any = None  # the training state that writes itself before the stop

    # -- handlers -------------------------------------------------------------------------------

    @contextlib.contextmanager
    def signals_watched(self) -> Iterator[None]:
        """The preemption signals set this watch's flag inside the block; the caller's handlers come
        back after it (outside the main thread, where Python sets no handlers, nothing changes)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {signum: signal.signal(signum, self._on_signal) for signum in preemption_signals()}
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler if handler is not None else signal.SIG_DFL)

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.signal_code = max(self.signal_code, signal_code(signum))
        self.requested = True

    # -- the stop ------------------------------------------------------------------------------

    def keep_state_with(self, state: Any) -> None:
        """``state`` (a training state) writes itself, with :meth:`save_for_preemption`, before the stop."""
        self.state = state

    def requested_anywhere(self) -> bool:
        """At the end of an epoch: did any process get a signal? (All processes call it.)"""
        self.agreed_code = max(self.agreed_code, self.signal_code)
        return self.requested

    def stop(self, epoch: int, batches: int) -> None:
        """Write the training state (``batches`` trained of ``epoch``; 0: before it began), requeue under
        SLURM, raise :class:`Preempted`. Every process calls it at the same batch."""
        where = f"after batch {batches} of epoch {epoch}" if batches else f"after epoch {epoch - 1}"
        if epoch == 1 and not batches:
            where = "before training began"
        code = self.agreed_code or self.signal_code
        name = SIGNAL_NAMES.get(code, "a signal")
        if self.state is None:
            raise Preempted(
                f"Training stopped by {name} {where}. No training state is kept, so a new run starts over: pass "
                "ckpt_path=... with resume=True, or callbacks=[kt.callbacks.BackupAndRestore('backup')], to continue "
                "where it stopped."
            )
        path = self.state.save_for_preemption(epoch, batches)
        self.runtime.wait_for_everyone()  # the state is on disk before any process ends
        requeued = ""
        if code == SIGUSR1_CODE and self.runtime.is_main_process:
            requeued = requeue_slurm_job()
        raise Preempted(
            f"Training stopped by {name} {where}; its state is in {path!r}. Run the same command again to continue "
            f"from there.{requeued}"
        )


class SharedPreemption(Preemption):
    """:class:`Preemption` for several processes: they agree, without a device sync, on the batch
    where they stop (see the module docstring)."""

    def __init__(self, runtime: Any):
        super().__init__(runtime)
        self.group: Any = None
        self._work: Any = None
        self._message: Optional[torch.Tensor] = None
        self._interval, self._since_check, self._last_check = 1, 0, 0.0

    def on_train_begin(self, logs: Optional[dict] = None) -> None:
        self._work, self._interval, self._since_check = None, 1, 0
        self._last_check = time.monotonic()
        if self.group is None:  # every process creates it, at the same point
            self.group = torch.distributed.new_group(backend="gloo")

    def on_train_end(self, logs: Optional[dict] = None) -> None:
        if self._work is None and self.group is not None:  # never in the middle of an exchange
            torch.distributed.destroy_process_group(self.group)
            self.group = None

    def _on_signal(self, signum: int, frame: Any) -> None:
        # Only this process's flag: the processes stop together, at the batch they agree on.
        self.signal_code = max(self.signal_code, signal_code(signum))

    def on_train_batch_end(self, batch: int, logs: Optional[dict] = None) -> None:
        self._since_check += 1
        step = getattr(self.model, "fit_step", None)
        if self._since_check < self._interval or (step is not None and not step.updates_now):
            return
        self._since_check = 0
        self._take_previous_answer()
        now = time.monotonic()
        proposal = 0.0
        if self.runtime.is_main_process:  # the main process sizes the next interval; the others follow it
            elapsed = max(now - self._last_check, 1e-6)
            proposal = float(min(max(round(self._interval * CHECK_EVERY_SECONDS / elapsed), 1), 100_000))
        self._last_check = now
        self._message = torch.tensor([float(self.signal_code), proposal], dtype=torch.float64)
        self._work = torch.distributed.all_reduce(
            self._message, op=torch.distributed.ReduceOp.MAX, group=self.group, async_op=True
        )

    def requested_anywhere(self) -> bool:
        self._take_previous_answer()
        message = torch.tensor([float(self.signal_code), 0.0], dtype=torch.float64)
        torch.distributed.all_reduce(message, op=torch.distributed.ReduceOp.MAX, group=self.group)
        self._agree(int(message[0]))
        return self.requested

    def _take_previous_answer(self) -> None:
        if self._work is None:
            return
        self._work.wait()
        self._work = None
        code, interval = (int(v) for v in self._message.tolist()) if self._message is not None else (0, 0)
        self._agree(code)
        if interval:
            self._interval = interval

    def _agree(self, code: int) -> None:
        if code:
            self.agreed_code = max(self.agreed_code, code)
            self.requested = True


def preemption_for(runtime: Any) -> Preemption:
    """The preemption watch of a run: shared between processes when there are several."""
    return SharedPreemption(runtime) if runtime.num_processes > 1 else Preemption(runtime)


def requeue_slurm_job() -> str:
    """``scontrol requeue`` this SLURM job (or array task); what to add to the message about it."""
    job = os.environ.get("SLURM_JOB_ID")
    scontrol = shutil.which("scontrol")
    if not job or scontrol is None:
        return ""
    array_job, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    target = f"{array_job}_{task}" if array_job and task else job
    try:
        result = subprocess.run([scontrol, "requeue", target], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as error:
        return f" Requeuing SLURM job {target} failed ({error}): requeue it yourself."
    if result.returncode != 0:
        reason = (result.stderr or result.stdout).strip().splitlines()
        return f" Requeuing SLURM job {target} failed ({reason[-1] if reason else result.returncode}): requeue it yourself."
    return f" SLURM job {target} was requeued."


@contextlib.contextmanager
def signals_passed_to_workers() -> Iterator[None]:
    """While ``fit(devices=k)`` waits for the worker processes it forked: a SIGUSR1 (under SLURM) is
    passed on to them, so that they stop as preempted. (A SIGTERM is passed on by torch's launcher.)"""
    watched = [s for s in preemption_signals() if s != signal.SIGTERM]
    if not watched or threading.current_thread() is not threading.main_thread():
        yield
        return

    def pass_on(signum: int, frame: Any) -> None:
        for child in multiprocessing.active_children():
            with contextlib.suppress(OSError):
                if child.pid:
                    os.kill(child.pid, signum)

    previous = {signum: signal.signal(signum, pass_on) for signum in watched}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)


__all__ = ["Preempted", "Preemption", "SharedPreemption", "preemption_for", "requeue_slurm_job"]
