"""Files written on a thread of their own while training goes on.

Writing a checkpoint is mostly waiting: for the disk to take the bytes (``fsync``) and for the
rename. Done on the training thread, each better epoch stops training for that long — a few
milliseconds for a small net, seconds for a large one. On a thread of its own the write overlaps
the next epoch, and whoever needs the file whole (the next write, a training state that names it,
the end of ``fit``) waits for it with :meth:`BackgroundWriter.wait`.

The thread is started at the first write and lives until :meth:`BackgroundWriter.close` (the end of
``fit``): starting a thread costs the training thread about 0.2 ms (``Thread.start`` waits until the
new thread runs), handing the next write to a standing one far less. Between writes it waits, using no
CPU.

What runs on the thread must compute nothing with torch (copies, clones, casts): a thread that has
run such an op keeps a team of OpenMP threads of its own while it lives, and on a 2-core machine
the training loop ran at less than half its speed beside one (``benchmarks/thread_beside.py``). So
the writer gets tensors ready to write (the caller copies on the training thread);
``tests/callbacks/test_checkpoint_writes.py`` records the ops the thread calls.

The thread is not a daemon: a program that ends while a write is under way (Ctrl-C in a script, a
preempted run) first lets it finish, and the write itself is atomic (:mod:`.atomic`), so the file is
the old one or the new one, never half of one.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Optional


class BackgroundWriter:
    """Runs one write at a time on a thread of its own; :meth:`wait` returns when the last is done,
    raising what it raised."""

    def __init__(self, name: str = "kerastorch-write"):
        self.name = name
        self._executor: Optional[ThreadPoolExecutor] = None  # of one thread, started at the first write
        self._writing: Optional[Future] = None

    def start(self, write: Callable[[], None]) -> None:
        """Run ``write()`` on the thread, after the write under way (wait for it first to hear of its error)."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=self.name)
        self._writing = self._executor.submit(write)

    def wait(self) -> None:
        """Block until the last write is done; raise its error, once, in the waiting thread."""
        writing, self._writing = self._writing, None
        if writing is not None:
            writing.result()

    def close(self) -> None:
        """Wait for the last write, then let the thread go (a later write starts another)."""
        try:
            self.wait()
        finally:
            executor, self._executor = self._executor, None
            if executor is not None:
                executor.shutdown(wait=True)


__all__ = ["BackgroundWriter"]
