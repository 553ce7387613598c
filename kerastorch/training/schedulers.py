"""How fit calls the learning-rate scheduler, and the call it tries once before training.

- torch's schedulers: ``scheduler.step()`` after every epoch (``lr_scheduler_interval="epoch"``,
  the default) or after every optimizer step (``"step"``); ``ReduceLROnPlateau`` gets
  ``step(value)`` with the monitored value after every epoch that has it.
- timm's schedulers (an object with ``step_update``, like ``timm.scheduler.CosineLRScheduler``):
  as timm's own ``train.py`` calls them, ``step_update(num_updates=n)`` after every optimizer step
  (``n`` counts the updates since the run began, ``epoch * updates_per_epoch + k``) and
  ``step(epoch, metric=value)`` after every epoch (``epoch`` is the one just finished, 1-based,
  which is the next one's 0-based number: timm's ``epoch + 1``). The scheduler's own
  ``t_in_epochs`` decides which of the two moves the rate, so ``lr_scheduler_interval`` is not needed.

A scheduler that does not take these calls (one whose ``step`` needs another argument) would fail
after a whole epoch of training: :func:`try_scheduler` makes the calls once before training, on
the scheduler and the optimizer's learning rates, and puts both back.

A scheduler sized in optimizer steps (torch's ``OneCycleLR``, ``CosineAnnealingLR``) that plans
another number of steps than the run makes trains wrongly without an error (the cycle never
anneals, or torch raises partway): :func:`check_planned_steps` says so before training, with the
number to build it with, counted as fit counts its updates (:func:`updates_per_epoch`).
"""

from __future__ import annotations

import contextlib
import copy
import math
import warnings
from typing import Any, Callable, Iterator, Optional

import torch

from ..data.peek import num_batches
from ..settings import FitSettings


def is_timm_style(scheduler: Any) -> bool:
    """A scheduler driven like timm's: it has ``step_update(num_updates)`` beside ``step(epoch)``."""
    return callable(getattr(scheduler, "step_update", None))


def after_update(scheduler: Any, interval: str) -> Optional[Callable[[int], None]]:
    """The call after every update of the model's optimizer, given the number of updates so far; None
    when the scheduler is not called then."""
    if scheduler is None:
        return None
    if is_timm_style(scheduler):
        return lambda updates: scheduler.step_update(num_updates=updates)
    if interval == "step":
        return lambda updates: scheduler.step()
    return None


def after_epoch(scheduler: Any, interval: str, epoch: int, logs: dict, monitor: Optional[str]) -> None:
    """The call after every epoch (``epoch`` is 1-based: the one just finished)."""
    if scheduler is None:
        return
    if is_timm_style(scheduler):
        scheduler.step(epoch, metric=logs.get(monitor) if monitor is not None else None)
    elif interval != "epoch":
        return
    elif isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        if monitor in logs:  # not on an epoch that was not validated
            scheduler.step(logs[monitor])
    else:
        scheduler.step()


def describe_calls(scheduler: Any, interval: str, monitor: Optional[str]) -> str:
    """What fit calls, in words."""
    if is_timm_style(scheduler):
        return (
            "scheduler.step_update(num_updates=n) after every optimizer step and scheduler.step(epoch, "
            f"metric={monitor or 'None'}) after every epoch, as timm's training script does"
        )
    if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        return f"scheduler.step({monitor}) after every epoch"
    when = "every epoch" if interval == "epoch" else "every optimizer step"
    return f"scheduler.step() after {when} (lr_scheduler_interval={interval!r})"


def check_plateau_mode(scheduler: Any, monitor: Optional[str], mode: Optional[str]) -> None:
    """torch's ``ReduceLROnPlateau`` gets fit's monitored value: its own ``mode`` must agree with fit's on
    which way that value improves, or the rate drops each time the value gets better (``mode="min"``,
    torch's default, fed an accuracy)."""
    if not isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau) or monitor is None or mode is None:
        return
    if scheduler.mode != mode:
        better = "higher" if mode == "max" else "lower"
        raise ValueError(
            f"lr_scheduler=ReduceLROnPlateau(mode={scheduler.mode!r}) gets {monitor} after every epoch, which is better "
            f"{better} (fit's mode={mode!r}): it would cut the learning rate each time {monitor} improves. Build it "
            f"with ReduceLROnPlateau(optimizer, mode={mode!r}, ...), or monitor a value that is better "
            f"{'lower' if mode == 'max' else 'higher'}; if fit has the direction wrong, pass "
            f"fit(mode={scheduler.mode!r})."
        )


