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

import copy
import math
import operator
from collections.abc import Mapping
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

import torch

from ..data.batches import detach
from .metric_sync import compute_metric, exact_sum_dtype, prepare_metric_for_processes

# How many steps of outputs are held before the metrics see them, and how many output elements at
# most: a segmentation net's outputs (8 x 21 x 512 x 512 floats, 176 MB a batch) go to the metrics
# batch by batch instead of piling up on the device. Any read flushes earlier. (Between training steps
# on a CPU, a torchmetrics update and the concatenation before it cost about 200 us for 64 steps'
# outputs of a small net, and 400 us for 256 steps': one update per 256 steps makes it one or two per
# epoch of a small dataset.)
FLUSH_EVERY = 256
FLUSH_ELEMENTS = 1 << 22


def is_stateful_metric(metric: Any) -> bool:
    """torchmetrics ``Metric`` or any object with ``compute`` and ``reset`` (torchkeras's pattern)."""
    return callable(getattr(metric, "compute", None)) and callable(getattr(metric, "reset", None))


# Names a metric cannot take: the history's own columns ("loss" would become train_loss / val_loss).
RESERVED_NAMES = ("loss", "lr", "epoch")


def check_metrics(metrics_dict: Optional[dict]) -> dict:
    """Refuse a metric that cannot be called, naming its key."""
    if metrics_dict is not None and not isinstance(metrics_dict, Mapping):
        raise TypeError(
            f"metrics_dict is a {type(metrics_dict).__name__}, but it must be a dict of name -> metric, "
            "e.g. {'acc': torchmetrics.Accuracy(task='multiclass', num_classes=10)}."
        )
    metrics_dict = dict(metrics_dict or {})
    for name, metric in metrics_dict.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"metrics_dict keys must be non-empty strings like 'acc'; got {name!r}.")
        if name in RESERVED_NAMES or name.startswith(("train_", "val_")):
            raise ValueError(
                f"metrics_dict[{name!r}]: the history already has columns named after it ({name!r} would become "
                f"'train_{name}' and 'val_{name}', or clash with 'epoch', 'lr', 'train_loss', 'val_loss'), and the "
                f"best weights would follow the wrong one. Name it otherwise, e.g. 'my_{name.split('_', 1)[-1]}'."
            )
        if isinstance(metric, type):
            raise TypeError(
                f"metrics_dict[{name!r}] is the class {metric.__name__}, not a metric. Build one: "
                f"{metric.__name__}(...) (note the brackets), e.g. torchmetrics.Accuracy(task='multiclass', "
                "num_classes=10)."
            )
        if type(metric).__name__ == "MetricCollection":
            raise TypeError(
                f"metrics_dict[{name!r}] is a torchmetrics MetricCollection, which computes a dict; the history holds "
                "one number per column. Put its metrics in metrics_dict one by one: "
                "metrics_dict={'acc': Accuracy(...), 'f1': F1Score(...)}."
            )
        if not callable(metric):
            raise TypeError(
                f"metrics_dict[{name!r}] is a {type(metric).__name__}, which cannot be called. A metric is a "
                "torchmetrics Metric (e.g. torchmetrics.Accuracy(task='multiclass', num_classes=10)), a module "
                "with forward/compute/reset, or a function f(preds, labels) -> tensor."
            )
    return metrics_dict


def metric_update_fn(metric: Any) -> Callable:
    """The call that feeds a stateful metric one batch: its ``update``, else the metric itself.

    torchmetrics and most hand-written metrics have ``update``; torchkeras's metric
    modules update in ``forward``.
    """
    return getattr(metric, "update", None) or metric


