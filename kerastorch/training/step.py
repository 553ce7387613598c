"""One training step, and the hooks that let a callback act inside it.

The loop hands each batch to :meth:`FitStep.run`, which calls the model's
``train_step(batch)``. The default ``KerasModel.train_step`` is the plain step —
forward and loss under autocast, ``model.backward(loss)``, ``model.optimizer_step()`` —
and those two calls come here: gradient accumulation (an update every k batches, DDP's
all-reduce only on the batch that ends a group), the grad scaler of ``16-mixed``,
clipping, a per-step scheduler, and the four step hooks that Lightning and fastai
users know. A user who overrides ``train_step`` (a GAN, two optimizers) calls the same
``model.backward`` and ``model.optimizer_step(optimizer)`` and gets all of it.

A hook is called only when a callback overrides it, so the plain step pays a
boolean test per hook and nothing else.

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
from typing import Any, Optional

import torch

from ..callbacks.callback_list import CallbackList
from ..checks.first_batch import checked_first_step
from ..devices.runtime import Runtime
from ..settings import StepSettings
from .meters import EpochMeters
from .modes import train_mode
from .protocols import TrainableModel
from .schedulers import after_update


class FitStep:
    """The optimizer-step machinery of one run: accumulation, scaling, clipping, scheduling, hooks."""

    def __init__(
        self,
        model: TrainableModel,
        runtime: Runtime,
        settings: StepSettings,
        callbacks: CallbackList,
        check_first_step: Optional[str] = None,
        meters: Optional[EpochMeters] = None,
    ):
        self.model = model
        self.runtime = runtime
        self.settings = settings
        self.callbacks = callbacks
        self.accumulate = settings.accumulation_steps
        self.scaler = runtime.scaler
        self.updates_now = True  # does the batch being run end an accumulation group?
        self._num_batches: Optional[int] = None
        self._waiting = 0  # batches whose gradients wait for the group's optimizer step
        self._deferred: list[torch.optim.Optimizer] = []  # optimizers asked to step before the group ended
        self._scaler_stepped = False
        self._before_backward = callbacks.wants("on_before_backward")
        self._after_backward = callbacks.wants("on_after_backward")
        self._before_optimizer_step = callbacks.wants("on_before_optimizer_step")
        self._after_optimizer_step = callbacks.wants("on_after_optimizer_step")
        # fit's first-batch checks ride on the real first step (the default train_step, one
        # process) instead of a forward pass of their own: see checks.checked_first_step. The
        # value is what the messages call the data ("train_data", "x").
        self._check_first_step = check_first_step
        # The training meter keeps the metric copies the check updated with the first batch.
        self._adopt_metric_trial = meters.adopt if meters is not None else None
        # A train_step of the user's own may hold several nets and optimizers: every batch starts with
        # each optimizer's gradients as its last optimizer_step call left them (none at a group's
        # start), so what another net's loss left on its parameters afterwards never reaches its update.
        self._own_step = not model.uses_default_train_step
        # Nothing of the default step overridden: run it here, without the model's calls in between.
        self._default_calls = model.uses_default_step_calls
        self._kept_grads: dict[int, list] = {}  # id(optimizer) -> [(parameter, its gradient then)]
        self._scheduler_after_update = after_update(model.lr_scheduler, settings.scheduler_interval)
        # Nothing between the backward pass and the update, nor after it: no accumulation, scaling,
        # clipping, step hook or per-step scheduler. The default step then updates in place.
        self._plain = (
            self.accumulate == 1
            and self.scaler is None
            and settings.clip_val is None
            and not (self._before_backward or self._after_backward)
            and not (self._before_optimizer_step or self._after_optimizer_step)
            and self._scheduler_after_update is None
        )
        self.epochs_done = 0  # set by the run when it resumes: the update count of a timm scheduler follows it
        self.updates_done = 0  # updates of the model's optimizer since the run began

    # -- called by the loop --------------------------------------------------------------

    def start_epoch(self, num_batches: Optional[int]) -> None:
        self._num_batches = num_batches
        self._waiting = 0
        self._deferred.clear()
        if num_batches is not None:  # timm's count: epoch * updates_per_epoch (also after a resume)
            self.updates_done = self.epochs_done * math.ceil(num_batches / self.accumulate)
        self.epochs_done += 1
        # Gradients left by the user's own backward, or by a run stopped mid-group, must not
        # leak into this epoch's first update.
        self.model.optimizer.zero_grad(set_to_none=True)

    def run(self, batch_index: int, batch: Any) -> Any:
        """The model's ``train_step`` on one batch; returns what it returns: ``(loss, preds, labels)``,
        or a dict of named values."""
        if self._own_step:
            self._drop_stray_gradients()
        self._waiting += 1
        self.updates_now = self._waiting == self.accumulate or batch_index + 1 == self._num_batches
        if not self.updates_now:
            # Gradients are exchanged between processes only on the batch that ends a group.
            with self.runtime.strategy.no_sync(self.model.net):
                return self._train_step(batch)
        outputs = self._train_step(batch)
        self._waiting = 0
        if self._deferred or self._kept_grads:
            self._deferred.clear()
            self._kept_grads.clear()
        if self._scaler_stepped:
            self._update_scaler()
        return outputs

    def _train_step(self, batch: Any) -> Any:
        if self._check_first_step is not None:
            name, self._check_first_step = self._check_first_step, None
            return checked_first_step(self.model, batch, self.runtime, name, self._adopt_metric_trial)
        if self._default_calls:
            return self._default_train_step(batch)
        return self.model.train_step(batch)

    def _default_train_step(self, batch: Any) -> tuple[torch.Tensor, Any, Any]:
        """``KerasModel.train_step`` as written there, for a model that overrides none of it: its calls to
        the model's ``autocast``, ``backward`` and ``optimizer_step``, which come back here, are made
        here directly (three frames and lookups fewer per batch, a few % of a small net's step), and with
        nothing between the backward pass and the update (``_plain``), what they come to."""
        with self.runtime.autocast():
            loss, preds, labels = self.model.forward_batch(batch)
        if self._plain:  # what backward and optimizer_step come to then, without their frames
            loss.backward()
            optimizer = self.model.optimizer
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            self.updates_done += 1
            return loss, preds, labels
        self.backward(loss)
        self.optimizer_step()
        return loss, preds, labels

    def end_epoch(self) -> None:
        """Step a last, shorter group: from a loader of unknown length, or stopped by a callback."""
        if self._waiting:
            if self._own_step:
                self._drop_stray_gradients()
            self.runtime.strategy.finish_accumulation(self.model.net, self.runtime)
            for optimizer in self._deferred or [self.model.optimizer]:
                self._step(optimizer, grad_factor=self.accumulate / self._waiting)
            self._update_scaler()
            self._waiting = 0
        self._deferred.clear()
        self._kept_grads.clear()

    def _drop_stray_gradients(self) -> None:
        """Every gradient of the net back to what its optimizer's last ``optimizer_step`` call in this
        accumulation group saw (none at the group's start)."""
        self.model.net.zero_grad(set_to_none=True)
        for kept in self._kept_grads.values():
            for parameter, grad in kept:
                parameter.grad = grad

    # -- called by train_step, through the model --------------------------------------------

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of the batch's loss: divided over an accumulation group, scaled under 16-mixed."""
        if self._before_backward:
            self.callbacks.call("on_before_backward", loss)
        if self.accumulate > 1:
            loss = loss / self.accumulate
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
        else:
            loss.backward()
        if self._after_backward:
            self.callbacks.call("on_after_backward")

    def optimizer_step(self, optimizer: Optional[torch.optim.Optimizer] = None) -> None:
        """Update with ``optimizer`` (default: the model's) if this batch ends an accumulation group;
        otherwise remember it and let the gradients add up."""
        optimizer = self.model.optimizer if optimizer is None else optimizer
        if self.updates_now:
            self._step(optimizer, grad_factor=self.accumulate / self._waiting)
            return
        if not any(optimizer is waiting for waiting in self._deferred):
            self._deferred.append(optimizer)
        if self._own_step:  # its gradients so far are its own: keep them from what later losses add
            params = [p for group in optimizer.param_groups for p in group["params"]]
            self._kept_grads[id(optimizer)] = [(p, None if p.grad is None else p.grad.clone()) for p in params]

    # -- the update ------------------------------------------------------------------------------

    def _step(self, optimizer: torch.optim.Optimizer, grad_factor: float) -> None:
        settings, scaler = self.settings, self.scaler
        if grad_factor != 1.0 or settings.clip_val is not None:
            params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if grad_factor != 1.0:  # a shorter last group: its mean is over fewer batches
            torch._foreach_mul_([p.grad for p in params], grad_factor)
        if scaler is not None and (settings.clip_val is not None or self._before_optimizer_step):
            scaler.unscale_(optimizer)  # clipping and callbacks see the true gradients, not the scaled ones
        if self._before_optimizer_step:
            self.callbacks.call("on_before_optimizer_step", optimizer)
        if settings.clip_val is not None:
            if settings.clip_algorithm == "norm":
                torch.nn.utils.clip_grad_norm_(params, settings.clip_val)
            else:
                torch.nn.utils.clip_grad_value_(params, settings.clip_val)
        if scaler is not None:
            scaler.step(optimizer)
            self._scaler_stepped = True
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if self._after_optimizer_step:
            self.callbacks.call("on_after_optimizer_step", optimizer)
        if optimizer is self.model.optimizer:
            self.updates_done += 1
            if self._scheduler_after_update is not None:
                self._scheduler_after_update(self.updates_done)

    def _update_scaler(self) -> None:
        # Once per batch, after every optimizer has stepped, as torch's AMP recipe asks.
        if self._scaler_stepped and self.scaler is not None:
            self.scaler.update()
            self._scaler_stepped = False


def run_once(model: TrainableModel, runtime: Runtime, settings: StepSettings, batch: Any) -> Any:
    """The model's ``train_step`` on one batch as fit's first step runs it (train mode, a group of one
    batch, the optimizers stepped), with a ``FitStep`` of its own and no callbacks: the trial of a step
    of the user's own, which :func:`~kerastorch.checks.first_batch.check_own_step` runs inside a snapshot."""
    trial = FitStep(model, runtime, settings, CallbackList([], model, {}))
    model.fit_step = trial  # what model.backward / model.optimizer_step use inside train_step
    try:
        with train_mode(model.net):
            trial.start_epoch(1)
            return trial.run(0, batch)
    finally:
        model.fit_step = None


__all__ = ["FitStep", "run_once"]
