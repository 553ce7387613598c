"""The epoch loop: train an epoch, validate, tell the callbacks, repeat.

Nothing here asks the device for a number: losses and metrics go into
:class:`~kerastorch.training.meters.EpochMeters`, which turns them into floats once per epoch
(and when the progress bar redraws). What happens inside a training step — backward,
accumulation, the optimizer step and its hooks — is :mod:`kerastorch.training.step`'s.
"""

from __future__ import annotations

import itertools
from typing import Any, Optional, Union

import torch

from ..callbacks.callback_list import CallbackList
from ..data.batches import OutputRows, batch_size_of, split_sample_weight, to_host
from ..data.loaders import FirstBatches
from ..data.peek import FirstPass, num_batches
from ..devices.runtime import Runtime
from ..settings import is_validated
from .meters import EpochMeters, StepLogs
from .modes import eval_mode
from .position import RunPosition
from .preemption import Preemption
from .protocols import Epochs, TrainableModel
from .schedulers import after_epoch
from .step import FitStep


def fit_loop(
    model: TrainableModel,
    stages: Epochs,
    train_loader: Any,
    val_loader: Optional[Any],
    runtime: Runtime,
    callbacks: CallbackList,
    epochs: int,
    history: list[dict],
    first_epoch: int = 1,
    validation_freq: Union[int, tuple[int, ...]] = 1,
    position: Optional[RunPosition] = None,
    preemption: Optional[Preemption] = None,
) -> None:
    """Run epochs ``first_epoch..epochs``, appending one row per epoch to ``history``.

    ``stages`` trains and validates an epoch: fit's own (:class:`FitEpochs`), or a torchkeras
    program's StepRunner (:class:`~kerastorch.compat.runners.RunnerEpochs`).
    Validation runs every ``validation_freq`` epochs (Keras's rule: epochs n, 2n, ...; or, for a tuple,
    the epochs listed); the
    logs of the other epochs have no ``val_*`` values, so the callbacks that watch one skip them.
    ``position`` says which epoch runs (and, resumed, where it goes on); ``preemption`` stops the
    run at the end of an epoch during which a preemption signal came between batches.
    """
    position = position if position is not None else RunPosition()
    for epoch in range(first_epoch, epochs + 1):
        callbacks.call("on_epoch_begin", epoch, {})
        lr = position.begin_epoch(epoch, current_lr(model.optimizer))
        train_logs = stages.train(train_loader)
        validate = val_loader is not None and is_validated(epoch, validation_freq)
        val_logs = stages.validate(val_loader) if validate else {}
        logs = {"epoch": epoch, **train_logs, "lr": lr, **val_logs}
        stages.end_epoch(logs)  # before the row joins the history: a failure here keeps the epoch out of it
        history.append(logs)
        runtime.wait_for_everyone()  # with several processes, files are written after a barrier
        callbacks.call("on_epoch_end", epoch, logs)
        model.stop_training = runtime.any_process(model.stop_training)  # all processes stop together
        if preemption is not None and preemption.requested_anywhere():
            preemption.stop(epoch + 1, batches=0)
        if model.stop_training:
            break


class FitEpochs:
    """fit's own epochs: :func:`train_epoch` with fit's step, :func:`evaluate_epoch`, and the
    scheduler's call after an epoch (:mod:`~kerastorch.training.schedulers`)."""

    def __init__(
        self,
        model: TrainableModel,
        runtime: Runtime,
        callbacks: CallbackList,
        meters: dict[str, EpochMeters],
        steps: FitStep,
        position: Optional[RunPosition] = None,
        preemption: Optional[Preemption] = None,
        first_val_pass: Optional[FirstPass] = None,
    ):
        self.model, self.runtime, self.callbacks, self.meters, self.steps = model, runtime, callbacks, meters, steps
        self.position, self.preemption = position, preemption
        # The pass over the validation data that the checks before training began: the first
        # validation goes on with it instead of fetching its first batch again.
        self.first_val_pass = first_val_pass

    def train(self, loader: Any) -> dict[str, float]:
        return train_epoch(
            self.model,
            loader,
            self.runtime,
            self.meters["train"],
            self.callbacks,
            self.steps,
            self.position,
            self.preemption,
        )

    def validate(self, loader: Any) -> dict[str, float]:
        kept, self.first_val_pass = self.first_val_pass, None
        batches = continued(loader, kept) if kept is not None else loader
        return evaluate_epoch(self.model, batches, self.runtime, self.meters["val"], self.callbacks)

    def end_epoch(self, logs: dict) -> None:
        settings = self.steps.settings
        after_epoch(self.model.lr_scheduler, settings.scheduler_interval, logs["epoch"], logs, settings.monitor)


def continued(loader: Any, kept: FirstPass) -> Any:
    """The batches of a pass over ``loader``: the kept pass when it is over the same data
    (``validation_steps`` takes its first batches too), else ``loader``."""
    if loader is kept.loader:
        return kept
    if isinstance(loader, FirstBatches) and loader.loader is kept.loader:
        return itertools.islice(kept, loader.steps)
    return loader


