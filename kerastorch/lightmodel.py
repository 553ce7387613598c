"""``LightModel``: the net, loss and metrics of a ``KerasModel``, trained by Lightning's ``Trainer``.

For users who prefer Lightning's ``Trainer`` and callbacks but want to keep writing
a model the kerastorch way: the same arguments, the same batch layouts (read by
:mod:`~kerastorch.data.batches`) and the same three kinds of metrics (checked by
:mod:`~kerastorch.training.meters`). Needs the ``lightning`` extra:
``pip install 'kerastorch[lightning]'``.

Logged names match ``KerasModel``'s history: ``train_loss``, ``train_<m>``,
``val_loss``, ``val_<m>`` (and ``test_loss``, ``test_<m>`` from ``trainer.test``).
All are epoch values over the epoch's samples, synced across devices.
"""

from __future__ import annotations

import copy
from typing import Any, Optional, cast

import torch
from torch import nn

try:
    import lightning.pytorch as pl
except ImportError as error:
    raise ImportError(
        f"kerastorch.LightModel needs Lightning, which could not be imported ({error}). "
        "Install it with: pip install 'kerastorch[lightning]'  (or use kerastorch.KerasModel, which needs no extra)."
    ) from error

from torchmetrics import Metric

from .data.batches import detach
from .model import ModelParts
from .training.meters import samples_in
from .training.metric_meters import is_stateful_metric, metric_friendly, metric_update_fn, scalar_metric_value
from .training.model_checks import check_loss_fn

STAGES = ("train", "val", "test")


