"""Epoch values of the loss and the metrics, accumulated on the device.

The training step hands each batch's loss, predictions and labels to
:class:`EpochMeters` and never waits for the device: sums stay tensors, and metric
updates are batched (a few steps' outputs concatenated, one ``update`` of a stateful
metric; a function metric then gets each batch of the group alone), because a
metric update per step costs more than the rest of a small model's step. A Python
float exists only when someone reads: the progress bar when it redraws, and the
loop at epoch end. Each read is one device-to-host copy.

Values are exact over the epoch's samples: the loss is weighted by batch size, never
a mean of batch means.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from typing import Any, Callable, Iterator, Optional, Sequence

import torch

from ..data.batches import detach, inputs_count
from .metric_meters import (
    FunctionMeter,
    MetricCopies,
    StatefulMeter,
    WeightedMeter,
    is_stateful_metric,
    metric_copies_for,
    metric_friendly,
    metric_of,
    stateful_value,
)
from .metric_sync import exact_sum_dtype

# How many steps of outputs are held before the metrics see them, and how many output elements at
# most: a segmentation net's outputs (8 x 21 x 512 x 512 floats, 176 MB a batch) go to the metrics
# batch by batch instead of piling up on the device. Any read flushes earlier. (Between training steps
# on a CPU, a torchmetrics update and the concatenation before it cost about 200 us for 64 steps'
# outputs of a small net, and 400 us for 256 steps': one update per 256 steps makes it one or two per
# epoch of a small dataset.)
FLUSH_EVERY = 256
FLUSH_ELEMENTS = 1 << 22


class EpochMeters:
    """Loss and metrics of one stage (``train`` or ``val``) over one epoch."""

    def __init__(
        self,
        prefix: str,
        metrics_dict: dict,
        device: torch.device,
        reduce_fn: Optional[Callable] = None,
        weighted_metrics: Optional[dict] = None,
        values: Optional[Sequence[str]] = None,
        copies: Optional[MetricCopies] = None,
        labels_at: Any = None,
    ):
        self.prefix = prefix
        self.labels_at = labels_at  # where batches hold their labels: the rest are inputs, which are counted
        # The names a train_step of the user's own returns in a dict, each summed like the loss
        # (None: the usual loss, from (loss, preds, labels)).
        self.values = tuple(values) if values is not None else None
        self.device = device
        self.sum_dtype = exact_sum_dtype(device)
        copies = copies if copies is not None else MetricCopies(device)  # the run's, shared with its checks
        self.meters: dict[str, Any] = {
            name: StatefulMeter(m, copies, reduce_fn)
            if is_stateful_metric(metric_of(m))
            else FunctionMeter(m, device, self.sum_dtype)
            for name, m in metrics_dict.items()
        }
        # Updated at once with each batch's weights (not batched with the others): see update.
        self.weighted = {
            name: WeightedMeter(fn, device, self.sum_dtype) for name, fn in (weighted_metrics or {}).items()
        }
        self.reduce_fn = reduce_fn  # sums a tensor over processes; None in a single process
        self.loss_sum = torch.zeros((), device=device, dtype=self.sum_dtype)
        # The batch losses not yet in loss_sum, with their batch sizes: added FLUSH_EVERY at a time,
        # since a kernel per step costs more than the rest of a step's bookkeeping. Added at the same
        # batches in every run (reads leave them be), so a resumed run adds up to the same last bit.
        self._losses: list[tuple[torch.Tensor, int]] = []
        self.value_sums = {name: torch.zeros((), device=device, dtype=self.sum_dtype) for name in self.values or ()}
        self.count = 0
        self._pending: list[tuple[Any, Any, int]] = []

    @property
    def names(self) -> list[str]:
        summed = ("loss",) if self.values is None else self.values
        return [f"{self.prefix}_{name}" for name in (*summed, *self.meters, *self.weighted)]

    def give_back_copies(self) -> None:
        """The run is over: the metrics' copies go back to the model's (:class:`MetricCopies`)."""
        for meter in self.meters.values():
            if isinstance(meter, StatefulMeter):
                meter.give_back_copy()

    def reset(self) -> None:
        self.loss_sum.zero_()
        self._losses.clear()
        for total in self.value_sums.values():
            total.zero_()
        self.count = 0
        self._pending.clear()
        for meter in (*self.meters.values(), *self.weighted.values()):
            meter.reset()

    def update(
        self, loss: Optional[torch.Tensor], preds: Any, labels: Any, batch: Any, weight: Optional[torch.Tensor] = None
    ) -> None:
        """Add one batch. ``loss`` is the batch mean; ``preds`` may still be part of the graph (they are
        detached here when a metric keeps them); ``batch`` is counted (:func:`samples_in`); ``weight`` the
        samples' weights (for ``weighted_metrics`` only). Nothing here waits for the device."""
        n = samples_in(labels, preds, batch, self.labels_at)
        if loss is not None:
            self._losses.append((loss.detach(), n))
            if len(self._losses) >= FLUSH_EVERY:
                self.loss_sum.add_(_sum_of(self._losses, self.loss_sum))
                self._losses.clear()
        self.count += n
        if not (self.meters or self.weighted):
            return
        preds = preds.detach() if isinstance(preds, torch.Tensor) else detach(preds)  # several outputs: each
        for weighted in self.weighted.values():
            weighted.update_weighted(preds, labels, n, weight)
        if not self.meters:
            return
        self._pending.append((preds, labels, n))
        if len(self._pending) >= FLUSH_EVERY or (
            isinstance(preds, torch.Tensor) and preds.numel() * len(self._pending) >= FLUSH_ELEMENTS
        ):
            self._flush()

    def update_values(self, values: dict, batch: Any) -> None:
        """Add one batch of a ``train_step`` that returns named batch means; nothing here waits for the device."""
        n = inputs_count(batch, self.labels_at)
        if values.keys() != self.value_sums.keys():
            raise ValueError(
                f"train_step returned {', '.join(values)} on this batch but {', '.join(self.value_sums)} on the first; "
                "return the same names on every batch (each a history column)."
            )
        for name, value in values.items():
            total = self.value_sums[name]
            if isinstance(value, torch.Tensor):
                total.add_(value.detach().reshape(()), alpha=n)
            else:
                total.add_(float(value) * n)
        self.count += n

    def _flush(self) -> None:
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        # A function metric is a mean of its batch values (sum of f(batch) * n over N): it gets each batch
        # alone, so its value does not depend on where the groups split (a read, a resumed run's start)
        # and is exact for one that is not a mean over samples (a spread, an F1). A stateful metric adds
        # its own states up, so it gets the group in as few updates as torch.cat allows.
        functions = [meter for meter in self.meters.values() if isinstance(meter, FunctionMeter)]
        stateful = [meter for meter in self.meters.values() if not isinstance(meter, FunctionMeter)]
        if functions:
            for preds, labels, n in pending:
                friendly = metric_friendly(preds)
                for meter in functions:
                    meter.update(friendly, labels, n)
        if stateful:
            for preds, labels, n in _joined(pending):
                preds = metric_friendly(preds)
                for meter in stateful:
                    meter.update(preds, labels, n)

    def state_dict(self) -> dict:
        """This process's partial sums of the epoch so far, for a training state saved mid-epoch: a
        resumed run adds the rest of the epoch to them and reads the same epoch values. The batches
        waiting for the metrics, and the losses waiting for ``loss_sum``, are kept as they are (adding
        them early could change a float sum's last bit)."""
        return {
            "loss_sum": self.loss_sum.clone(),
            "losses": list(self._losses),
            "value_sums": {name: total.clone() for name, total in self.value_sums.items()},
            "count": self.count,
            "pending": list(self._pending),
            "meters": {name: meter.state_dict() for name, meter in self.meters.items()},
            "weighted": {name: meter.state_dict() for name, meter in self.weighted.items()},
        }

    def flush(self) -> None:
        """Hand the waiting batches to the metrics now (before a state that could not hold them is saved)."""
        self._flush()

    def load_state_dict(self, state: dict) -> None:
        """Take back what :meth:`state_dict` returned (the same metrics, on this run's device)."""
        if set(state["meters"]) != set(self.meters) or set(state["weighted"]) != set(self.weighted):
            raise ValueError(
                f"The saved epoch's metrics are {sorted(state['meters'])}, this run's are {sorted(self.meters)}."
            )
        saved_values = state.get("value_sums", {})  # absent from a state written before named values
        if set(saved_values) != set(self.value_sums):
            raise ValueError(
                f"The saved epoch's train_step values are {sorted(saved_values)}, this run's are {sorted(self.value_sums)}."
            )
        self.loss_sum.copy_(state["loss_sum"])
        waiting = state.get("losses", [])  # absent from an older state
        self._losses = [(_to(loss, self.device), n) for loss, n in waiting]
        for name, total in self.value_sums.items():
            total.copy_(saved_values[name])
        self.count = state["count"]
        self._pending = [
            (_to(preds, self.device), _to(labels, self.device), n) for preds, labels, n in state["pending"]
        ]
        for name, meter in (*self.meters.items(), *self.weighted.items()):
            meter.load_state_dict({**state["meters"], **state["weighted"]}[name])

    def loss_total(self) -> torch.Tensor:
        """The sum of the epoch's batch losses so far, each times its batch size (on the device; no read)."""
        return self.loss_sum + _sum_of(self._losses, self.loss_sum) if self._losses else self.loss_sum

    def read(self, synced: bool = True) -> dict[str, float]:
        """The epoch's values so far, as floats: one device-to-host copy.

        ``synced=False`` reads this process's share only (for the progress bar, which
        runs on the main process alone and must not enter a collective).
        """
        self._flush()
        if synced and self.reduce_fn is not None:
            return self._read_synced()
        sums = [self.loss_total()] if self.values is None else list(self.value_sums.values())
        values = [*sums]
        for name, meter in (*self.meters.items(), *self.weighted.items()):
            value = stateful_value(meter, name) if isinstance(meter, StatefulMeter) else meter.value()
            values.append(value.detach().to(self.device, self.sum_dtype))
        floats = torch.stack(values).tolist()
        # The sums' means, taken on the host in float64: what the device would compute, with no kernels
        # (on MPS, whose sums are float32, a little more exactly).
        count = max(self.count, 1)
        return dict(zip(self.names, [*(total / count for total in floats[: len(sums)]), *floats[len(sums) :]]))

    def _read_synced(self) -> dict[str, float]:
        """:meth:`read` over every process: the sums, the counts and the function metrics' totals
        summed in one collective, each stateful metric computed over every process's states."""
        sums = [self.loss_total()] if self.values is None else list(self.value_sums.values())
        count = torch.tensor(float(self.count), device=self.device, dtype=self.sum_dtype)
        function_meters = {k: m for k, m in self.meters.items() if isinstance(m, FunctionMeter)}
        function_meters.update(self.weighted)
        parts = [*sums, count]
        for m in function_meters.values():
            parts += [m.total, m.denominator()]
        summed = self.reduce_fn(torch.stack(parts))  # type: ignore[misc]
        k = len(sums)
        sums, count = list(summed[:k]), summed[k]
        function_values = {
            name: summed[k + 1 + 2 * i] / summed[k + 2 + 2 * i].clamp_min(1e-30)
            for i, name in enumerate(function_meters)
        }
        values = [total / count.clamp_min(1) for total in sums]
        for name, meter in (*self.meters.items(), *self.weighted.items()):
            value = (
                stateful_value(meter, name, synced=True) if isinstance(meter, StatefulMeter) else function_values[name]
            )
            values.append(value.detach().to(self.device, self.sum_dtype))
        floats = torch.stack(values).tolist()
        return dict(zip(self.names, floats))