def check_monitor_is_there_for_the_scheduler(scheduler: Any, monitor: Optional[str], added_logs: list) -> None:
    """fit steps a plateau scheduler with the monitored value once the epoch is validated, before the
    epoch's callbacks run: a value a callback adds to the logs (``adds_logs``) is not there yet, and
    the scheduler would never be stepped."""
    plateau = isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau) or (
        is_timm_style(scheduler) and "Plateau" in type(scheduler).__name__
    )
    if plateau and monitor is not None and monitor in added_logs:
        raise ValueError(
            f"lr_scheduler={type(scheduler).__name__} is stepped with {monitor} once the epoch is validated, before "
            f"the epoch's callbacks run, and {monitor} is a value a callback adds to the logs (adds_logs): it is not "
            "there yet, so the rate would never change. Leave the scheduler out of KerasModel and use the "
            f"callback, which runs after the one that adds it: callbacks=[..., kt.callbacks.ReduceLROnPlateau("
            f"{monitor!r}, factor=0.1, patience=10)]."
        )


def try_scheduler(model: Any, interval: str, monitor: Optional[str]) -> None:
    """Make fit's scheduler calls once, then put the scheduler and the learning rates back: a scheduler
    that does not take them fails now, saying what kerastorch calls and how to adapt, not after an epoch.

    A scheduler without ``state_dict`` / ``load_state_dict`` cannot be put back, so it is not tried."""
    scheduler = model.lr_scheduler
    if scheduler is None or not (
        callable(getattr(scheduler, "state_dict", None)) and callable(getattr(scheduler, "load_state_dict", None))
    ):
        return
    saved_state = copy.deepcopy(scheduler.state_dict())
    try:
        with hyperparameters_kept(model.optimizer), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch warns of a scheduler step before the first optimizer step
            call = after_update(scheduler, interval)
            if call is not None:
                call(1)
            trial_logs = {} if monitor is None or is_timm_style(scheduler) else {monitor: 0.0}
            after_epoch(scheduler, interval, 1, trial_logs, monitor)
    except Exception as error:
        raise TypeError(
            f"lr_scheduler={type(scheduler).__name__} failed when kerastorch tried it once before training, the way "
            f"fit calls it: {describe_calls(scheduler, interval, monitor)}. It raised {type(error).__name__}: "
            f"{error}. Nothing has changed. {how_to_adapt(interval)}"
        ) from error
    finally:
        scheduler.load_state_dict(saved_state)


@contextlib.contextmanager
def hyperparameters_kept(optimizer: torch.optim.Optimizer) -> Iterator[None]:
    """Put every parameter group's hyper-parameters back as they were on entry, also after an error:
    the learning rate, momentum or betas a scheduler moved, and no key a scheduler added (``initial_lr``,
    ``max_lr``...). The optimizer's state (Adam's moments) stays as training left it."""
    saved = [
        {key: copy.deepcopy(value) for key, value in group.items() if key != "params"}
        for group in optimizer.param_groups
    ]
    try:
        yield
    finally:
        # optimizer.param_groups again: a state loaded meanwhile (a run in workers) replaces the group dicts.
        for group, values in zip(optimizer.param_groups, saved):
            for key in [key for key in group if key != "params" and key not in values]:
                del group[key]
            for key, value in values.items():
                if isinstance(value, torch.Tensor) and isinstance(group.get(key), torch.Tensor):
                    group[key].copy_(value)  # a tensor learning rate stays the same tensor
                else:
                    group[key] = value


def batches_per_epoch(train_loader: Any, num_processes: int, steps_per_epoch: Optional[int]) -> Optional[int]:
    """How many batches one process trains in an epoch (the shares are padded to equal); None when
    the training data has no length."""
    if steps_per_epoch is not None:
        return steps_per_epoch
    total = num_batches(train_loader)
    return math.ceil(total / num_processes) if total else None


def updates_per_epoch(train_loader: Any, num_processes: int, settings: FitSettings) -> Optional[int]:
    """How many optimizer steps one process takes in an epoch: its batches over the accumulation steps,
    a last partial group counting as one; None when the training data has no length."""
    batches = batches_per_epoch(train_loader, num_processes, settings.data.steps_per_epoch)
    return None if batches is None else math.ceil(batches / settings.step.accumulation_steps)


