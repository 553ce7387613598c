"""Write the history to a CSV file, one row per epoch, as training goes."""

from __future__ import annotations

import csv
import os
from typing import IO, Optional, Union

from ..files.atomic import atomic_write
from ..files.writable import check_folder_writable, check_not_a_folder
from ..training.callback import Callback


class CSVLogger(Callback):
    """Append one row per epoch to a CSV file with the history's columns
    (``epoch, train_loss, ..., lr, val_loss, ...``).

    Each row is flushed when its epoch ends, so the file can be read (``pd.read_csv``,
    another notebook, ``tail -f``) while training runs. ``append=True`` adds to an
    existing file (a run that goes on with ``initial_epoch``, or a resumed one); its header must match this
    run's columns. A run resumed from a training state (``resume=True``, ``BackupAndRestore``) first
    drops the rows a kill left past its saved epoch, so that each epoch is in the file once. The
    file is opened when the first epoch ends, and only the main process writes.

    Example::

        import pandas as pd
        from kerastorch.callbacks import CSVLogger

        model.fit(dl_train, dl_val, epochs=10, callbacks=[CSVLogger("history.csv")])
        pd.read_csv("history.csv")   # the same numbers as model.history
    """

    def __init__(self, filename: Union[str, os.PathLike], separator: str = ",", append: bool = False):
        if not isinstance(filename, (str, os.PathLike)):
            raise TypeError(f"filename must be a path like 'history.csv'; got a {type(filename).__name__}.")
        self.filename = os.fspath(filename)
        self.separator = separator
        self.append = append
        self._file: Optional[IO[str]] = None
        self._writer: Optional[csv.DictWriter] = None
        self._columns: Optional[list[str]] = None

    def on_train_begin(self, logs=None):
        self._columns = None
        if self.model.is_main_process:  # the one that writes: its file is checked before the first batch
            self._check_writable()
        if self.append:
            self._columns = self._existing_header()
            names = self.params.get("metrics")
            if self._columns is not None and names is not None and self._columns != ["epoch", *names]:
                raise ValueError(
                    f"CSVLogger(append=True): {self.filename!r} has the columns {self._columns}, but this run logs "
                    f"{['epoch', *names]}. Write to another file, or pass append=False to start it afresh."
                )

    def on_epoch_end(self, epoch, logs=None):
        if not self.model.is_main_process:
            return
        if self._writer is None:
            if self.append and self.params.get("resumed"):  # rows of this epoch on, written before a kill, go
                self._drop_rows_from(epoch)
            names = self.params.get("metrics")  # every column, also those an epoch may lack (not validated)
            self._open(["epoch", *names] if names else list(logs))
        self._writer.writerow(logs)
        self._file.flush()  # readable during the run

    def on_train_end(self, logs=None):
        if self._file is not None:
            self._file.close()
        self._file, self._writer = None, None

    def _check_writable(self) -> None:
        what, example = f"CSVLogger filename {self.filename!r}", "CSVLogger('logs/history.csv')"
        check_not_a_folder(self.filename, what, example)
        if not (self.append and os.path.isfile(self.filename)):
            check_folder_writable(self.filename, what, example)
            return
        try:  # appended to, the file itself must take rows (its folder may be read-only)
            with open(self.filename, "a", encoding="utf-8"):
                pass
        except OSError as error:
            raise ValueError(
                f"{what} cannot be appended to ({error.strerror}). Make it writable, or log to another file, "
                f"e.g. {example}."
            ) from None

    def _open(self, columns: list[str]) -> None:
        folder = os.path.dirname(os.path.abspath(self.filename))
        os.makedirs(folder, exist_ok=True)
        write_header = self._columns is None
        self._columns = self._columns or columns
        # Open for the whole run (one row per epoch), closed in on_train_end.
        self._file = open(self.filename, "a" if self.append else "w", newline="", encoding="utf-8")  # noqa: SIM115
        self._writer = csv.DictWriter(
            self._file, fieldnames=self._columns, delimiter=self.separator, restval="", extrasaction="ignore"
        )
        if write_header:
            self._writer.writeheader()

    def _drop_rows_from(self, epoch: int) -> None:
        """Rewrite the file (atomically) without the latest run's rows of ``epoch`` and later."""
        if self._existing_header() is None:
            return
        with open(self.filename, newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f, delimiter=self.separator))
        # Only the latest run in the file (from its last epoch-1 row on) is the one being resumed.
        starts = [i for i, row in enumerate(rows) if i and row and row[0] == "1"]
        latest = starts[-1] if starts else 1
        kept = rows[:latest] + [row for row in rows[latest:] if row and row[0].isdigit() and int(row[0]) < epoch]
        if len(kept) == len(rows):
            return

        def write(tmp: str) -> None:
            with open(tmp, "w", newline="", encoding="utf-8") as out:
                csv.writer(out, delimiter=self.separator).writerows(kept)

        atomic_write(self.filename, write)

    def _existing_header(self) -> Optional[list[str]]:
        """The header of a non-empty file to append to, or None when there is none."""
        if not os.path.isfile(self.filename) or os.path.getsize(self.filename) == 0:
            return None
        with open(self.filename, newline="", encoding="utf-8") as f:
            return next(csv.reader(f, delimiter=self.separator), None)


__all__ = ["CSVLogger"]
