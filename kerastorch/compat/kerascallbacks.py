"""torchkeras's callbacks by their names and arguments: ``from kerastorch.kerascallbacks import ...``.

Each is one of kerastorch's callbacks (or, for ``VisDisplay``, a torchkeras-style callback
that :class:`~kerastorch.callbacks.TorchkerasCallback` runs) with torchkeras's arguments and
the files torchkeras writes:

| torchkeras | here | files |
| --- | --- | --- |
| `TensorBoardCallback(save_dir, model_name, log_weight, log_weight_freq)` | `TensorBoard` | `save_dir/model_name/<time>/`: events, `dfhistory.csv` |
| `WandbCallback(project, config, name, save_ckpt, save_code)` | `WandbLogger` | the wandb run: `best_score`, `dfhistory.csv`, the `checkpoint` artifact |
| `EpochCheckpoint(ckpt_dir, save_freq, max_ckpt)` | `ModelCheckpoint` | `ckpt_dir/checkpoint_epoch<N>.pt`, the last `max_ckpt` |
| `VisMetric(figsize, save_path)` | `LivePlot` | the plot, and `save_path` at the end |
| `VisProgress()` | fit's own progress | — |
| `VisDisplay(display_fn, model, init_display, dis_period)` | a torchkeras-style callback | — |
"""

from __future__ import annotations

import datetime
import os
import shutil
from typing import Any, Callable, Optional

from ..callbacks.live_plot import LivePlot
from ..callbacks.model_checkpoint import ModelCheckpoint
from ..callbacks.tensorboard import TensorBoard
from ..callbacks.wandb_logger import WandbLogger
from ..training.callback import Callback


class TensorBoardCallback(TensorBoard):
    """torchkeras's TensorBoard logging: the values of every epoch under
    ``save_dir/model_name/<date_time>``, the weights' histograms every ``log_weight_freq``
    epochs when ``log_weight``, and the history as ``dfhistory.csv`` in the same folder."""

    def __init__(
        self, save_dir: str = "runs", model_name: str = "model", log_weight: bool = False, log_weight_freq: int = 5
    ):
        self.log_path = os.path.join(save_dir, model_name, datetime.datetime.now().strftime("%Y%m%d_%H%M%S"))
        super().__init__(self.log_path, histogram_freq=log_weight_freq if log_weight else 0)

    def on_train_end(self, logs=None):
        super().on_train_end(logs)
        if self.model.is_main_process and len(self.model.history):
            os.makedirs(self.log_path, exist_ok=True)
            self.model.history.to_csv(os.path.join(self.log_path, "dfhistory.csv"), index=False)


class WandbCallback(WandbLogger):
    """torchkeras's Weights & Biases logging, with the run's files torchkeras writes: the best
    monitored value as ``best_score`` in the run's summary (besides ``best_<monitor>``), the
    history as ``dfhistory.csv`` in the run's folder, and with ``save_ckpt`` the file at
    ``fit(ckpt_path=...)`` as a model artifact named ``checkpoint`` (and a copy in the run's
    folder); without a ``ckpt_path`` the best weights are stored as ``weights.safetensors``.
    ``save_code`` asks wandb to save the code; ``name`` defaults to the date and time."""

    def __init__(
        self,
        project: Optional[str] = None,
        config: Any = None,
        name: Optional[str] = None,
        save_ckpt: bool = True,
        save_code: bool = True,
        **init_kwargs: Any,
    ):
        if name is None:
            name = datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
        super().__init__(
            project=project, name=name, config=config, log_weights=save_ckpt, save_code=save_code, **init_kwargs
        )
        self.save_ckpt = save_ckpt

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        if self.run is not None and self.best is not None:
            self.run.summary["best_score"] = self.best  # the key torchkeras's run tables sort by

    def on_train_end(self, logs=None):
        ckpt_path = self.model.ckpt_path
        has_ckpt = ckpt_path is not None and os.path.isfile(ckpt_path)
        if self.run is not None:
            self.model.history.to_csv(os.path.join(self.run.dir, "dfhistory.csv"), index=False)
            if self.save_ckpt and has_ckpt:
                shutil.copy(ckpt_path, os.path.join(self.run.dir, os.path.basename(ckpt_path)))
                artifact = self.wandb.Artifact("checkpoint", type="model")
                artifact.add_file(str(ckpt_path))
                self.run.log_artifact(artifact)
        self.log_weights = self.save_ckpt and not has_ckpt  # the checkpoint already is the weights
        super().on_train_end(logs)


class EpochCheckpoint(ModelCheckpoint):
    """torchkeras's checkpoint every ``save_freq`` epochs, as ``ckpt_dir/checkpoint_epoch<N>.pt``
    (a plain state dict of tensors, as ``torch.load`` reads it), keeping the last ``max_ckpt``."""

    def __init__(self, ckpt_dir: str = "weights", save_freq: int = 1, max_ckpt: int = 10):
        super().__init__(
            os.path.join(ckpt_dir, "checkpoint_epoch{epoch}.pt"), every_n_epochs=save_freq, keep_last=max_ckpt
        )


class VisMetric(LivePlot):
    """torchkeras's live plot of the monitored metric; the last drawing is also saved to ``save_path``."""

    def __init__(self, figsize: tuple = (6, 4), save_path: str = "history.png"):
        super().__init__(path=save_path)
        self.figsize = figsize  # accepted for torchkeras's signature; the plot sizes itself
        self.save_path = save_path

    def on_train_begin(self, logs=None):
        self.monitor = self.monitor or self.params.get("monitor")
        self.mode = self.params.get("mode", self.mode)
        super().on_train_begin(logs)

    def on_train_end(self, logs=None):
        super().on_train_end(logs)
        if self.figure is not None and self.model.is_main_process:
            self.figure.savefig(self.save_path, dpi=self.dpi)


class VisProgress(Callback):
    """torchkeras's progress bar. ``fit`` shows its own progress (``verbose=1``), so this adds
    nothing; it is here so that torchkeras programs that pass it run unchanged."""


class VisDisplay:
    """torchkeras's ``display_fn(model)``, called before training (``init_display``) and
    after every ``dis_period`` epochs, with the model as torchkeras callbacks see it
    (``model.history`` a dict of lists)."""

    def __init__(
        self, display_fn: Callable[[Any], Any], model: Any = None, init_display: bool = True, dis_period: int = 1
    ):
        self.display_fn = display_fn
        self.init_display = init_display
        self.dis_period = dis_period
        if init_display and model is not None:
            display_fn(model)
            self.init_display = False  # shown once already, as torchkeras does

    def on_fit_start(self, model: Any) -> None:
        if self.init_display:
            self.display_fn(model)

    def on_validation_epoch_end(self, model: Any) -> None:
        if len(model.history.get("epoch", [])) % self.dis_period == 0:
            self.display_fn(model)


__all__ = ["EpochCheckpoint", "TensorBoardCallback", "VisDisplay", "VisMetric", "VisProgress", "WandbCallback"]
