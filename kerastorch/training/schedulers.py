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
"""

from __future__ import annotations

import copy
import warnings
from typing import Any, Callable, Optional

import torch


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
    groups = model.optimizer.param_groups
    saved_groups = [{key: value for key, value in group.items() if key != "params"} for group in groups]
    saved_state = copy.deepcopy(scheduler.state_dict())
    try:
        with warnings.catch_warnings():
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
        for group, saved in zip(groups, saved_groups):
            for key in [key for key in group if key != "params" and key not in saved]:
                del group[key]
            group.update(saved)
        scheduler.load_state_dict(saved_state)


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
    "check_monitor_is_there_for_the_scheduler",
    "check_plateau_mode",
    "describe_calls",
    "is_timm_style",
    "try_scheduler",
]
