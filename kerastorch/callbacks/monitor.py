"""Shared base for callbacks that watch one logged value ("monitor a value"), and what fit's own
``monitor=`` and ``mode=`` mean for a run (:func:`monitor_for_run`)."""

from __future__ import annotations

import dataclasses
import difflib
import math
import warnings
from typing import Optional, Sequence

from ..helpers.values import check_mode, check_real_number
from ..settings import AUTO, MonitorSettings
from ..training.callback import Callback
from ..training.history import history_columns


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


# Monitored names that contain one of these are better when higher (Keras's list, and a few more).
HIGHER_IS_BETTER_WORDS = ("acc", "auc", "f1", "precision", "recall", "iou", "dice", "r2", "score", "fbeta")


def auto_mode(monitor: str, metrics_dict: Optional[dict] = None) -> str:
    """``"max"`` or ``"min"`` for ``monitor``: the metric's own ``higher_is_better`` (torchmetrics)
    if it has one, else ``"max"`` for names like accuracy, AUC, F1, IoU, R², ``"min"`` otherwise.

    >>> auto_mode("val_acc"), auto_mode("val_loss"), auto_mode("train_r2"), auto_mode("val_mae")
    ('max', 'min', 'max', 'min')
    """
    return auto_mode_and_source(monitor, metrics_dict)[0]


def auto_mode_and_source(monitor: str, metrics_dict: Optional[dict] = None) -> tuple[str, str]:
    """:func:`auto_mode`, and where it came from, as fit's first line says it: ``"from the metric's
    higher_is_better"`` or ``"from its name"``.

    >>> auto_mode_and_source("val_acc")
    ('max', 'from its name')
    """
    bare = monitor.split("_", 1)[1] if monitor.startswith(("train_", "val_")) else monitor
    higher = getattr((metrics_dict or {}).get(bare), "higher_is_better", None)
    if isinstance(higher, bool):
        return ("max" if higher else "min"), "from the metric's higher_is_better"
    if "loss" in bare.lower():
        return "min", "from its name"
    return ("max" if any(word in bare.lower() for word in HIGHER_IS_BETTER_WORDS) else "min"), "from its name"


def monitor_for_run(
    watch: MonitorSettings,
    *,
    has_val: bool,
    metrics: dict,
    added_logs: Sequence[str],
    names_known: bool,
    lr_groups: int = 1,
) -> MonitorSettings:
    """fit's ``monitor`` and ``mode`` for this run: ``"auto"`` decided (``val_loss``, or ``train_loss``
    without validation data; the direction from the metric or the name), and a monitored name checked
    against the values the run will produce, before the first batch (``metrics``: the run's metrics by
    name; ``added_logs``: the values callbacks say they add; ``lr_groups``: the optimizer's parameter
    groups, an ``lr`` column each). ``names_known=False``: a step of the
    user's names its values on its first batch, where the name is checked."""
    if watch.monitor is None:
        return watch
    monitor_was_auto = watch.monitor == AUTO
    monitor = ("val_loss" if has_val else "train_loss") if monitor_was_auto else watch.monitor
    if names_known:
        check_monitor(monitor, list(metrics), has_val, added_logs, lr_groups)
    mode, mode_source = watch.mode, ""
    if mode == "auto":
        mode, mode_source = auto_mode_and_source(monitor, metrics)
    else:
        check_mode_against_metric(monitor, mode, metrics)
    return dataclasses.replace(
        watch,
        monitor=monitor,
        mode=mode,
        mode_was_auto=watch.mode == "auto",
        monitor_was_auto=monitor_was_auto,
        mode_source=mode_source,
    )


# The way out when the value is one a callback of the user's writes into the logs (Keras's pattern).
WRITTEN_BY_A_CALLBACK = " If a callback of yours writes it into the logs, say so on its class: adds_logs = ('name',)."


def check_monitor(
    monitor: str, metric_names: list[str], has_val: bool, added_logs: Sequence[str] = (), lr_groups: int = 1
) -> None:
    """``monitor`` names a value the run will produce, known before the first batch: a column of the
    history, or a value a callback says it adds to the logs (``adds_logs``)."""
    names = [*history_columns(metric_names, has_val, lr_groups), *added_logs]
    if monitor in names:
        return
    if monitor.startswith("val_") and not has_val and monitor in history_columns(metric_names, True):
        raise ValueError(
            f"monitor={monitor!r} needs validation data, but val_data is None. Pass val_data=..., "
            f"or monitor one of: {', '.join(names)}."
        )
    close = difflib.get_close_matches(str(monitor), names, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ValueError(
        f"monitor={monitor!r} is not a value this run produces; available: {', '.join(names)}.{hint}"
        f"{WRITTEN_BY_A_CALLBACK}"
    )


def check_mode_against_metric(monitor: str, mode: str, metrics: dict) -> None:
    """Warn when ``mode`` contradicts the monitored metric's own ``higher_is_better`` (torchmetrics): the
    best weights would be the worst epoch's. Keras accepts any mode, so this is a warning, not a refusal."""
    bare = monitor.split("_", 1)[1] if monitor.startswith(("train_", "val_")) else monitor
    metric = metrics.get(bare)
    higher = getattr(metric, "higher_is_better", None)
    if isinstance(higher, bool) and mode != ("max" if higher else "min"):
        warnings.warn(
            f"mode={mode!r} for {monitor}, but its metric {type(metric).__name__} says higher_is_better={higher}: "
            f"the best weights would be those of the {'lowest' if mode == 'min' else 'highest'} {monitor}, and "
            f"early stopping would wait for it to {'fall' if mode == 'min' else 'rise'}. Pass "
            f"mode={'max' if higher else 'min'!r}, or mode='auto', which follows the metric.",
            UserWarning,
            stacklevel=5,  # the caller of KerasModel.fit
        )


class MonitorCallback(Callback):
    """Keeps the best value of ``monitor`` seen so far. A NaN is never the best.

    ``mode="auto"`` is decided when training begins (:meth:`resolve_mode`), by the rule ``fit``
    uses for its own ``mode="auto"`` (:func:`auto_mode`): a torchmetrics metric's
    ``higher_is_better`` first, then the monitored name.
    """

    def __init__(self, monitor: str = "val_loss", mode: str = "auto", min_delta: float = 0.0):
        if not isinstance(monitor, str):
            raise TypeError(f"monitor={monitor!r} must be the name of a logged value, e.g. 'val_loss' or 'val_acc'.")
        self.monitor = monitor
        self.asked_mode = check_mode(mode)
        self.mode = self.asked_mode  # "min" or "max" once resolve_mode has run
        self.min_delta = abs(check_real_number("min_delta", min_delta))
        self.best: Optional[float] = None
        self.best_epoch: Optional[int] = None

    def resolve_mode(self) -> None:
        """Decide ``mode="auto"`` from the model's metrics (again on every run: a reused callback may
        watch another model)."""
        if self.asked_mode == "auto":
            self.mode = auto_mode(self.monitor, getattr(self.model, "metrics_dict", None))

    def check_monitor_is_logged(self) -> None:
        """Fail before the first batch when ``monitor`` is not a value this run will log."""
        names = self.params.get("metrics")
        if names is not None and self.monitor not in names:
            raise ValueError(
                f"{type(self).__name__} monitors {self.monitor!r}, which this run does not log; "
                f"available: {', '.join(names)}.{WRITTEN_BY_A_CALLBACK}"
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
        if self.mode == "auto":  # used outside fit, without on_train_begin
            self.resolve_mode()
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