def check_planned_steps(scheduler: Any, train_loader: Any, num_processes: int, settings: FitSettings) -> None:
    """Warn before training when a scheduler stepped after every optimizer step plans another number of
    steps than this run makes, naming the number to build it with.

    torch's ``OneCycleLR`` must take exactly its ``total_steps``: with more, torch raises partway through
    training; with fewer, the rate never anneals. A ``CosineAnnealingLR`` whose ``T_max`` is longer than
    the run stops partway down its cosine (a shorter one is a cosine that goes up again, which may be
    meant). Counted as fit counts: every process steps once per update, ``initial_epoch`` epochs are done.
    """
    if settings.step.scheduler_interval != "step" or is_timm_style(scheduler):
        return
    one_cycle = isinstance(scheduler, torch.optim.lr_scheduler.OneCycleLR)
    if not one_cycle and not isinstance(scheduler, torch.optim.lr_scheduler.CosineAnnealingLR):
        return
    per_epoch = updates_per_epoch(train_loader, num_processes, settings)
    if per_epoch is None:  # data without a length: the run's steps are not known before it
        return
    epochs = settings.epochs - settings.initial_epoch
    updates, done = epochs * per_epoch, scheduler.last_epoch  # the steps the scheduler has taken already
    if one_cycle:
        name, planned = "total_steps", scheduler.total_steps
    else:
        name, planned = "T_max", scheduler.T_max
    left = planned - done
    if left == updates or (not one_cycle and updates > left):  # a cosine that goes on past its low point
        return
    later = ""
    if left < updates:
        fails_at = max(left, 0) + 1
        epoch = settings.initial_epoch + math.ceil(fails_at / per_epoch)
        outcome = f"torch raises at the optimizer step {fails_at}, in epoch {epoch}, which ends training there"
    else:
        later = " If a later fit goes on with this schedule, this is expected."
        outcome = (
            f"the cycle stops {(done + updates) / planned:.0%} of the way through and the rate never anneals"
            if one_cycle
            else f"the rate stops {(done + updates) / planned:.0%} of the way down its cosine, above its eta_min"
        )
    if done:
        taken = f" of its {planned} ({done} taken already)"
        build = (
            f"Build a new one with {name}={updates} for this run, or {name}={done + updates} to go on from its {done}"
        )
    else:
        taken, build = "", f"Build it with {name}={updates}"
    warnings.warn(
        f"lr_scheduler={type(scheduler).__name__}({name}={planned}) has {left} optimizer steps left{taken}, and "
        f"this fit makes {updates}: {how_counted(train_loader, num_processes, settings, per_epoch)}. So {outcome}. "
        f"{build}.{later}",
        UserWarning,
        stacklevel=6,
    )


def how_counted(train_loader: Any, num_processes: int, settings: FitSettings, per_epoch: int) -> str:
    """The run's optimizer steps in words: epochs x steps per epoch, and where these come from."""
    epochs = f"{settings.epochs - settings.initial_epoch} epochs"
    if settings.initial_epoch:
        epochs += f" (epochs={settings.epochs} - initial_epoch={settings.initial_epoch})"
    if settings.data.steps_per_epoch is not None:
        batches = f"steps_per_epoch={settings.data.steps_per_epoch} batches"
    elif num_processes > 1:
        batches = f"{num_batches(train_loader)} batches shared by {num_processes} processes"
    else:
        batches = f"{num_batches(train_loader)} batches"
    if settings.step.accumulation_steps > 1:
        batches += f" / gradient_accumulation_steps={settings.step.accumulation_steps}, rounded up"
    each = " in each process" if num_processes > 1 else ""
    return f"{epochs} x {per_epoch} optimizer steps{each} ({batches})"


def how_to_adapt(interval: str) -> str:
    other = "step" if interval == "epoch" else "epoch"
    when = "every optimizer step" if other == "step" else "every epoch"
    return (
        f"If it takes step() after {when}, say so: KerasModel(..., lr_scheduler_interval={other!r}). For any "
        "other call, leave it out of KerasModel (lr_scheduler=None) and call it yourself from a callback: "
        "callbacks=[kt.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: scheduler.step(...))]."
    )


__all__ = [
    "after_epoch",
    "after_update",
    "batches_per_epoch",
    "check_monitor_is_there_for_the_scheduler",
    "check_planned_steps",
    "check_plateau_mode",
    "describe_calls",
    "hyperparameters_kept",
    "is_timm_style",
    "try_scheduler",
    "updates_per_epoch",
]
