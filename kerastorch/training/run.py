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

import contextlib
import dataclasses
import functools
import math
import warnings
from typing import Any, Iterator, Optional

import pandas as pd
import torch

from ..callbacks.base import logs_added_by, may_read_ckpt_path
from ..callbacks.best_weights import RestoreBestWeights
from ..callbacks.callback_list import CallbackList
from ..callbacks.early_stopping import EarlyStopping, early_stoppings_in
from ..callbacks.last_weights import KeepLastWeights
from ..callbacks.live_plot import LivePlot
from ..callbacks.progress import ProgressBar
from ..callbacks.ray_report import ray_train_report
from ..callbacks.terminate_on_nan import TerminateOnNaN
from ..callbacks.training_state import TrainingState, resumed_history, training_state_path, training_states_in
from ..callbacks.wandb_logger import WandbLogger
from ..checks.first_batch import StepOutline, check_first_batch, check_own_step, monitor_for_columns
from ..checks.model import check_model_for_fit
from ..compat.runners import ProgramRunners, RunnerEpochs, check_runner_monitor, program_runners, runner_columns
from ..data.forms import FitData, prepare_data
from ..data.loaders import per_process_training_data, per_process_validation_data, training_labels
from ..data.peek import FirstPass, num_batches
from ..data.sample_weights import check_weighted_loss, class_weight_table
from ..devices.launch import run_in_workers
from ..devices.placement import place_parts
from ..devices.plan import Plan, make_plan
from ..devices.runtime import Runtime, build_runtime
from ..settings import FitSettings
from ..strategies import cpu_state_dict, unwrap
from ..tools.doctor import check_before_fit
from .compiling import compiled_net
from .history import history_frame
from .loop import FitEpochs, fit_loop
from .meters import EpochMeters, metric_copies_for
from .parts import ModelParts
from .position import RunPosition
from .preemption import Preempted, Preemption, preemption_for, signals_passed_to_workers
from .protocols import Epochs, TrainableModel
from .schedulers import check_monitor_is_there_for_the_scheduler, check_plateau_mode, try_scheduler
from .step import FitStep, run_once


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
    )
    check_model_for_fit(model, train_data, settings, sample_weight=data.sample_weight)
    if runners is None:  # a program's runner calls its scheduler itself
        check_plateau_mode(model.lr_scheduler, settings.monitoring.monitor, settings.monitoring.mode)
        check_monitor_is_there_for_the_scheduler(
            model.lr_scheduler, settings.monitoring.monitor, logs_added_by(settings.callbacks)
        )
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


@contextlib.contextmanager
def scheduled_for_this_run(
    model: TrainableModel, lr_schedule: Any, settings: FitSettings, plan: Plan, train_loader: Any
) -> Iterator[FitSettings]:
    """The model's scheduler replaced by ``lr_schedule``'s for the run, stepped after every optimizer
    step; the settings say so. Nothing changes without a schedule."""
    if lr_schedule is None:
        yield settings
        return
    steps = updates_per_epoch(train_loader, plan.num_processes, settings)
    epochs = settings.epochs - settings.initial_epoch  # the epochs this run trains
    model.lr_scheduler = lr_schedule.scheduler(model.optimizer, total_steps=epochs * steps)
    model.lr_scheduler_interval = "step"
    try:
        yield dataclasses.replace(settings, step=dataclasses.replace(settings.step, scheduler_interval="step"))
    finally:
        model.lr_scheduler, model.lr_scheduler_interval = None, "epoch"


def updates_per_epoch(train_loader: Any, num_processes: int, settings: FitSettings) -> int:
    """How many optimizer steps one process takes in an epoch: its share of the batches (the
    shares are padded to equal), over the accumulation steps."""
    batches = settings.data.steps_per_epoch
    if batches is None:
        total = num_batches(train_loader)
        if not total:
            raise ValueError(
                "fit_one_cycle plans its schedule from the number of batches in an epoch, and this training "
                "data has no length: pass steps_per_epoch=..."
            )
        batches = math.ceil(total / num_processes)
    return math.ceil(batches / settings.step.accumulation_steps)


