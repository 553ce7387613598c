"""Shared base for callbacks that watch one logged value ("monitor a value")."""

from __future__ import annotations

import math
from typing import Optional

from .base import Callback

MODES = ("min", "max")


def improves(current: float, best: Optional[float], mode: str, min_delta: float = 0.0) -> bool:
    """True when ``current`` is better than ``best`` by more than ``min_delta``; a NaN never is.

    >>> improves(0.9, 0.8, "max"), improves(0.9, None, "min"), improves(float("nan"), None, "min")
    (True, True, False)
    """
    if math.isnan(current):
        return False
    if best is None:
        return True
    if mode == "min":
        return current < best - min_delta
    return current > best + min_delta


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(
            f"mode={mode!r} is not supported; use 'min' (lower is better, e.g. a loss) or 'max' (e.g. accuracy)."
        )
    return mode


class MonitorCallback(Callback):
    """Keeps the best value of ``monitor`` seen so far. A NaN is never the best."""

    def __init__(self, monitor: str = "val_loss", mode: str = "min", min_delta: float = 0.0):
        self.monitor = monitor
        self.mode = check_mode(mode)
        self.min_delta = abs(float(min_delta))
        self.best: Optional[float] = None
        self.best_epoch: Optional[int] = None

    def check_monitor_is_logged(self) -> None:
        """Fail before the first batch when ``monitor`` is not a value this run will log."""
        names = self.params.get("metrics")
        if names is not None and self.monitor not in names:
            raise ValueError(
                f"{type(self).__name__} monitors {self.monitor!r}, which this run does not log; "
                f"available: {', '.join(names)}."
            )

    def watches(self, logs: dict) -> bool:
        """False on an epoch whose logs lack the monitored value because the run did not compute it
        (``val_*`` on an epoch that was not validated, ``validation_freq > 1``): skip that epoch."""
        names = self.params.get("metrics")
        return self.monitor in logs or names is None or self.monitor not in names

    def current_value(self, logs: dict) -> float:
        if self.monitor not in logs:
            available = ", ".join(k for k in logs if k != "epoch")
            raise ValueError(
                f"{type(self).__name__} monitors {self.monitor!r}, which is not logged; available: {available}."
            )
        return float(logs[self.monitor])

    def is_improvement(self, current: float) -> bool:
        return improves(current, self.best, self.mode, self.min_delta)

    def update_best(self, epoch: int, logs: dict) -> bool:
        """Record ``logs[monitor]`` if it improves on the best; return whether it did."""
        current = self.current_value(logs)
        if not self.is_improvement(current):
            return False
        self.best, self.best_epoch = current, epoch
        return True

    def state_dict(self) -> dict:
        return {"best": self.best, "best_epoch": self.best_epoch}

    def load_state_dict(self, state: dict) -> None:
        self.best, self.best_epoch = state["best"], state["best_epoch"]
