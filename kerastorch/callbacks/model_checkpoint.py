"""Write the net's weights to files during training: the best, the last, or every N epochs."""

from __future__ import annotations

import os
import string
from typing import Optional, Union

from ..files.weights import check_writable, save_weights
from ..strategies import whole_weights_on_main
from .monitor import MonitorCallback


class ModelCheckpoint(MonitorCallback):
    """Save the net's weights (safetensors, atomically) at the end of epochs.

    ``filepath`` may name the epoch and any logged value, e.g.
    ``"ckpt/epoch{epoch:03d}-{val_loss:.3f}.safetensors"``. What is kept follows from it:

    - the best epoch: ``ModelCheckpoint("best.safetensors", save_best_only=True)``;
    - the last epoch: ``ModelCheckpoint("last.safetensors")`` (overwritten each epoch);
    - every N epochs: ``ModelCheckpoint("ckpt/epoch{epoch}.safetensors", every_n_epochs=N)``,
      with ``keep_last=k`` to delete all but the k newest files this callback wrote.

    A file is written beside its target and renamed over it, so a crash never leaves a
    half-written checkpoint; only the main process writes. Load one back with
    ``model.load_ckpt(path)``. ``fit(ckpt_path=...)`` already keeps the best epoch's
    weights; use this callback for anything more.

    Example::

        import kerastorch as kt
        from kerastorch.callbacks import ModelCheckpoint

        model.fit(dl_train, dl_val, epochs=10, callbacks=[
            ModelCheckpoint("ckpt/epoch{epoch:02d}-{val_loss:.3f}.safetensors", keep_last=3),
            ModelCheckpoint("ckpt/best.safetensors", monitor="val_acc", mode="max", save_best_only=True),
        ])
        model.load_ckpt("ckpt/best.safetensors")
    """

    def __init__(
        self,
        filepath: Union[str, os.PathLike],
        monitor: str = "val_loss",
        mode: str = "min",
        save_best_only: bool = False,
        every_n_epochs: int = 1,
        keep_last: Optional[int] = None,
        min_delta: float = 0.0,
        verbose: int = 0,
    ):
        super().__init__(monitor, mode, min_delta)
        if not isinstance(filepath, (str, os.PathLike)):
            raise TypeError(
                f"filepath must be a path like 'ckpt/epoch{{epoch}}.safetensors'; got a {type(filepath).__name__}."
            )
        self.filepath = os.fspath(filepath)
        self.fields = template_fields(self.filepath)
        if isinstance(every_n_epochs, bool) or not isinstance(every_n_epochs, int) or every_n_epochs < 1:
            raise ValueError(f"every_n_epochs={every_n_epochs!r} must be a whole number >= 1.")
        if keep_last is not None and (isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1):
            raise ValueError(f"keep_last={keep_last!r} must be a whole number >= 1, or None to keep every file.")
        self.save_best_only = save_best_only
        self.every_n_epochs = every_n_epochs
        self.keep_last = keep_last
        self.verbose = verbose
        self.saved_paths: list[str] = []  # oldest first; only what this callback wrote

    def on_train_begin(self, logs=None):
        # A reused callback starts each run afresh (a resumed run gets its state back afterwards).
        self.best, self.best_epoch, self.saved_paths = None, None, []
        if self.save_best_only:
            self.check_monitor_is_logged()
        if self.model.is_main_process:
            check_writable(os.path.join(self.folder, "checkpoint.safetensors"))
        names = self.params.get("metrics")
        unknown = [f for f in self.fields if names is not None and f != "epoch" and f not in names]
        if unknown:
            raise ValueError(
                f"ModelCheckpoint filepath {self.filepath!r} names {', '.join(map(repr, unknown))}, which "
                f"this run does not log; use 'epoch' or any of: {', '.join(names)}."
            )

    def on_epoch_end(self, epoch, logs=None):
        if epoch % self.every_n_epochs != 0:
            return
        if self.save_best_only and (not self.watches(logs) or not self.update_best(epoch, logs)):
            return
        weights = whole_weights_on_main(self.model)  # every process: gathering may need them all
        if weights is None:
            return
        path = self.filepath.format(**{**logs, "epoch": epoch})
        save_weights(weights, path)
        self._remember(path)
        if self.verbose:
            self.model.print(f"Epoch {epoch}: saved weights to {path}")

    def _remember(self, path: str) -> None:
        if path in self.saved_paths:  # a name without {epoch} is overwritten, not added
            self.saved_paths.remove(path)
        self.saved_paths.append(path)
        while self.keep_last is not None and len(self.saved_paths) > self.keep_last:
            oldest = self.saved_paths.pop(0)
            if self.is_own(oldest) and os.path.isfile(oldest):  # never anything outside this callback's folder
                os.remove(oldest)

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
        return {**super().state_dict(), "saved_paths": list(self.saved_paths)}

    def load_state_dict(self, state):
        super().load_state_dict(state)
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