def scalar_metric_value(value: Any, name: str) -> torch.Tensor:
    """``value`` as a 0-d tensor, or an error naming the metric: a history holds one number per metric."""
    if isinstance(value, Mapping):
        raise ValueError(
            f"Metric {name!r} computed a dict ({', '.join(map(str, value))}); the history holds one number per "
            "metric. Put each of its values in metrics_dict as a metric of its own."
        )
    value = torch.as_tensor(value)
    if value.numel() != 1:
        raise ValueError(
            f"Metric {name!r} computed a tensor of shape {tuple(value.shape)}; the history holds one number per "
            "metric. Use a metric that returns a scalar (e.g. average='macro' in torchmetrics)."
        )
    return value.reshape(())


class MetricCopies:
    """A model's copies of its stateful metrics on one device: the first-batch checks try a metric on
    one, and each meter keeps one.

    A deep copy of a torchmetrics metric costs about half a millisecond, more than the rest of the
    metric work of a one-batch fit. So a copy is made once and used again: one its taker is done
    with comes back reset (a check's at once, a meter's when its run ends) and the next taker gets
    it. The model keeps its copies between runs (:func:`metric_copies_for`), as Keras keeps a
    compiled model's metrics and resets them at each fit: a model's first fit makes two copies of
    each metric, its later fits none.
    """

    def __init__(self, device: torch.device):
        self.device = device
        # id(metric) -> (the metric, its copies that nobody holds, reset). The metric is held so that
        # its id cannot be taken by a new object, whose copies these are not.
        self._spare: dict[int, tuple[Any, list]] = {}
        # id(metric) -> (the metric, the kinds of outputs a copy of it computed one number from: see
        # outputs_kind). A check need not compute it again on outputs of a kind it already did.
        self._scalar_on: dict[int, tuple[Any, set]] = {}

    def take(self, metric: Any) -> Any:
        spare = self._spare.get(id(metric))
        if spare is not None and spare[0] is metric and spare[1]:
            return spare[1].pop()
        copied = copy.deepcopy(metric)
        if isinstance(copied, torch.nn.Module):
            copied.to(self.device)
        copied.reset()  # the user's metric may hold updates of their own
        return copied

    def give_back(self, metric: Any, copied: Any) -> None:
        """``copied`` (taken for ``metric``) is of no more use to its taker: reset, another may take it."""
        copied.reset()
        spare = self._spare.get(id(metric))
        if spare is None or spare[0] is not metric:
            spare = self._spare[id(metric)] = (metric, [])
        spare[1].append(copied)

    def computed_one_number(self, metric: Any, kind: Optional[tuple]) -> bool:
        """Whether a copy of ``metric`` computed one number from outputs of this ``kind``
        (:func:`outputs_kind`; None, a kind never known, never did)."""
        seen = self._scalar_on.get(id(metric))
        return kind is not None and seen is not None and seen[0] is metric and kind in seen[1]

    def note_one_number(self, metric: Any, kind: Optional[tuple]) -> None:
        """A copy of ``metric`` computed one number from outputs of this ``kind``."""
        if kind is None:
            return
        seen = self._scalar_on.get(id(metric))
        if seen is None or seen[0] is not metric:
            seen = self._scalar_on[id(metric)] = (metric, set())
        seen[1].add(kind)

    def keep_only(self, metrics: Iterable[Any]) -> None:
        """Drop the copies of metrics not among ``metrics`` (a model whose metrics_dict was replaced)."""
        wanted = {id(metric) for metric in metrics}
        for kept in (self._spare, self._scalar_on):
            for key in [key for key in kept if key not in wanted]:
                del kept[key]


def outputs_kind(preds: Any, labels: Any) -> Optional[tuple]:
    """What decides the shape of a metric's value, besides the metric: the dtypes of the outputs and
    the labels and their shapes past the batch dimension. None for anything but two tensors."""
    if not (isinstance(preds, torch.Tensor) and isinstance(labels, torch.Tensor)):
        return None
    return preds.dtype, preds.shape[1:], labels.dtype, labels.shape[1:]


