"""One ``fit`` run: settings → plan → runtime → loop → history.

:func:`fit` takes the settings the door made (:mod:`kerastorch.arguments`), makes the
:class:`~kerastorch.devices.plan.Plan`, turns the data into loaders, checks the model, and runs
the plan: in this process (:func:`fit_here`), or in k forked workers that each run
:func:`fit_here` as one rank and hand the main one's results back
(:func:`~kerastorch.devices.launch.run_in_workers`). The plan's strategy
(:mod:`kerastorch.strategies`) prepares the net and the loaders for each process.

fit's own behaviours — the NaN guard, the best weights, early stopping, the live plot,
Weights & Biases, the training state, the reports to Ray Train (inside its workers) and the
progress bar — are callbacks, chosen from the settings in :func:`callbacks_for_fit`.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from typing import Any, Callable, Optional

import pandas as pd
import torch

from ..callbacks.base import logs_added_by
from ..callbacks.callback_list import CallbackList
from ..callbacks.for_fit import callbacks_for_fit
from ..callbacks.training_state import resumed_history, training_states_in
from ..checks.first_batch import StepOutline, check_batch, check_first_batches, monitor_for_columns, try_own_step
from ..checks.model import check_model_for_fit
from ..compat.runners import ProgramRunners, RunnerEpochs, check_runner_monitor, program_runners, runner_columns
from ..data.forms import FitData, prepare_data
from ..data.loaders import per_process_training_data, per_process_validation_data, training_labels
from ..data.peek import first_batch
from ..data.sample_weights import check_weighted_loss, class_weight_table
from ..devices.launch import run_in_workers
from ..devices.placement import place_parts
from ..devices.plan import Plan, make_plan
from ..devices.runtime import Runtime, build_runtime
from ..settings import FitSettings
from ..strategies import cpu_state_dict, unwrap
from ..tools.doctor import check_before_fit
from ..tools.tuning import scheduled_for_this_run
from .compiling import compiled_net
from .history import history_frame
from .loop import FitEpochs, FitStep, fit_loop
from .meters import EpochMeters
from .metric_meters import metric_copies_for
from .modes import modes_kept
from .position import RunPosition
from .preemption import Preempted, Preemption, preemption_for, signals_passed_to_workers
from .protocols import Epochs, TrainableModel
from .schedulers import (
    check_monitor_is_there_for_the_scheduler,
    check_planned_steps,
    check_plateau_mode,
    try_scheduler,
)


def fit(model: TrainableModel, data: FitData, settings: FitSettings, lr_schedule: Any = None) -> pd.DataFrame:
    """Train ``model`` as ``settings`` say, wherever the plan says; return the history.

    ``lr_schedule`` (``fit_one_cycle``'s) makes a scheduler sized to the optimizer steps one process
    takes, stepped after each of them, for this run only."""
    plan = make_plan(settings.devices, model.net)
    plan.strategy.check(model)
    runners = program_runners(model)  # a program's own step classes, which get the very loaders given
    train_data, val_data = prepare_data(
        data,
        settings.data.batch_size,
        settings.data.shuffle,
        settings.data.validation_split,
        keep_float64=plan.precision == "64-true",
        pin_memory=plan.device_type == "cuda",
        steps_per_epoch=settings.data.steps_per_epoch,
        validation_batch_size=settings.data.validation_batch_size,
        validation_steps=settings.data.validation_steps,
        by_index=runners is None,
    )
    check_model_for_fit(model, train_data, settings, sample_weight=data.sample_weight)
    if runners is None:  # a program's runner calls its scheduler itself
        check_plateau_mode(model.lr_scheduler, settings.monitoring.monitor, settings.monitoring.mode)
        check_monitor_is_there_for_the_scheduler(
            model.lr_scheduler, settings.monitoring.monitor, logs_added_by(settings.callbacks)
        )
        check_planned_steps(model.lr_scheduler, train_data, plan.num_processes, settings)
        try_scheduler(model, settings.step.scheduler_interval, settings.monitoring.monitor)
    if settings.doctor:
        check_before_fit(model, train_data, val_data)
    class_weights = class_weights_for(model, train_data, data, settings)
    with scheduled_for_this_run(model, lr_schedule, settings, plan, train_data) as settings:
        if plan.where == "workers":
            work = functools.partial(
                _fit_as_worker, model, train_data, val_data, settings, plan.for_worker(), class_weights
            )
            with signals_passed_to_workers():
                return take_results(model, run_in_workers(plan, work))
        return fit_here(model, train_data, val_data, settings, plan, class_weights)


def class_weights_for(model: TrainableModel, train_data: Any, data: FitData, settings: FitSettings) -> Any:
    """The class-weight table (or None), and a loss that can weight samples when weights are asked for."""
    asked = [
        word
        for word, value in (("class_weight=", settings.data.class_weight), ("sample_weight=", data.sample_weight))
        if value is not None
    ]
    if asked and model.uses_default_forward_batch:
        check_weighted_loss(model.loss_fn, " and ".join(asked))
    if settings.data.class_weight is None:
        return None
    if model.labels_at is not None:
        raise ValueError(
            f"class_weight reads the labels where batches usually hold them, and this model reads them at "
            f"labels_at={model.labels_at!r}. Weight the samples yourself: a dict batch with a 'sample_weight' key "
            "(one weight per sample), or sample_weight= beside arrays."
        )
    return class_weight_table(settings.data.class_weight, training_labels(train_data))


def fit_here(
    model: TrainableModel,
    train_data: Any,
    val_data: Optional[Any],
    settings: FitSettings,
    plan: Plan,
    class_weights: Optional[torch.Tensor] = None,
) -> pd.DataFrame:
    """The run in this process: alone (``plan.where == "here"``) or as one rank of a job."""
    runtime = plan.strategy.runtime_for(build_runtime(plan), model, train_data)
    model.runtime = runtime
    # A run decides on its first batch how it reads the labels and the net's output, and says it once.
    model.start_reading(say=model.print if settings.output.verbose else None)
    preemption = preemption_for(runtime)
    meters: dict[str, EpochMeters] = {}
    try:
        # From here on a preemption signal stops the run cleanly, also during the trial of a train_step.
        with preemption.signals_watched(), modes_kept(model.net):
            place_parts(model, runtime)
            runners = program_runners(model)  # a program's own step class, or None
            outline = StepOutline()
            columns: Optional[list[str]]
            if runners is None:
                outline, columns, settings = fits_own_columns(model, train_data, val_data, runtime, settings)
            else:
                columns = columns_of_runner(model, runners, train_data, val_data, runtime, settings)
            # A program's runner gathers over the processes at every batch: they must all run as many.
            sharing = runtime.strategy.training(
                model, runtime, train_data, val_data, even_validation=runners is not None
            )
            with sharing as (train_loader, val_loader), compiled_net(model, settings.devices.compile):
                train_loader = per_process_training_data(
                    train_loader, settings.data, class_weights, followed=keeps_training_state(settings)
                )
                val_loader = per_process_validation_data(val_loader, settings.data)
                if not runtime.is_main_process:  # one process prints, draws and logs
                    settings = dataclasses.replace(settings, output=settings.output.silenced())
                meters = epoch_meters(model, runtime, settings, outline) if runners is None else {}
                position = RunPosition(meters.get("train"))
                callbacks = callbacks_for_fit(
                    model, settings, train_loader, val_loader, columns, position, preemption, mid_epoch=runners is None
                )
                fit_step = FitStep(model, runtime, settings.step, callbacks)
                epochs: Epochs
                first_check: Optional[Callable[[], None]] = None
                if runners is None:
                    epochs = FitEpochs(model, runtime, callbacks, meters, fit_step, position, preemption)
                    first_check = functools.partial(
                        check_first_batches, model, train_data, val_data, runtime, settings.data
                    )
                else:
                    unchecked = settings.monitoring.monitor if columns is None else None
                    epochs = RunnerEpochs(model, runners, runtime, callbacks, unchecked_monitor=unchecked)
                if settings.output.verbose:
                    model.print(f"{runtime.describe()}; {what_is_kept(settings.monitoring)}")
                return train_with_callbacks(
                    model,
                    epochs,
                    train_loader,
                    val_loader,
                    runtime,
                    callbacks,
                    fit_step,
                    settings,
                    columns,
                    position,
                    preemption,
                    first_check,
                )
    finally:
        for stage in meters.values():
            stage.give_back_copies()
        runtime.teardown()


def fits_own_columns(
    model: TrainableModel, train_data: Any, val_data: Optional[Any], runtime: Runtime, settings: FitSettings
) -> tuple[StepOutline, list[str], FitSettings]:
    """The history's columns of a run with fit's own epochs, known before the callbacks begin: a
    ``train_step`` of the user's own is tried once to see what it returns (:func:`try_own_step`), and
    the monitored value is one of its values. A net with lazy modules (``nn.LazyLinear``, sized by its
    first batch as a Keras ``Dense`` is) gets its weights from a first batch now, before anything
    copies them."""
    name = settings.data.train_name
    if has_lazy_parameters(model.net):
        check_batch(model, first_batch(train_data, name), runtime, name)
    outline = StepOutline()
    if not model.uses_default_train_step:
        outline = try_own_step(model, train_data, runtime, settings.step, name)
    columns = outline.columns(settings.metric_names(model.metrics_dict), val_data is not None)
    columns += [name for name in logs_added_by(settings.callbacks) if name not in columns]
    if not model.uses_default_train_step:  # the step named its values on its trial: monitor one of them
        monitoring = monitor_for_columns(settings.monitoring, columns, outline.values)
        step = dataclasses.replace(settings.step, monitor=monitoring.monitor)
        settings = dataclasses.replace(settings, monitoring=monitoring, step=step)
    return outline, columns, settings


def has_lazy_parameters(net: torch.nn.Module) -> bool:
    """Parameters a lazy module has not sized yet (they take their shapes from the first forward pass)."""
    return any(isinstance(p, torch.nn.parameter.UninitializedParameter) for p in net.parameters())


def what_is_kept(watch: Any) -> str:
    """fit's first line, on the weights it keeps: by which value, and whether the best come back."""
    if watch.monitor is None:
        return "nothing monitored (monitor=None): the last epoch's weights stay"
    chosen = f"{watch.mode}, {watch.mode_source}" if watch.mode_was_auto else watch.mode
    if not watch.restore_best_weights:
        return f"best epoch by {watch.monitor} ({chosen}); the last epoch's weights stay (restore_best_weights=False)"
    return f"best weights by {watch.monitor} ({chosen})"


def columns_of_runner(
    model: TrainableModel,
    runners: ProgramRunners,
    train_data: Any,
    val_data: Optional[Any],
    runtime: Runtime,
    settings: FitSettings,
) -> Optional[list[str]]:
    """The history's columns as a torchkeras StepRunner names them, read on one batch before
    training, with the monitored name checked against them; None with the program's own
    EpochRunner, whose names are known only after an epoch (the monitor is checked then)."""
    if runners.epoch_class is not None:
        return None
    probed = val_data if val_data is not None else train_data
    columns = runner_columns(model, runners, probed, runtime, has_val=val_data is not None)
    columns += [name for name in logs_added_by(settings.callbacks) if name not in columns]
    if settings.monitoring.monitor is not None:
        check_runner_monitor(settings.monitoring.monitor, columns, model)
    return columns


def epoch_meters(
    model: TrainableModel,
    runtime: Runtime,
    settings: FitSettings,
    outline: Optional[StepOutline] = None,
) -> dict[str, EpochMeters]:
    """The train and val meters; a train_step that returns named values gets them summed instead of
    the loss and the metrics (which need predictions)."""
    device = runtime.outputs_device
    # Only several processes have anything to sum: alone, an epoch's read takes its means on the host.
    reduce_sum = runtime.reduce_sum if runtime.num_processes > 1 else None
    copies = metric_copies_for(model, device)  # the model's, shared with the first-batch checks
    weighted = settings.weighted_metrics
    labels_at = model.labels_at
    val = EpochMeters("val", model.metrics_dict, device, reduce_sum, weighted, copies=copies, labels_at=labels_at)
    if outline is not None and outline.values is not None:
        train = EpochMeters("train", {}, device, reduce_sum, values=outline.values, labels_at=labels_at)
        return {"train": train, "val": val}
    train = EpochMeters("train", model.metrics_dict, device, reduce_sum, weighted, copies=copies, labels_at=labels_at)
    return {"train": train, "val": val}


def train_with_callbacks(
    model: TrainableModel,
    epochs: Epochs,
    train_loader: Any,
    val_loader: Optional[Any],
    runtime: Runtime,
    callbacks: CallbackList,
    fit_step: FitStep,
    settings: FitSettings,
    columns: Optional[list[str]],
    position: Optional[RunPosition] = None,
    preemption: Optional[Preemption] = None,
    first_check: Optional[Callable[[], None]] = None,
) -> pd.DataFrame:
    """The epochs between ``on_train_begin`` and ``on_train_end``; Ctrl-C returns the history so far,
    a preemption signal raises :class:`~kerastorch.training.preemption.Preempted` once the state is written.

    ``columns`` are the history's columns after ``epoch`` (None: known only once an epoch ran);
    ``first_check`` checks the first batches, after ``on_train_begin`` and before the first epoch.
    """
    rows: list[dict] = []
    model.stop_training = False
    model.fit_step = fit_step  # what model.backward / model.optimizer_step use inside train_step
    callbacks.call("on_train_begin", {})
    rows.extend(resumed_history(callbacks))
    # Whether this run goes on from a saved training state (a CSVLogger then drops the rows a kill left past it).
    callbacks.params["resumed"] = any(state.resumed_epoch is not None for state in training_states_in(callbacks))
    fit_step.epochs_done = len(rows)  # a timm scheduler counts the updates of the epochs already done
    if len(rows) > settings.epochs:  # the saved run went further than asked: show the epochs asked for
        model.print(
            f"The training state holds {len(rows)} epochs; epochs={settings.epochs} returns the first "
            f"{settings.epochs} rows (the weights are the best of all {len(rows)})."
        )
        del rows[settings.epochs :]
    ended = "failed"  # how fit ended, for on_train_end (params["ended"]): until the loop returns or is interrupted
    # Keras's initial_epoch=n: n epochs are done, the first to train is the (n + 1)-th (1-based, as the history).
    first_epoch = rows[-1]["epoch"] + 1 if rows else settings.initial_epoch + 1
    stopped_by: Optional[BaseException] = None  # the error that ends the run, if one does
    try:
        if not model.stop_training:  # a resumed run that had already stopped early stays stopped
            if first_check is not None:
                first_check()
            fit_loop(
                model,
                epochs,
                train_loader,
                val_loader,
                runtime,
                callbacks,
                settings.epochs,
                rows,
                first_epoch=first_epoch,
                validation_freq=settings.data.validation_freq,
                position=position,
                preemption=preemption,
            )
        ended = "finished"
    except Preempted as preempted:
        ended, stopped_by = "preempted", preempted  # the state is written; the caller gets the Preempted
        raise
    except KeyboardInterrupt:
        ended = "interrupted"
        restored = "the best weights restored" if rows else "the weights from before training restored"
        model.print(
            f"Interrupted during epoch {rows[-1]['epoch'] + 1 if rows else first_epoch}: returning the history of "
            f"the {len(rows)} finished epoch(s) with {restored}.{where_the_state_is(callbacks)}"
        )
    except BaseException as error:
        stopped_by = error
        raise
    finally:
        model.fit_step = None
        model.history = history_frame(rows, ["epoch", *columns] if columns is not None else None)
        callbacks.params["ended"] = ended
        try:
            end_callbacks(callbacks, rows[-1] if rows else {}, stopped_by)
        finally:
            stopped_by = None  # the error's traceback holds this frame: no cycle keeps the run's tensors alive
    return model.history


def end_callbacks(callbacks: CallbackList, logs: dict, stopped_by: Optional[BaseException]) -> None:
    """``on_train_end`` on every callback, whatever the others' ends raise; then the one error the caller
    gets, first of: a Ctrl-C (or an exit) during an end; the error that stopped training (the one to
    fix, and the one an ``except`` around ``fit`` waits for, :class:`~kerastorch.training.preemption.Preempted`
    too), which the ``finally`` this is called from lets go on; the error a callback raises to tell how
    the run ended (``raises_the_outcome``: Optuna's ``TrialPruned``); the first end's error. Each other
    end's error (a checkpoint's write that failed on its thread) is told in its traceback."""
    raised = callbacks.call_every("on_train_end", logs)
    ranked = [
        *(error for _, error in raised if not isinstance(error, Exception)),
        *([stopped_by] if stopped_by is not None else []),
        *(error for callback, error in raised if callback.raises_the_outcome),
        *(error for _, error in raised),
    ]
    if not ranked:
        return
    chosen = ranked[0]
    tell_the_others(chosen, raised)
    if chosen is stopped_by:
        return
    try:
        raise chosen
    finally:
        del ranked, raised, chosen, stopped_by  # the raised error's traceback holds this frame: no cycle


def tell_the_others(chosen: BaseException, raised: list) -> None:
    """Each end's error but ``chosen``, told in ``chosen``'s traceback with the callback that raised it."""
    for callback, error in raised:
        if error is not chosen:
            tell_beside(
                chosen,
                f"{type(callback).__name__}.on_train_end raised too, as fit ended: {type(error).__name__}: {error}",
            )


def tell_beside(error: BaseException, message: str) -> None:
    """``message`` in ``error``'s traceback (a note, Python 3.11 and later), else as a warning."""
    if hasattr(error, "add_note"):
        error.add_note(message)
    else:
        warnings.warn(message, RuntimeWarning, stacklevel=2)


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


# -- results of a run in workers ------------------------------------------------------------


def _fit_as_worker(
    model: TrainableModel,
    train_data: Any,
    val_data: Optional[Any],
    settings: FitSettings,
    plan: Plan,
    class_weights: Optional[torch.Tensor],
) -> dict:
    """One worker's run; the main one's results go back to the caller. A preempted run sends its
    results too (its best weights and history), with the :class:`Preempted` the caller raises."""
    preempted: Optional[Preempted] = None
    try:
        history = fit_here(model, train_data, val_data, settings, plan, class_weights)
    except Preempted as error:
        history, preempted = model.history, error
    return {**results_of(model, history), "preempted": preempted}


def results_of(model: TrainableModel, history: pd.DataFrame) -> dict:
    """What the main worker sends back: the history, the best weights, the optimizer's and scheduler's state."""
    return {
        "history": history.to_dict("records"),
        "weights": cpu_state_dict(model.net),
        "optimizer": model.optimizer.state_dict(),
        "lr_scheduler": model.lr_scheduler.state_dict() if model.lr_scheduler is not None else None,
        "stop_training": model.stop_training,
    }


def take_results(model: TrainableModel, results: dict) -> pd.DataFrame:
    """Load what the main worker sent back into the caller's model; return the history (or raise the
    :class:`Preempted` the workers stopped with, once the caller's model holds their results)."""
    unwrap(model.net).load_state_dict(results["weights"])
    model.optimizer.load_state_dict(results["optimizer"])
    if model.lr_scheduler is not None and results["lr_scheduler"] is not None:
        model.lr_scheduler.load_state_dict(results["lr_scheduler"])
    model.stop_training = results["stop_training"]
    model.runtime = None
    model.history = history_frame(results["history"])
    if results.get("preempted") is not None:
        raise results["preempted"]
    return model.history


__all__ = ["callbacks_for_fit", "fit", "fit_here"]
