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
"""

from __future__ import annotations

import contextlib
from typing import Any, Optional

import torch

from ..callbacks.callback_list import CallbackList
from ..checks.first_batch import checked_first_step
from ..devices.runtime import Runtime
from ..settings import StepSettings
from .protocols import TrainableModel

_UPDATE_NOW = contextlib.nullcontext()  # reusable: entering it does nothing


class FitStep:
    """The optimizer-step machinery of one run: accumulation, scaling, clipping, scheduling, hooks."""

    def __init__(
        self,
        model: TrainableModel,
        runtime: Runtime,
        settings: StepSettings,
        callbacks: CallbackList,
        check_first_step: bool = False,
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
        # process) instead of a forward pass of their own: see checks.checked_first_step.
        self._check_first_step = check_first_step

    # -- called by the loop --------------------------------------------------------------

    def start_epoch(self, num_batches: Optional[int]) -> None:
        self._num_batches = num_batches
        self._waiting = 0
        self._deferred.clear()
        # Gradients left by the user's own backward, or by a run stopped mid-group, must not
        # leak into this epoch's first update.
        self.model.optimizer.zero_grad(set_to_none=True)

    def run(self, batch_index: int, batch: Any) -> tuple[torch.Tensor, Any, Any]:
        """The model's ``train_step`` on one batch; returns its ``(loss, preds, labels)``."""
        self._waiting += 1
        self.updates_now = self._waiting == self.accumulate or batch_index + 1 == self._num_batches
        # Gradients are exchanged between processes only on the batch that ends a group.
        with _UPDATE_NOW if self.updates_now else self.runtime.strategy.no_sync(self.model.net):
            if self._check_first_step:
                self._check_first_step = False
                outputs = checked_first_step(self.model, batch, self.runtime)
            else:
                outputs = self.model.train_step(batch)
        if self.updates_now:
            self._waiting = 0
            self._deferred.clear()
        self._update_scaler()
        return outputs

    def end_epoch(self) -> None:
        """Step a last, shorter group: from a loader of unknown length, or stopped by a callback."""
        if self._waiting:
            self.runtime.strategy.finish_accumulation(self.model.net, self.runtime)
            for optimizer in self._deferred or [self.model.optimizer]:
                self._step(optimizer, grad_factor=self.accumulate / self._waiting)
            self._update_scaler()
            self._waiting = 0
        self._deferred.clear()

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
        elif not any(optimizer is waiting for waiting in self._deferred):
            self._deferred.append(optimizer)

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
        model = self.model
        if optimizer is model.optimizer and model.lr_scheduler is not None and settings.scheduler_interval == "step":
            model.lr_scheduler.step()

    def _update_scaler(self) -> None:
        # Once per batch, after every optimizer has stepped, as torch's AMP recipe asks.
        if self._scaler_stepped and self.scaler is not None:
            self.scaler.update()
            self._scaler_stepped = False


__all__ = ["FitStep"]
