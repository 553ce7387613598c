"""The run's report at the end of ``fit``: what the curves say (:func:`~kerastorch.tools.diagnosis.diagnose`),
with what only the run knows: each epoch's timing, where a NaN loss came from, and the validation
samples also in the training data.

``fit`` keeps the report for ``model.diagnose()`` and prints it (``verbose >= 1``, the main process)
when it has something to say; not after Ctrl-C, where the user stopped the run on purpose.

**Where a NaN came from.** The loop reads the loss only at an epoch's end (and when the progress bar
redraws), never per step, so a healthy run pays nothing for this. When a loss turns NaN or infinite,
:class:`~kerastorch.callbacks.TerminateOnNaN` stops the run at the end of that epoch: by then the
steps after the bad one have made the weights NaN, and the weights from before the bad step are gone
(keeping them would cost a copy of the weights at every step). So, after training, with the finite
weights ``fit`` put back, :func:`replay_divergence` passes over the data once, forward only, in eval
mode and without gradients, and stops at the first batch that gives a NaN or infinite value: its
inputs, its labels, a module's output (forward hooks name the first) or the loss. That finds what
does not need the weights to blow up: NaN in the data, a loss that is infinite on some labels, a
layer that overflows on some inputs. When every batch stays finite, the data and the loss are not to
blame: the updates blew the weights up, and the finding names the first module that held NaN or
infinite weights when the run stopped. The pass reads at most one epoch of batches (``REPLAY_LIMIT``
for data of unknown length), in a run of one process with fit's own training step.

**Validation samples in the training data** are counted for data held in memory, when its inputs
take at most ``OVERLAP_MAX_BYTES`` (256 MiB: MNIST's 70,000 images, 210 MiB, take about 0.45 s on
two CPU cores). Other data is not read again here; ``model.doctor(train_data, val_data)`` compares
the first batches of any data.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Optional

import pandas as pd
import torch

from ..callbacks.terminate_on_nan import TerminateOnNaN
from ..data.batches import split_batch, split_sample_weight
from ..data.overlap import Overlap, count_overlap, memory_rows
from ..data.peek import num_batches, rng_untouched
from ..helpers.modes import eval_mode
from ..helpers.protocols import TrainableModel
from ..settings import FitSettings
from ..strategies import unwrap
from ..training.callback_list import CallbackList
from .diagnosis import LOSS_FUNCTION, NET_ITSELF, Divergence, diagnose
from .report import TIMING_COLUMNS, Diagnosis

OVERLAP_MAX_BYTES = 256 * 2**20
REPLAY_LIMIT = 1000  # batches replayed from data of unknown length


def end_of_fit_report(
    model: TrainableModel,
    history: pd.DataFrame,
    callbacks: CallbackList,
    timing: Optional[list[dict]],
    train_data: Any,
    val_data: Optional[Any],
    settings: FitSettings,
    replay: bool = True,
) -> Diagnosis:
    """The report of the run that just ended, printed when it has something to say.

    ``timing``: the rows the loop measured (None: not measured); ``train_data`` / ``val_data``: the
    data as fit prepared it, before the run's wrappers; ``replay``: the run used fit's own training
    step, so a batch can be replayed through ``forward_batch``.
    """
    runtime = model.runtime
    main = runtime is None or runtime.is_main_process
    alone = runtime is None or runtime.num_processes == 1
    watch = next((cb for cb in callbacks.callbacks if isinstance(cb, TerminateOnNaN) and cb.nan_epoch), None)
    divergence = None
    if watch is not None and main:
        data = train_data if watch.nan_loss == "train_loss" else val_data
        can_replay = replay and alone and model.uses_default_train_step and data is not None
        divergence = replay_divergence(model, data, watch) if can_replay else divergence_noted(watch)
    monitoring = settings.monitoring
    params = callbacks.params
    report = diagnose(
        history,
        pd.DataFrame(timing, columns=list(TIMING_COLUMNS)) if timing is not None else None,
        divergence,
        overlap_in_memory(train_data, val_data) if main else None,
        monitor=monitoring.monitor,
        mode=monitoring.mode,
        restore_best_weights=monitoring.restore_best_weights,
        # The loss before the first step, for a run that began with its first epoch (not resumed).
        start_loss=None if params.get("resumed") else params.get("start_loss"),
    )
    if report.findings and settings.output.verbose and callbacks.params.get("ended") != "interrupted":
        model.print(str(report))
    return report


def overlap_in_memory(train_data: Any, val_data: Optional[Any]) -> Optional[Overlap]:
    """The validation samples also in the training data, for data held in memory and not too big to
    hash at the end of every fit (``OVERLAP_MAX_BYTES``); None otherwise."""
    if val_data is None:
        return None
    train_rows, val_rows = memory_rows(train_data), memory_rows(val_data)
    if train_rows is None or val_rows is None:
        return None
    if sum(rows.numel() * rows.element_size() for rows in (train_rows, val_rows)) > OVERLAP_MAX_BYTES:
        return None
    return count_overlap(train_rows, val_rows)


def divergence_noted(watch: TerminateOnNaN) -> Divergence:
    """What the NaN watch saw when it stopped the run: the epoch, and the first module holding NaN or
    infinite weights then (when it could look)."""
    epoch, broken = watch.nan_epoch, watch.broken_modules
    assert epoch is not None, "asked only of a watch that stopped a run"
    data = "training" if watch.nan_loss == "train_loss" else "validation"
    if broken is None:
        return Divergence(epoch, data=data)
    module = (broken[0] or NET_ITSELF) if broken else None
    return Divergence(epoch, module=module, weights_finite=not broken, data=data)


def replay_divergence(model: TrainableModel, data: Any, watch: TerminateOnNaN) -> Divergence:
    """Pass over ``data`` with the weights the net holds now, forward only, until a batch gives a NaN
    or infinite value (see the module's docstring); what that batch shows, or, when none does, what
    the NaN watch saw."""
    noted = divergence_noted(watch)
    net, runtime = unwrap(model.net), model.runtime
    if not finite([*net.parameters(), *net.buffers()]):  # no finite weights came back (monitor=None, say)
        return noted
    limit = num_batches(data) or REPLAY_LIMIT
    replayed = 0
    try:
        with rng_untouched(data), eval_mode(net, model.loss_fn), torch.no_grad():
            for replayed, batch in enumerate(data, start=1):
                batch = runtime.to_device(batch) if runtime is not None else batch
                inputs_finite, labels_finite = inputs_and_labels_finite(batch, model.labels_at)
                loss = forward(model, batch)[0]
                if inputs_finite is not False and labels_finite is not False and finite(loss):
                    if replayed >= limit:
                        break
                    continue
                module = first_nonfinite_module(model, net, batch)
                return Divergence(
                    noted.epoch, replayed, inputs_finite, module, labels_finite, replayed=replayed, data=noted.data
                )
    except Exception:  # the report must not turn a run that stopped cleanly into an error
        return noted
    return dataclasses.replace(noted, replayed=replayed)


def forward(model: TrainableModel, batch: Any) -> Any:
    runtime = model.runtime
    if runtime is None:
        return model.forward_batch(batch)
    with runtime.autocast():
        return model.forward_batch(batch)


def first_nonfinite_module(model: TrainableModel, net: torch.nn.Module, batch: Any) -> Optional[str]:
    """The batch through ``forward_batch`` again, with a forward hook on every module of ``net``: the
    qualified name of the first whose output holds NaN or infinite values (hooks run as each module
    returns, so a layer is seen before the block around it); else the loss function, if its value does."""
    found: list[str] = []

    def watch(name: str) -> Any:
        def hook(module: torch.nn.Module, args: Any, output: Any) -> None:
            if not found and not finite(output):
                found.append(name or NET_ITSELF)

        return hook

    handles = [module.register_forward_hook(watch(name)) for name, module in net.named_modules()]
    try:
        loss = forward(model, batch)[0]
    finally:
        for handle in handles:
            handle.remove()
    if found:
        return found[0]
    return None if finite(loss) else LOSS_FUNCTION


def inputs_and_labels_finite(batch: Any, labels_at: Any) -> tuple[Optional[bool], Optional[bool]]:
    """Whether the batch's inputs, and its labels, hold only finite values (None: the batch is not
    laid out as fit reads it)."""
    try:
        args, kwargs, labels = split_batch(split_sample_weight(batch)[0], labels_at)
    except Exception:  # a layout of a forward_batch of the user's own
        return None, None
    return finite((args, kwargs)), (None if labels is None else finite(labels))


def finite(value: Any) -> bool:
    """No NaN or infinite value in any floating-point tensor of ``value`` (tensors, tuples, lists,
    dicts and Hugging Face outputs, nested)."""
    if isinstance(value, torch.Tensor):
        return not (value.is_floating_point() or value.is_complex()) or bool(torch.isfinite(value).all())
    if isinstance(value, Mapping):
        return all(finite(v) for v in value.values())
    if isinstance(value, (tuple, list)):
        return all(finite(v) for v in value)
    return True


__all__ = ["OVERLAP_MAX_BYTES", "REPLAY_LIMIT", "end_of_fit_report", "overlap_in_memory", "replay_divergence"]
