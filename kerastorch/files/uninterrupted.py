"""Ctrl-C during a file's write, acted on once the file is whole.

A Ctrl-C (SIGINT) raises ``KeyboardInterrupt`` wherever the main thread is. Raised in the middle of
an atomic write, it leaves the old file (:mod:`.atomic`), so the training state of the epoch that
just ended would be lost, and ``fit`` would stop without it. While a write runs on the main thread,
a Ctrl-C is only recorded; it is delivered to the handler it was meant for (Python's, or the
caller's own) as soon as the write is done. A second Ctrl-C during the same write raises at once:
someone who presses it twice does not want to wait, and the write still leaves the old file whole.

Only the main thread can set signal handlers (as :mod:`~kerastorch.training.preemption` knows);
writes on other threads are left as they are (a Ctrl-C reaches the main thread, not them). A
handler that Python did not install (``signal.getsignal`` gives None) cannot be put back, so it is
left alone too.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Any, Iterator


@contextlib.contextmanager
def ctrl_c_after_the_write() -> Iterator[None]:
    """Hold a Ctrl-C that arrives inside the ``with`` until it ends (see the module docstring)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous is None:
        yield
        return
    pressed: list[int] = []

    def record(signum: int, frame: Any) -> None:
        if pressed:  # the second one: do not wait
            pressed.clear()
            raise KeyboardInterrupt
        pressed.append(signum)

    signal.signal(signal.SIGINT, record)
    try:
        yield
    except BaseException:
        # The write failed (a full disk): its error stops the run, as the Ctrl-C would have, and is the one
        # to see; delivered here, the Ctrl-C would hide it behind fit's "Interrupted" (the run's end).
        pressed.clear()
        raise
    finally:
        signal.signal(signal.SIGINT, previous)
        if pressed:
            # Delivered to the handler it was meant for: Python's raises KeyboardInterrupt here.
            signal.raise_signal(signal.SIGINT)


__all__ = ["ctrl_c_after_the_write"]
