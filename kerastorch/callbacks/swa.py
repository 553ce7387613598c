"""``SWA``: stochastic weight averaging from a given epoch on, with torch's ``SWALR``."""

from __future__ import annotations

import math
from typing import Any, Literal, Optional, Union

import torch
from torch.optim.swa_utils import SWALR, AveragedModel, update_bn

from ..helpers.modes import train_mode
from .averaged_weights import AveragedWeights


class SWA(AveragedWeights):
    """Stochastic weight averaging: from ``swa_epoch_start`` on, the weights at the end of each
    epoch join an equal average, the learning rate anneals to ``swa_lrs`` (torch's ``SWALR``),
    and validation, the best weights, early stopping and the weights ``fit`` returns use the
    average. Before the averaged weights are validated, BatchNorm statistics are recomputed
    for them with torch's ``update_bn`` over the training data.

    ``swa_epoch_start``: an epoch number (1-based), or a fraction of ``epochs`` (0.8: the
    last 20 % of the epochs). A ``KerasModel`` with its own ``lr_scheduler`` is refused: SWA
    sets the learning rate from its start on.

    Example::

        model.fit(dl_train, dl_val, epochs=20, callbacks=[kt.callbacks.SWA(swa_lrs=1e-3, swa_epoch_start=0.75)])
    """

    def __init__(
        self,
        swa_lrs: float,
        swa_epoch_start: Union[int, float] = 0.8,
        annealing_epochs: int = 2,
        annealing_strategy: Literal["cos", "linear"] = "cos",
    ):
        super().__init__()
        start_ok = (isinstance(swa_epoch_start, int) and swa_epoch_start >= 1) or (
            isinstance(swa_epoch_start, float) and 0 < swa_epoch_start < 1
        )
        if isinstance(swa_epoch_start, bool) or not start_ok:
            raise ValueError(
                f"SWA(swa_epoch_start={swa_epoch_start!r}); use an epoch number >= 1, or a fraction of "
                "the epochs in (0, 1) such as 0.8."
            )
        if annealing_strategy not in ("cos", "linear"):
            raise ValueError(f"SWA(annealing_strategy={annealing_strategy!r}); use 'cos' or 'linear'.")
        self.swa_lrs = swa_lrs
        self.swa_epoch_start = swa_epoch_start
        self.annealing_epochs = annealing_epochs
        self.annealing_strategy = annealing_strategy
        self.scheduler: Optional[SWALR] = None
        self.averaged_epoch: Optional[int] = None  # the last epoch whose weights joined the average
        self.epoch = 0  # the epoch being trained

    @property
    def start_epoch(self) -> int:
        if isinstance(self.swa_epoch_start, float):
            return max(1, math.ceil(self.swa_epoch_start * self.params["epochs"]))
        return self.swa_epoch_start

    def make_average(self, net: torch.nn.Module) -> AveragedModel:
        return AveragedModel(net)  # parameters only: BatchNorm statistics are recomputed (update_bn)

    def on_train_begin(self, logs: Optional[dict] = None) -> None:
        if self.model.lr_scheduler is not None:
            raise ValueError(
                f"SWA sets the learning rate (SWALR) from epoch {self.start_epoch} on, but this model "
                f"also has lr_scheduler={type(self.model.lr_scheduler).__name__}. Remove one of them."
            )
        super().on_train_begin(logs)
        self.scheduler, self.averaged_epoch = None, None

    def on_epoch_begin(self, epoch: int, logs: Optional[dict] = None) -> None:
        super().on_epoch_begin(epoch, logs)
        self.epoch = epoch
        if epoch >= self.start_epoch and self.scheduler is None:
            self.scheduler = self._swalr()

    def on_test_begin(self, logs: Optional[dict] = None) -> None:
        self._average_and_swap_in()

    def on_epoch_end(self, epoch: int, logs: Optional[dict] = None) -> None:
        self._average_and_swap_in()
        if self.scheduler is not None:
            self.scheduler.step()

    def _average_and_swap_in(self) -> None:
        epoch = self.epoch
        if epoch < self.start_epoch or self.averaged is None or self.swapped_epoch is not None:
            return
        if self.averaged_epoch != epoch:
            self.averaged.update_parameters(self.net)
            self.averaged_epoch = epoch
        self.swap_in(epoch)
        if _has_batch_norm(self.net):
            self._recompute_batch_norm()

    def _recompute_batch_norm(self) -> None:
        loader = self.params.get("train_data")
        if loader is None:
            return
        runtime, model = self.model.runtime, self.model

        def inputs():
            for batch in loader:
                yield (_Batch(runtime.to_device(batch) if runtime is not None else batch),)

        # update_bn leaves its module in the mode that module had, and a fresh wrapper is in train
        # mode: the net would then validate with dropout on and batch statistics. train_mode puts
        # every layer's own mode back (eval, inside validation).
        with train_mode(model.net):
            update_bn(inputs(), _PredictBatch(model))

    def _swalr(self) -> SWALR:
        return SWALR(
            self.model.optimizer,
            swa_lr=self.swa_lrs,
            anneal_epochs=self.annealing_epochs,
            anneal_strategy=self.annealing_strategy,
        )

    def state_dict(self) -> dict:
        return {
            **super().state_dict(),
            "averaged_epoch": self.averaged_epoch,
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
        }

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.averaged_epoch = state["averaged_epoch"]
        if state["scheduler"] is not None:
            self.scheduler = self._swalr()
            self.scheduler.load_state_dict(state["scheduler"])


class _Batch:
    """A whole batch handed through ``update_bn``, which unpacks lists and tuples one level."""

    def __init__(self, batch: Any):
        self.batch = batch


class _PredictBatch(torch.nn.Module):
    """The net as ``update_bn`` calls it: one argument, the batch, through ``predict_batch``."""

    def __init__(self, model: Any):
        super().__init__()
        self.net = model.net  # registered, so update_bn finds its BatchNorm layers
        self._model = [model]  # not a submodule

    def forward(self, wrapped: _Batch) -> Any:
        return self._model[0].predict_batch(wrapped.batch)


def _has_batch_norm(net: torch.nn.Module) -> bool:
    return any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in net.modules())


__all__ = ["SWA"]
