"""torchkeras's way to change the step: ``KerasModel.StepRunner = MyStepRunner``.

A torchkeras program replaces the class that runs one batch. ``StepRunner(net, loss_fn,
accelerator, stage, metrics_dict, optimizer, lr_scheduler)``, called on a batch, runs the
forward pass and, in the ``"train"`` stage, the backward pass and the optimizer's and
scheduler's steps; it returns ``(step_losses, step_metrics)``, two dicts of numbers named
``<stage>_<name>``. A few programs also replace ``EpochRunner(step_runner, quiet)``, called
on a whole loader and returning the epoch's dict.

``fit`` and ``evaluate`` honour them inside kerastorch's own loop — callbacks, best weights,
early stopping, progress, several processes and resume stay — and use them as torchkeras's
``fit`` does:

- a new runner for each stage of each epoch, with its own copies of the metrics;
- an epoch's value of a step loss is its mean over the epoch's samples (each batch weighted by
  its size, where torchkeras weighs batches alike), of a metric in ``metrics_dict`` its
  ``compute()`` over the epoch, and of anything else (``lr``) the last batch's;
- with several processes, every process runs as many batches (the runner gathers over them at
  every batch; the last batches are evened out with repeated samples, which its
  ``accelerator.gather`` drops again), and the values are averaged over the processes (the same
  on all of them, so they stop together and keep the same best epoch);
- the runner steps the optimizer and the scheduler itself, so the loop steps neither.

What fit's own step would add — gradient accumulation, clipping, 16-mixed's grad scaler, the
step hooks of callbacks, sample and class weights — is then the runner's business: asking for
it is refused with what to do (see :func:`check_runner_fit`), not silently skipped.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
from typing import Any, Iterator, Optional

import torch

from ..data.batches import inputs_count
from ..data.peek import dry_run_first_batch
from ..devices.runtime import Runtime
from ..helpers.modes import eval_mode
from ..training.callback import hooks_of, logs_added_by
from ..training.callback_list import CallbackList
from .accelerator import RunnerAccelerator

STEP_HOOKS = ("on_before_backward", "on_after_backward", "on_before_optimizer_step", "on_after_optimizer_step")


@dataclasses.dataclass(frozen=True)
class ProgramRunners:
    """The runner classes a torchkeras program set on ``KerasModel`` (or on one model): the one seam
    between fit's run and torchkeras's way to change the step. The run asks it to check fit's settings
    (:meth:`check_fit`), for the history's columns (:meth:`columns`) and for the epochs it runs
    (:meth:`epochs`)."""

    step_class: type
    epoch_class: Optional[type] = None

    def check_fit(self, model: Any, settings: Any, sample_weight: Any = None) -> None:
        check_runner_fit(model, settings, sample_weight)

    def columns(
        self, model: Any, train_data: Any, val_data: Optional[Any], runtime: Runtime, settings: Any
    ) -> Optional[list[str]]:
        """The history's columns as the StepRunner names them, read on one batch before training, with
        the monitored name checked against them; None with the program's own EpochRunner, whose names
        are known only after an epoch (the monitor is checked then)."""
        if self.epoch_class is not None:
            return None
        probed = val_data if val_data is not None else train_data
        columns = runner_columns(model, self, probed, runtime, has_val=val_data is not None)
        columns += [name for name in logs_added_by(settings.callbacks) if name not in columns]
        if settings.monitoring.monitor is not None:
            check_runner_monitor(settings.monitoring.monitor, columns, model)
        return columns

    def epochs(
        self, model: Any, runtime: Runtime, callbacks: CallbackList, columns: Optional[list[str]], settings: Any
    ) -> RunnerEpochs:
        unchecked = settings.monitoring.monitor if columns is None else None
        return RunnerEpochs(model, self, runtime, callbacks, unchecked_monitor=unchecked)


def program_runners(model: Any) -> Optional[ProgramRunners]:
    """The program's ``StepRunner`` (and ``EpochRunner``), or None when it set neither."""
    step_class = getattr(model, "StepRunner", None)
    epoch_class = getattr(model, "EpochRunner", None)
    if step_class is None and epoch_class is None:
        return None
    if step_class is None:
        raise TypeError(
            f"{type(model).__name__}.EpochRunner is set but StepRunner is not. torchkeras's EpochRunner calls a "
            "StepRunner on each batch: set KerasModel.StepRunner to your step class as well."
        )
    for name, runner in (("StepRunner", step_class), ("EpochRunner", epoch_class)):
        if runner is not None and not isinstance(runner, type):
            raise TypeError(
                f"{type(model).__name__}.{name} is a {type(runner).__name__}, not a class. Assign the class itself, "
                f"as torchkeras programs do: KerasModel.{name} = My{name} (no brackets)."
            )
    return ProgramRunners(step_class, epoch_class)


