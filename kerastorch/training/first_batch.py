"""The first batch, run through the net, the loss and copies of the metrics before the first weight
changes: a wrong batch layout, a net/loss mismatch or a metric that does not fit the outputs
fails now, with a message that names the part that failed (the batch, a module of the net, the
loss), says how kerastorch read the batch and what to fix, not after an epoch of training.

The checks run once, after ``on_train_begin`` and before the first epoch
(:func:`check_first_batches`), on the first batch of the training and the validation data,
fetched with the data order left as it was. A ``train_step`` of the user's own is tried as it is
(:func:`try_own_step`) before the callbacks begin: once, on the first batch, inside a snapshot of
everything a step changes, so nothing has changed afterwards; what it returns tells the history's
columns before the first epoch (:class:`StepOutline`).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import difflib
from typing import Any, Iterator, NamedTuple, Optional

import torch

from ..data.batches import BatchError, describe_batch, on_fewer_samples
from ..data.peek import first_batch
from ..helpers.modes import eval_mode, train_mode
from ..settings import MonitorSettings
from ..strategies import unwrap
from .callback import logs_added_by
from .callback_list import CallbackList
from .compiling import eager_net
from .first_batch_hints import broadcast_mismatch, first_batch_hint
from .history import history_columns
from .loop import FitStep
from .metric_meters import (
    MetricCopies,
    OutputMetric,
    is_stateful_metric,
    metric_copies_for,
    metric_friendly,
    metric_update_fn,
    outputs_kind,
    scalar_metric_value,
)
from .metric_sync import is_torchmetrics
from .outputs import NoLossError
from .snapshot import model_attributes, training_snapshot


def check_first_batches(
    model: Any, train_data: Any, val_data: Optional[Any], runtime: Any, names: Any
) -> Optional[float]:
    """Before the first epoch (and after ``on_train_begin``, whose changes to the data count): the first
    batch of the training data, then of the validation data, through the net, the loss and copies of
    the metrics (:func:`check_batch`). The data order and every random generator are left as they
    were (:func:`~kerastorch.data.peek.first_batch`). A ``train_step`` of the user's own was tried
    already (:func:`try_own_step`): its training batch is not checked again here.

    Every process checks the same batches (the data before each takes its share), so a check fails
    on all of them or on none. A compiled net is checked as the module it compiles.

    Returns the loss of the first training batch before any step (None with a ``train_step`` of the
    user's own): the run's report compares the first epoch's loss with it."""
    start_loss = None
    with eager_net(model):
        if model.uses_default_train_step:
            start_loss = check_batch(model, first_batch(train_data, names.train_name), runtime, names.train_name)
        if val_data is not None:
            check_batch(model, first_batch(val_data, names.val_name), runtime, names.val_name)
    return start_loss


def check_batch(model: Any, batch: Any, runtime: Any, name: str) -> float:
    """Run ``batch`` through the net, the loss and copies of the metrics, in eval mode and without
    gradients, so a wrong batch layout, a net/loss mismatch or a metric that does not fit the
    outputs fails before any weight changes, naming the part that failed (:class:`Culprit`).
    ``name`` is what the user called the data. Returns the batch's loss."""
    batch = runtime.to_device(batch)
    culprit = Culprit(model.net)

    def forward(batch: Any) -> tuple:
        try:
            with eval_mode(model.net, model.loss_fn), torch.no_grad(), culprit.watching(), runtime.autocast():
                return model.forward_batch(batch)
        except torch.OutOfMemoryError:
            runtime.strategy.forward_failed(model.net)  # the next pass exchanges what the other processes' does
            raise

    try:
        loss, preds, labels = on_fewer_samples(forward, batch, model.labels_at)  # out of memory: checks fewer samples
    except (BatchError, NoLossError):
        raise
    except Exception as error:
        raise _wrapped(error, name, culprit.part(model), first_batch_hint(model, batch, error, culprit)) from error
    check_first_outputs(model, loss, preds, labels, runtime, name)
    return float(loss)


class Culprit:
    """Which part of a batch's forward pass raised: reading the batch, a module of the net (by its
    name in the net), the net's own ``forward``, or what comes after the net (the loss). Forward
    hooks on every module say where the pass got to; they are removed when the block ends."""

    def __init__(self, net: torch.nn.Module):
        self.net = net
        self.names = {module: name for name, module in unwrap(net).named_modules()}
        self.inside: list[torch.nn.Module] = []  # the modules entered and not yet left, outermost first
        self.failed_in: Optional[torch.nn.Module] = None
        self.net_entered = self.net_done = False

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        handles = []
        for module in self.net.modules():
            handles.append(module.register_forward_pre_hook(self._enter))
            handles.append(module.register_forward_hook(self._leave))
        try:
            yield
        except Exception:
            self.failed_in = self.inside[-1] if self.inside else None
            raise
        finally:
            for handle in handles:
                handle.remove()

    def _enter(self, module: torch.nn.Module, args: Any) -> None:
        self.net_entered = True
        self.inside.append(module)

    def _leave(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if self.inside and self.inside[-1] is module:
            self.inside.pop()
        if module is self.net:
            self.net_done = True

    @property
    def in_net(self) -> bool:
        return self.net_entered and not self.net_done

    def part(self, model: Any) -> str:
        """The part that failed, in words: "inside the net, in module 'conv2' (Conv2d(...))", "in the loss"."""
        if not self.net_entered:
            return "before reaching the net (reading the batch)"
        if self.in_net:
            name = self.names.get(self.failed_in) if self.failed_in is not None else None
            if not name:
                return f"in the forward of the net ({type(unwrap(self.net)).__name__})"
            return f"inside the net, in its module {name!r} ({_short(self.failed_in)})"
        loss = getattr(model, "loss_fn", None)
        if loss is None or not model.uses_default_forward_batch:
            return "after the net (in forward_batch)"
        return f"in the loss ({_short(loss)})"


def _short(module: Any) -> str:
    text = repr(module) if isinstance(module, torch.nn.Module) else type(module).__name__
    text = " ".join(text.split())
    return text if len(text) <= 80 else text[:77] + "..."


# -- a train_step of the user's own -------------------------------------------------------------


class StepOutline(NamedTuple):
    """What a ``train_step`` returns, as seen on its trial: ``(loss, preds, labels)`` (``values`` is
    None), or a dict of named batch means (``values`` holds their names, in order)."""

    values: Optional[tuple[str, ...]] = None

    def columns(self, metric_names: list[str], has_val: bool, lr_groups: int = 1) -> list[str]:
        """The history's columns after ``epoch``: a dict's names as ``train_<name>`` (``loss`` is
        ``train_loss``; the train metrics need predictions, which a dict does not give), then ``lr``
        and the validation columns."""
        usual = history_columns(metric_names, has_val, lr_groups)
        if self.values is None:
            return usual
        return [*(f"train_{name}" for name in self.values), *usual[usual.index("lr") :]]


RESERVED_VALUE_NAMES = ("lr", "epoch")


def outline_of(outputs: Any) -> StepOutline:
    """Read what a ``train_step`` returned, or say what it should return."""
    if isinstance(outputs, dict):
        if not outputs:
            raise ValueError(
                "train_step returned an empty dict; return the batch's values by name, e.g. {'d_loss': d_loss, "
                "'g_loss': g_loss} (they become history columns), or (loss, preds, labels)."
            )
        for key, value in outputs.items():
            if not isinstance(key, str) or not key or key in RESERVED_VALUE_NAMES:
                raise ValueError(
                    f"train_step returned a dict with the key {key!r}; its keys become history columns "
                    "(train_<key>): use names like 'd_loss' (not 'lr' or 'epoch')."
                )
            if not (isinstance(value, torch.Tensor) and value.numel() == 1) and not isinstance(value, (int, float)):
                shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
                raise ValueError(
                    f"train_step returned {key!r}: {shape}; each value of the dict is one number for the batch (a "
                    "0-d tensor, the batch mean: loss.detach() or loss itself)."
                )
        return StepOutline(tuple(outputs))
    if isinstance(outputs, (tuple, list)) and len(outputs) == 3:
        return StepOutline(None)
    raise ValueError(
        f"train_step returned {describe_batch(outputs) if isinstance(outputs, (tuple, list)) else type(outputs).__name__}; "
        "return (loss, preds, labels) to feed train_loss and the train metrics, or a dict of named batch means, "
        "e.g. {'d_loss': d_loss, 'g_loss': g_loss}, which become the columns train_d_loss and train_g_loss."
    )


def try_own_step(model: Any, data: Any, runtime: Any, settings: Any, name: str) -> StepOutline:
    """Try the model's own ``train_step`` once on the first batch of ``data``, as fit's first step runs
    it (train mode, a group of one batch, the optimizers stepped, with a :class:`FitStep` of its own
    and no callbacks), inside a snapshot of the weights, every optimizer and module the model holds,
    the scheduler, the grad scaler and the random generators: a mistake fails now, with the batch it
    got, and nothing has changed afterwards. Returns what the step returns, outlined."""
    batch = runtime.to_device(first_batch(data, name))
    with trial_snapshot(model, [data], runtime):
        model.fit_step = FitStep(model, runtime, settings, CallbackList([], model, {}))
        try:
            with train_mode(model.net):
                model.fit_step.start_epoch(1)
                outputs = model.fit_step.run(0, batch)
        except (BatchError, NoLossError):
            raise
        except Exception as error:
            hint = f" kerastorch gave your train_step the first batch: {describe_batch(batch)}."
            raise _wrapped(error, name, "", hint, own_step=True) from error
        finally:
            model.fit_step = None
        outline = outline_of(outputs)
        if outline.values is None:
            loss, preds, labels = outputs
            check_first_outputs(model, loss, preds, labels, runtime, name)
    return outline


@contextlib.contextmanager
def trial_snapshot(model: Any, loaders: list, runtime: Any) -> Iterator[None]:
    """:func:`~kerastorch.training.snapshot.training_snapshot`, plus what else a step of the user's own
    may change: the optimizers, schedulers and grad scalers the model holds as attributes (a GAN's
    second optimizer and its scheduler), fit's grad scaler, and the other modules the model holds."""
    own = [*model_attributes(model).values(), *([runtime.scaler] if getattr(runtime, "scaler", None) else [])]
    modules = [p for p in vars(model).values() if isinstance(p, torch.nn.Module) and p is not model.net]
    saved_own = [copy.deepcopy(part.state_dict()) for part in own]
    saved_modules = [{k: v.detach().clone() for k, v in module.state_dict().items()} for module in modules]
    try:
        with training_snapshot(model, loaders):
            yield
    finally:
        for part, state in zip(own, saved_own):
            part.load_state_dict(state)
        for module, state in zip(modules, saved_modules):
            module.load_state_dict(state)


def monitor_for_columns(
    watch: MonitorSettings, columns: list[str], values: Optional[tuple[str, ...]]
) -> MonitorSettings:
    """The monitored value of a run whose columns a ``train_step`` of the user's own named on its trial:
    ``monitor="auto"`` becomes nothing when the step returns no loss (the last weights stay); a name it
    does not produce is an error that lists what it does."""
    if watch.monitor is None or watch.monitor in columns:
        return watch
    if watch.monitor_was_auto:
        return dataclasses.replace(watch, monitor=None, patience=None)
    close = difflib.get_close_matches(watch.monitor, columns, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    returned = f"Your train_step returns {', '.join(values)}, so this" if values else "This"
    raise ValueError(
        f"monitor={watch.monitor!r} is not a value this run produces. {returned} run logs: {', '.join(columns)}."
        f"{hint} Or pass monitor=None to monitor nothing (the last epoch's weights stay)."
    )


def check_first_outputs(
    model: Any,
    loss: Any,
    preds: Any,
    labels: Any,
    runtime: Any,
    name: str,
) -> None:
    """The loss is one number, outputs and labels do not broadcast into each other, and every
    metric takes the outputs: checked on the first batch, before any weight changes."""
    mismatch = broadcast_mismatch(model.loss_fn, preds, labels)
    if mismatch:
        raise ValueError(f"The first batch of {name}: {mismatch}")
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise ValueError(
            f"The loss must be a single number (a 0-d tensor, the mean over the batch); got {shape}. Use a loss "
            "with reduction='mean', or return loss.mean() (or loss.squeeze() for one element) from your loss or "
            "forward_batch."
        )
    copies = metric_copies_for(model, runtime.outputs_device)  # the model's, which its meters take too
    check_metrics_on(model.metrics_dict, preds, labels, name, copies, runtime.num_processes)


def check_metrics_on(
    metrics_dict: dict,
    whole_preds: Any,
    whole_labels: Any,
    name: str,
    copies: MetricCopies,
    processes: int = 1,
) -> None:
    """Update and compute a copy of every metric on one batch: a metric that does not fit the
    outputs (3 classes into Accuracy(num_classes=2)) fails now, not after an epoch of training.
    In one process, a copy is computed only on outputs of a kind (dtypes, shapes past the batch
    dimension) none of the metric's copies computed one number from before: the update is what
    reads the values.
    The copies come from ``copies``, and go back to it for the run's meters.
    Under several processes, a metric whose state is plain Python numbers (which cannot be
    summed over processes) is refused too: it would report one process's share alone."""
    for key, metric in metrics_dict.items():
        number_states: list[str] = []
        try:
            with torch.no_grad():
                if isinstance(metric, OutputMetric):  # a metric of one output gets its values alone
                    metric, (preds, labels) = metric.metric, metric.pick(whole_preds, whole_labels)
                else:
                    preds, labels = whole_preds, whole_labels
                preds = metric_friendly(preds)
                kind = outputs_kind(preds, labels)
                if is_stateful_metric(metric):
                    trial = copies.take(metric)  # comes reset
                    numbers = _number_states(trial) if processes > 1 else {}
                    metric_update_fn(trial)(preds, labels)
                    number_states = [k for k, v in numbers.items() if vars(trial).get(k) != v]
                    # Under several processes every rank computes, as before: a torchmetrics compute is
                    # a collective, and ranks whose batches differ in shape would not agree to skip it.
                    if processes > 1 or not copies.computed_one_number(metric, kind):
                        scalar_metric_value(trial.compute(), key)
                        copies.note_one_number(metric, kind)
                else:
                    scalar_metric_value(metric(preds, labels), key)
                if is_stateful_metric(metric):
                    copies.give_back(metric, trial)
        except Exception as error:
            raise ValueError(
                f"Metric {key!r} failed on the first batch of {name}, before training started: "
                f"{type(error).__name__}: {error}. Check that it fits the net's outputs (number of classes, task) "
                "and the labels."
            ) from error
        if number_states and processes > 1 and not is_torchmetrics(metric):
            raise ValueError(
                f"Metric {key!r} keeps its state in plain Python numbers ({', '.join(number_states)}), which cannot "
                f"be combined over the {processes} processes: it would report one process's share of the data. "
                f"Keep the state in tensors, e.g. self.register_buffer('{number_states[0]}', torch.tensor(0.0)) or "
                f"nn.Parameter(torch.tensor(0.0), requires_grad=False), or use a torchmetrics metric."
            )


def _number_states(metric: Any) -> dict[str, Any]:
    """The metric's attributes that hold plain Python numbers (an update that changes one keeps state
    that cannot be summed over processes)."""
    return {k: v for k, v in vars(metric).items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def _wrapped(error: Exception, name: str, part: str, hint: str = "", own_step: bool = False) -> Exception:
    """``error`` again, its message saying which data's first batch failed and where, then the hint."""
    said = str(error)
    if hint and not said.rstrip().endswith((".", "!", "?")):
        said = said.rstrip() + "."  # torch's text often has no full stop, and the hint is a new sentence
    if own_step:
        message = (
            f"On the first batch of {name}, your train_step failed, before training started (nothing has changed): "
        )
    else:
        message = f"The first batch of {name} failed {part}, before training started (nothing has changed): "
    message += said + hint
    try:
        return type(error)(message)
    except Exception:  # an exception type that takes other arguments
        return RuntimeError(message)


def fits_own_columns(
    model: Any, train_data: Any, val_data: Optional[Any], runtime: Any, settings: Any
) -> tuple[StepOutline, list[str], Any]:
    """The history's columns of a run with fit's own epochs, known before the callbacks begin: a
    ``train_step`` of the user's own is tried once to see what it returns (:func:`try_own_step`), and
    the monitored value is one of its values. A net with lazy modules (``nn.LazyLinear``, sized by its
    first batch as a Keras ``Dense`` is) gets its weights from a first batch now, before anything
    copies them."""
    name = settings.data.train_name
    if has_lazy_parameters(model.net):
        check_batch(model, first_batch(train_data, name), runtime, name)
    outline = StepOutline()
    if not model.uses_default_train_step:
        outline = try_own_step(model, train_data, runtime, settings.step, name)
    lr_groups = len(model.optimizer.param_groups)
    columns = outline.columns(settings.metric_names(model.metrics_dict), val_data is not None, lr_groups)
    columns += [name for name in logs_added_by(settings.callbacks) if name not in columns]
    if not model.uses_default_train_step:  # the step named its values on its trial: monitor one of them
        monitoring = monitor_for_columns(settings.monitoring, columns, outline.values)
        step = dataclasses.replace(settings.step, monitor=monitoring.monitor)
        settings = dataclasses.replace(settings, monitoring=monitoring, step=step)
    return outline, columns, settings


def has_lazy_parameters(net: torch.nn.Module) -> bool:
    """Parameters a lazy module has not sized yet (they take their shapes from the first forward pass)."""
    return any(isinstance(p, torch.nn.parameter.UninitializedParameter) for p in net.parameters())


__all__ = [
    "Culprit",
    "StepOutline",
    "broadcast_mismatch",
    "check_batch",
    "check_first_batches",
    "check_first_outputs",
    "check_metrics_on",
    "fits_own_columns",
    "monitor_for_columns",
    "outline_of",
    "try_own_step",
]
