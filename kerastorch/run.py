"""One ``fit``, from the settings the door made to the history.

:func:`fit` makes the plan (:mod:`kerastorch.devices.plan`), turns the data into loaders, checks
the model, and runs the plan: here (:func:`fit_here`), or in k forked workers that each run
:func:`fit_here` as one rank and send the main one's results back
(:func:`~kerastorch.devices.launch.run_in_workers`). :func:`train_with_callbacks` is what happens
between ``on_train_begin`` and ``on_train_end``; the epochs themselves are
:func:`~kerastorch.training.loop.fit_loop`'s.

A torchkeras program that set ``KerasModel.StepRunner`` is the one other way a run trains: its
:class:`~kerastorch.compat.runners.ProgramRunners` checks fit's settings, names the history's
columns and runs the epochs, where fit's own step would.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Optional

import pandas as pd
import torch

from .callbacks.for_fit import callbacks_for_fit, keeps_training_state, what_is_kept, where_the_state_is
from .callbacks.training_state import resumed_history, training_states_in
from .compat.runners import ProgramRunners, program_runners
from .data.forms import FitData, prepare_data
from .data.loaders import class_weights_for, per_process_training_data, per_process_validation_data
from .devices.launch import results_of, run_in_workers, take_results
from .devices.placement import place_parts
from .devices.plan import Plan, make_plan
from .devices.runtime import build_runtime
from .helpers.modes import modes_kept
from .helpers.protocols import Epochs, TrainableModel
from .settings import FitSettings
from .tools.doctor import check_before_fit
from .tools.fit_report import end_of_fit_report
from .tools.tuning import scheduled_for_this_run
from .training.callback_list import CallbackList
from .training.compiling import compiled_net
from .training.first_batch import StepOutline, check_first_batches, fits_own_columns
from .training.history import history_frame
from .training.loop import FitEpochs, FitStep, fit_loop
from .training.meters import EpochMeters, meters_for_fit
from .training.model_checks import check_fits_own_step, check_model_for_fit
from .training.position import RunPosition
from .training.preemption import Preempted, preemption_for, signals_passed_to_workers


def fit(model: TrainableModel, data: FitData, settings: FitSettings, lr_schedule: Any = None) -> pd.DataFrame:
    """Train ``model`` as ``settings`` say, wherever the plan says; return the history.

    ``lr_schedule`` (``fit_one_cycle``'s) makes a scheduler sized to the optimizer steps one process
    takes, stepped after each of them, for this run only."""
    plan = make_plan(settings.devices, model.net)
    plan.strategy.check(model)
    program = program_runners(model)  # a program's own step classes (see compat), or None: fit's own step
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
    check_model_for_fit(model, train_data)
    if program is None:
        check_fits_own_step(model, train_data, plan.num_processes, settings)
    else:
        program.check_fit(model, settings, data.sample_weight)
    if settings.doctor:
        check_before_fit(model, train_data, val_data)
    class_weights = class_weights_for(model, train_data, settings.data.class_weight, data.sample_weight)
    with scheduled_for_this_run(model, lr_schedule, settings, plan, train_data) as settings:
        if plan.where != "workers":  # this process alone, or one rank of a job a launcher started
            return fit_here(model, train_data, val_data, settings, plan, class_weights, program)
        work = functools.partial(
            fit_as_worker, model, train_data, val_data, settings, plan.for_worker(), class_weights, program
        )
        with signals_passed_to_workers():
            results = run_in_workers(plan, work)
        model.history = history_frame(take_results(model, results))
        if results["preempted"] is not None:  # the caller's model holds the workers' best weights first
            raise results["preempted"]
        return model.history


def fit_here(
    model: TrainableModel,
    train_data: Any,
    val_data: Optional[Any],
    settings: FitSettings,
    plan: Plan,
    class_weights: Optional[torch.Tensor] = None,
    program: Optional[ProgramRunners] = None,
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
            outline, columns = StepOutline(), None
            if program is None:
                outline, columns, settings = fits_own_columns(model, train_data, val_data, runtime, settings)
            else:
                columns = program.columns(model, train_data, val_data, runtime, settings)
            # A program's runner gathers over the processes at every batch: they must all run as many.
            sharing = runtime.strategy.training(model, runtime, train_data, val_data, even_validation=bool(program))
            with sharing as (train_loader, val_loader), compiled_net(model, settings.devices.compile):
                followed = keeps_training_state(settings)
                train_loader = per_process_training_data(train_loader, settings.data, class_weights, followed)
                val_loader = per_process_validation_data(val_loader, settings.data)
                if not runtime.is_main_process:  # one process prints, draws and logs
                    settings = dataclasses.replace(settings, output=settings.output.silenced())
                meters = meters_for_fit(model, runtime, settings, outline) if program is None else {}
                position = RunPosition(meters.get("train"))
                callbacks = callbacks_for_fit(
                    model, settings, train_loader, val_loader, columns, position, preemption, mid_epoch=not program
                )
                fit_step = FitStep(model, runtime, settings.step, callbacks)
                epochs: Epochs
                first_check: Optional[Callable[[], Optional[float]]] = None
                if program is None:
                    epochs = FitEpochs(model, runtime, callbacks, meters, fit_step, position, preemption)
                    first_check = functools.partial(
                        check_first_batches, model, train_data, val_data, runtime, settings.data
                    )
                else:
                    epochs = program.epochs(model, runtime, callbacks, columns, settings)
                if settings.output.verbose:
                    model.print(f"{runtime.describe()}; {what_is_kept(settings.monitoring)}")
                run = functools.partial(train_with_callbacks, model, epochs, train_loader, val_loader, runtime)
                history = run(callbacks, fit_step, settings, columns, position, preemption, first_check)
            # The run's report, with the net the user's own module again (not compiled, not wrapped).
            timing = getattr(epochs, "timing", None)
            model.fit_report = end_of_fit_report(
                model, history, callbacks, timing, train_data, val_data, settings, replay=program is None
            )
            return history
    finally:
        for stage in meters.values():
            stage.give_back_copies()
        runtime.teardown()


def train_with_callbacks(
    model: TrainableModel,
    epochs: Epochs,
    train_loader: Any,
    val_loader: Optional[Any],
    runtime: Any,
    callbacks: CallbackList,
    fit_step: FitStep,
    settings: FitSettings,
    columns: Optional[list[str]],
    position: Optional[RunPosition] = None,
    preemption: Any = None,
    first_check: Optional[Callable[[], Optional[float]]] = None,
) -> pd.DataFrame:
    """The epochs between ``on_train_begin`` and ``on_train_end``; Ctrl-C returns the history so far, a
    preemption signal raises :class:`~kerastorch.training.preemption.Preempted` once the state is written.

    ``columns`` are the history's columns after ``epoch`` (None: known only once an epoch ran);
    ``first_check`` checks the first batches, after ``on_train_begin`` and before the first epoch; the
    first training batch's loss it returns goes to the run's report (``params["start_loss"]``).
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
                callbacks.params["start_loss"] = first_check()
            fit_loop(model, epochs, train_loader, val_loader, runtime, callbacks, settings.epochs, rows,
                     first_epoch, settings.data.validation_freq, position, preemption)  # fmt: skip
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
            callbacks.end(rows[-1] if rows else {}, stopped_by)
        finally:
            stopped_by = None  # the error's traceback holds this frame: no cycle keeps the run's tensors alive
    return model.history


def fit_as_worker(
    model: TrainableModel,
    train_data: Any,
    val_data: Optional[Any],
    settings: FitSettings,
    plan: Plan,
    class_weights: Optional[torch.Tensor],
    program: Optional[ProgramRunners],
) -> dict:
    """One worker's run; the main one's results go back to the caller. A preempted run sends its
    results too (its best weights and history), with the :class:`Preempted` the caller raises."""
    preempted: Optional[Preempted] = None
    try:
        history = fit_here(model, train_data, val_data, settings, plan, class_weights, program)
    except Preempted as error:
        history, preempted = model.history, error
    return results_of(model, history.to_dict("records"), preempted)


__all__ = ["fit", "fit_here", "train_with_callbacks"]