def metric_copies_for(model: Any, device: torch.device) -> MetricCopies:
    """The copies ``model`` keeps of its metrics on ``device`` (see :class:`MetricCopies`)."""
    kept: Optional[dict] = getattr(model, "_metric_copies", None)
    if kept is None:
        kept = {}
        model._metric_copies = kept
    copies = kept.get(device)
    if copies is None:
        copies = kept[device] = MetricCopies(device)
    copies.keep_only(model.metrics_dict.values())
    return copies


class _StatefulMeter:
    """A metric that keeps its own state: updated with batches, read with ``compute``."""

    def __init__(self, metric: Any, copies: MetricCopies, reduce_fn: Optional[Callable] = None):
        self.source = metric  # the user's metric: the meter updates a copy of its own
        self.copies = copies
        self._metric: Any = None  # the copy, taken when first used (see MetricCopies)
        self.seen = False
        self.device = copies.device
        self.reduce_fn = reduce_fn  # set in a k-process run: a synced read combines every process's states

    @property
    def metric(self) -> Any:
        if self._metric is None:
            self._metric = self.copies.take(self.source)
            if self.reduce_fn is not None:
                prepare_metric_for_processes(self._metric)
        return self._metric

    def update(self, preds: Any, labels: Any, n: int) -> None:
        metric_update_fn(self.metric)(preds, labels)
        self.seen = True

    def value(self, synced: bool = False) -> torch.Tensor:
        reduce_fn = self.reduce_fn if synced else None
        return torch.as_tensor(compute_metric(self.metric, reduce_fn, self.device))

    def reset(self) -> None:
        if self._metric is not None:  # a copy not yet taken comes reset
            self._metric.reset()
        self.seen = False

    def give_back_copy(self) -> None:
        """The run is over: the copy goes back, reset, for the model's next run."""
        if self._metric is not None:
            self.copies.give_back(self.source, self._metric)
            self._metric = None
            self.seen = False

    def state_dict(self) -> dict:
        """The metric's states so far: its parameters and buffers, and every attribute that holds a
        tensor, a list of tensors or a number (a torchmetrics Metric's states are such attributes)."""
        metric = self.metric
        return {
            "module": metric.state_dict() if isinstance(metric, torch.nn.Module) else {},
            "attributes": {name: value for name, value in vars(metric).items() if _is_state_value(value)},
            "seen": self.seen,
        }

    def load_state_dict(self, state: dict) -> None:
        metric = self.metric
        if isinstance(metric, torch.nn.Module) and state["module"]:
            metric.load_state_dict(state["module"])
        for name, value in state["attributes"].items():
            if isinstance(value, torch.Tensor):
                value = value.to(self.device)
            elif isinstance(value, list):
                value = [v.to(self.device) for v in value]
            setattr(metric, name, value)
        self.seen = state["seen"]


def _is_state_value(value: Any) -> bool:
    if isinstance(value, list):
        return all(isinstance(v, torch.Tensor) for v in value)
    return isinstance(value, (torch.Tensor, bool, int, float)) or value is None


class _FunctionMeter:
    """A plain ``f(preds, labels) -> tensor``, averaged over samples."""

    def __init__(self, fn: Callable, device: torch.device, sum_dtype: torch.dtype):
        self.fn = fn
        self.total = torch.zeros((), device=device, dtype=sum_dtype)
        self.count = 0
        self.seen = False

    def update(self, preds: Any, labels: Any, n: int) -> None:
        value = torch.as_tensor(self.fn(preds, labels))
        self.total += value.detach().to(self.total.device, self.total.dtype) * n
        self.count += n
        self.seen = True

    def value(self) -> torch.Tensor:
        return self.total / max(self.count, 1)

    def denominator(self) -> torch.Tensor:
        return torch.tensor(float(self.count), device=self.total.device, dtype=self.total.dtype)

    def reset(self) -> None:
        self.total.zero_()
        self.count = 0
        self.seen = False

    def state_dict(self) -> dict:
        return {"total": self.total.clone(), "count": self.count, "seen": self.seen}

    def load_state_dict(self, state: dict) -> None:
        self.total.copy_(state["total"])
        self.count, self.seen = state["count"], state["seen"]


