"""A file only the main process may have, read there and handed to every process.

In a job of several processes only the main one (rank 0) writes the training state. On
machines without a shared filesystem the other ranks have no copy, or an old one, of what
it wrote: if every rank read its own, the ranks would resume at different epochs and wait
for each other forever. So rank 0 alone decides whether the file exists and reads it, and
every rank gets what it read, as if they all shared its disk.
"""

from __future__ import annotations

import os
from typing import Callable, Optional, TypeVar

import torch

T = TypeVar("T")


def read_on_main_process(path: str, read: Callable[[str], T]) -> Optional[T]:
    """``read(path)`` on rank 0, or None when rank 0 has no file at ``path``; the same on every rank.

    A collective in a process group of several processes (every rank must call it, at the
    same point); a plain read in one process. An error reading the file on rank 0 is raised
    there and, with rank 0's message, on every other rank, so that none waits alone.

    >>> read_on_main_process("no-such-file.state", open) is None
    True
    """
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return read(path) if os.path.exists(path) else None
    box: list = [None]
    error: Optional[BaseException] = None
    if dist.get_rank() == 0:
        try:
            box = [("read", read(path) if os.path.exists(path) else None)]
        except Exception as raised:  # told to the other ranks, then raised here
            error = raised
            box = [("failed", f"{type(raised).__name__}: {raised}")]
    # The state holds only plain values and tensors, read without running code; pickling it here
    # only carries it from this job's rank 0 to its other ranks.
    dist.broadcast_object_list(box, src=0)
    outcome, value = box[0]
    if error is not None:
        raise error
    if outcome == "failed":
        raise RuntimeError(
            f"The main process (rank 0) could not read its copy of the file, so this rank stops too: {value}"
        )
    return value


__all__ = ["read_on_main_process"]
