"""Log the history to Weights & Biases, one point per epoch."""

from __future__ import annotations

import os
from typing import Any, Optional

from ..files.weights import save_weights
from ..settings import OutputSettings
from ..strategies import strategy_of
from ..training.callback import ORDER_DISPLAY, Callback
from .monitor import improves


def import_wandb() -> Any:
    """The ``wandb`` module, or an ImportError that says which extra to install."""
    try:
        import wandb
    except ImportError:
        raise ImportError(
            "WandbLogger (fit(wandb=True)) needs the wandb package: pip install 'kerastorch[wandb]' "
            "(or pip install wandb)."
        ) from None
    return wandb


class WandbLogger(Callback):
    """Send each epoch's row of the history to a wandb run, with ``epoch`` as its x axis,
    and keep ``best_<monitor>`` in the run's summary.

    A run is started when the first epoch begins (``wandb.init(project=..., name=...,
    config=..., **init_kwargs)``) and finished when ``fit`` ends; a run you started
    yourself with ``wandb.init`` is used and left open. Without a wandb account, pass
    ``mode="offline"`` (or set ``WANDB_MODE=offline``): the run is written under
    ``dir`` and can be uploaded later with ``wandb sync``. ``log_weights=True`` stores
    the final weights (the best epoch's, as ``fit`` restores them) as a model artifact.
    ``fit(wandb=True)`` adds one of these; ``fit(wandb={"project": ...})`` passes its
    arguments. Only the main process logs.

    Example::

        from kerastorch.callbacks import WandbLogger

        model.fit(dl_train, dl_val, epochs=5,
                  callbacks=[WandbLogger(project="digits", mode="offline", dir="wandb_runs")])
    """

    order = ORDER_DISPLAY

    def __init__(
        self,
        project: Optional[str] = None,
        name: Optional[str] = None,
        config: Optional[dict] = None,
        log_weights: bool = False,
        **init_kwargs: Any,
    ):
        self.wandb = import_wandb()
        self.project = project
        self.name = name
        if config is not None and not isinstance(config, dict):
            config = vars(config)  # an argparse.Namespace, as some programs pass it
        self.config = dict(config or {})
        self.log_weights = log_weights
        self.init_kwargs = init_kwargs
        self.run: Any = None
        self.owns_run = False
        self.best: Optional[float] = None

    @classmethod
    def for_fit(cls, output: OutputSettings) -> WandbLogger:
        """The logger ``fit(wandb=True)`` adds; ``fit(wandb={...})`` passes its arguments."""
        return cls(**(output.wandb if isinstance(output.wandb, dict) else {}))

    def on_train_begin(self, logs=None):
        self.best = None

    def on_epoch_begin(self, epoch, logs=None):
        if self.run is None and self.model.is_main_process:
            self._start_run()

    def on_epoch_end(self, epoch, logs=None):
        if self.run is None:
            return
        row = dict(logs)
        monitor, fits_best = self.params.get("monitor"), self.params.get("best")
        value = row.get(monitor)
        if fits_best is not None:  # fit's own decision, the epoch whose weights it keeps
            improved = fits_best.best_epoch == epoch
        else:
            improved = value is not None and improves(value, self.best, self.params.get("mode", "min"))
        if improved:
            self.best = row[monitor]
            self.run.summary[f"best_{monitor}"] = self.best
            self.run.summary["best_epoch"] = epoch
        self.run.log(row)

    def on_train_end(self, logs=None):
        if self.run is None:
            return
        try:
            if self.log_weights:
                path = os.path.join(self.run.dir, "weights.safetensors")
                save_weights(strategy_of(self.model).whole_weights(self.model.net), path)
                artifact = self.wandb.Artifact(f"weights-{self.run.id}", type="model")
                artifact.add_file(path)
                self.run.log_artifact(artifact)
        finally:
            if self.owns_run:
                self.run.finish()
            self.run, self.owns_run = None, False

    def _start_run(self) -> None:
        if self.wandb.run is not None:
            self.run, self.owns_run = self.wandb.run, False
        else:
            config = {**self._run_description(), **self.config}
            self.run = self.wandb.init(project=self.project, name=self.name, config=config, **self.init_kwargs)
            self.owns_run = True
        self.model.run_id = self.run.id  # programs read the run's id from the model
        # Every value is drawn against the epoch, not wandb's own step counter.
        self.run.define_metric("epoch", hidden=True)
        self.run.define_metric("*", step_metric="epoch")

    def _run_description(self) -> dict:
        optimizer = self.model.optimizer
        return {
            "epochs": self.params.get("epochs"),
            "monitor": self.params.get("monitor"),
            "mode": self.params.get("mode"),
            "optimizer": type(optimizer).__name__,
            "lr": optimizer.param_groups[0]["lr"],
            "net": type(self.model.net).__name__,
        }


__all__ = ["WandbLogger", "import_wandb"]
