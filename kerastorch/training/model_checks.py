"""What ``fit`` checks about the model and the loaders before the first weight changes: gradients
switched on, a loss, an optimizer over this net, a scheduler over that optimizer, what the
strategy refuses, and BatchNorm's batches of one sample.

Each message says what was wrong, what was expected and what to try. The keywords themselves
were checked at the door (:mod:`kerastorch.arguments`); the first batch is checked by
:mod:`kerastorch.training.first_batch`.
"""

from __future__ import annotations

import warnings
from typing import Any, Optional

import torch

from ..data.peek import num_batches
from ..settings import FitSettings
from .callback import logs_added_by
from .schedulers import (
    check_monitor_is_there_for_the_scheduler,
    check_planned_steps,
    check_plateau_mode,
    try_scheduler,
)


def check_model_parts(net: Any, loss_fn: Any, lr_scheduler: Any, lr_scheduler_interval: Any) -> None:
    """What KerasModel and LightModel refuse at construction."""
    if not isinstance(net, torch.nn.Module):
        raise TypeError(f"net must be a torch.nn.Module; got a {type(net).__name__}.")
    if loss_fn is not None and not callable(loss_fn):
        raise TypeError(f"loss_fn must be callable, like nn.CrossEntropyLoss(); got a {type(loss_fn).__name__}.")
    if lr_scheduler_interval not in ("epoch", "step"):
        raise ValueError(f"lr_scheduler_interval={lr_scheduler_interval!r}; use 'epoch' or 'step'.")
    if lr_scheduler_interval == "step" and isinstance(lr_scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        raise ValueError("ReduceLROnPlateau needs an epoch's monitored value; use lr_scheduler_interval='epoch'.")


def check_loss_fn(model: Any, net_may_compute_it: bool = True) -> None:
    """A loss object, not its class. No loss at all is fine when the net may compute its own (found on
    the first batch), or a custom ``forward_batch`` or ``train_step`` needs none."""
    if isinstance(model.loss_fn, type):
        name = model.loss_fn.__name__
        raise TypeError(
            f"loss_fn is the class {name}, not a loss. Pass an instance: loss_fn=nn.{name}() (note the brackets)."
        )
    if model.loss_fn is None and not net_may_compute_it and model.uses_default_forward_batch:
        kind = type(model).__name__
        raise ValueError(
            f"{kind} has no loss_fn. Pass one, e.g. {kind}(net, loss_fn=nn.CrossEntropyLoss()), "
            "or override forward_batch to compute the loss yourself."
        )


def check_model_for_fit(model: Any, train_loader: Any) -> None:
    """Everything about the model that can be checked without running the net, whichever step trains it
    (fit's own, or a torchkeras program's: see :func:`check_fits_own_step` for what only fit's own needs)."""
    if not torch.is_grad_enabled():
        raise RuntimeError(
            "Gradients are switched off here (torch.set_grad_enabled(False), or fit called inside a "
            "torch.no_grad() block), so fit cannot train. Call torch.set_grad_enabled(True) first, or move the "
            "fit call out of the no_grad block."
        )
    check_optimizer(model)
    check_lr_scheduler(model)
    check_no_single_sample_batch(model.net, train_loader)


def check_fits_own_step(model: Any, train_loader: Any, num_processes: int, settings: FitSettings) -> None:
    """What fit's own step needs: a loss, and a scheduler that takes fit's calls, sized for the steps
    fit makes (a torchkeras program's runner computes its loss and steps its scheduler itself)."""
    check_loss_fn(model)
    warn_if_scheduler_looks_per_batch(model, settings)
    watch, scheduler = settings.monitoring, model.lr_scheduler
    check_plateau_mode(scheduler, watch.monitor, watch.mode)
    check_monitor_is_there_for_the_scheduler(scheduler, watch.monitor, logs_added_by(settings.callbacks))
    check_planned_steps(scheduler, train_loader, num_processes, settings)
    try_scheduler(model, settings.step.scheduler_interval, watch.monitor)


def check_optimizer(model) -> None:
    """An optimizer object (not its class) that updates at least one of the net's parameters."""
    optimizer = model.optimizer
    example = "torch.optim.Adam(net.parameters(), lr=1e-3)"
    if isinstance(optimizer, type):
        raise TypeError(
            f"optimizer is the class {optimizer.__name__}, not an optimizer. Build one over the net's "
            f"parameters: optimizer=torch.optim.{optimizer.__name__}(net.parameters(), lr=1e-3)."
        )
    if not (
        callable(getattr(optimizer, "step", None))
        and callable(getattr(optimizer, "zero_grad", None))
        and isinstance(getattr(optimizer, "param_groups", None), list)
    ):
        raise TypeError(
            f"optimizer is a {type(optimizer).__name__}, but it must be a torch.optim.Optimizer such as {example}."
        )
    trainable = {id(p) for p in model.net.parameters() if p.requires_grad}
    updated = {id(p) for group in optimizer.param_groups for p in group["params"]}
    own_step = getattr(type(model), "train_step", None)
    default_step = getattr(own_step, "__qualname__", "") in ("KerasModel.train_step", "")
    frozen = sum(1 for _ in model.net.parameters())
    learns = any(p.requires_grad for group in optimizer.param_groups for p in group["params"])
    # An optimizer over trainable tensors outside the net (a loss with weights of its own) still learns.
    if frozen and not trainable and not learns and default_step:
        raise ValueError(
            f"No parameter of the net requires grad: all {frozen} are frozen (requires_grad=False), so there is "
            "nothing to train and the backward pass would fail. Unfreeze the ones to train, e.g. "
            "net.fc.requires_grad_(True) for the last layer, and build the optimizer over them: "
            "torch.optim.Adam([p for p in net.parameters() if p.requires_grad], lr=1e-3)."
        )
    if trainable and not trainable & updated:
        raise ValueError(
            "The optimizer updates none of the net's parameters, so training would change nothing. It "
            "was probably built for another net (in a notebook: the net's cell was run again after the "
            f"optimizer's). Build it over this net: optimizer={example}."
        )
    left_out = [name for name, p in model.net.named_parameters() if p.requires_grad and id(p) not in updated]
    # An overridden train_step may update the rest with optimizers of its own.
    if left_out and default_step:
        warnings.warn(
            f"The optimizer does not update {len(left_out)} of the net's trainable parameters: "
            f"{', '.join(left_out[:5])}{' ...' if len(left_out) > 5 else ''} (added to the net after the optimizer "
            f"was built?). They will not learn. Build the optimizer after the net is complete: optimizer={example}, "
            "or freeze them on purpose with requires_grad_(False).",
            UserWarning,
            stacklevel=4,
        )


def warn_if_scheduler_looks_per_batch(model, settings: FitSettings) -> None:
    """A scheduler sized in batches (torchkeras steps it after every batch) that fit would step once
    per epoch: say what it would do here and how to step it per batch."""
    epochs = settings.epochs
    if (
        model.lr_scheduler is None
        or settings.step.scheduler_interval != "epoch"
        or not isinstance(epochs, int)
        or isinstance(epochs, bool)
        or epochs < 1
    ):
        return
    what_it_would_do = _stepped_per_epoch(model.lr_scheduler, epochs)
    if what_it_would_do is not None:
        warnings.warn(
            f"{what_it_would_do} A scheduler sized in batches (stepped after every batch) needs "
            "KerasModel(..., lr_scheduler_interval='step'); one sized in epochs is right as it is.",
            UserWarning,
            stacklevel=4,
        )


def _stepped_per_epoch(scheduler: Any, epochs: int) -> Optional[str]:
    """What a scheduler whose sizes look like counts of batches does when stepped once per epoch; None if fine."""
    schedulers = torch.optim.lr_scheduler
    if isinstance(scheduler, schedulers.OneCycleLR) and scheduler.total_steps > epochs:
        return (
            f"The OneCycleLR has total_steps={scheduler.total_steps} but fit steps the scheduler once per epoch "
            f"({epochs} epochs), so the cycle would not finish."
        )
    if isinstance(scheduler, schedulers.CosineAnnealingLR) and scheduler.T_max > epochs:
        return (
            f"The CosineAnnealingLR has T_max={scheduler.T_max} but fit steps the scheduler once per epoch "
            f"({epochs} epochs), so the rate would stop partway down its cosine."
        )
    if isinstance(scheduler, schedulers.CosineAnnealingWarmRestarts) and epochs > scheduler.T_0:
        restarts, period, ends = 0, scheduler.T_0, scheduler.T_0
        while ends < epochs:
            restarts, period = restarts + 1, period * scheduler.T_mult
            ends += period
        return (
            f"The CosineAnnealingWarmRestarts has T_0={scheduler.T_0}; fit steps the scheduler once per epoch, so "
            f"the rate restarts {restarts} time{'s' if restarts > 1 else ''} in {epochs} epochs (the first after "
            f"epoch {scheduler.T_0})."
        )
    return None


def check_lr_scheduler(model) -> None:
    """A scheduler object (not its class) that drives this model's optimizer."""
    scheduler = model.lr_scheduler
    if scheduler is None:
        return
    example = "torch.optim.lr_scheduler.StepLR(optimizer, step_size=10)"
    if isinstance(scheduler, type):
        raise TypeError(
            f"lr_scheduler is the class {scheduler.__name__}, not a scheduler. Build one over the "
            f"optimizer, e.g. lr_scheduler={example}."
        )
    if not callable(getattr(scheduler, "step", None)):
        raise TypeError(
            f"lr_scheduler is a {type(scheduler).__name__}, but it must be a torch.optim.lr_scheduler "
            f"object such as {example}."
        )
    driven = getattr(scheduler, "optimizer", None)
    if isinstance(driven, torch.optim.Optimizer) and _bare_optimizer(driven) is not _bare_optimizer(model.optimizer):
        raise ValueError(
            "The lr_scheduler drives another optimizer than the model's, so the learning rate would "
            "never change. Build it over the optimizer you pass to KerasModel: "
            f"lr_scheduler={example}."
        )


def _bare_optimizer(optimizer):
    # accelerate's AcceleratedOptimizer keeps the user's optimizer as .optimizer
    while (
        isinstance(getattr(optimizer, "optimizer", None), torch.optim.Optimizer)
        and optimizer.optimizer is not optimizer
    ):
        optimizer = optimizer.optimizer
    return optimizer


def check_no_single_sample_batch(net: torch.nn.Module, loader: Any) -> None:
    """BatchNorm cannot train on a batch of one sample: refuse a loader whose last batch has one."""
    if not any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in net.modules()):
        return
    size, dataset = getattr(loader, "batch_size", None), getattr(loader, "dataset", None)
    if not isinstance(size, int) or getattr(loader, "drop_last", False) or num_batches(dataset) is None:
        return
    samples = num_batches(dataset) or 0  # len(dataset): its number of samples
    if samples % size == 1:
        other = next((s for s in range(size + 1, samples + 2) if samples % s != 1), size + 1)  # one this accepts
        raise ValueError(
            f"The training data has {samples} samples in batches of {size}, so the last batch of every epoch holds "
            "a single sample, and BatchNorm cannot train on one (torch fails at the end of the first epoch). Pass "
            f"drop_last=True to your DataLoader, or another batch_size (e.g. {other})."
        )


__all__ = ["check_lr_scheduler", "check_model_for_fit", "check_optimizer"]
