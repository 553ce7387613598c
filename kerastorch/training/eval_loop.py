"""The loops of ``evaluate`` and ``predict`` (and fit's validation): one pass over data in eval mode,
without gradients: :func:`evaluate_epoch` sums the loss and the metrics, :func:`predict_outputs` joins
the net's outputs in data order."""

from __future__ import annotations

from typing import Any, Optional

import torch

from ..data.batches import OutputRows, split_sample_weight, to_host
from ..devices.runtime import Runtime
from ..helpers.modes import eval_mode
from ..helpers.protocols import TrainableModel
from .callback_list import CallbackList
from .meters import EpochMeters, StepLogs
from .out_of_memory import EvalPieces

PROGRESS_DELAY_S = 2.0  # predict shows a bar once it has taken this long


@torch.no_grad()
def evaluate_epoch(
    model: TrainableModel,
    loader: Any,
    runtime: Runtime,
    meters: EpochMeters,
    callbacks: CallbackList,
    pieces: Optional[EvalPieces] = None,
) -> dict[str, float]:
    """The loss and the metrics over ``loader``. A batch that runs out of memory is evaluated in pieces
    (``pieces``: fit's, kept for the run's validations; by default, this pass's)."""
    if pieces is None:
        pieces = EvalPieces("evaluate", model, runtime, model.print if callbacks.params.get("verbose", 1) else None)
    with eval_mode(model.net, model.loss_fn):  # also after Ctrl-C or an error: back to the modes they were in
        meters.reset()
        callbacks.call("on_test_begin", {})
        on_begin, on_end = callbacks.wants("on_test_batch_begin"), callbacks.wants("on_test_batch_end")
        for batch_index, batch in enumerate(loader):
            if on_begin:
                callbacks.call("on_test_batch_begin", batch_index, {})
            batch = runtime.to_device(batch)
            loss, preds, labels = pieces.forward(model.forward_batch, batch)
            weight = split_sample_weight(batch)[1] if meters.weighted else None
            meters.update(loss, preds, labels, batch, weight)
            if on_end:
                callbacks.call("on_test_batch_end", batch_index, StepLogs(meters))
        if meters.count == 0 and runtime.num_processes == 1:  # a process may get no share of a short loader
            raise ValueError("The validation data produced no batches. Pass a non-empty DataLoader or val_data=None.")
        logs = meters.read()
        callbacks.call("on_test_end", logs)
    return logs


@torch.no_grad()
def predict_outputs(
    model: TrainableModel,
    loader: Any,
    runtime: Runtime,
    callbacks: Optional[CallbackList] = None,
    *,
    held: str = "batches",
    concatenate: bool = True,
) -> Any:
    """The net's outputs for every batch, on the CPU, in data order: concatenated into one structure
    (stacked where ``held`` is ``"samples"``: each batch is one sample, see
    :func:`~kerastorch.data.loaders.what_batches_hold`), or with ``concatenate=False`` a list of each
    batch's outputs. ``callbacks`` get Keras's predict hooks (``on_predict_batch_end``'s logs
    hold the batch's ``outputs``). A batch that runs out of memory is predicted in pieces, and so are
    the batches after it."""
    rows = OutputRows(held)
    listed = []
    callbacks = callbacks if callbacks is not None else CallbackList([], model, {})
    on_begin, on_end = callbacks.wants("on_predict_batch_begin"), callbacks.wants("on_predict_batch_end")
    say = model.print if callbacks.params.get("verbose", 1) else None
    pieces = EvalPieces("predict", model, runtime, say, one_sample=held == "samples")
    with eval_mode(model.net):
        callbacks.call("on_predict_begin", {})
        for batch_index, batch in enumerate(loader):
            if on_begin:
                callbacks.call("on_predict_batch_begin", batch_index, {})
            batch = runtime.to_device(batch)
            batch_outputs = pieces.forward(model.predict_batch, batch)
            if concatenate:
                rows.append(to_host(batch_outputs), batch)  # refuses, at this batch, outputs that cannot join
            else:
                listed.append(to_host(batch_outputs))
            if on_end:
                callbacks.call("on_predict_batch_end", batch_index, {"outputs": batch_outputs})
        callbacks.call("on_predict_end", {})
    if not (rows.batches or listed):
        raise ValueError("predict got no batches: the data is empty.")
    return rows.concatenated() if concatenate else listed


class _NoPreemption:
    requested = False


__all__ = ["evaluate_epoch", "predict_outputs"]
