"""Whether a run can write its files where it is told to, checked before training changes any weight.

A path that cannot be written is otherwise found out at the first write, after an epoch (or a
whole run) of training: ``fit``'s ``ckpt_path`` at the door, the callbacks that write files
(``ModelCheckpoint``, ``CSVLogger``, ``BackupAndRestore``) in their ``on_train_begin``, on the main
process (the one that writes).
"""

from __future__ import annotations

import contextlib
import os
from typing import Optional

CKPT_PATH_EXAMPLE = "ckpt_path='runs/best.safetensors'"
SEPARATORS = tuple(sep for sep in (os.sep, os.altsep) if sep)


def check_writable(path: str | os.PathLike, what: Optional[str] = None, example: str = CKPT_PATH_EXAMPLE) -> None:
    """Refuse a ``path`` that names a folder, or whose folder cannot be created or written.

    ``what`` names the path in the message (``ckpt_path='...'`` by default), ``example`` is a call
    that would work."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"ckpt_path={path!r} must be a file path (a str or pathlib.Path) like 'runs/best.safetensors'.")
    what = what or f"ckpt_path={os.fspath(path)!r}"
    check_not_a_folder(path, what, example)
    check_folder_writable(path, what, example)


def check_not_a_folder(path: str | os.PathLike, what: str, example: str) -> None:
    """Refuse a folder, and a path that ends with a separator: one that does not exist yet would be
    written as a file with the folder's name (``runs/`` as a file ``runs``)."""
    raw = os.fspath(path)
    if raw.endswith(SEPARATORS):
        raise ValueError(f"{what} ends with {raw[-1]!r}, so it names a folder; give a file path, e.g. {example}.")
    if os.path.isdir(raw):
        raise ValueError(f"{what} is a folder; give a file path, e.g. {example}.")


def check_folder_writable(path: str | os.PathLike, what: str, example: str) -> None:
    """Create ``path``'s folder if needed and write (then remove) an empty file in it."""
    folder = os.path.dirname(os.path.abspath(os.fspath(path)))
    probe = None
    try:
        os.makedirs(folder, exist_ok=True)
        probe = os.path.join(folder, f".kerastorch-write-test-{os.getpid()}")
        with open(probe, "wb") as f:
            f.write(b"")
    except OSError as error:
        blocker = _file_in_the_way(folder)
        why = (
            f"{blocker!r} is a file, so it cannot hold a folder"
            if blocker
            else f"its folder {folder!r} cannot be written ({error.strerror})"
        )
        raise ValueError(
            f"{what} cannot be written: {why}. Choose a path in a folder you can write to, e.g. {example}."
        ) from None
    finally:
        if probe is not None:
            with contextlib.suppress(OSError):
                os.remove(probe)


def _file_in_the_way(folder: str) -> Optional[str]:
    """The nearest existing ancestor of ``folder``, if it is a file rather than a folder."""
    while folder and not os.path.exists(folder):
        parent = os.path.dirname(folder)
        if parent == folder:
            return None
        folder = parent
    return folder if os.path.isfile(folder) else None


__all__ = ["check_folder_writable", "check_not_a_folder", "check_writable"]
