"""``evaluate`` and ``predict``: one pass over data with the net where it already is."""

from __future__ import annotations

from typing import Any, Optional

from tqdm.std import tqdm as text_tqdm

from ..callbacks.callback_list import CallbackList
from ..callbacks.progress import ProgressBar
from ..compat.runners import RunnerEpochs, program_runners
from ..data.forms import eval_loader
from ..data.peek import num_batches
from ..devices.runtime import runtime_for_net
from ..tools.notebook import output_style
from .loop import evaluate_epoch, predict_outputs
from .meters import EpochMeters
from .parts import check_loss_fn
from .protocols import TrainableModel

PROGRESS_DELAY_S = 2.0  # predict shows a bar once it has taken this long


def evaluate(
    model: TrainableModel, data: Any, y: Any = None, batch_size: Optional[int] = None, quiet: bool = False
) -> dict[str, float]:
    """Loss and metrics over ``data`` (eval mode, no gradients): ``{"val_loss": ..., "val_<m>": ...}``."""
    data = eval_loader(data, y, batch_size, needs_labels=True)
    runners = program_runners(model)  # a program's own step class evaluates, as it does in its own library
    if runners is None:
        check_loss_fn(model)  # type: ignore[arg-type]
    runtime = runtime_for_net(model.net)
    runtime = runtime.strategy.runtime_for(runtime, model, data)
    model.start_reading(say=None if quiet else model.print)  # this data's first batch decides how labels are read
    callbacks = CallbackList([ProgressBar(verbose=0 if quiet else 1)], model, {"epochs": 1, "steps": num_batches(data)})
    if runners is not None:
        logs = RunnerEpochs(model, runners, runtime, callbacks).validate(data)
    else:
        meters = EpochMeters("val", model.metrics_dict, runtime.outputs_device)
        logs = evaluate_epoch(model, data, runtime, meters, callbacks)
    if not quiet:
        model.print(", ".join(f"{k}={v:.4g}" for k, v in logs.items()))
    return logs


def predict(model: TrainableModel, data: Any, batch_size: Optional[int] = None, verbose: int = 1) -> Any:
    """The net's outputs for ``data``, on the CPU, rows in data order (eval mode, no gradients)."""
    data = eval_loader(data, None, batch_size, needs_labels=False)
    # A text bar only for a long prediction (tqdm's delay), gone when done; never in a log, where each
    # redraw would be a line. Text, not a widget, so a short prediction leaves nothing in a notebook.
    shown = bool(verbose) and model.is_main_process and output_style() != "lines"
    batches = text_tqdm(
        data,
        total=num_batches(data),
        desc="Predicting",
        unit="batch",
        delay=PROGRESS_DELAY_S,
        leave=False,
        disable=not shown,
    )
    return predict_outputs(model, batches, runtime_for_net(model.net))


__all__ = ["evaluate", "predict"]
