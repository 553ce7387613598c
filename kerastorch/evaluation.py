"""``evaluate`` and ``predict``: one pass over data with the net where it already is."""

from __future__ import annotations

from typing import Any

from .callbacks.callback_list import CallbackList
from .callbacks.progress import ProgressBar
from .checks import check_loader
from .data import num_batches
from .loop import evaluate_epoch, predict_outputs
from .meters import EpochMeters
from .model_parallel import is_model_parallel, model_parallel_runtime
from .parts import check_loss_fn
from .protocols import TrainableModel
from .runtime import runtime_for_net


def evaluate(model: TrainableModel, data: Any, quiet: bool = False) -> dict[str, float]:
    """Loss and metrics over ``data`` (eval mode, no gradients): ``{"val_loss": ..., "val_<m>": ...}``."""
    check_loader(data, "data")
    check_loss_fn(model)  # type: ignore[arg-type]
    runtime = runtime_for_net(model.net)
    if is_model_parallel(model.net):
        runtime = model_parallel_runtime(model, runtime, data)
    meters = EpochMeters("val", model.metrics_dict, runtime.outputs_device)
    callbacks = CallbackList([ProgressBar(verbose=0 if quiet else 1)], model, {"epochs": 1, "steps": num_batches(data)})
    logs = evaluate_epoch(model, data, runtime, meters, callbacks)
    if not quiet:
        model.print(", ".join(f"{k}={v:.4g}" for k, v in logs.items()))
    return logs


def predict(model: TrainableModel, data: Any) -> Any:
    """The net's outputs for ``data``, on the CPU, rows in data order (eval mode, no gradients)."""
    check_loader(data, "data")
    return predict_outputs(model, data, runtime_for_net(model.net))


__all__ = ["evaluate", "predict"]
