"""Stop training when a monitored value has stopped improving (Keras's ``EarlyStopping``)."""

from __future__ import annotations

from typing import Any, Iterable, Optional

from ..helpers.values import check_real_number, check_verbose, check_whole_number
from ..settings import MonitorSettings, OutputSettings
from ..strategies import strategy_of
from ..training.callback import ORDER_EARLY_STOPPING
from .monitor import MonitorCallback, improves
from .terminate_on_nan import losses_are_finite

# Said when an argument's type shows a call written in another order than Keras's.
KERAS_ORDER = (
    "; EarlyStopping takes Keras's arguments in Keras's order (monitor, min_delta, patience, verbose, mode, "
    "baseline, restore_best_weights, start_from_epoch): pass the others by name, e.g. "
    "EarlyStopping('val_acc', mode='max', patience=3)"
)


class EarlyStopping(MonitorCallback):
    """Stop when ``monitor`` has stopped improving: Keras's ``EarlyStopping``, rule for rule.

    After each epoch whose logs hold ``monitor`` (epochs that were not validated, with
    ``fit(validation_freq=n)``, are skipped), a counter ``wait`` goes up by one and is reset to
    0 when the value improves on the best so far by more than ``min_delta``. Training stops at
    the first epoch that does not improve once ``wait >= patience``: ``patience`` epochs after
    the best one (``patience=0``: at the first epoch without improvement).

    Args:
        monitor: the logged value to watch, e.g. ``"val_loss"`` or ``"val_acc"``.
        min_delta: an improvement must beat the best by more than this.
        patience: epochs without improvement before stopping (Keras's default, 0).
        verbose: 1 prints a line when the run ends, saying at which epoch it stopped and why; 0
            is silent. ``None`` (default): as ``fit``'s ``verbose`` (Keras's default is 0; a run
            that shows its epochs here also says why they ended).
        mode: ``"min"``, ``"max"``, or ``"auto"`` (default): decided when training begins by
            ``fit``'s own rule — a torchmetrics metric's ``higher_is_better``, else the name
            (``max`` for acc, auc, f1, precision, recall, iou, r2, score...).
        baseline: with a baseline, ``wait`` is reset only by an epoch that improves on both the
            best so far and the baseline. The stop itself still comes only at an epoch that does
            not improve on the best so far (Keras's rule), so a run that never beats the baseline
            stops at its first such epoch once ``patience`` epochs have been watched.
        restore_best_weights: ``None`` (default): leave it to ``fit``, which always puts back the
            best epoch by its own ``monitor`` (Keras's default is ``False``). ``True``: when ``fit``
            returns, the net holds the weights of this callback's best epoch (by this callback's
            ``monitor``; none before ``start_from_epoch``: then the last weights stay). ``False``:
            the net keeps the last epoch's weights (``fit`` restores nothing, unless the loss became
            NaN: NaN weights are never kept).
        start_from_epoch: the first ``start_from_epoch`` epochs are not watched at all (a warm-up:
            no best, no ``wait``), so the earliest stop is at epoch
            ``start_from_epoch + 1 + max(patience, 1)``.

    Epochs count from 1, as in the history. An epoch whose loss is NaN is never the best. When
    you pass an EarlyStopping, ``fit`` adds none of its own (its ``patience=`` is not used).

    Example::

        model.fit(dl_train, dl_val, epochs=50,
                  callbacks=[kt.callbacks.EarlyStopping("val_acc", mode="max", patience=3)])
    """

    order = ORDER_EARLY_STOPPING

    def __init__(
        self,
        monitor: str = "val_loss",
        min_delta: float = 0.0,
        patience: int = 0,
        verbose: Optional[int] = None,
        mode: str = "auto",
        baseline: Optional[float] = None,
        restore_best_weights: Optional[bool] = None,
        start_from_epoch: int = 0,
    ):
        check_real_number("min_delta", min_delta, KERAS_ORDER)
        super().__init__(monitor, mode, min_delta)
        self.patience = check_whole_number("patience", patience, 0, ", e.g. patience=3")
        self.verbose = None if verbose is None else check_verbose(verbose, KERAS_ORDER)
        self.baseline = None if baseline is None else check_real_number("baseline", baseline, ", or None")
        if restore_best_weights not in (None, True, False):
            raise TypeError(
                f"restore_best_weights={restore_best_weights!r} must be None (fit restores its best epoch), "
                "True (this callback's best epoch) or False (keep the last epoch's weights)."
            )
        self.restore_best_weights = restore_best_weights
        self.start_from_epoch = check_whole_number("start_from_epoch", start_from_epoch, 0, ", e.g. 5")
        self.wait = 0
        self.stopped_epoch: Optional[int] = None
        self.best_weights: Optional[dict] = None
        self.says = True  # set when training begins, from verbose (or fit's verbose)
        self.set_by_fit = False  # fit's own, from its patience=: its message says how to turn it off

    @classmethod
    def for_fit(cls, watch: MonitorSettings, output: OutputSettings) -> EarlyStopping:
        """The early stopping ``fit(patience=...)`` adds, whose message names ``patience`` and ``patience=None``
        (said unless fit is silent)."""
        assert watch.monitor is not None and watch.patience is not None  # fit adds one only then
        stopper = cls(watch.monitor, watch.min_delta, watch.patience, int(output.verbose > 0), watch.mode)
        stopper.set_by_fit = True
        return stopper

    def on_train_begin(self, logs=None):
        self.check_monitor_is_logged()
        self.says = bool(self.params.get("verbose", 1) if self.verbose is None else self.verbose)
        self.resolve_mode()
        # A reused instance must not compare with the previous fit's best (Keras resets it too).
        self.best, self.best_epoch, self.best_weights = None, None, None
        self.wait = 0
        self.stopped_epoch = None
        self._said_stop = False

    def on_epoch_end(self, epoch, logs=None):
        # Not validated this epoch, still warming up, or a NaN loss (TerminateOnNaN stops the run): not watched.
        if not self.watches(logs) or epoch <= self.start_from_epoch or not losses_are_finite(logs):
            return
        self.wait += 1
        if self.update_best(epoch, logs):
            if self.restore_best_weights:
                # Written over the previous best copy, let go of first: stopped halfway, the net holds the new best.
                previous, self.best_weights = self.best_weights, None
                self.best_weights = strategy_of(self.model).whole_weights(self.model.net, into=previous)
            if self.baseline is None or improves(self.best, self.baseline, self.mode, self.min_delta):
                self.wait = 0
            return
        if self.wait >= self.patience and epoch > 1:
            self.stopped_epoch = epoch
            self.model.stop_training = True

    def stop_message(self, epoch: int) -> str:
        if self.best is None:
            why = f"{self.monitor} has had no finite value for {self.wait} epoch(s)"
        elif self.baseline is not None and not improves(self.best, self.baseline, self.mode, self.min_delta):
            why = (
                f"{self.monitor} has not beaten baseline={self.baseline:g} in {self.wait} epoch(s) "
                f"(best {self.best:.6g} at epoch {self.best_epoch})"
            )
        else:
            why = (
                f"{self.monitor} has not improved for {self.wait} epoch(s) "
                f"(best {self.best:.6g} at epoch {self.best_epoch})"
            )
        message = f"Stopped early at epoch {epoch}: {why}."
        if self.set_by_fit:
            epochs = self.params.get("epochs")
            message += (
                f" fit stops a run after patience={self.patience} epochs without improvement; pass patience=None "
                f"to train all {epochs} epochs, or a larger patience."
            )
        return message

    def say_stopped(self) -> None:
        """Print why the run stopped, once. Said once the run has ended, so that the line comes after the
        last epoch's line; fit's best weights call it before saying which weights they put back, so that
        the last line names the weights the net ends with."""
        if self.stopped_epoch is not None and self.says and not self._said_stop:
            self._said_stop = True
            self.model.print(self.stop_message(self.stopped_epoch))

    def on_train_end(self, logs=None):
        self.say_stopped()
        if self.restore_best_weights and self.best_weights is not None:
            strategy_of(self.model).load_whole_weights(self.model.net, self.best_weights)
            if self.says:
                self.model.print(
                    f"Restored the weights of epoch {self.best_epoch} ({self.monitor} {self.best:.4g}, "
                    "EarlyStopping's best)."
                )
        elif self.restore_best_weights is False and self.says and self.best_epoch is not None and logs:
            self.model.print(
                f"Kept the last epoch's weights (restore_best_weights=False); the best {self.monitor} was at "
                f"epoch {self.best_epoch}."
            )
        self.best_weights = None  # a copy of the whole net: not kept after the run

    def state_dict(self):
        return {**super().state_dict(), "wait": self.wait, "best_weights": self.best_weights}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.wait = state["wait"]
        self.best_weights = state.get("best_weights")  # absent from the states of older versions


def early_stoppings_in(callbacks: Optional[Iterable[Any]]) -> list[EarlyStopping]:
    """The user's EarlyStopping callbacks: with one, ``fit`` adds no early stopping of its own, and
    their ``restore_best_weights`` decides whether ``fit`` puts its best epoch back."""
    return [cb for cb in callbacks or () if isinstance(cb, EarlyStopping)]


__all__ = ["EarlyStopping", "early_stoppings_in"]
