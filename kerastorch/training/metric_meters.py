"""One meter per metric, and the copies of its metrics a model keeps.

A torchmetrics ``Metric`` (or any object with ``compute`` and ``reset``, torchkeras's pattern) is
updated on a copy of its own (:class:`MetricCopies`: the user's metric stays untouched); a plain
function ``f(preds, labels)`` is averaged over the samples; a ``weighted_metrics`` function over the
sample weights. :class:`~kerastorch.training.meters.EpochMeters` holds one of these per metric.

A net whose outputs and labels are dicts may have a metric per output (Keras's per-output metrics):
``metrics_dict={"cls": {"acc": Accuracy(...)}}``, or a torchmetrics ``MultitaskWrapper``. Each such
metric is an :class:`OutputMetric`, named ``<output>_<name>`` (the history's ``val_cls_acc``), and
gets the output's values alone.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from typing import Any, Callable, Iterable, Optional

import torch

from .metric_sync import compute_metric, prepare_metric_for_processes


def is_stateful_metric(metric: Any) -> bool:
    """torchmetrics ``Metric`` or any object with ``compute`` and ``reset`` (torchkeras's pattern)."""
    return callable(getattr(metric, "compute", None)) and callable(getattr(metric, "reset", None))


# Names a metric cannot take: the history's own columns ("loss" would become train_loss / val_loss).
RESERVED_NAMES = ("loss", "lr", "epoch")


class OutputMetric:
    """A metric of one output of a net whose outputs and labels are dicts: it gets ``preds[output]`` and
    ``labels[output]`` (Keras's per-output metrics). :func:`check_metrics` makes them."""

    def __init__(self, output: str, metric: Any):
        self.output = output
        self.metric = metric

    @property
    def higher_is_better(self) -> Optional[bool]:  # the metric's own (torchmetrics), for mode="auto"
        return getattr(self.metric, "higher_is_better", None)

    def pick(self, preds: Any, labels: Any) -> tuple[Any, Any]:
        """This output's predictions and labels."""
        for what, value in (("outputs", preds), ("labels", labels)):
            if not (isinstance(value, Mapping) and self.output in value):
                held = f"a dict with keys {', '.join(map(repr, value))}" if isinstance(value, Mapping) else "no dict"
                raise ValueError(
                    f"this metric is for the output {self.output!r}, but the batch's {what} are {held}. A metric per "
                    f"output needs a net that returns a dict and labels in a dict, both with the key {self.output!r}."
                )
        return preds[self.output], labels[self.output]


def metric_of(metric: Any) -> Any:
    """The user's metric itself (the one inside an :class:`OutputMetric`)."""
    return metric.metric if isinstance(metric, OutputMetric) else metric


def check_metrics(metrics_dict: Optional[Mapping]) -> dict:
    """The metrics by column name, each checked (a metric that cannot be called is refused, naming its
    key). A metric per output, ``{"cls": {"acc": m}}`` or ``{"acc": MultitaskWrapper({"cls": m})}``, is
    named ``cls_acc`` (an :class:`OutputMetric`)."""
    if metrics_dict is not None and not isinstance(metrics_dict, Mapping):
        raise TypeError(
            f"metrics_dict is a {type(metrics_dict).__name__}, but it must be a dict of name -> metric, "
            "e.g. {'acc': torchmetrics.Accuracy(task='multiclass', num_classes=10)}."
        )
    checked: dict = {}
    for name, metric in (metrics_dict or {}).items():
        where = f"metrics_dict[{name!r}]"
        _check_name(name, where)
        # (where, the output it reads or None for the whole outputs, the output's key or metric's name, column, metric)
        if isinstance(metric, Mapping):  # Keras's per-output form: {output: {name: metric}}
            entries = [(f"{where}[{k!r}]", name, k, f"{name}_{k}", m) for k, m in metric.items()]
        elif type(metric).__name__ == "MultitaskWrapper":  # torchmetrics' metric per task: {task: metric}
            tasks = metric.task_metrics.items()
            entries = [(f"{where}'s task {k!r}", k, k, f"{k}_{name}", m) for k, m in tasks]
        else:
            entries = [(where, None, name, name, metric)]
        for place, output, key, column, m in entries:
            _check_name(key, place)
            _check_metric(column, m, place)
            if column in checked:
                raise ValueError(f"{place} makes the column {column!r} twice; give one of the metrics another name.")
            checked[column] = m if output is None else OutputMetric(output, m)
    return checked


def _check_name(name: Any, where: str, column: bool = False) -> None:
    if not isinstance(name, str) or not name:
        raise TypeError(f"{where}: metrics_dict keys must be non-empty strings like 'acc'; got {name!r}.")
    if column and (name in RESERVED_NAMES or name.startswith(("train_", "val_"))):
        raise ValueError(
            f"{where}: the history already has columns named after it ({name!r} would become "
            f"'train_{name}' and 'val_{name}', or clash with 'epoch', 'lr', 'train_loss', 'val_loss'), and the "
            f"best weights would follow the wrong one. Name it otherwise, e.g. 'my_{name.split('_', 1)[-1]}'."
        )


def _check_metric(name: str, metric: Any, where: str) -> None:
    _check_name(name, where, column=True)
    if isinstance(metric, type):
        raise TypeError(
            f"{where} is the class {metric.__name__}, not a metric. Build one: "
            f"{metric.__name__}(...) (note the brackets), e.g. torchmetrics.Accuracy(task='multiclass', "
            "num_classes=10)."
        )
    if type(metric).__name__ == "MetricCollection":
        raise TypeError(
            f"{where} is a torchmetrics MetricCollection, which computes a dict; the history holds "
            "one number per column. Put its metrics in metrics_dict one by one: "
            "metrics_dict={'acc': Accuracy(...), 'f1': F1Score(...)}."
        )
    if isinstance(metric, Mapping):
        raise TypeError(
            f"{where} is a dict again; a metric per output takes one level: "
            "metrics_dict={'cls': {'acc': Accuracy(...)}, 'reg': {'mae': MeanAbsoluteError()}}."
        )
    if not callable(metric):
        raise TypeError(
            f"{where} is a {type(metric).__name__}, which cannot be called. A metric is a "
            "torchmetrics Metric (e.g. torchmetrics.Accuracy(task='multiclass', num_classes=10)), a module "
            "with forward/compute/reset, or a function f(preds, labels) -> tensor."
        )


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
            "metric. Put each of its values in metrics_dict as a metric of its own. For a metric per output of a "
            "net that returns a dict, name the output: metrics_dict={'cls': {'acc': Accuracy(...)}}."
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
    copies.keep_only(metric_of(metric) for metric in model.metrics_dict.values())
    return copies


class StatefulMeter:
    """A metric that keeps its own state: updated with batches, read with ``compute``."""

    def __init__(self, metric: Any, copies: MetricCopies, reduce_fn: Optional[Callable] = None):
        self.output = metric if isinstance(metric, OutputMetric) else None  # a metric of one output
        metric = metric_of(metric)
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
        if self.output is not None:
            preds, labels = self.output.pick(preds, labels)
            preds = metric_friendly(preds)
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


class FunctionMeter:
    """A plain ``f(preds, labels) -> tensor``, averaged over samples."""

    def __init__(self, fn: Callable, device: torch.device, sum_dtype: torch.dtype):
        self.output = fn if isinstance(fn, OutputMetric) else None  # a metric of one output
        self.fn = metric_of(fn)
        self.total = torch.zeros((), device=device, dtype=sum_dtype)
        self.count = 0
        self.seen = False

    def update(self, preds: Any, labels: Any, n: int) -> None:
        if self.output is not None:
            preds, labels = self.output.pick(preds, labels)
            preds = metric_friendly(preds)
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


class WeightedMeter(FunctionMeter):
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


def stateful_value(meter: StatefulMeter, name: str, synced: bool = False) -> torch.Tensor:
    synced = synced and meter.reduce_fn is not None
    if not meter.seen and not synced:  # a synced read is a collective: every process takes part
        return torch.tensor(math.nan)
    return scalar_metric_value(meter.value(synced), name)


def metric_friendly(preds: Any) -> Any:
    # Half-precision outputs (16/bf16 mixed or true) go to metrics as float32, which all accept.
    if isinstance(preds, torch.Tensor) and preds.dtype in (torch.float16, torch.bfloat16):
        return preds.float()
    return preds
