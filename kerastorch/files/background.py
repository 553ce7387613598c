"""A file written on a thread of its own while training goes on.

Writing a checkpoint is mostly waiting: for the disk to take the bytes (``fsync``) and for the
rename. Done on the training thread, each better epoch stops training for that long — a few
milliseconds for a small net, seconds for a large one. On a thread of its own the write overlaps
the next epoch, and whoever needs the file whole (the next write, a training state that names it,
the end of ``fit``) waits for it with :meth:`BackgroundWrite.wait`.

What runs on the thread must compute nothing with torch (copies, clones, casts): a thread that has
run such an op may keep a team of OpenMP threads of its own while it lives, and on a 2-core machine
the training loop ran at less than half its speed beside one (``benchmarks/thread_beside.py``). So
the writer gets tensors ready to write (the caller copies on the training thread), and a thread
lives for one write only, never as a standing worker.

The thread is not a daemon: a program that ends while a write is under way (Ctrl-C in a script, a
preempted run) first lets it finish, and the write itself is atomic (:mod:`.atomic`), so the file is
the old one or the new one, never half of one.
"""

from __future__ import annotations

import threading
from typing import Callable, Optional


class BackgroundWrite:
    """Run ``write()`` on a thread now; :meth:`wait` returns when it is done, raising what it raised."""

    def __init__(self, write: Callable[[], None], name: str = "kerastorch-write"):
        self._error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._run, args=(write,), name=name)
        self._thread.start()

    def _run(self, write: Callable[[], None]) -> None:
        try:
            write()
        except BaseException as error:  # handed to the thread that waits, which reports it
            self._error = error

    def wait(self) -> None:
        """Block until the write is done; raise its error, once, in the waiting thread."""
        self._thread.join()
        error, self._error = self._error, None
        if error is not None:
            raise error


__all__ = ["BackgroundWrite"]
