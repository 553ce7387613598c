"""Writing a file so that a crash or a kill leaves the old file or the new one, never half of one."""

from __future__ import annotations

import contextlib
import os
import tempfile
from typing import Callable, Iterator


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[str]:
    """Yield a temporary path beside ``path``; on success it is fsynced and renamed onto ``path``.

    A ``path`` that is a symbolic link is written through to the link's target (the link stays).
    """
    path = os.path.realpath(os.fspath(path))
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=folder)
    os.close(fd)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
        with contextlib.suppress(OSError):  # make the rename itself durable
            dir_fd = os.open(folder, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def atomic_write(path: str | os.PathLike, write: Callable[[str], None]) -> None:
    with atomic_path(path) as tmp:
        write(tmp)


__all__ = ["atomic_path", "atomic_write"]
