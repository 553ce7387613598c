"""``BackupAndRestore``: Keras's callback for continuing a run that was interrupted."""

from __future__ import annotations

import os
from typing import Any

from ..files.writable import check_folder_writable
from .training_state import SaveFreq, TrainingState

STATE_FILE = "training.state"


class BackupAndRestore(TrainingState):
    """Back up the whole training state in ``backup_dir`` while ``fit`` trains, and restore it
    when ``fit`` starts again: a run that was interrupted (a crash, ``kill -9``, a preemption)
    continues where its last backup was, and ends as if it had never stopped — the same history,
    bit for bit, and the same weights.

    Keras's arguments and meaning:

    - ``backup_dir``: the folder of the backup (one file, ``training.state``, written atomically).
      Use it for this run only.
    - ``save_freq``: ``"epoch"`` (after every epoch), an int N (on the first optimizer step after
      every N training batches: the state then holds the batch reached, the data order with the
      sampler's position, each worker's random state and the epoch's partial sums, so a resumed
      run goes on with the next batch), or ``False`` (only when fit is preempted by SIGTERM).
    - ``delete_checkpoint``: remove the backup when fit completes (the last epoch, or an early
      stop). An interrupted, failed or preempted fit always keeps it.

    It is ``fit(ckpt_path=..., resume=True)``'s machinery (see
    :mod:`~kerastorch.callbacks.training_state`): pass one or the other, not both. Unlike Keras, it
    restores everything the run depends on (optimizer, scheduler, callbacks, random generators,
    history), not only the weights and the epoch; and it removes only its own file, never the
    folder's other content.

    Example::

        backup = kt.callbacks.BackupAndRestore("backup", save_freq=500)
        model.fit(dl_train, dl_val, epochs=20, callbacks=[backup])
        # killed in epoch 7? run the same line again: epoch 7 goes on after its last 500th batch.
    """

    def __init__(self, backup_dir: str | os.PathLike, save_freq: SaveFreq = "epoch", delete_checkpoint: bool = True):
        if not isinstance(backup_dir, (str, os.PathLike)) or not os.fspath(backup_dir):
            raise ValueError(
                f"BackupAndRestore(backup_dir={backup_dir!r}): give the folder to keep the backup in, e.g. "
                "BackupAndRestore('backup')."
            )
        if os.path.isfile(backup_dir):
            raise ValueError(
                f"BackupAndRestore(backup_dir={os.fspath(backup_dir)!r}) is a file; give a folder (it is created if "
                "needed)."
            )
        if not isinstance(delete_checkpoint, bool):
            raise TypeError(f"BackupAndRestore(delete_checkpoint={delete_checkpoint!r}) must be True or False.")
        super().__init__(os.path.join(os.fspath(backup_dir), STATE_FILE), save_freq=save_freq)
        self.backup_dir = os.fspath(backup_dir)
        self.delete_checkpoint = delete_checkpoint
        self.removes_when_done = delete_checkpoint

    def on_train_begin(self, logs: Any = None) -> None:
        if self.model.is_main_process:  # before the first batch, not at the first backup
            check_folder_writable(
                self.path, f"BackupAndRestore(backup_dir={self.backup_dir!r})", "BackupAndRestore('backup')"
            )
        super().on_train_begin(logs)

    def on_train_end(self, logs: Any = None) -> None:
        super().on_train_end(logs)
        if self.delete_checkpoint and self.finished and self.model.is_main_process:
            try:  # the folder goes too when the backup was all it held
                os.rmdir(self.backup_dir)
            except OSError:
                pass

    def __repr__(self) -> str:
        return (
            f"BackupAndRestore({self.backup_dir!r}, save_freq={self.save_freq!r}, "
            f"delete_checkpoint={self.delete_checkpoint})"
        )


__all__ = ["BackupAndRestore"]