class _WeightedMeter(_FunctionMeter):
    """A ``weighted_metrics`` function: ``sum_i w_i * m_i / sum_i w_i`` over the epoch's samples, with
    ``m_i`` the function's value per sample (or its batch value for every sample of the batch)."""

    def __init__(self, fn: Callable, device: torch.device, sum_dtype: torch.dtype):
        super().__init__(fn, device, sum_dtype)
        self.weight_total = torch.zeros((), device=device, dtype=sum_dtype)

    def update_weighted(self, preds: Any, labels: Any, n: int, weight: Optional[torch.Tensor]) -> None:
        value = (
            torch.as_tensor(self.fn(metric_friendly(preds), labels)).detach().to(self.total.device, self.total.dtype)
        )
        weight = (
            torch.ones(n, device=self.total.device, dtype=self.total.dtype)
            if weight is None
            else weight.detach().reshape(-1).to(self.total.device, self.total.dtype)
        )
        self.total += (value.reshape(-1) * weight).sum() if value.numel() == n else value.reshape(()) * weight.sum()
        self.weight_total += weight.sum()
        self.count += n
        self.seen = True

    def value(self) -> torch.Tensor:
        return self.total / self.weight_total.clamp_min(1e-30)

    def denominator(self) -> torch.Tensor:
        return self.weight_total

    def reset(self) -> None:
        super().reset()
        self.weight_total.zero_()

    def state_dict(self) -> dict:
        return {**super().state_dict(), "weight_total": self.weight_total.clone()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.weight_total.copy_(state["weight_total"])


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
    ):
        self.prefix = prefix
        # The names a train_step of the user's own returns in a dict, each summed like the loss
        # (None: the usual loss, from (loss, preds, labels)).
        self.values = tuple(values) if values is not None else None
        self.device = device
        self.sum_dtype = exact_sum_dtype(device)
        copies = copies if copies is not None else MetricCopies(device)  # the run's, shared with its checks
        self.meters: dict[str, Any] = {
            name: _StatefulMeter(m, copies, reduce_fn)
            if is_stateful_metric(m)
            else _FunctionMeter(m, device, self.sum_dtype)
            for name, m in metrics_dict.items()
        }
        # Updated at once with each batch's weights (not batched with the others): see update.
        self.weighted = {
            name: _WeightedMeter(fn, device, self.sum_dtype) for name, fn in (weighted_metrics or {}).items()
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
        self._adopted: set[str] = set()  # metrics whose copy holds the next batch already (see adopt)

    @property
    def names(self) -> list[str]:
        summed = ("loss",) if self.values is None else self.values
        return [f"{self.prefix}_{name}" for name in (*summed, *self.meters, *self.weighted)]

    def give_back_copies(self) -> None:
        """The run is over: the metrics' copies go back to the model's (:class:`MetricCopies`)."""
        for meter in self.meters.values():
            if isinstance(meter, _StatefulMeter):
                meter.give_back_copy()

    def adopt(self, name: str, copied: Any) -> bool:
        """Keep ``copied``, a copy of metric ``name`` that the first-batch check updated with the batch
        this meter is about to get, as that metric's: the batch is not fed to it twice, and the check's
        update is not made twice. Only at the start of an epoch that holds nothing yet (not in a
        resumed one); False when not kept."""
        meter = self.meters.get(name)
        if not isinstance(meter, _StatefulMeter) or meter._metric is not None or self.count or self._pending:
            return False
        meter._metric, meter.seen = copied, True
        if meter.reduce_fn is not None:
            prepare_metric_for_processes(copied)
        self._adopted.add(name)
        return True

    def reset(self) -> None:
        self._adopted.clear()
        self.loss_sum.zero_()
        self._losses.clear()
        for total in self.value_sums.values():
            total.zero_()
        self.count = 0
        self._pending.clear()
        for meter in (*self.meters.values(), *self.weighted.values()):
            meter.reset()

    def update(
        self, loss: Optional[torch.Tensor], preds: Any, labels: Any, n: int, weight: Optional[torch.Tensor] = None
    ) -> None:
        """Add one batch. ``loss`` is the batch mean; ``preds`` may still be part of the graph (they are
        detached here when a metric keeps them); ``weight`` the samples' weights (for ``weighted_metrics``
        only). Nothing here waits for the device."""
        if loss is not None:
            self._losses.append((loss.detach(), n))
            if len(self._losses) >= FLUSH_EVERY:
                self.loss_sum.add_(_sum_of(self._losses, self.loss_sum))
                self._losses.clear()
        self.count += n
        if not (self.meters or self.weighted):
            return
        preds = detach(preds)
        for weighted in self.weighted.values():
            weighted.update_weighted(preds, labels, n, weight)
        if not self.meters:
            return
        if self._adopted:  # the first batch, which the check's copies of these metrics hold already
            adopted, self._adopted = self._adopted, set()
            friendly = metric_friendly(preds)
            for name, meter in self.meters.items():
                if name not in adopted:
                    meter.update(friendly, labels, n)
            return
        self._pending.append((preds, labels, n))
        if len(self._pending) >= FLUSH_EVERY or (
            isinstance(preds, torch.Tensor) and preds.numel() * len(self._pending) >= FLUSH_ELEMENTS
        ):
            self._flush()

    def update_values(self, values: dict, n: int) -> None:
        """Add one batch of a ``train_step`` that returns named batch means; nothing here waits for the device."""
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
        functions = [meter for meter in self.meters.values() if isinstance(meter, _FunctionMeter)]
        stateful = [meter for meter in self.meters.values() if not isinstance(meter, _FunctionMeter)]
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
            value = _stateful_value(meter, name) if isinstance(meter, _StatefulMeter) else meter.value()
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
        function_meters = {k: m for k, m in self.meters.items() if isinstance(m, _FunctionMeter)}
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
                _stateful_value(meter, name, synced=True)
                if isinstance(meter, _StatefulMeter)
                else function_values[name]
            )
            values.append(value.detach().to(self.device, self.sum_dtype))
        floats = torch.stack(values).tolist()
        return dict(zip(self.names, floats))


