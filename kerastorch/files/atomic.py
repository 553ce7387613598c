"""Writing a file so that a crash or a kill leaves the old file or the new one, never half of one."""

from __future__ import annotations

import contextlib
import glob
import os
import secrets
import stat
from typing import Callable, Iterator, Optional

from .uninterrupted import ctrl_c_after_the_write


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[str]:
    """Yield a temporary path beside ``path``; on success it is fsynced and renamed onto ``path``.

    A ``path`` that is a symbolic link is written through to the link's target (the link stays).
    The file gets the mode of the file it replaces, or else the one ``open(path, "w")`` would give.
    A Ctrl-C on the main thread is acted on once the file is whole (:mod:`.uninterrupted`).
    """
    path = os.path.realpath(os.fspath(path))
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    with ctrl_c_after_the_write():
        tmp, mode = _create_temporary_file(path)
        try:
            yield tmp
            with open(tmp, "rb") as f:  # read-only: fsync needs no write permission
                os.fsync(f.fileno())
            # Last, once written: a writer may have put its own file there (safetensors writes one with mode
            # 0600 and renames it onto ``tmp``), and a read-only mode kept from the old file (0444) would have
            # kept the writer out. The final file gets the mode chosen here all the same.
            if stat.S_IMODE(os.stat(tmp).st_mode) != mode:
                os.chmod(tmp, mode)
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


def _create_temporary_file(path: str) -> tuple[str, int]:
    """An empty ``.<name>.<random>.tmp`` beside ``path``, and the mode the final file gets.

    Not ``tempfile.mkstemp``: its files are 0600, so every checkpoint would end up unreadable to the
    group and others whatever the umask (``torch.save`` gives 0644 under umask 022). Created with
    0666, the kernel applies the umask (and a folder's default ACL) as for a plain ``open``; a file
    being replaced passes on its own mode instead, as editors do (a group-shared 0664 stays 0664).
    """
    try:
        kept_mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        kept_mode = None
    folder, name = os.path.split(path)
    while True:
        tmp = os.path.join(folder, f".{name}.{secrets.token_hex(4)}.tmp")
        # Never wider than the file it replaces, even for a moment (the umask only narrows), but writable
        # by its owner while it is written: the mode of a read-only file (0444) comes once it is whole.
        created_mode = 0o666 if kept_mode is None else kept_mode | stat.S_IWUSR | stat.S_IRUSR
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, created_mode)
        except FileExistsError:
            continue
        try:
            if kept_mode is not None:
                os.fchmod(fd, created_mode)  # the bits the umask took away
                return tmp, kept_mode
            return tmp, stat.S_IMODE(os.fstat(fd).st_mode)  # the umask's (and an ACL's) result, read back
        finally:
            os.close(fd)


def atomic_write(path: str | os.PathLike, write: Callable[[str], None]) -> None:
    with atomic_path(path) as tmp:
        write(tmp)


def remove_stale_temporary_files(path: str | os.PathLike, name_glob: Optional[str] = None) -> None:
    """Remove the temporary files that writes killed halfway left beside ``path``; with ``name_glob``
    (a pattern of file names, for a template's files), those of every name it matches in ``path``'s
    folder. Called by the main process before a run writes there, so that a kill's leftovers (as
    large as the file) do not pile up."""
    folder, name = os.path.split(os.path.realpath(os.fspath(path)))  # beside the target, as atomic_path writes
    names = glob.escape(name) if name_glob is None else name_glob
    for stale in glob.glob(os.path.join(glob.escape(folder), "." + names + ".*.tmp")):
        with contextlib.suppress(OSError):
            os.remove(stale)


__all__ = ["atomic_path", "atomic_write", "remove_stale_temporary_files"]