def meters_for_fit(
    model: Any,
    runtime: Any,
    settings: Any,
    outline: Any = None,
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


def samples_in(labels: Any, preds: Any, batch: Any, labels_at: Any = None) -> int:
    """How many samples a batch holds, which weighs its loss in the epoch's mean: the first dimension of
    the labels, else of the outputs, else of the inputs (a list of images: its length). Labels that
    are a list of a dict per image (a detector's boxes) are not counted by what they hold."""
    for value in (labels, preds):
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return value.shape[0]
    return inputs_count(batch, labels_at)


def _sum_of(losses: list[tuple[torch.Tensor, int]], like: torch.Tensor) -> torch.Tensor:
    """Σ loss·n over the batches, with the dtype and device of ``like``: a stack and a sum per batch
    size (nearly always one: the last batch may be shorter)."""
    by_size: dict[int, list[torch.Tensor]] = {}
    for loss, n in losses:
        by_size.setdefault(n, []).append(loss)
    parts = [torch.stack(same).to(like.device, like.dtype).sum() * n for n, same in by_size.items()]
    return parts[0] if len(parts) == 1 else torch.stack(parts).sum()


def _to(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (list, tuple)):
        return type(value)(_to(v, device) for v in value)
    if isinstance(value, dict):
        return {k: _to(v, device) for k, v in value.items()}
    return value


def _joined(pending: list[tuple[Any, Any, int]]) -> list[tuple[Any, Any, int]]:
    """The waiting batches as few metric updates as ``torch.cat`` allows: all in one (tensors of one
    dtype, equal but for the batch dimension), else each run of such neighbours in one (sequences of
    several lengths). Asked once per group, not at every step."""
    if len(pending) > 1:
        preds, labels = [p for p, _, _ in pending], [y for _, y, _ in pending]
        if _of_one_kind(preds) and _of_one_kind(labels):
            whole = _concatenated(pending, preds, labels)
            if whole is not None:
                return [whole]
    runs: list[list[tuple[Any, Any, int]]] = []
    for item in pending:
        if runs and _can_concatenate(runs[-1][-1], item):
            runs[-1].append(item)
        else:
            runs.append([item])
    joined: list[tuple[Any, Any, int]] = []
    for run in runs:
        whole = _concatenated(run) if len(run) > 1 else None
        joined.extend(run if whole is None else [whole])
    return joined


def _concatenated(
    items: list[tuple[Any, Any, int]], preds: Optional[list] = None, labels: Optional[list] = None
) -> Optional[tuple[Any, Any, int]]:
    """One batch of ``items`` (whose predictions and labels, listed, may be given), or None where
    ``torch.cat`` refuses them (shapes beyond the batch dimension that differ, tensors on several devices)."""
    preds = [p for p, _, _ in items] if preds is None else preds
    labels = [y for _, y, _ in items] if labels is None else labels
    try:
        return torch.cat(preds), torch.cat(labels), sum(n for _, _, n in items)
    except RuntimeError:
        return None


def _of_one_kind(values: list) -> bool:
    """Tensors with a batch dimension, all of one dtype (``torch.cat`` would promote a mix silently)."""
    first = values[0]
    if not (isinstance(first, torch.Tensor) and first.dim() > 0):
        return False
    # Asked of the sets of the values' types and dtypes: 14 us for a group of 256 steps, where a test
    # of each value in turn took 42.
    return (
        all(issubclass(kind, torch.Tensor) for kind in set(map(type, values))) and len(set(map(_dtype_of, values))) == 1
    )


_dtype_of = operator.attrgetter("dtype")


def _can_concatenate(previous: tuple, item: tuple) -> bool:
    (prev_preds, prev_labels, _), (preds, labels, _) = previous, item
    return (
        isinstance(preds, torch.Tensor)
        and isinstance(labels, torch.Tensor)
        and isinstance(prev_preds, torch.Tensor)
        and isinstance(prev_labels, torch.Tensor)
        and preds.dim() > 0
        and labels.dim() > 0
        and preds.shape[1:] == prev_preds.shape[1:]
        and labels.shape[1:] == prev_labels.shape[1:]
        and preds.dtype == prev_preds.dtype
        and labels.dtype == prev_labels.dtype
    )


class StepLogs(Mapping):
    """The running values handed to per-step callbacks, read from the device only if looked at.

    A callback that ignores ``logs`` costs nothing; one that reads ``logs["train_loss"]``
    pays one device-to-host copy for that step.
    """

    def __init__(self, meters: EpochMeters):
        self._meters = meters
        self._values: Optional[dict] = None

    def _read(self) -> dict:
        if self._values is None:
            self._values = self._meters.read(synced=False)
        return self._values

    def __getitem__(self, key: str) -> float:
        return self._read()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._meters.names)

    def __len__(self) -> int:
        return len(self._meters.names)

    def __repr__(self) -> str:
        return f"StepLogs({self._read()!r})"
