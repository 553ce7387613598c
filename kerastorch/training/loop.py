"""The epoch loop and the optimizer step: train an epoch, validate, tell the callbacks, repeat.

Reading one training step needs this file and three others: ``KerasModel.train_step`` and
``forward_batch`` (:mod:`kerastorch.model`: the batch through the net and the loss), the epoch's
sums (:mod:`~kerastorch.training.meters`) and the device (:mod:`~kerastorch.devices.runtime`:
``to_device``, ``autocast``). ``train_step`` calls ``model.backward(loss)`` and
``model.optimizer_step()``, which come to this file's :class:`FitStep`: gradient accumulation,
the grad scaler of ``16-mixed``, clipping, a per-step scheduler and the step hooks.

Nothing here asks the device for a number: losses and metrics go into
:class:`~kerastorch.training.meters.EpochMeters`, which turns them into floats once per epoch
(and when the progress bar redraws).

When gradients are zeroed: ``optimizer_step(opt)`` zeroes ``opt``'s gradients right after
its update; the model's optimizer is zeroed when an epoch starts. With an overridden
``train_step`` (which may hold several optimizers and several nets), every batch starts with
each parameter's gradient as its optimizer's last ``optimizer_step`` call in the accumulation
group saw it (none at the group's start): a gradient one net got from another's loss after its
own optimizer's call (a discriminator's, from the generator's loss) never reaches its update,
with or without accumulation. Within one ``train_step``, before an optimizer's call, gradients
add up as in PyTorch.
"""

from __future__ import annotations

import math
import time
from typing import Any, Iterator, Optional, Union

import torch

from ..data.batches import samples_in_batch, split_sample_weight
from ..data.peek import num_batches
from ..devices.runtime import Runtime
from ..helpers.modes import TrainingModes
from ..helpers.protocols import Epochs, TrainableModel
from ..settings import StepSettings, is_validated
from .callback_list import CallbackList
from .eval_loop import evaluate_epoch
from .history import lr_columns
from .meters import EpochMeters, StepLogs
from .out_of_memory import EvalPieces, agree_on_micro_batch, failure_of, train_in_pieces
from .position import RunPosition
from .preemption import Preemption
from .schedulers import after_epoch, after_update


def fit_loop(
    model: TrainableModel,
    epochs: Epochs,
    train_loader: Any,
    val_loader: Optional[Any],
    runtime: Runtime,
    callbacks: CallbackList,
    last_epoch: int,
    history: list[dict],
    first_epoch: int = 1,
    validation_freq: Union[int, tuple[int, ...]] = 1,
    position: Optional[RunPosition] = None,
    preemption: Optional[Preemption] = None,
) -> None:
    """Run epochs ``first_epoch..last_epoch``, appending one row per epoch to ``history``.

    ``epochs`` trains and validates an epoch: fit's own (:class:`FitEpochs`), or a torchkeras
    program's (:mod:`kerastorch.compat`). Validation runs every ``validation_freq`` epochs (Keras's
    rule: epochs n, 2n, ...; or, for a tuple, the epochs listed); the logs of the other epochs have
    no ``val_*`` values, so the callbacks that watch one skip them. ``position`` says which epoch
    runs (and, resumed, where it goes on); ``preemption`` stops the run at the end of an epoch
    during which a preemption signal came between batches.
    """
    position = position if position is not None else RunPosition()
    if preemption is not None and preemption.requested_anywhere():  # a signal came before training began
        preemption.stop(first_epoch, batches=0)
    modes = TrainingModes(model.net)  # the modes the user gave the net's modules, kept for training
    for epoch in range(first_epoch, last_epoch + 1):
        modes.for_training()  # before on_epoch_begin: a callback may put a module in eval mode there
        callbacks.call("on_epoch_begin", epoch, {})
        rates = position.begin_epoch(epoch, learning_rates(model.optimizer))
        train_logs = epochs.train(train_loader)
        validate = val_loader is not None and is_validated(epoch, validation_freq)
        val_logs = epochs.validate(val_loader) if validate else {}
        logs = {"epoch": epoch, **train_logs, **rates, **val_logs}
        epochs.end_epoch(logs)  # before the row joins the history: a failure here keeps the epoch out of it
        history.append(logs)
        runtime.wait_for_everyone()  # with several processes, files are written after a barrier
        callbacks.call("on_epoch_end", epoch, logs)
        model.stop_training = runtime.any_process(model.stop_training)  # all processes stop together
        if preemption is not None and preemption.requested_anywhere():
            preemption.stop(epoch + 1, batches=0)
        if model.stop_training:
            break