# What fit keeps doing around a program's runner; every other setting belongs to fit's own step, which
# the runner replaces, so asking for it is refused (a keyword added to fit later is refused too, until
# it is added here).
LEFT_TO_FIT = {
    "FitSettings": {"epochs", "callbacks", "monitoring", "output", "devices", "step", "data", "initial_epoch"},
    "StepSettings": {"monitor"},
    "DataSettings": {
        "batch_size",
        "shuffle",
        "validation_split",
        "steps_per_epoch",
        "validation_freq",
        "validation_steps",
        "validation_batch_size",
        "train_name",
        "val_name",
    },
}
KEYWORDS = {  # a setting's name in fit's keywords, where they differ
    "accumulation_steps": "gradient_accumulation_steps",
    "clip_val": "gradient_clip_val",
    "clip_algorithm": "gradient_clip_algorithm",
    "scheduler_interval": "lr_scheduler_interval='step'",
}
IN_THE_RUNNER = "do it in the runner"
INSTEAD = {  # what to do instead, where there is more to say than "do it in the runner"
    "gradient_clip_val": "clip in the runner: self.accelerator.clip_grad_norm_(self.net.parameters(), 1.0) before "
    "self.optimizer.step()",
    "class_weight": "weight the loss in the runner",
    "sample_weight": "weight the loss in the runner",
    "doctor": "run model.doctor(...) without the StepRunner",
    "lr_scheduler_interval='step'": "leave it out: the runner steps the scheduler after every batch itself",
    "precision='16-mixed'": "use precision='bf16-mixed' (mixed_precision='bf16'), which needs no grad scaler",
}


def settings_for_fits_own_step(settings: Any, sample_weight: Any = None) -> list[str]:
    """The keywords asked for that only fit's own step carries out (settings away from their defaults
    that :data:`LEFT_TO_FIT` does not name), plus what the runner cannot run with."""
    asked = []
    for group in (settings, settings.step, settings.data):
        for field in dataclasses.fields(group):
            if field.name in LEFT_TO_FIT[type(group).__name__]:
                continue
            default = field.default if field.default is not dataclasses.MISSING else None
            if getattr(group, field.name) != default:
                asked.append(KEYWORDS.get(field.name, field.name))
    if sample_weight is not None:
        asked.append("sample_weight")
    if settings.devices.precision == "16-mixed":
        asked.append("precision='16-mixed'")
    strategy = settings.devices.strategy
    if strategy is not None and strategy.foreign_step_refusal:
        INSTEAD[f"strategy={strategy!r}"] = strategy.foreign_step_refusal
        asked.append(f"strategy={strategy!r}")
    return asked


def check_runner_fit(model: Any, settings: Any, sample_weight: Any = None) -> None:
    """Refuse what fit's own step would do but a program's runner does itself, before anything runs."""
    asked = settings_for_fits_own_step(settings, sample_weight)
    if asked:
        raise ValueError(
            f"{', '.join(asked)}: a torchkeras StepRunner ({runner_name(model)}) runs the whole step itself (forward, "
            "backward, optimizer and scheduler steps), so fit cannot add this to it. Instead: "
            f"{'; '.join(INSTEAD.get(name, IN_THE_RUNNER) for name in asked)}. Or drop the StepRunner: subclass "
            "KerasModel and override train_step(batch), which gets all of fit's options."
        )
    for callback in settings.callbacks or []:
        hooks = [hook for hook in STEP_HOOKS if hook in hooks_of(callback)]
        if hooks:
            raise ValueError(
                f"The callback {type(callback).__name__} acts inside the training step ({', '.join(hooks)}), which "
                f"a torchkeras StepRunner ({runner_name(model)}) runs itself: those hooks would never be called. "
                "Subclass KerasModel and override train_step(batch) instead of setting StepRunner, or leave the "
                "callback out."
            )


def runner_name(model: Any) -> str:
    runners = program_runners(model)
    return getattr(runners.step_class, "__name__", "?") if runners else "none"


class DeviceBatches:
    """A loader whose batches arrive on the run's device, for a program's ``EpochRunner``, which
    iterates the loader itself. Attributes go to the loader (torchkeras's runners read
    ``loader.size`` and some set ``loader.agent``)."""

    def __init__(self, loader: Any, runtime: Runtime):
        object.__setattr__(self, "_loader", loader)
        object.__setattr__(self, "_runtime", runtime)

    def __iter__(self) -> Iterator[Any]:
        for batch in self._loader:
            yield self._runtime.to_device(batch)

    def __len__(self) -> int:
        return len(self._loader)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._loader, name, value)


