"""``evaluate`` and ``predict``: one pass over data with the net where it already is.

Both take Keras's keywords (checked at the door, :mod:`kerastorch.arguments`): ``steps`` runs the
first n batches (and, without ``batch_size``, sizes the batches kerastorch makes so that n cover
the data, as Keras does), ``callbacks`` get the test hooks (``evaluate``) or the predict hooks
(``predict``) in Keras's order, ``evaluate(return_dict=False)`` gives Keras's list. The loops are
:mod:`kerastorch.training.eval_loop`'s; a torchkeras program's StepRunner evaluates as it does in
its own library.
"""

from __future__ import annotations

from typing import Any

from tqdm.std import tqdm as text_tqdm

from .callbacks.progress import ProgressBar
from .compat.runners import RunnerEpochs, program_runners
from .data.arrays import is_flat_group
from .data.forms import EvalData, eval_loader
from .data.loaders import FirstBatches, what_batches_hold
from .data.peek import num_batches
from .devices.runtime import runtime_for_net
from .helpers.notebook import output_style
from .helpers.protocols import TrainableModel
from .settings import EvaluateSettings, PredictSettings
from .training.callback_list import CallbackList
from .training.eval_loop import evaluate_epoch, predict_outputs
from .training.meters import EpochMeters
from .training.metric_meters import metric_copies_for
from .training.model_checks import check_loss_fn

PROGRESS_DELAY_S = 2.0  # predict shows a bar once it has taken this long


def evaluate(model: TrainableModel, given: EvalData, settings: EvaluateSettings) -> Any:
    """Loss and metrics over the data (eval mode, no gradients): ``{"val_loss": ..., "val_<m>": ...}``,
    or with ``return_dict=False`` Keras's list of the same values in the same order (a single number
    when there is only the loss)."""
    runners = program_runners(model)  # a program's own step class evaluates, as it does in its own library
    data = eval_loader(
        given.data,
        given.y,
        settings.batch_size,
        needs_labels=True,
        sample_weight=given.sample_weight,
        steps=settings.steps,
    )
    if settings.steps is not None:
        data = FirstBatches(data, settings.steps)
    if runners is None:
        check_loss_fn(model)
    runtime = runtime_for_net(model.net)
    runtime = runtime.strategy.runtime_for(runtime, model, data)
    model.start_reading(
        say=model.print if settings.verbose else None
    )  # this data's first batch decides how labels are read
    params = {"epochs": 1, "steps": num_batches(data), "verbose": settings.verbose}
    bar = [ProgressBar(verbose=settings.verbose)] if settings.verbose else []
    callbacks = CallbackList([*settings.callbacks, *bar], model, params)
    if runners is not None:
        logs = RunnerEpochs(model, runners, runtime, callbacks).validate(data)
    else:
        copies = metric_copies_for(model, runtime.outputs_device)
        meters = EpochMeters("val", model.metrics_dict, runtime.outputs_device, copies=copies)
        try:
            logs = evaluate_epoch(model, data, runtime, meters, callbacks)
        finally:
            meters.give_back_copies()
    if settings.verbose:
        model.print(", ".join(f"{k}={v:.4g}" for k, v in logs.items()))
    if settings.return_dict:
        return logs
    values = list(logs.values())  # the loss first, then the metrics in metrics_dict's order, as Keras lists them
    return values[0] if len(values) == 1 else values


def predict(model: TrainableModel, given: EvalData, settings: PredictSettings) -> Any:
    """The net's outputs for the data, on the CPU, rows in data order (eval mode, no gradients); with
    ``settings.concatenate`` False, a list of each batch's outputs."""
    data = eval_loader(given.data, None, settings.batch_size, needs_labels=False, steps=settings.steps)
    if settings.steps is not None:
        data = FirstBatches(data, settings.steps)
    # A text bar only for a long prediction (tqdm's delay), gone when done; never in a log, where each
    # redraw would be a line. Text, not a widget, so a short prediction leaves nothing in a notebook.
    shown = settings.verbose == 1 and model.is_main_process and output_style() != "lines"
    batches = text_tqdm(
        data,
        total=num_batches(data),
        desc="Predicting",
        unit="batch",
        delay=PROGRESS_DELAY_S,
        leave=False,
        disable=not shown,
    )
    params = {"epochs": 1, "steps": num_batches(data), "verbose": settings.verbose}
    callbacks = CallbackList(settings.callbacks, model, params)
    try:
        return predict_outputs(
            model,
            batches,
            runtime_for_net(model.net),
            callbacks,
            held=what_batches_hold(data),
            concatenate=settings.concatenate,
        )
    except TypeError as error:
        inputs = given.data
        if isinstance(inputs, (tuple, list)) and is_flat_group(inputs) and len(inputs) > 1:
            raise TypeError(
                f"{error}. predict passed the {len(inputs)} arrays of the {type(inputs).__name__} to the net as "
                f"{len(inputs)} inputs: predict takes no labels, so every array is an input (Keras's rule). Pass the "
                "inputs only: model.predict(X) for a net with one, model.predict([X1, X2]) for a net with two."
            ) from error
        raise


__all__ = ["evaluate", "predict"]