class FitEpochs:
    """fit's own epochs: :func:`train_epoch` with the model's ``train_step``, ``evaluate_epoch``, and
    the scheduler's call after an epoch (:mod:`~kerastorch.training.schedulers`)."""

    def __init__(
        self,
        model: TrainableModel,
        runtime: Runtime,
        callbacks: CallbackList,
        meters: dict[str, EpochMeters],
        fit_step: FitStep,
        position: Optional[RunPosition] = None,
        preemption: Optional[Preemption] = None,
    ):
        self.model, self.runtime, self.callbacks, self.meters = model, runtime, callbacks, meters
        self.fit_step, self.position, self.preemption = fit_step, position, preemption
        self.timing: list[dict] = []  # one row per epoch trained: epoch, seconds, data_wait_fraction

    def train(self, loader: Any) -> dict[str, float]:
        return train_epoch(
            self.model,
            loader,
            self.runtime,
            self.meters["train"],
            self.callbacks,
            self.fit_step,
            self.position,
            self.preemption,
            self.timing,
        )

    def validate(self, loader: Any) -> dict[str, float]:
        pieces = self.fit_step.validation_pieces
        return evaluate_epoch(self.model, loader, self.runtime, self.meters["val"], self.callbacks, pieces)

    def end_epoch(self, logs: dict) -> None:
        settings = self.fit_step.settings
        after_epoch(self.model.lr_scheduler, settings.scheduler_interval, logs["epoch"], logs, settings.monitor)


def train_epoch(
    model: TrainableModel,
    loader: Any,
    runtime: Runtime,
    meters: EpochMeters,
    callbacks: CallbackList,
    fit_step: FitStep,
    position: Optional[RunPosition] = None,
    preemption: Optional[Preemption] = None,
    timing: Optional[list[dict]] = None,
) -> dict[str, float]:
    """One epoch's training batches: ``train_step`` on each, its values into ``meters``.

    ``position``: a resumed epoch starts at its first batch not yet trained (the loader hands out
    the rest); ``preemption``: after a preemption signal, the epoch stops at the next
    optimizer-step boundary (see :mod:`~kerastorch.training.preemption`); ``timing`` gets the
    epoch's row: its seconds and the share of them spent waiting for the loader (:class:`TimedBatches`)."""
    batches = TimedBatches(loader)
    meters.reset()
    # The hooks are asked for once: a hook no callback overrides costs nothing per batch.
    on_batch_begin = callbacks.listeners("on_train_batch_begin")
    on_batch_end = callbacks.listeners("on_train_batch_end")
    fit_step.start_epoch(num_batches(loader))
    weighted = bool(meters.weighted)  # weighted_metrics read each batch's sample weights
    first_batch = position.continue_epoch(meters) if position is not None else 0
    for batch_index, batch in enumerate(batches, start=first_batch):
        for hook in on_batch_begin:
            hook(batch_index, {})
        batch = runtime.to_device(batch)
        outputs = fit_step.run(batch_index, batch)
        if isinstance(outputs, dict):  # a train_step of the user's own that names its values
            meters.update_values(outputs, batch)
        else:
            loss, preds, labels = outputs
            weight = split_sample_weight(batch)[1] if weighted else None
            meters.update(loss, preds, labels, batch, weight)
        if on_batch_end:
            logs = StepLogs(meters)  # read from the device only if a callback looks at it
            for hook in on_batch_end:
                hook(batch_index, logs)
        if model.stop_training:  # set by a batch hook: stop after this batch, as Keras does
            break
        if preemption is not None and preemption.requested and fit_step.updates_now:  # Python flags: no sync
            preemption.stop(position.epoch if position is not None else 0, batches=batch_index + 1)
    fit_step.end_epoch()
    if meters.count == 0:
        raise ValueError(
            "train_data produced no batches this epoch. Check that the dataset is not empty and drop_last "
            "does not drop the only batch."
        )
    values = meters.read()  # waits for the device: the epoch's seconds include its work
    if timing is not None:
        timing.append(batches.row(position.epoch if position is not None else len(timing) + 1))
    return values


class TimedBatches:
    """A loader's batches, and the seconds the loop waited for them: the time spent in the loader's
    ``__next__`` (and in ``iter``, which starts its workers), read on the host with
    ``time.perf_counter``. No device is asked anything, so nothing waits for it."""

    def __init__(self, loader: Any):
        self.loader = loader
        self.started = time.perf_counter()
        self.waited = 0.0

    def __iter__(self) -> Iterator[Any]:
        asked = time.perf_counter()
        batches, done = iter(self.loader), object()
        while True:
            batch = next(batches, done)
            self.waited += time.perf_counter() - asked
            if batch is done:
                return
            yield batch
            asked = time.perf_counter()

    def row(self, epoch: int) -> dict:
        """The epoch's timing row: its seconds until now, and the share of them spent waiting."""
        seconds = time.perf_counter() - self.started
        return {"epoch": epoch, "seconds": seconds, "data_wait_fraction": self.waited / seconds if seconds else 0.0}