def train_epoch(
    model: TrainableModel,
    loader: Any,
    runtime: Runtime,
    meters: EpochMeters,
    callbacks: CallbackList,
    steps: FitStep,
    position: Optional[RunPosition] = None,
    preemption: Optional[Preemption] = None,
) -> dict[str, float]:
    """One epoch's training batches. ``position``: a resumed epoch starts at its first batch not yet
    trained (the loader hands out the rest); ``preemption``: after a preemption signal, the epoch
    stops at the next optimizer-step boundary (see :mod:`~kerastorch.training.preemption`)."""
    model.net.train()
    meters.reset()
    on_begin, on_end = callbacks.wants("on_train_batch_begin"), callbacks.wants("on_train_batch_end")
    steps.start_epoch(num_batches(loader))
    weighted = bool(meters.weighted)  # weighted_metrics read each batch's sample weights
    first_batch = position.continue_epoch(meters) if position is not None else 0
    watch: Any = preemption if preemption is not None else _NO_PREEMPTION
    for batch_index, batch in enumerate(loader, start=first_batch):
        if on_begin:
            callbacks.call("on_train_batch_begin", batch_index, {})
        batch = runtime.to_device(batch)
        outputs = steps.run(batch_index, batch)
        if isinstance(outputs, dict):  # a train_step of the user's own that names its values
            meters.update_values(outputs, batch_size_of(None, None, batch))
        else:
            loss, preds, labels = outputs
            weight = split_sample_weight(batch)[1] if weighted else None
            meters.update(loss, preds, labels, batch_size_of(labels, preds, batch), weight)
        if on_end:
            callbacks.call("on_train_batch_end", batch_index, StepLogs(meters))
        if model.stop_training:  # set by a batch hook: stop after this batch, as Keras does
            break
        if watch.requested and steps.updates_now:  # a Python flag: no device sync
            watch.stop(position.epoch if position is not None else 0, batches=batch_index + 1)
    steps.end_epoch()
    if meters.count == 0:
        raise ValueError(
            "train_data produced no batches this epoch. Check that the dataset is not empty and drop_last "
            "does not drop the only batch."
        )
    return meters.read()


@torch.no_grad()
def evaluate_epoch(
    model: TrainableModel, loader: Any, runtime: Runtime, meters: EpochMeters, callbacks: CallbackList
) -> dict[str, float]:
    with eval_mode(model.net):  # also after Ctrl-C or an error, the net goes back to the mode it was in
        meters.reset()
        callbacks.call("on_test_begin", {})
        on_begin, on_end = callbacks.wants("on_test_batch_begin"), callbacks.wants("on_test_batch_end")
        for batch_index, batch in enumerate(loader):
            if on_begin:
                callbacks.call("on_test_batch_begin", batch_index, {})
            batch = runtime.to_device(batch)
            with runtime.autocast():
                loss, preds, labels = model.forward_batch(batch)
            weight = split_sample_weight(batch)[1] if meters.weighted else None
            meters.update(loss, preds, labels, batch_size_of(labels, preds), weight)
            if on_end:
                callbacks.call("on_test_batch_end", batch_index, StepLogs(meters))
        if meters.count == 0 and runtime.num_processes == 1:  # a process may get no share of a short loader
            raise ValueError("The validation data produced no batches. Pass a non-empty DataLoader or val_data=None.")
        logs = meters.read()
        callbacks.call("on_test_end", logs)
    return logs


@torch.no_grad()
def predict_outputs(
    model: TrainableModel,
    loader: Any,
    runtime: Runtime,
    callbacks: Optional[CallbackList] = None,
    *,
    held: str = "batches",
    concatenate: bool = True,
) -> Any:
    """The net's outputs for every batch, on the CPU, in data order: concatenated into one structure
    (stacked where ``held`` is ``"samples"``: each batch is one sample, see
    :func:`~kerastorch.data.loaders.what_batches_hold`), or with ``concatenate=False`` a list of each
    batch's outputs. ``callbacks`` get Keras's predict hooks (``on_predict_batch_end``'s logs
    hold the batch's ``outputs``)."""
    rows = OutputRows(held)
    listed = []
    callbacks = callbacks if callbacks is not None else CallbackList([], model, {})
    on_begin, on_end = callbacks.wants("on_predict_batch_begin"), callbacks.wants("on_predict_batch_end")
    with eval_mode(model.net):
        callbacks.call("on_predict_begin", {})
        for batch_index, batch in enumerate(loader):
            if on_begin:
                callbacks.call("on_predict_batch_begin", batch_index, {})
            batch = runtime.to_device(batch)
            with runtime.autocast():
                batch_outputs = model.predict_batch(batch)
            if concatenate:
                rows.append(to_host(batch_outputs), batch)  # refuses, at this batch, outputs that cannot join
            else:
                listed.append(to_host(batch_outputs))
            if on_end:
                callbacks.call("on_predict_batch_end", batch_index, {"outputs": batch_outputs})
        callbacks.call("on_predict_end", {})
    if not (rows.batches or listed):
        raise ValueError("predict got no batches: the data is empty.")
    return rows.concatenated() if concatenate else listed


class _NoPreemption:
    requested = False


_NO_PREEMPTION = _NoPreemption()


def current_lr(optimizer: torch.optim.Optimizer) -> float:
    return float(optimizer.param_groups[0]["lr"])


__all__ = ["FitEpochs", "evaluate_epoch", "fit_loop", "predict_outputs", "train_epoch"]
