"""Write the net's weights to files during training: the best, the last, or every N epochs."""

from __future__ import annotations

import glob
import os
import string
from typing import Any, Optional, Union

from ..files.atomic import remove_stale_temporary_files
from ..files.background import BackgroundWriter
from ..files.weights import save_weights
from ..files.writable import check_folder_writable, check_not_a_folder
from ..helpers.values import check_real_number, check_verbose, check_whole_number
from ..settings import describe_validated, is_validated
from ..strategies import strategy_of, whole_weights_on_main
from .monitor import MonitorCallback

# Said when an argument's type shows a call written in another order than Keras's.
KERAS_ORDER = (
    "; ModelCheckpoint takes Keras's arguments in Keras's order (filepath, monitor, verbose, save_best_only, "
    "save_weights_only, mode, save_freq, initial_value_threshold): pass the others by name, e.g. "
    "ModelCheckpoint('best.safetensors', monitor='val_acc', mode='max', save_best_only=True)"
)


class ModelCheckpoint(MonitorCallback):
    """Save the net's weights (safetensors, atomically) at the end of epochs, or every N batches.

    Keras's ``ModelCheckpoint(filepath, monitor, verbose, save_best_only, save_weights_only,
    mode, save_freq, initial_value_threshold)``, in Keras's order, and kerastorch's
    ``every_n_epochs``, ``keep_last`` and ``min_delta`` by name. ``filepath`` may name the
    epoch, the batch (with ``save_freq=N``) and any logged value, e.g.
    ``"ckpt/epoch{epoch:03d}-{val_loss:.3f}.safetensors"``. What is kept follows from it:

    - the best epoch: ``ModelCheckpoint("best.safetensors", save_best_only=True)``;
    - the last epoch: ``ModelCheckpoint("last.safetensors")`` (overwritten each epoch);
    - every N epochs: ``ModelCheckpoint("ckpt/epoch{epoch}.safetensors", every_n_epochs=N)``,
      with ``keep_last=k`` to delete all but the k newest files this callback wrote;
    - every N training batches: ``ModelCheckpoint("ckpt/e{epoch}-b{batch}.safetensors", save_freq=N)``.

    Args:
        filepath: where to write; ``{epoch}`` is 1-based, ``{batch}`` the 1-based batch of the
            epoch after which the file is written (``save_freq=N`` only).
        monitor: the value ``save_best_only`` compares.
        verbose: 1 prints a line for every file written.
        save_best_only: write only when ``monitor`` improves on the best so far (by more than
            ``min_delta``); a NaN never does.
        save_weights_only: accepted with both values; kerastorch always writes the net's weights
            (safetensors, or torch's plain state dict for ``.pt`` / ``.pth`` / ``.ckpt`` / ``.bin``,
            never a pickled model), so ``False`` writes the same file as ``True``: the architecture
            is your code, and ``model.load_ckpt(path)`` loads the file into it.
        mode: ``"min"``, ``"max"`` or ``"auto"`` (default): decided when training begins by
            ``fit``'s own rule (a torchmetrics metric's ``higher_is_better``, else the name).
        save_freq: ``"epoch"`` (default) writes at the end of epochs. An int N writes after every
            N training batches, counted across epochs (Keras's rule), and never at an epoch's end;
            ``save_best_only`` then compares the running value of a ``train_*`` column over the
            epoch so far, read from the device once per N batches (values of validation are not
            known during an epoch).
        initial_value_threshold: with ``save_best_only``, the value to beat before the first file.
        every_n_epochs: with ``save_freq="epoch"``, write at epochs N, 2N, ...
        keep_last: delete all but the k newest files this callback wrote (None keeps all).
        min_delta: the smallest improvement ``save_best_only`` counts.

    A file is written beside its target and renamed over it, so a crash never leaves a
    half-written checkpoint; only the main process writes. Load one back with
    ``model.load_ckpt(path)``. ``fit(ckpt_path=...)`` already keeps the best epoch's
    weights; use this callback for anything more.

    In ``fit``, each file is written on a thread of its own while training goes on, as ``fit``'s
    own ``ckpt_path`` is (:mod:`~kerastorch.files.background`): the weights are copied to host
    memory at once, and the disk takes them while the next batches train. Every file is whole
    before anything relies on it: the next file this callback writes, a training state (which
    names them), and the end of ``fit``; ``keep_last`` removes an old file only once the new one
    is whole. With a callback of yours in the run that may read files
    (:func:`~kerastorch.training.callback.may_read_ckpt_path`), each file is written before the
    callbacks after this one are called instead.

    Example::

        import kerastorch as kt
        from kerastorch.callbacks import ModelCheckpoint

        model.fit(dl_train, dl_val, epochs=10, callbacks=[
            ModelCheckpoint("ckpt/epoch{epoch:02d}-{val_loss:.3f}.safetensors", keep_last=3),
            ModelCheckpoint("ckpt/best.safetensors", monitor="val_acc", save_best_only=True),
            ModelCheckpoint("ckpt/step-e{epoch}-b{batch}.safetensors", save_freq=4, keep_last=2),
        ])
        model.load_ckpt("ckpt/best.safetensors")
    """

    def __init__(
        self,
        filepath: Union[str, os.PathLike],
        monitor: str = "val_loss",
        verbose: int = 0,
        save_best_only: bool = False,
        save_weights_only: bool = False,
        mode: str = "auto",
        save_freq: Union[str, int] = "epoch",
        initial_value_threshold: Optional[float] = None,
        *,
        every_n_epochs: int = 1,
        keep_last: Optional[int] = None,
        min_delta: float = 0.0,
    ):
        super().__init__(monitor, mode, min_delta)
        if not isinstance(filepath, (str, os.PathLike)):
            raise TypeError(
                f"filepath must be a path like 'ckpt/epoch{{epoch}}.safetensors'; got a {type(filepath).__name__}."
            )
        self.filepath = os.fspath(filepath)
        check_not_a_folder(
            self.filepath, f"ModelCheckpoint filepath {self.filepath!r}", "'ckpt/epoch{epoch}.safetensors'"
        )
        self.fields = template_fields(self.filepath)
        self.verbose = check_verbose(verbose, KERAS_ORDER)
        for name, value in (("save_best_only", save_best_only), ("save_weights_only", save_weights_only)):
            if not isinstance(value, bool):
                raise TypeError(f"{name}={value!r} must be True or False{KERAS_ORDER}.")
        if save_freq != "epoch" and (isinstance(save_freq, bool) or not isinstance(save_freq, int) or save_freq < 1):
            raise ValueError(
                f"save_freq={save_freq!r} must be 'epoch' (write at the end of epochs) or a whole number of "
                "training batches >= 1 (e.g. save_freq=100 writes after every 100 batches)."
            )
        every_n_epochs = check_whole_number("every_n_epochs", every_n_epochs, 1)
        if save_freq != "epoch" and every_n_epochs != 1:
            raise ValueError(
                f"every_n_epochs={every_n_epochs} counts epochs, but save_freq={save_freq} writes every "
                f"{save_freq} batches: pass one of them (save_freq='epoch' with every_n_epochs, or save_freq alone)."
            )
        if keep_last is not None and (isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1):
            raise ValueError(f"keep_last={keep_last!r} must be a whole number >= 1, or None to keep every file.")
        self.initial_value_threshold = (
            None
            if initial_value_threshold is None
            else check_real_number("initial_value_threshold", initial_value_threshold, ", or None")
        )
        self.save_best_only = save_best_only
        self.save_weights_only = save_weights_only  # the same weights file either way (see the docstring)
        self.save_freq = save_freq
        self.every_n_epochs = every_n_epochs
        self.keep_last = keep_last
        self.saved_paths: list[str] = []  # oldest first; only what this callback wrote
        self._writer = BackgroundWriter("kerastorch-model-checkpoint")
        self.epoch = 0  # the epoch under way, for {epoch} in files written between batches
        self.batches_since_save = 0  # counted across epochs, as Keras does
        self.batches_per_save = 0 if save_freq == "epoch" else int(save_freq)
        if self.batches_per_save:
            # Set on the instance only here, so that an epoch checkpoint costs the loop no call per batch.
            self.on_train_batch_end = self.save_every_n_batches  # type: ignore[method-assign]

    def on_train_begin(self, logs=None):
        # A reused callback starts each run afresh (a resumed run gets its state back afterwards).
        self.best, self.best_epoch, self.saved_paths = self.initial_value_threshold, None, []
        self.batches_since_save = 0
        self.resolve_mode()
        if self.save_best_only:
            self.check_monitor_is_logged()
        if self.model.is_main_process:
            check_folder_writable(
                os.path.join(self.folder, "checkpoint.safetensors"),
                f"ModelCheckpoint filepath {self.filepath!r}",
                "ModelCheckpoint('ckpt/epoch{epoch}.safetensors')",
            )
            self.remove_stale_temporary_files()
        self.check_template()
        if self.batches_per_save and self.save_best_only and strategy_of(self.model).gathers_together:
            # Between batches only the main process knows its running value, but every process must gather.
            raise ValueError(
                f"ModelCheckpoint(save_best_only=True, save_freq={self.save_freq}) decides on the main process's "
                f"running values, and this run's strategy ({strategy_of(self.model)!r}) gathers the weights on every "
                "process: pass save_freq='epoch', or save_best_only=False."
            )

    def remove_stale_temporary_files(self) -> None:
        """The temporary files that a run killed while writing one of this callback's files left (for a
        template, of any name it can produce: its fields match anything)."""
        folder, name = os.path.split(self.filepath)
        if "{" in folder:  # the folder itself varies: nowhere fixed to look
            return
        if name.startswith("{"):
            # Every name of its kind would match ("{epoch}.pt": any .pt): another run's write under way in a
            # shared folder (side-by-side trials) must not lose its file. Only a name with its own start is cleaned.
            return
        name_glob = "".join(
            glob.escape(literal) + ("*" if field is not None else "")
            for literal, field, _, _ in string.Formatter().parse(name)
        )
        remove_stale_temporary_files(self.filepath, name_glob)

    def check_template(self) -> None:
        """Fail before the first batch when ``filepath`` (or ``monitor``, with ``save_freq=N``) names a
        value that will not be there when a file is written, or formats one in a way it cannot be."""
        self.check_formats()
        names = self.params.get("metrics")
        if names is None:  # known only after an epoch (a program's own EpochRunner)
            return
        by_batch = self.save_freq != "epoch"
        known = [n for n in names if n.startswith("train_")] if by_batch else list(names)
        unknown = [f for f in self.fields if f not in ("epoch", "batch") and f not in known]
        if unknown:
            why = (
                f"which is not known between batches (save_freq={self.save_freq}: only the running training values "
                "are); use 'epoch', 'batch'"
                if by_batch
                else "which this run does not log; use 'epoch'"
            )
            raise ValueError(
                f"ModelCheckpoint filepath {self.filepath!r} names {', '.join(map(repr, unknown))}, {why} or any of: "
                f"{', '.join(known)}."
            )
        validation_freq = self.params.get("validation_freq") or 1
        unvalidated = [f for f in self.fields if f.startswith("val_")]
        writes_unvalidated = not (self.save_best_only and self.monitor.startswith("val_"))
        trained = range((self.params.get("initial_epoch") or 0) + 1, (self.params.get("epochs") or 0) + 1)
        written = [epoch for epoch in trained if epoch % self.every_n_epochs == 0]
        if (
            unvalidated
            and not by_batch
            and writes_unvalidated
            and any(not is_validated(epoch, validation_freq) for epoch in written)
        ):
            every = "every epoch" if self.every_n_epochs == 1 else f"every {self.every_n_epochs} epochs"
            instead = f"every_n_epochs={validation_freq}, " if isinstance(validation_freq, int) else ""
            raise ValueError(
                f"ModelCheckpoint filepath {self.filepath!r} names {', '.join(map(repr, unvalidated))}, which only the "
                f"validated epochs log ({describe_validated(validation_freq)}), and it writes {every}. Pass "
                f"{instead}save_best_only=True with a val_ monitor, or drop the val_ fields."
            )
        if "batch" in self.fields and not by_batch:
            raise ValueError(
                f"ModelCheckpoint filepath {self.filepath!r} names {{batch}}, which exists only when writing "
                "between batches: pass save_freq=N (every N training batches), or drop {batch}."
            )
        if by_batch and self.save_best_only and self.monitor not in known:
            raise ValueError(
                f"ModelCheckpoint(save_best_only=True, save_freq={self.save_freq}) compares {self.monitor!r} "
                f"every {self.save_freq} batches, but during an epoch only the running training values are "
                f"known: monitor one of {', '.join(known)}, or pass save_freq='epoch'."
            )

    def check_formats(self) -> None:
        """Format ``filepath`` as a write would, with a whole number for ``{epoch}`` and ``{batch}`` and a
        float for every logged value: a spec such as ``{val_loss:02d}`` fails here, not after an epoch."""
        sample = {f: 0.5 for f in self.fields}
        try:
            self.filepath.format(**{**sample, "epoch": 1, "batch": 1})
        except (ValueError, TypeError) as error:
            raise ValueError(
                f"ModelCheckpoint filepath {self.filepath!r} cannot be formatted ({error}): {{epoch}} and {{batch}} "
                "are whole numbers, every logged value a float. Give the values a float format such as "
                "{val_loss:.3f}, and the numbers one such as {epoch:02d}."
            ) from None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_epoch_end(self, epoch, logs=None):
        if self.save_freq != "epoch" or epoch % self.every_n_epochs != 0:
            return
        if self.save_best_only and (not self.watches(logs) or not self.update_best(epoch, logs)):
            return
        self.save(epoch, logs)

    def save_every_n_batches(self, batch: int, logs=None) -> None:
        """``on_train_batch_end`` with ``save_freq=N``: reads ``logs`` (a device read) only at the N-th batch."""
        self.batches_since_save += 1
        if self.batches_since_save < self.batches_per_save:
            return
        self.batches_since_save = 0
        if self.save_best_only and not (self.model.is_main_process and self.update_best(self.epoch, logs)):
            return  # only the main process decides, from its own running values (refused where all must gather)
        self.save(self.epoch, logs, batch=batch + 1)

    def save(self, epoch: int, logs: Any, batch: Optional[int] = None) -> None:
        """Write the whole weights (gathered on every process where the strategy needs them all)."""
        # The file under way is whole first: one copy of the weights waits for the disk at a time, and
        # its error (a full disk) stops training here.
        self._writer.wait()
        # Copied on the training thread: the writer's thread must compute nothing (see files.background).
        weights = whole_weights_on_main(self.model)
        if weights is None:
            return
        named = {f: logs[f] for f in self.fields if f not in ("epoch", "batch")}  # only the values it names
        path = self.filepath.format(**named, epoch=epoch, batch=batch)
        if self.verbose:
            where = f"epoch {epoch}" if batch is None else f"epoch {epoch}, batch {batch}"
            self.model.print(f"ModelCheckpoint at {where}: saving the weights to {path}")
        dropped = self._remember(path)
        self._writer.start(lambda: self._write(weights, path, dropped))
        if not self.params.get("write_while_training", False):  # fit's decision for its run (the class's note)
            self._writer.wait()

    def _remember(self, path: str) -> list[str]:
        """Count ``path`` as written; the files ``keep_last`` lets go of, to remove once it is."""
        if path in self.saved_paths:  # a name without {epoch} is overwritten, not added
            self.saved_paths.remove(path)
        self.saved_paths.append(path)
        dropped = []
        while self.keep_last is not None and len(self.saved_paths) > self.keep_last:
            dropped.append(self.saved_paths.pop(0))
        return dropped

    def _write(self, weights: dict, path: str, dropped: list[str]) -> None:
        save_weights(weights, path)
        for oldest in dropped:  # only once the newer file is whole: a crash never leaves fewer than keep_last
            if self.is_own(oldest) and os.path.isfile(oldest):  # never anything outside this callback's folder
                os.remove(oldest)

    def on_train_end(self, logs=None):
        self._writer.close()  # fit returns with every file whole (or raises the last write's error)

    @property
    def folder(self) -> str:
        """The fixed folder of ``filepath`` (before any ``{field}``): where every file this callback writes lies."""
        fixed = self.filepath.split("{", 1)[0]
        return os.path.dirname(os.path.abspath(fixed if "{" in self.filepath else self.filepath))

    def is_own(self, path: str) -> bool:
        """True for a path inside :attr:`folder` that ``filepath`` could have produced (suffix included)."""
        real, folder = os.path.realpath(path), os.path.realpath(self.folder)
        suffix = os.path.splitext(self.filepath)[1]
        return os.path.commonpath([real, folder]) == folder and real != folder and real.endswith(suffix)

    def state_dict(self):
        # A training state that names these files is written only once they are whole.
        self._writer.wait()
        return {
            **super().state_dict(),
            "saved_paths": list(self.saved_paths),
            "batches_since_save": self.batches_since_save,
        }

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.batches_since_save = int(state.get("batches_since_save", 0))  # absent from older states
        paths = [str(p) for p in state["saved_paths"]]
        foreign = [p for p in paths if not self.is_own(p)]
        if foreign:
            # A crafted or foreign training state must not make keep_last delete other files.
            raise ValueError(
                f"The training state names checkpoint files outside this ModelCheckpoint's folder {self.folder!r} "
                f"(e.g. {foreign[0]!r}); it was not written by this callback, so it is not trusted. Delete the "
                "state file to start fresh, or pass resume=False."
            )
        self.saved_paths = paths


def template_fields(template: str) -> list[str]:
    """The names in a ``str.format`` template (``"e{epoch:02d}-{val_loss:.3f}"`` -> epoch, val_loss)."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as error:
        raise ValueError(
            f"filepath {template!r} is not a valid template ({error}); write fields like "
            "{epoch:02d} or {val_loss:.3f}, and double braces {{ }} for literal ones."
        ) from None
    fields = []
    for _, name, _, _ in parsed:
        if name is None:
            continue
        if not name or not name.isidentifier():
            raise ValueError(
                f"filepath {template!r} has the field {{{name}}}; fields must be names like "
                "{epoch} or {val_loss:.3f}."
            )
        fields.append(name)
    return fields


__all__ = ["ModelCheckpoint"]
