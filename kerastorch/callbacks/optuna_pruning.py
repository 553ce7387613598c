"""Prune an Optuna trial whose monitored value is going nowhere, after fit has cleaned up."""

from __future__ import annotations

import math
import os
from typing import Any, Optional

from ..training.callback import ORDER_PRUNING, Callback


def import_optuna() -> Any:
    """The ``optuna`` module, or an ImportError that says which extra to install."""
    try:
        import optuna
    except ImportError:
        raise ImportError(
            "OptunaPruning needs the optuna package: pip install 'kerastorch[optuna]' (or pip install optuna)."
        ) from None
    return optuna


class OptunaPruning(Callback):
    """Report ``monitor`` (default: fit's) to an Optuna ``trial`` after every epoch, and stop
    the trial when its pruner says so.

    Epochs without the value (no validation that epoch) or with a NaN are not reported.
    A pruned run stops like an early stop — every process together, the best weights
    restored, every file whole — and then ``fit`` raises ``optuna.TrialPruned``, which
    Optuna's ``study.optimize`` records as a pruned trial (``model.history`` holds the
    epochs that ran). Only the main process reports. ``fit(devices=k)`` from the process that
    made the callback is refused before training: its forked workers' reports would never reach
    the study (under ``torchrun`` each rank makes its own, and the main one reports).

    Example::

        import optuna
        from kerastorch.callbacks import OptunaPruning

        def objective(trial):
            model = make_model(lr=trial.suggest_float("lr", 1e-4, 1e-1, log=True))
            history = model.fit(dl_train, dl_val, epochs=10, callbacks=[OptunaPruning(trial)])
            return history["val_acc"].max()

        optuna.create_study(direction="maximize", pruner=optuna.pruners.MedianPruner()).optimize(objective, 20)
    """

    order = ORDER_PRUNING
    raises_the_outcome = True  # its TrialPruned is what study.optimize waits for, whatever else failed

    def __init__(self, trial: Any, monitor: Optional[str] = None):
        self.optuna = import_optuna()
        self.trial = trial
        self.monitor = monitor
        self.pruned_at: Optional[int] = None
        self.trial_process = os.getpid()  # where the trial lives: reports from elsewhere are lost

    def on_train_begin(self, logs=None):
        self.pruned_at = None
        if self.monitor is None and self.params.get("monitor") is None:
            raise ValueError(
                "OptunaPruning reports fit's monitored value to the trial, but fit monitors nothing (monitor=None). "
                "Name the value to report: OptunaPruning(trial, monitor='val_loss'), or pass fit a monitor."
            )
        if os.getpid() != self.trial_process:
            # fit(devices=k) forked this process from the one that holds the trial: what it reports
            # and its "pruned" stay in this copy and never reach the study.
            processes = self.model.runtime.num_processes
            raise ValueError(
                f"OptunaPruning reports to the trial of the process that made it, but this fit trains in {processes} "
                f"processes forked from it (devices={processes}), whose reports would never reach the study: the "
                "trial would end PRUNED with nothing reported. Train each trial with devices=1 and run trials side "
                "by side instead (study.optimize(objective, n_trials=..., n_jobs=2), or several processes sharing a "
                "study on a database storage), or start the script with torchrun and make the callback in it."
            )
        names = self.params.get("metrics")
        if self.monitor is not None and names is not None and self.monitor not in names:
            raise ValueError(
                f"OptunaPruning(monitor={self.monitor!r}): this run logs {', '.join(names)}. Pick one of them, "
                "or leave monitor out to report fit's own."
            )

    def on_epoch_end(self, epoch, logs=None):
        if not self.model.is_main_process:
            return
        name = self.monitor or self.params.get("monitor")
        value = (logs or {}).get(name)
        if value is None or not math.isfinite(value):
            return
        self.trial.report(float(value), step=epoch)
        if self.trial.should_prune():
            self.pruned_at = epoch
            self.model.stop_training = True  # all processes stop together, as after early stopping

    def on_train_end(self, logs=None):
        if self.pruned_at is not None and self.model.is_main_process:
            name = self.monitor or self.params.get("monitor")
            raise self.optuna.TrialPruned(f"pruned after epoch {self.pruned_at} ({name} {logs.get(name)})")


__all__ = ["OptunaPruning", "import_optuna"]
