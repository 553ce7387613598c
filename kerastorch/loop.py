"""The epoch and step loop: train an epoch, validate, tell the callbacks, repeat.

Nothing here asks the device for a number: losses and metrics go into
:class:`~kerastorch.meters.EpochMeters`, which turns them into floats once per epoch
(and when the progress bar redraws).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Optional

import torch

from .batches import batch_size_of
from .callbacks.base import CallbackList
from .meters import EpochMeters, StepLogs
from .runtime import Runtime


@dataclass
class StepSettings:
    """How gradients become updates."""

    accumulation_steps: int = 1
    clip_val: Optional[float] = None
    clip_algorithm: str = "norm"
    scheduler_interval: str = "epoch"
    monitor: str = "val_loss"  # what a ReduceLROnPlateau scheduler is stepped with


def fit_loop(model, train_loader, val_loader, runtime: Runtime, callbacks: CallbackList,
             meters: dict[str, EpochMeters], settings: StepSettings, epochs: int,
             history: list[dict], first_epoch: int = 1) -> None:
    """Run epochs ``first_epoch..epochs``, appending one row per epoch to ``history``."""
    for epoch in range(first_epoch, epochs + 1):
        callbacks.call("on_epoch_begin", epoch, {})
        lr = current_lr(model.optimizer)
        train_logs = train_epoch(model, train_loader, runtime, meters["train"], callbacks, settings)
        val_logs = evaluate_epoch(model, val_loader, runtime, meters["val"], callbacks) if val_loader is not None else {}
        logs = {"epoch": epoch, **train_logs, "lr": lr, **val_logs}
        history.append(logs)
        if model.lr_scheduler is not None and settings.scheduler_interval == "epoch":
            step_epoch_scheduler(model.lr_scheduler, logs, settings.monitor)
        runtime.wait_for_everyone()  # with several processes, files are written after a barrier
        callbacks.call("on_epoch_end", epoch, logs)
        model.stop_training = runtime.any_process(model.stop_training)  # all processes stop together
        if model.stop_training:
            break


def train_epoch(model, loader, runtime: Runtime, meters: EpochMeters, callbacks: CallbackList,
                settings: StepSettings) -> dict[str, float]:
    net, optimizer = model.net, model.optimizer
    net.train()
    meters.reset()
    on_begin, on_end = callbacks.wants("on_train_batch_begin"), callbacks.wants("on_train_batch_end")
    accumulate = settings.accumulation_steps
    num_batches = _length(loader)
    waiting = 0  # batches whose gradients wait for the next optimizer step
    # Gradients left by the user's own backward, or by a run stopped mid-group, must not
    # leak into this epoch's first update.
    optimizer.zero_grad(set_to_none=True)
    for batch_index, batch in enumerate(loader):
        if on_begin:
            callbacks.call("on_train_batch_begin", batch_index, {})
        batch = runtime.to_device(batch)
        waiting += 1
        updates_now = waiting == accumulate or batch_index + 1 == num_batches
        # Under DDP, gradients are all-reduced only on the batch that ends a group.
        with contextlib.nullcontext() if updates_now else runtime.no_sync(net):
            with runtime.autocast():
                loss, preds, labels = model.forward_batch(batch)
            backward(loss / accumulate if accumulate > 1 else loss, runtime)
        if updates_now:
            optimizer_step(model, runtime, settings, grad_factor=accumulate / waiting)
            waiting = 0
        meters.update(loss, detach(preds), labels, batch_size_of(labels, preds))
        if on_end:
            callbacks.call("on_train_batch_end", batch_index, StepLogs(meters))
        if model.stop_training:  # set by a batch hook: stop after this batch, as Keras does
            break
    if waiting:  # a last, shorter group: from a loader of unknown length, or stopped by a callback
        average_unsynced_gradients(net, runtime)
        optimizer_step(model, runtime, settings, grad_factor=accumulate / waiting)
    if meters.count == 0:
        raise ValueError("train_data produced no batches this epoch. Check that the dataset is not empty and drop_last "
                         "does not drop the only batch.")
    return meters.read()


@torch.no_grad()
def evaluate_epoch(model, loader, runtime: Runtime, meters: EpochMeters, callbacks: CallbackList) -> dict[str, float]:
    net = model.net
    was_training = net.training
    net.eval()
    meters.reset()
    callbacks.call("on_test_begin", {})
    on_begin, on_end = callbacks.wants("on_test_batch_begin"), callbacks.wants("on_test_batch_end")
    for batch_index, batch in enumerate(loader):
        if on_begin:
            callbacks.call("on_test_batch_begin", batch_index, {})
        batch = runtime.to_device(batch)
        with runtime.autocast():
            loss, preds, labels = model.forward_batch(batch)
        meters.update(loss, preds, labels, batch_size_of(labels, preds))
        if on_end:
            callbacks.call("on_test_batch_end", batch_index, StepLogs(meters))
    if meters.count == 0 and runtime.num_processes == 1:  # a process may get no share of a short loader
        raise ValueError("The validation data produced no batches. Pass a non-empty DataLoader or val_data=None.")
    logs = meters.read()
    callbacks.call("on_test_end", logs)
    net.train(was_training)
    return logs


@torch.no_grad()
def predict_outputs(model, loader, runtime: Runtime) -> Any:
    """The net's outputs for every batch, on the CPU, concatenated in data order."""
    net = model.net
    was_training = net.training
    net.eval()
    outputs = []
    for batch in loader:
        batch = runtime.to_device(batch)
        with runtime.autocast():
            outputs.append(_to_cpu(model.predict_batch(batch)))
    net.train(was_training)
    if not outputs:
        raise ValueError("predict got no batches: the data is empty.")
    return _concatenate(outputs)


