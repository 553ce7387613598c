"""Write the history to TensorBoard: train and val of each quantity on one chart."""

from __future__ import annotations

import datetime
import os
from typing import Any, Optional, Union

from ..strategies import unwrap
from ..training.callback import Callback

STAGES = ("train", "val")


def summary_writer_class() -> Any:
    """torch's ``SummaryWriter``, or an ImportError that says which extra to install."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ImportError(
            "The TensorBoard callback needs the tensorboard package: "
            "pip install 'kerastorch[tensorboard]' (or pip install tensorboard)."
        ) from None
    return SummaryWriter


class TensorBoard(Callback):
    """Log each epoch's values as TensorBoard scalars.

    Train values go to ``log_dir/train`` and val values to ``log_dir/val`` under one tag
    per quantity (``loss``, ``acc``, ...), so TensorBoard draws the train and val curves
    of a quantity on the same chart, as Keras does. ``lr`` is logged with the train run.
    ``histogram_freq=N`` also writes a histogram of every weight each N epochs.
    The step of every point is the epoch. Only the main process writes; files are
    flushed each epoch, so TensorBoard shows a run while it trains.

    Example::

        from kerastorch.callbacks import TensorBoard

        model.fit(dl_train, dl_val, epochs=10, callbacks=[TensorBoard("runs/mlp")])
        # then: tensorboard --logdir runs
    """

    def __init__(self, log_dir: Optional[Union[str, os.PathLike]] = None, histogram_freq: int = 0):
        self.writer_class = summary_writer_class()
        if isinstance(histogram_freq, bool) or not isinstance(histogram_freq, int) or histogram_freq < 0:
            raise ValueError(f"histogram_freq={histogram_freq!r} must be a whole number of epochs >= 0 (0: none).")
        if log_dir is None:
            log_dir = os.path.join("runs", datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))
        self.log_dir = os.fspath(log_dir)
        self.histogram_freq = histogram_freq
        self.writers: dict[str, Any] = {}

    def on_epoch_end(self, epoch, logs=None):
        if not self.model.is_main_process:
            return
        for name, value in logs.items():
            if name == "epoch":
                continue
            stage, quantity = split_name(name)
            self._writer(stage).add_scalar(quantity, value, epoch)
        if self.histogram_freq and epoch % self.histogram_freq == 0:
            for name, param in unwrap(self.model.net).named_parameters():
                self._writer("train").add_histogram(name, param.detach().float().cpu(), epoch)
        for writer in self.writers.values():
            writer.flush()

    def on_train_end(self, logs=None):
        for writer in self.writers.values():
            writer.close()
        self.writers = {}

    def _writer(self, stage: str) -> Any:
        # Opened at the first write, so a run that fails before its first epoch leaves no folder.
        if stage not in self.writers:
            self.writers[stage] = self.writer_class(os.path.join(self.log_dir, stage))
        return self.writers[stage]


def split_name(name: str) -> tuple[str, str]:
    """``"val_acc"`` -> ``("val", "acc")``; names without a stage (``lr``) go with train."""
    for stage in STAGES:
        if name.startswith(stage + "_"):
            return stage, name[len(stage) + 1 :]
    return "train", name


__all__ = ["TensorBoard"]