class FitStep:
    """What ``model.backward(loss)`` and ``model.optimizer_step()`` do inside ``train_step``:
    gradient accumulation (an update every k batches, DDP's all-reduce only on the batch that ends
    a group), the grad scaler of ``16-mixed``, clipping, a per-step scheduler, and the four step
    hooks that Lightning and fastai users know (each called only when a callback overrides it). A
    batch that runs out of memory is trained again as micro-batches
    (:mod:`~kerastorch.training.out_of_memory`)."""

    def __init__(self, model: TrainableModel, runtime: Runtime, settings: StepSettings, callbacks: CallbackList):
        self.model = model
        self.runtime = runtime
        self.settings = settings
        self.callbacks = callbacks
        self.accumulate = settings.accumulation_steps
        self.scaler = runtime.scaler
        self.updates_now = True  # does the batch being run end an accumulation group?
        self.num_batches: Optional[int] = None
        self.waiting = 0  # batches whose gradients wait for the group's optimizer step
        self.deferred: list[torch.optim.Optimizer] = []  # optimizers asked to step before the group ended
        self.scaler_stepped = False
        self.hooked = {hook: callbacks.wants(hook) for hook in STEP_HOOKS}
        # A train_step of the user's own may hold several nets and optimizers: every batch starts with
        # each optimizer's gradients as its last optimizer_step call left them (none at a group's
        # start), so what another net's loss left on its parameters afterwards never reaches its update.
        self.own_step = not model.uses_default_train_step
        self.kept_grads: dict[int, list] = {}  # id(optimizer) -> [(parameter, its gradient then)]
        self.scheduler_after_update = after_update(model.lr_scheduler, settings.scheduler_interval)
        self.epochs_done = 0  # set by the run when it resumes: the update count of a timm scheduler follows it
        self.updates_done = 0  # updates of the model's optimizer since the run began
        # Out of memory (see out_of_memory): the micro-batch size reached (None: whole batches), each
        # micro-batch's share of its batch's samples, and the part of the step that runs.
        self.on_oom = settings.on_oom
        self.micro_batch: Optional[int] = None
        self.share = 1.0
        self.phase = "forward"
        self.say = model.print if callbacks.params.get("verbose", 1) else None
        self.validation_pieces = EvalPieces("Validation", model, runtime, self.say, splits=settings.on_oom != "raise")

    # -- called by the loop --------------------------------------------------------------

    def start_epoch(self, num_batches: Optional[int]) -> None:
        self.num_batches = num_batches
        self.waiting = 0
        self.deferred.clear()
        if num_batches is not None:  # timm's count: epoch * updates_per_epoch (also after a resume)
            self.updates_done = self.epochs_done * math.ceil(num_batches / self.accumulate)
        self.epochs_done += 1
        # Gradients left by the user's own backward, or by a run stopped mid-group, must not
        # leak into this epoch's first update.
        self.model.optimizer.zero_grad(set_to_none=True)

    def run(self, batch_index: int, batch: Any) -> Any:
        """The model's ``train_step`` on one batch; returns what it returns: ``(loss, preds, labels)``,
        or a dict of named values. Out of memory, the batch is trained again as micro-batches
        (:mod:`~kerastorch.training.out_of_memory`), and so are the batches after it."""
        if self.own_step:
            self.drop_stray_gradients()
        self.waiting += 1
        self.updates_now = self.waiting == self.accumulate or batch_index + 1 == self.num_batches
        outputs, failure = None, None
        if self.micro_batch is None:
            try:
                outputs = self.train(batch)
            except torch.OutOfMemoryError as error:
                if self.on_oom == "raise":
                    raise
                failure = failure_of(self, error, batch_index, samples_in_batch(batch, self.model.labels_at))
        if self.micro_batch is not None or failure is not None:  # after the error is gone, with what it held
            outputs = train_in_pieces(self, batch, batch_index, failure)
        if self.updates_now:
            self.waiting = 0
            self.deferred.clear()
            self.kept_grads.clear()
            self.update_scaler()
        return outputs

    def train(self, batch: Any) -> Any:
        """The model's ``train_step`` on a batch, or on a micro-batch of one."""
        self.phase = "forward"
        if self.updates_now:
            return self.model.train_step(batch)
        # Gradients are exchanged between processes only on the batch that ends a group.
        with self.runtime.strategy.no_sync(self.model.net):
            return self.model.train_step(batch)

    def end_epoch(self) -> None:
        """Step a last, shorter group: from a loader of unknown length, or stopped by a callback."""
        if self.waiting:
            if self.own_step:
                self.drop_stray_gradients()
            self.runtime.strategy.finish_accumulation(self.model.net, self.runtime)
            for optimizer in self.deferred or [self.model.optimizer]:
                self.step(optimizer, grad_factor=self.accumulate / self.waiting)
            self.update_scaler()
            self.waiting = 0
        self.deferred.clear()
        self.kept_grads.clear()
        if self.runtime.num_processes > 1 and self.on_oom != "raise":
            agree_on_micro_batch(self)

    def micro_batches(self) -> dict:
        """The micro-batch sizes the run reached (None: whole batches), for a training state."""
        return {"train": self.micro_batch, "validation": self.validation_pieces.size}

    def use_micro_batches(self, sizes: Optional[dict]) -> None:
        """Go on with the micro-batch sizes of :meth:`micro_batches` (a resumed run's)."""
        if sizes:
            self.micro_batch, self.validation_pieces.size = sizes.get("train"), sizes.get("validation")

    def drop_stray_gradients(self) -> None:
        """Every gradient of the net back to what its optimizer's last ``optimizer_step`` call in this
        accumulation group saw (none at the group's start)."""
        self.model.net.zero_grad(set_to_none=True)
        for kept in self.kept_grads.values():
            for parameter, grad in kept:
                parameter.grad = grad

    # -- called by train_step, through the model --------------------------------------------

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of the batch's loss: divided over an accumulation group, scaled under 16-mixed."""
        self.phase = "backward"
        if self.hooked["on_before_backward"]:
            self.callbacks.call("on_before_backward", loss)
        if self.accumulate > 1:
            loss = loss / self.accumulate
        if self.share != 1.0:  # a micro-batch: its share of the batch's samples
            loss = loss * self.share
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
        else:
            loss.backward()
        if self.hooked["on_after_backward"]:
            self.callbacks.call("on_after_backward")

    def optimizer_step(self, optimizer: Optional[torch.optim.Optimizer] = None) -> None:
        """Update with ``optimizer`` (default: the model's) if this batch ends an accumulation group;
        otherwise remember it and let the gradients add up."""
        optimizer = self.model.optimizer if optimizer is None else optimizer
        if self.updates_now:
            self.step(optimizer, grad_factor=self.accumulate / self.waiting)
            return
        if not any(optimizer is waiting for waiting in self.deferred):
            self.deferred.append(optimizer)
        if self.own_step:  # its gradients so far are its own: keep them from what later losses add
            params = [p for group in optimizer.param_groups for p in group["params"]]
            self.kept_grads[id(optimizer)] = [(p, None if p.grad is None else p.grad.clone()) for p in params]

    # -- the update ------------------------------------------------------------------------------

    def step(self, optimizer: torch.optim.Optimizer, grad_factor: float) -> None:
        self.phase = "update"
        settings, scaler = self.settings, self.scaler
        if grad_factor != 1.0 or settings.clip_val is not None:
            params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if grad_factor != 1.0:  # a shorter last group: its mean is over fewer batches
            for param in params:
                param.grad.mul_(grad_factor)
        if scaler is not None and (settings.clip_val is not None or self.hooked["on_before_optimizer_step"]):
            scaler.unscale_(optimizer)  # clipping and callbacks see the true gradients, not the scaled ones
        if self.hooked["on_before_optimizer_step"]:
            self.callbacks.call("on_before_optimizer_step", optimizer)
        if settings.clip_val is not None:
            if settings.clip_algorithm == "norm":
                torch.nn.utils.clip_grad_norm_(params, settings.clip_val)
            else:
                torch.nn.utils.clip_grad_value_(params, settings.clip_val)
        if scaler is not None:
            scaler.step(optimizer)
            self.scaler_stepped = True
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if self.hooked["on_after_optimizer_step"]:
            self.callbacks.call("on_after_optimizer_step", optimizer)
        if optimizer is self.model.optimizer:
            self.updates_done += 1
            if self.scheduler_after_update is not None:
                self.scheduler_after_update(self.updates_done)

    def update_scaler(self) -> None:
        # Once per batch, after every optimizer has stepped, as torch's AMP recipe asks.
        if self.scaler_stepped and self.scaler is not None:
            self.scaler.update()
            self.scaler_stepped = False


STEP_HOOKS = ("on_before_backward", "on_after_backward", "on_before_optimizer_step", "on_after_optimizer_step")


def learning_rates(optimizer: torch.optim.Optimizer) -> dict[str, float]:
    """Each parameter group's learning rate as the epoch begins, under its history column's name: ``lr``,
    then ``lr_1``, ``lr_2``... with several groups (also a group a callback adds during the run)."""
    groups = optimizer.param_groups
    return dict(zip(lr_columns(len(groups)), (float(group["lr"]) for group in groups)))


__all__ = ["FitEpochs", "FitStep", "TimedBatches", "fit_loop", "train_epoch"]
