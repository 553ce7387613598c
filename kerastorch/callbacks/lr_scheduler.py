"""Set the learning rate at the start of each epoch from a function of the epoch."""

from __future__ import annotations

import inspect
import math
from typing import Callable

from ..training.callback import Callback


class LearningRateScheduler(Callback):
    """Call ``schedule(epoch, lr)`` at the start of every epoch and train the epoch with
    the lr it returns. ``epoch`` is 1-based, as in the history; ``lr`` is the current
    lr. A ``schedule(epoch)`` of one argument works too.

    With several parameter groups the schedule is applied to each group's own lr, so
    ``lambda epoch, lr: lr * 0.9`` keeps their ratios. The history's ``lr`` column
    shows the lr each epoch trained with. For torch's own schedulers pass
    ``KerasModel(..., lr_scheduler=...)`` instead.

    Example::

        from kerastorch.callbacks import LearningRateScheduler

        warm_then_decay = LearningRateScheduler(lambda epoch, lr: 1e-3 if epoch <= 2 else lr * 0.5)
        model.fit(dl_train, dl_val, epochs=6, callbacks=[warm_then_decay])
    """

    def __init__(self, schedule: Callable, verbose: int = 0):
        if not callable(schedule):
            raise TypeError(f"schedule must be a function of (epoch, lr); got a {type(schedule).__name__}.")
        self.schedule = schedule
        self.takes_lr = _positional_count(schedule) != 1
        self.verbose = verbose

    def on_epoch_begin(self, epoch, logs=None):
        for group in self.model.optimizer.param_groups:
            new_lr = self.schedule(epoch, group["lr"]) if self.takes_lr else self.schedule(epoch)
            group["lr"] = _checked_lr(new_lr, epoch)
        if self.verbose:
            self.model.print(f"Epoch {epoch}: learning rate {self.model.optimizer.param_groups[0]['lr']:.6g}")


def _checked_lr(value, epoch: int) -> float:
    if hasattr(value, "item"):  # a one-element tensor or numpy number
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(
            f"The schedule returned {value!r} at epoch {epoch}; it must return a learning rate, a finite number >= 0."
        )
    return float(value)


def _positional_count(fn: Callable) -> int:
    """How many positional arguments ``fn`` takes; 2 when it cannot be told."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return 2
    if any(p.kind == p.VAR_POSITIONAL for p in parameters):
        return 2
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in parameters)


__all__ = ["LearningRateScheduler"]