def _sum_of(losses: list[tuple[torch.Tensor, int]], like: torch.Tensor) -> torch.Tensor:
    """Σ loss·n over the batches, with the dtype and device of ``like``: a stack and a sum per batch
    size (nearly always one: the last batch may be shorter)."""
    by_size: dict[int, list[torch.Tensor]] = {}
    for loss, n in losses:
        by_size.setdefault(n, []).append(loss)
    parts = [torch.stack(same).to(like.device, like.dtype).sum() * n for n, same in by_size.items()]
    return parts[0] if len(parts) == 1 else torch.stack(parts).sum()


def _stateful_value(meter: _StatefulMeter, name: str, synced: bool = False) -> torch.Tensor:
    synced = synced and meter.reduce_fn is not None
    if not meter.seen and not synced:  # a synced read is a collective: every process takes part
        return torch.tensor(math.nan)
    return scalar_metric_value(meter.value(synced), name)


def _to(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (list, tuple)):
        return type(value)(_to(v, device) for v in value)
    if isinstance(value, dict):
        return {k: _to(v, device) for k, v in value.items()}
    return value


def metric_friendly(preds: Any) -> Any:
    # Half-precision outputs (16/bf16 mixed or true) go to metrics as float32, which all accept.
    if isinstance(preds, torch.Tensor) and preds.dtype in (torch.float16, torch.bfloat16):
        return preds.float()
    return preds


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
