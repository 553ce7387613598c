"""fit's own callbacks, built from its settings: the NaN guard, the best (or last) weights, early
stopping, the live plot, Weights & Biases, the training state, the reports to Ray Train (inside
its workers) and the progress bar, beside the user's callbacks.

Each built-in callback takes the settings group it needs whole (``ProgressBar.for_fit(output)``,
``EarlyStopping.for_fit(monitoring, output)``), so a new keyword of ``fit`` that one of them reads
reaches it without passing through here.
"""

from __future__ import annotations

from typing import Any, Optional

from ..data.peek import num_batches
from ..files.state import training_state_path
from ..helpers.protocols import TrainableModel
from ..settings import FitSettings, MonitorSettings
from ..training.callback import may_read_ckpt_path
from ..training.callback_list import CallbackList
from ..training.position import RunPosition
from ..training.preemption import Preemption
from .best_weights import RestoreBestWeights
from .early_stopping import EarlyStopping, early_stoppings_in
from .last_weights import KeepLastWeights
from .live_plot import LivePlot
from .progress import ProgressBar
from .ray_report import ray_train_report
from .terminate_on_nan import TerminateOnNaN
from .training_state import TrainingState, training_states_in
from .wandb_logger import WandbLogger


def callbacks_for_fit(
    model: TrainableModel,
    settings: FitSettings,
    train_loader: Any,
    val_loader: Optional[Any],
    columns: Optional[list[str]],
    position: Optional[RunPosition] = None,
    preemption: Optional[Preemption] = None,
    mid_epoch: bool = True,
) -> CallbackList:
    """fit's own callbacks, the user's, the training state (it keeps theirs), the preemption watch
    and the progress bar.

    They run in the order of their ``order`` attribute (see :class:`~kerastorch.Callback`).
    ``columns`` are the history's columns after ``epoch`` (None: known only after an epoch).
    """
    watch, output = settings.monitoring, settings.output
    says = int(output.verbose > 0)
    users_stoppers = early_stoppings_in(settings.callbacks)  # with one, fit adds no stopper of its own
    stale_state = training_state_path(watch.ckpt_path) if watch.ckpt_path and not watch.resume else None
    # Files are written while the next epoch trains, unless code of the user's may read them.
    write_while_training = not any(may_read_ckpt_path(callback) for callback in settings.callbacks)
    best_weights: Optional[RestoreBestWeights] = None
    if watch.monitor is None:  # nothing monitored: the last epoch's weights stay
        chosen: list[Any] = [
            TerminateOnNaN(verbose=says),
            KeepLastWeights(watch.ckpt_path, stale_state, write_while_training),
        ]
    else:
        best_weights = RestoreBestWeights(
            watch.monitor,
            watch.mode,
            watch.min_delta,
            ckpt_path=watch.ckpt_path,
            stale_state=stale_state,
            # A user's EarlyStopping with restore_best_weights=True or False decides instead of fit.
            restore=watch.restore_best_weights
            and all(stopper.restore_best_weights is None for stopper in users_stoppers),
            write_while_training=write_while_training,
        )
        chosen = [TerminateOnNaN(verbose=says), best_weights]
    if watch.monitor is not None and watch.patience is not None and not users_stoppers:
        chosen.append(EarlyStopping.for_fit(watch, output))
    if best_weights is not None:
        best_weights.stoppers = early_stoppings_in([*chosen, *settings.callbacks])
    if output.plot:
        chosen.append(LivePlot.for_fit(output, watch))
    if output.wandb:
        chosen.append(WandbLogger.for_fit(output))
    chosen.extend(settings.callbacks)
    if watch.resume and watch.ckpt_path is not None:  # the door refuses resume without a ckpt_path
        chosen.append(TrainingState(training_state_path(watch.ckpt_path), verbose=says))
    states = training_states_in(chosen)
    if len(states) > 1:
        raise ValueError(
            f"fit was given {len(states)} training states ({', '.join(type(s).__name__ for s in states)}): they "
            "would each restore the run. Keep one: resume=True (with ckpt_path), or one BackupAndRestore."
        )
    position = position if position is not None else RunPosition()
    runtime = model.runtime
    reports_to_ray = runtime is not None and runtime.cluster.name == "ray"
    for state in states:
        # Ray's report copies the state file at each epoch's end: it is written before, not while training.
        state.attach(list(chosen), (train_loader, val_loader), position, mid_epoch, read_at_epoch_end=reports_to_ray)
        if preemption is not None:
            preemption.keep_state_with(state)
    if preemption is not None:
        chosen.append(preemption)
    if reports_to_ray:  # a Ray Train worker: report each epoch to Ray
        kept_files = [training_state_path(watch.ckpt_path)] if watch.resume and watch.ckpt_path else []
        chosen.append(ray_train_report(watch.ckpt_path, kept_files, model.is_main_process))
    if output.verbose:  # silent, a bar would only be called at every step to do nothing
        chosen.append(ProgressBar.for_fit(output))
    params = {
        "epochs": settings.epochs,
        "steps": num_batches(train_loader),
        "verbose": output.verbose,
        "monitor": watch.monitor,
        "mode": watch.mode,
        "metrics": columns,
        "train_data": train_loader,
        "ckpt_path": watch.ckpt_path,
        "initial_epoch": settings.initial_epoch,  # Keras's: the epochs done before this run (it trains the next)
        "validation_freq": settings.data.validation_freq,  # the epochs validated (and logging val_*): n, 2n, ... or those listed
        # Whether files (ckpt_path, a ModelCheckpoint's, the training state) may be written while training
        # goes on: no code of the user's that may read them runs before fit has waited for them.
        "write_while_training": write_while_training,
        "best": best_weights,  # fit's best epoch, decided once: .best_epoch, .best (the progress mark, loggers)
    }
    return CallbackList(chosen, model, params)


def what_is_kept(watch: MonitorSettings) -> str:
    """fit's first line, on the weights it keeps: by which value, and whether the best come back."""
    if watch.monitor is None:
        return "nothing monitored (monitor=None): the last epoch's weights stay"
    chosen = f"{watch.mode}, {watch.mode_source}" if watch.mode_was_auto else watch.mode
    if not watch.restore_best_weights:
        return f"best epoch by {watch.monitor} ({chosen}); the last epoch's weights stay (restore_best_weights=False)"
    return f"best weights by {watch.monitor} ({chosen})"


def where_the_state_is(callbacks: CallbackList) -> str:
    """For the line a Ctrl-C prints: the training state on disk this run can go on from, if any."""
    for state in training_states_in(callbacks):
        if state.saved_at is not None:
            epoch, batches = state.saved_at
            after = f"batch {batches} of epoch {epoch + 1}" if batches else f"epoch {epoch}"
            return f" The training state after {after} is in {state.path!r}: the same call goes on from there."
    return ""


def keeps_training_state(settings: FitSettings) -> bool:
    """A training state is kept: ``resume=True`` with a ``ckpt_path``, or a BackupAndRestore among the callbacks."""
    watch = settings.monitoring
    return bool(watch.resume and watch.ckpt_path is not None) or bool(training_states_in(settings.callbacks or ()))


__all__ = ["callbacks_for_fit", "keeps_training_state", "what_is_kept", "where_the_state_is"]
