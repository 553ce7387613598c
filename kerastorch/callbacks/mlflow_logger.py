"""Log a run to MLflow: its parameters, each epoch's values, and the best weights as an artifact."""

from __future__ import annotations

import math
import os
import tempfile
import time
import warnings
from typing import Any, Callable, Optional

from ..files.weights import save_weights
from ..strategies import strategy_of, unwrap
from ..training.callback import ORDER_TRAINING_STATE, Callback


def import_mlflow() -> Any:
    """The ``mlflow`` module, or an ImportError that says which extra to install."""
    try:
        import mlflow
    except ImportError:
        raise ImportError(
            "MLflowLogger needs the mlflow package: pip install 'kerastorch[mlflow]' (or pip install mlflow)."
        ) from None
    return mlflow


class MLflowLogger(Callback):
    """Log ``fit`` to an MLflow run: one point per epoch and value (``epoch`` as the step).

    When training begins, a run is started in ``experiment`` (created if new) of the store
    at ``tracking_uri`` (default: MLflow's own, ``MLFLOW_TRACKING_URI`` or else
    ``mlflow.db`` in the working folder; ``sqlite:///runs.db`` or a server's address) with
    these parameters: fit's ``epochs``, ``monitor`` and ``mode``, the batches per epoch,
    the net's class and parameter count, the loss, the optimizer's class and
    hyper-parameters (its first param group) and the metrics' names, plus ``params`` of
    your own. When ``fit`` ends, the best weights (as ``fit`` restores them, or the
    ``ckpt_path`` file, under its own name) are stored as the artifact ``best.safetensors`` and the run is
    ended as ``FINISHED`` (also after early stopping), ``KILLED`` (Ctrl-C) or ``FAILED``
    (an error in fit), as fit ended. ``run_id`` names the run afterwards.

    A store lost mid-run does not stop training: the logger runs after the training state is
    written, says once (a warning) that the store failed, keeps the values it could not log and
    sends them with the next epoch's, or at the end, if the store comes back. Only the main process logs; with
    ``fit(devices=k)`` from a notebook that is a worker, so ``run_id`` stays unset in the
    notebook: find the run in the store (``MlflowClient(uri).search_runs(...)``).

    Example::

        from kerastorch.callbacks import MLflowLogger

        model.fit(dl_train, dl_val, epochs=5,
                  callbacks=[MLflowLogger(experiment="digits", tracking_uri="sqlite:///mlruns.db")])
    """

    # After the training state (resume=True): a store that fails must not cost the epoch's state.
    order = ORDER_TRAINING_STATE + 5

    def __init__(
        self,
        experiment: str = "kerastorch",
        tracking_uri: Optional[str] = None,
        run_name: Optional[str] = None,
        params: Optional[dict] = None,
        tags: Optional[dict] = None,
        log_weights: bool = True,
    ):
        self.mlflow = import_mlflow()
        self.experiment = experiment
        self.tracking_uri = tracking_uri
        self.run_name = run_name
        self.extra_params = dict(params or {})
        self.tags = dict(tags or {})
        self.log_weights = log_weights
        self.client: Any = None
        self.run_id: Optional[str] = None
        self.pending: list = []  # values not logged yet (the store failed): sent with the next batch
        self.logged_epoch = 0  # the last epoch whose values were handed to the store
        self.store_failed = False

    def on_train_begin(self, logs=None):
        self.run_id, self.pending, self.logged_epoch, self.store_failed = None, [], 0, False
        if not self.model.is_main_process:
            return
        self.client = self.mlflow.tracking.MlflowClient(tracking_uri=self.tracking_uri)
        found = self.client.get_experiment_by_name(self.experiment)
        experiment_id = found.experiment_id if found is not None else self.client.create_experiment(self.experiment)
        run = self.client.create_run(experiment_id, run_name=self.run_name, tags=self.tags)
        self.run_id = run.info.run_id
        params = {**self.run_params(), **self.extra_params}
        self.client.log_batch(
            self.run_id, params=[self.mlflow.entities.Param(k, str(v)[:500]) for k, v in params.items()]
        )

    def run_params(self) -> dict:
        """What describes this run: fit's settings, the net, the loss, the optimizer and the metrics."""
        model, params = self.model, self.params
        net = unwrap(model.net)
        optimizer = model.optimizer
        found = {
            "epochs": params.get("epochs"),
            "monitor": params.get("monitor"),
            "mode": params.get("mode"),
            "steps_per_epoch": params.get("steps"),
            "net": type(net).__name__,
            "net_parameters": sum(p.numel() for p in net.parameters()),
            "loss_fn": type(model.loss_fn).__name__,
            "optimizer": type(optimizer).__name__,
            "metrics": ", ".join(model.metrics_dict) or "none",
        }
        group = optimizer.param_groups[0]
        for key, value in group.items():
            if key != "params" and isinstance(value, (int, float, str, bool, tuple)) and value is not None:
                found[f"optimizer.{key}"] = value
        return found

    def on_epoch_end(self, epoch, logs=None):
        if self.run_id is None:
            return
        self.queue(epoch, logs or {})
        self.send(f"after epoch {epoch}")

    def queue(self, epoch: int, logs: dict) -> None:
        now = int(time.time() * 1000)
        self.pending += [
            self.mlflow.entities.Metric(key, float(value), now, epoch)
            for key, value in logs.items()
            if key != "epoch" and isinstance(value, (int, float)) and math.isfinite(value)
        ]
        self.logged_epoch = epoch

    def send(self, when: str) -> bool:
        """Log the values kept so far; a store that fails is said once and training goes on."""
        try:
            if self.pending:
                self.client.log_batch(self.run_id, metrics=self.pending)
            self.pending = []
            return True
        except Exception as error:  # any failure of the store: the training matters more than its record
            if not self.store_failed:
                warnings.warn(
                    f"MLflowLogger: the MLflow store failed {when} ({type(error).__name__}: {error}); the training "
                    f"goes on, and the values of run {self.run_id} are sent again at each epoch's end until the "
                    "store answers.",
                    UserWarning,
                    stacklevel=2,
                )
            self.store_failed = True
            return False

    def on_train_end(self, logs=None):
        if self.run_id is None:
            return
        ended = self.params.get("ended", "failed")
        status = {"finished": "FINISHED", "interrupted": "KILLED", "preempted": "KILLED"}.get(ended, "FAILED")
        # Epochs in the history that no on_epoch_end logged (Ctrl-C in an earlier callback's epoch end).
        for row in self.model.history.to_dict("records") if self.model.history is not None else []:
            if row.get("epoch", 0) > self.logged_epoch:
                self.queue(int(row["epoch"]), row)
        if not self.send("when fit ended"):
            warnings.warn(
                f"MLflowLogger: the store does not answer, so run {self.run_id} keeps the values it has and is not "
                f"ended as {status}; the weights are in the net (and in ckpt_path, if given).",
                UserWarning,
                stacklevel=2,
            )
            return
        if self.log_weights and status != "FAILED":
            self._tolerant("store the best weights of", self._log_best_weights)
        self._tolerant(f"end as {status}", lambda: self.client.set_terminated(self.run_id, status=status))

    def _tolerant(self, what: str, action: Callable[[], Any]) -> None:
        try:
            action()
        except Exception as error:  # fit has ended; its result must not be lost to the store's failure
            warnings.warn(
                f"MLflowLogger: could not {what} run {self.run_id} ({type(error).__name__}: {error}).",
                UserWarning,
                stacklevel=3,
            )

    def _log_best_weights(self) -> None:
        ckpt_path = self.params.get("ckpt_path")
        if ckpt_path and os.path.isfile(ckpt_path):
            self.client.log_artifact(self.run_id, os.fspath(ckpt_path))
            return
        with tempfile.TemporaryDirectory() as folder:  # the net holds the best weights by now
            path = os.path.join(folder, "best.safetensors")
            save_weights(strategy_of(self.model).whole_weights(self.model.net), path)
            self.client.log_artifact(self.run_id, path)


__all__ = ["MLflowLogger", "import_mlflow"]