class LightModel(ModelParts, pl.LightningModule):
    """A ``LightningModule`` built from a net, a loss, a dict of metrics and an optimizer.

    Example::

        import lightning.pytorch as pl
        import torchmetrics
        from torch import nn
        import kerastorch as kt
        from kerastorch.examples import create_cnn, digits_loaders

        dl_train, dl_val, dl_test = digits_loaders()
        net = create_cnn()
        model = kt.LightModel(net, loss_fn=nn.CrossEntropyLoss(),
                              metrics_dict={"acc": torchmetrics.Accuracy(task="multiclass", num_classes=10)},
                              optimizer=torch.optim.Adam(net.parameters(), lr=1e-3))
        trainer = pl.Trainer(max_epochs=10, accelerator="auto", devices="auto",
                             callbacks=[pl.callbacks.ModelCheckpoint(monitor="val_acc", mode="max"),
                                        pl.callbacks.EarlyStopping(monitor="val_acc", mode="max", patience=3)])
        trainer.fit(model, dl_train, dl_val)
        trainer.callback_metrics["val_acc"]

    Metrics may be torchmetrics ``Metric`` objects (Lightning computes, syncs and resets
    them), stateful objects with ``update``/``forward``, ``compute`` and ``reset``
    (torchkeras's pattern; computed once per epoch), or functions ``f(preds, labels)``
    (averaged over samples). Each stage gets its own copy of a stateful metric.

    A ``ReduceLROnPlateau`` scheduler is stepped with ``val_loss``. Override
    :meth:`forward_batch` (and :meth:`predict_batch`) for other batch layouts, as with
    ``KerasModel``.
    """

    def __init__(
        self,
        net: nn.Module,
        loss_fn: Optional[Any] = None,
        metrics_dict: Optional[dict] = None,
        optimizer: Optional[torch.optim.Optimizer] = None,
        lr_scheduler: Optional[Any] = None,
        lr_scheduler_interval: str = "epoch",
    ):
        super().__init__()
        self.set_parts(net, loss_fn, metrics_dict, optimizer, lr_scheduler, lr_scheduler_interval)
        check_loss_fn(self, net_may_compute_it=False)
        # Labels reshaped or cast as Keras does (decided on the first batch) are said once, never silently.
        self.start_reading(say=pl.utilities.rank_zero.rank_zero_info)

        # One copy of each stateful metric per stage, keyed by its logged name ("val_acc").
        # torchmetrics copies sit in a ModuleDict: Lightning moves them with the model and
        # finds them when they are logged; their states stay out of the checkpoint.
        self.stage_metrics = nn.ModuleDict()
        # Other stateful metrics are kept out of the module tree, so their states (often
        # nn.Parameters in hand-written metrics) are neither trained, broadcast by DDP,
        # nor written into checkpoints; they are moved to the device at epoch start.
        self.custom_metrics: dict[str, Any] = {}
        for stage in STAGES:
            for name, metric in self.metrics_dict.items():
                if isinstance(metric, Metric):
                    self.stage_metrics[f"{stage}_{name}"] = copy.deepcopy(metric)
                elif is_stateful_metric(metric):
                    self.custom_metrics[f"{stage}_{name}"] = copy.deepcopy(metric)
        self.samples_seen = dict.fromkeys(STAGES, 0)  # this process's samples in the current epoch

    # forward_batch and predict_batch come from ModelParts: override them for custom
    # batches, as in KerasModel.

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.net(*args, **kwargs)

    # -- Lightning's steps ---------------------------------------------------------------

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self._shared_step(batch, "train")

    def validation_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self._shared_step(batch, "val")

    def test_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self._shared_step(batch, "test")

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Any:
        return self.predict_batch(batch)

    def _shared_step(self, batch: Any, stage: str) -> torch.Tensor:
        loss, preds, labels = self.forward_batch(batch)
        batch_size = samples_in(labels, preds, batch, self.labels_at)
        # batch_size makes Lightning's epoch value a sample-weighted mean (exact with a
        # short last batch); sync_dist sums over devices once, at epoch end.
        self.log(
            f"{stage}_loss", loss, on_step=False, on_epoch=True, batch_size=batch_size, sync_dist=True, prog_bar=True
        )
        self._update_metrics(stage, metric_friendly(detach(preds)), labels, batch_size)
        return loss

    def _update_metrics(self, stage: str, preds: Any, labels: Any, batch_size: int) -> None:
        self.samples_seen[stage] += batch_size
        for name, metric in self.metrics_dict.items():
            key = f"{stage}_{name}"
            if key in self.stage_metrics:  # torchmetrics: Lightning computes, syncs and resets it
                stage_metric = cast(Metric, self.stage_metrics[key])
                stage_metric.update(preds, labels)
                self.log(key, stage_metric, on_step=False, on_epoch=True, prog_bar=True)
            elif key in self.custom_metrics:  # read once, in _log_custom_metrics at epoch end
                metric_update_fn(self.custom_metrics[key])(preds, labels)
            else:  # a function: its batch values, weighted by batch size, like the loss
                value = scalar_metric_value(metric(preds, labels), key).detach()
                value = value.to(self.device, value.dtype if value.is_floating_point() else torch.float32)
                self.log(key, value, on_step=False, on_epoch=True, batch_size=batch_size, sync_dist=True, prog_bar=True)

    def _start_epoch(self, stage: str) -> None:
        self.samples_seen[stage] = 0
        for key, metric in self.custom_metrics.items():
            if key.startswith(f"{stage}_"):
                if isinstance(metric, nn.Module):
                    metric.to(self.device)
                metric.reset()

    def _log_custom_metrics(self, stage: str) -> None:
        samples = self.samples_seen[stage]
        if samples == 0:
            return
        for key, metric in self.custom_metrics.items():
            if key.startswith(f"{stage}_"):
                value = scalar_metric_value(metric.compute(), key).detach()
                value = value.to(self.device, value.dtype if value.is_floating_point() else torch.float32)
                # Each device computed the metric over its own samples; weighting by their
                # number makes the synced value exact for per-sample means such as accuracy.
                self.log(key, value, on_step=False, on_epoch=True, batch_size=samples, sync_dist=True, prog_bar=True)
                metric.reset()

    def on_train_epoch_start(self) -> None:
        self._start_epoch("train")

    def on_validation_epoch_start(self) -> None:
        self._start_epoch("val")

    def on_test_epoch_start(self) -> None:
        self._start_epoch("test")

    def on_train_epoch_end(self) -> None:
        self._log_custom_metrics("train")

    def on_validation_epoch_end(self) -> None:
        self._log_custom_metrics("val")

    def on_test_epoch_end(self) -> None:
        self._log_custom_metrics("test")

    # -- optimizer and scheduler --------------------------------------------------------

    def configure_optimizers(self) -> Any:
        if self.lr_scheduler is None:
            return self.optimizer
        scheduler = {"scheduler": self.lr_scheduler, "interval": self.lr_scheduler_interval}
        if isinstance(self.lr_scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
            scheduler["monitor"] = "val_loss"  # what KerasModel.fit steps it with by default
        return {"optimizer": self.optimizer, "lr_scheduler": scheduler}


__all__ = ["LightModel"]