def class_weights_for(model: TrainableModel, train_data: Any, data: FitData, settings: FitSettings) -> Any:
    """The class-weight table (or None), and a loss that can weight samples when weights are asked for."""
    asked = [
        word
        for word, value in (("class_weight=", settings.data.class_weight), ("sample_weight=", data.sample_weight))
        if value is not None
    ]
    if asked and type(model).forward_batch is ModelParts.forward_batch:
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
    meters: dict[str, EpochMeters] = {}
    try:
        place_parts(model, runtime)
        runners = program_runners(model)  # a program's own step class, or None
        checks_ride_on_first_step: Optional[str] = None
        outline = StepOutline()
        first_val_pass: Optional[FirstPass] = None
        columns: Optional[list[str]]
        if runners is None:
            checks_ride_on_first_step, outline, first_val_pass = check_first_batches(
                model, train_data, val_data, runtime, settings
            )
            columns = outline.columns(settings.metric_names(model.metrics_dict), val_data is not None)
            columns += [name for name in logs_added_by(settings.callbacks) if name not in columns]
            if not model.uses_default_train_step:  # the step named its values on its trial: monitor one of them
                monitoring = monitor_for_columns(settings.monitoring, columns, outline.values)
                step = dataclasses.replace(settings.step, monitor=monitoring.monitor)
                settings = dataclasses.replace(settings, monitoring=monitoring, step=step)
        else:
            columns = columns_of_runner(model, runners, train_data, val_data, runtime, settings)
        # A program's runner gathers over the processes at every batch: they must all run as many.
        sharing = runtime.strategy.training(model, runtime, train_data, val_data, even_validation=runners is not None)
        with sharing as (train_loader, val_loader), compiled_net(model, settings.devices.compile):
            train_loader = per_process_training_data(
                train_loader, settings.data, class_weights, followed=keeps_training_state(settings)
            )
            val_loader = per_process_validation_data(val_loader, settings.data)
            if not runtime.is_main_process:  # one process prints, draws and logs
                settings = dataclasses.replace(settings, output=settings.output.silenced())
            meters = epoch_meters(model, runtime, settings, outline) if runners is None else {}
            position, preemption = RunPosition(meters.get("train")), preemption_for(runtime)
            callbacks = callbacks_for_fit(
                model, settings, train_loader, val_loader, columns, position, preemption, mid_epoch=runners is None
            )
            steps = FitStep(model, runtime, settings.step, callbacks, checks_ride_on_first_step, meters.get("train"))
            stages: Epochs
            if runners is None:
                stages = FitEpochs(model, runtime, callbacks, meters, steps, position, preemption, first_val_pass)
            else:
                unchecked = settings.monitoring.monitor if columns is None else None
                stages = RunnerEpochs(model, runners, runtime, callbacks, unchecked_monitor=unchecked)
            if settings.output.verbose:
                model.print(f"{runtime.describe()}; {what_is_kept(settings.monitoring)}")
            return train_with_callbacks(
                model,
                stages,
                train_loader,
                val_loader,
                runtime,
                callbacks,
                steps,
                settings,
                columns,
                position,
                preemption,
            )
    finally:
        for stage in meters.values():
            stage.give_back_copies()
        runtime.teardown()