class EpochValues:
    """One stage's values over an epoch, from the runner's per-batch dicts."""

    def __init__(self, stage: str):
        self.stage = stage
        self.sums: dict[str, float] = {}
        self.samples = 0
        self.last: dict[str, float] = {}

    def add(self, step_losses: dict, step_metrics: dict, n: int) -> None:
        for name, value in step_losses.items():
            self.sums[name] = self.sums.get(name, 0.0) + _number(value, name) * n
        self.samples += n
        self.last = {name: _number(value, name) for name, value in step_metrics.items()}

    def running(self) -> dict[str, float]:
        """The epoch so far: what the progress bar shows."""
        return {**{name: total / self.samples for name, total in self.sums.items()}, **self.last}

    def epoch(self, metrics: dict, runtime: Runtime) -> dict[str, float]:
        """The epoch's values, the same on every process; the metrics are reset."""
        losses = {name: total / self.samples for name, total in self.sums.items()}
        others = dict(self.last)
        for name, metric in metrics.items():
            others[f"{self.stage}_{name}"] = _number(metric.compute(), name)
            metric.reset()
        if runtime.num_processes > 1:
            losses, others = _averaged_over_processes(losses, self.samples, others, runtime)
        return {**losses, **others}


def _averaged_over_processes(losses: dict, samples: int, others: dict, runtime: Runtime) -> tuple[dict, dict]:
    # Every process runs the same runner, so the names agree; sorted, they line up in one all-reduce.
    loss_names, other_names = sorted(losses), sorted(others)
    parts = [losses[k] * samples for k in loss_names] + [float(samples)] + [others[k] for k in other_names]
    summed = runtime.reduce_sum(torch.tensor(parts, dtype=torch.float64, device=runtime.device)).tolist()
    total = summed[len(loss_names)]
    losses = {k: summed[i] / total for i, k in enumerate(loss_names)}
    others = {k: summed[len(loss_names) + 1 + i] / runtime.num_processes for i, k in enumerate(other_names)}
    return losses, others


def _number(value: Any, name: str) -> float:
    try:
        return float(value.detach() if isinstance(value, torch.Tensor) else value)
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(
            f"The StepRunner returned {name!r} = {value!r}; every value of step_losses and step_metrics must be one "
            "number (a float, or a tensor with one element), as torchkeras's history holds one number per column."
        ) from None


class RunnerEpochs:
    """Runs the program's runners for one fit (or one evaluate), a stage of an epoch at a time:
    the :class:`~kerastorch.training.protocols.Epochs` that :func:`~kerastorch.training.loop.fit_loop` runs.

    ``unchecked_monitor``: the monitored name, when it could not be checked before training (a
    program's EpochRunner names its values only once an epoch ran): checked after the first epoch.
    """

    def __init__(
        self,
        model: Any,
        runners: ProgramRunners,
        runtime: Runtime,
        callbacks: CallbackList,
        unchecked_monitor: Optional[str] = None,
    ):
        self.model = model
        self.runners = runners
        self.runtime = runtime
        self.callbacks = callbacks
        self.accelerator = RunnerAccelerator(runtime) if runtime.accelerator is not None else model.accelerator
        self.unchecked_monitor = unchecked_monitor

    def step_runner(self, stage: str) -> Any:
        """A new runner for one stage of one epoch, as torchkeras builds them: copies of the metrics,
        and the optimizer and scheduler only for training."""
        model, training = self.model, stage == "train"
        metrics = {name: copy.deepcopy(metric) for name, metric in model.metrics_dict.items()}
        for metric in metrics.values():
            if isinstance(metric, torch.nn.Module):
                metric.to(self.runtime.outputs_device)
        return self.runners.step_class(
            net=model.net,
            loss_fn=model.loss_fn,
            accelerator=self.accelerator,
            stage=stage,
            metrics_dict=metrics,
            optimizer=model.optimizer if training else None,
            lr_scheduler=model.lr_scheduler if training else None,
        )

    def train(self, loader: Any) -> dict[str, float]:
        self.model.net.train()
        return self._run("train", loader)

    @torch.no_grad()
    def validate(self, loader: Any) -> dict[str, float]:
        with eval_mode(self.model.net):
            self.callbacks.call("on_test_begin", {})
            logs = self._run("val", loader)
            self.callbacks.call("on_test_end", logs)
        return logs

    def end_epoch(self, logs: dict) -> None:
        """The runner stepped the scheduler after every batch, as in torchkeras: nothing to step here.
        A monitored name not checked before training is checked on the first epoch that has it in
        its stage (an error here ends fit with the weights from before training restored)."""
        monitor = self.unchecked_monitor
        if monitor is None or (monitor.startswith("val_") and not any(k.startswith("val_") for k in logs)):
            return
        self.unchecked_monitor = None
        check_runner_monitor(monitor, [name for name in logs if name != "epoch"], self.model, "after the first epoch")

    def _run(self, stage: str, loader: Any) -> dict[str, float]:
        runner = self.step_runner(stage)
        if self.runners.epoch_class is not None:
            return dict(self.runners.epoch_class(runner, quiet=True)(DeviceBatches(loader, self.runtime)))
        hooks = "train" if stage == "train" else "test"
        callbacks = self.callbacks
        on_begin, on_end = callbacks.wants(f"on_{hooks}_batch_begin"), callbacks.wants(f"on_{hooks}_batch_end")
        values = EpochValues(stage)
        for batch_index, batch in enumerate(loader):
            if on_begin:
                callbacks.call(f"on_{hooks}_batch_begin", batch_index, {})
            batch = self.runtime.to_device(batch)
            step_losses, step_metrics = _two_dicts(runner(batch))
            values.add(step_losses, step_metrics, inputs_count(batch))
            if on_end:
                callbacks.call(f"on_{hooks}_batch_end", batch_index, values.running())
            if stage == "train" and self.model.stop_training:  # set by a batch hook: stop after this batch
                break
        if values.samples == 0:
            raise ValueError(f"The {stage} data produced no batches. Check the dataset's size and drop_last.")
        return values.epoch(metrics_of(runner), self.runtime)