def backward(loss: torch.Tensor, runtime: Runtime) -> None:
    if runtime.scaler is not None:
        runtime.scaler.scale(loss).backward()
    else:
        loss.backward()


def optimizer_step(model, runtime: Runtime, settings: StepSettings, grad_factor: float = 1.0) -> None:
    optimizer, scaler = model.optimizer, runtime.scaler
    if grad_factor != 1.0 or settings.clip_val is not None:
        params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    if grad_factor != 1.0:  # a shorter last group: its mean is over fewer batches
        torch._foreach_mul_([p.grad for p in params], grad_factor)
    if settings.clip_val is not None:
        if scaler is not None:
            scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
        if settings.clip_algorithm == "norm":
            torch.nn.utils.clip_grad_norm_(params, settings.clip_val)
        else:
            torch.nn.utils.clip_grad_value_(params, settings.clip_val)
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if model.lr_scheduler is not None and settings.scheduler_interval == "step":
        model.lr_scheduler.step()


def average_unsynced_gradients(net, runtime: Runtime) -> None:
    """Under DDP, a group that ended after the loop ran all its batches under ``no_sync``:
    average its gradients over the processes, as DDP's own all-reduce would have."""
    if not isinstance(net, torch.nn.parallel.DistributedDataParallel) or runtime.num_processes == 1:
        return
    for param in net.parameters():
        if param.grad is not None:
            param.grad.copy_(runtime.reduce_sum(param.grad) / runtime.num_processes)


def step_epoch_scheduler(scheduler, logs: dict, monitor: str) -> None:
    if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        scheduler.step(logs[monitor])
    else:
        scheduler.step()


def current_lr(optimizer) -> float:
    return float(optimizer.param_groups[0]["lr"])


def _length(loader) -> Optional[int]:
    try:
        return len(loader)
    except TypeError:
        return None


def detach(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach()
    if isinstance(obj, (list, tuple)):
        return type(obj)(detach(o) for o in obj)
    if isinstance(obj, dict):
        return {k: detach(v) for k, v in obj.items()}
    return obj


def _to_cpu(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        out = obj.detach().to("cpu")
        return out.float() if out.dtype in (torch.float16, torch.bfloat16) else out
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(o) for o in obj)
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    return obj


def _concatenate(outputs: list) -> Any:
    first = outputs[0]
    if isinstance(first, torch.Tensor):
        return torch.cat([o.reshape(1) if o.dim() == 0 else o for o in outputs])
    if isinstance(first, (list, tuple)):
        return type(first)(_concatenate([o[i] for o in outputs]) for i in range(len(first)))
    if isinstance(first, dict):
        return {k: _concatenate([o[k] for o in outputs]) for k in first}
    return outputs