def check_first_batches(
    model: TrainableModel,
    train_data: Any,
    val_data: Optional[Any],
    runtime: Runtime,
    settings: FitSettings,
) -> tuple[Optional[str], StepOutline, Optional[FirstPass]]:
    """Check the first batches against the net, loss and metrics, and try a train_step of the user's
    own. Returns the training data's name when its checks ride on the real first step instead, what
    the train_step returns, and the pass over the validation data that its checked batch began,
    when the first validation can go on with it (one process; see :class:`FirstPass`).

    One process and the default train_step: the training batch is checked inside the real first
    step, at no cost. Otherwise by a pass of its own, before any process starts training (a check
    failing on one rank alone would leave the others waiting): the user's own train_step runs once
    inside a snapshot (:func:`~kerastorch.checks.first_batch.check_own_step`).
    """
    names = settings.data
    outline = StepOutline()
    # A net with lazy modules (nn.LazyLinear, sized by its first batch as a Keras Dense is) gets its
    # weights from a forward pass: the separate check gives it that before anything copies them.
    rides = runtime.num_processes == 1 and model.uses_default_train_step and not has_lazy_parameters(model.net)
    if not model.uses_default_train_step:
        run_step = functools.partial(run_once, model, runtime, settings.step)
        outline = check_own_step(model, train_data, runtime, names.train_name, run_step)
    elif not rides:
        check_first_batch(model, train_data, runtime, names.train_name)
    first_val_pass = None
    if val_data is not None:
        first_val_pass = check_first_batch(model, val_data, runtime, names.val_name)
    if runtime.num_processes > 1:  # each process validates on its own share of the data, not on this pass
        first_val_pass = None
    return (names.train_name if rides else None), outline, first_val_pass


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
    val = EpochMeters("val", model.metrics_dict, device, reduce_sum, weighted, copies=copies)
    if outline is not None and outline.values is not None:
        return {"train": EpochMeters("train", {}, device, reduce_sum, values=outline.values), "val": val}
    train = EpochMeters("train", model.metrics_dict, device, reduce_sum, weighted, copies=copies)
    return {"train": train, "val": val}


def train_with_callbacks(
    model: TrainableModel,
    stages: Epochs,
    train_loader: Any,
    val_loader: Optional[Any],
    runtime: Runtime,
    callbacks: CallbackList,
    steps: FitStep,
    settings: FitSettings,
    columns: Optional[list[str]],
    position: Optional[RunPosition] = None,
    preemption: Optional[Preemption] = None,
) -> pd.DataFrame:
    """The epochs between ``on_train_begin`` and ``on_train_end``; Ctrl-C returns the history so far,
    a preemption signal raises :class:`~kerastorch.training.preemption.Preempted` once the state is written.

    ``columns`` are the history's columns after ``epoch`` (None: known only once an epoch ran).
    """
    rows: list[dict] = []
    model.stop_training = False
    model.fit_step = steps  # what model.backward / model.optimizer_step use inside train_step
    callbacks.call("on_train_begin", {})
    rows.extend(resumed_history(callbacks))
    # Whether this run goes on from a saved training state (a CSVLogger then drops the rows a kill left past it).
    callbacks.params["resumed"] = any(state.resumed_epoch is not None for state in training_states_in(callbacks))
    steps.epochs_done = len(rows)  # a timm scheduler counts the updates of the epochs already done
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
            fit_loop(
                model,
                stages,
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
        chosen.append(EarlyStopping.for_fit(watch.monitor, watch.mode, watch.patience, watch.min_delta, says))
    if best_weights is not None:
        best_weights.stoppers = early_stoppings_in([*chosen, *settings.callbacks])
    if output.plot:
        chosen.append(LivePlot(monitor=watch.monitor, mode=watch.mode))
    if output.wandb:
        chosen.append(WandbLogger(**(output.wandb if isinstance(output.wandb, dict) else {})))
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
        chosen.append(ProgressBar(verbose=output.verbose))
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


# -- results of a run in workers ------------------------------------------------------------


def _fit_as_worker(
    model: TrainableModel,
    train_data: Any,
    val_data: Optional[Any],
    settings: FitSettings,
    plan: Plan,
    class_weights: Optional[torch.Tensor],
) -> dict:
    history = fit_here(model, train_data, val_data, settings, plan, class_weights)
    return results_of(model, history)


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
    """Load what the main worker sent back into the caller's model; return the history."""
    unwrap(model.net).load_state_dict(results["weights"])
    model.optimizer.load_state_dict(results["optimizer"])
    if model.lr_scheduler is not None and results["lr_scheduler"] is not None:
        model.lr_scheduler.load_state_dict(results["lr_scheduler"])
    model.stop_training = results["stop_training"]
    model.runtime = None
    model.history = history_frame(results["history"])
    return model.history


__all__ = ["callbacks_for_fit", "fit", "fit_here"]