def metrics_of(runner: Any) -> dict:
    """The runner's copies of the metrics (torchkeras computes each at the epoch's end); a runner
    that logs its metrics itself may keep none."""
    return getattr(runner, "metrics_dict", None) or {}


def _two_dicts(returned: Any) -> tuple[dict, dict]:
    if isinstance(returned, tuple) and len(returned) == 2 and all(isinstance(part, dict) for part in returned):
        return returned
    raise TypeError(
        f"The StepRunner returned a {type(returned).__name__}; torchkeras's StepRunner.__call__(batch) returns two "
        "dicts, (step_losses, step_metrics), e.g. ({'train_loss': loss.item()}, {'train_acc': acc})."
    )


def runner_columns(model: Any, runners: ProgramRunners, data: Any, runtime: Runtime, has_val: bool) -> list[str]:
    """The history's columns, read from the program's runner on one batch before training: a
    ``"val"`` runner (no optimizer, no gradients, eval mode, nothing changes) on the first batch of
    ``data``, its names mirrored for training (``val_x`` → ``train_x``), with ``lr``."""
    epochs = RunnerEpochs(model, runners, runtime, CallbackList([], model, {}))

    def names_from_one_batch(batch: Any) -> list[str]:
        runner = epochs.step_runner("val")
        step_losses, step_metrics = _two_dicts(runner(runtime.to_device(batch)))
        names = [*step_losses, *step_metrics, *(f"val_{name}" for name in metrics_of(runner))]
        return list(dict.fromkeys(names))

    try:
        val_names = dry_run_first_batch(model.net, data, "data", names_from_one_batch)
    except Exception as error:
        message = (
            f"The StepRunner {runner_name(model)} failed on the first batch, run in the 'val' stage before training "
            f"(to see the values it logs; nothing was changed): {error}"
        )
        try:
            wrapped = type(error)(message)
        except Exception:  # an exception type that takes other arguments
            wrapped = RuntimeError(message)
        raise wrapped from error
    train_names = [("train_" + name[4:]) if name.startswith("val_") else name for name in val_names]
    train_names = [*(name for name in train_names if name != "lr"), "lr"]
    return [*train_names, *(val_names if has_val else [])]


def check_runner_monitor(monitor: str, columns: list[str], model: Any, when: str = "on a first batch") -> None:
    """Fail when ``monitor`` is not one of the values the program's runners log."""
    if monitor in columns:
        return
    close = difflib.get_close_matches(monitor, columns, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ValueError(
        f"monitor={monitor!r} is not a value the StepRunner {runner_name(model)} returns; {when} it "
        f"returned: {', '.join(columns)}.{hint} Pass monitor= one of those."
    )


__all__ = [
    "DeviceBatches",
    "EpochValues",
    "ProgramRunners",
    "RunnerEpochs",
    "check_runner_fit",
    "check_runner_monitor",
    "program_runners",
    "runner_columns",
]
