"""Which learning rate? ``lr_find`` answers without changing anything, and ``fit_one_cycle``
trains with torch's one-cycle schedule around the answer.

``lr_find`` trains for at most ``num_steps`` batches while the learning rate rises
exponentially from ``start_lr`` to ``end_lr``, records the loss of every step (and an
exponentially smoothed copy, debiased as in Adam), and stops once the smoothed loss
exceeds ``diverge`` times its best. Then everything goes back as it was
(:func:`~kerastorch.tools.snapshot.training_snapshot`): weights, buffers, optimizer state and
learning rates, scheduler and every RNG, so ``lr_find`` followed by ``fit`` trains exactly
as ``fit`` alone.

The suggestion is the learning rate where the smoothed loss falls fastest per unit of
``log10(lr)`` (the steepest descent), looked for between the start and the lowest point
of the curve; it is always one of the rates tried. A curve that never descends (lowest in
its first steps) is said, with what to try. The lowest point itself is too large a rate — just past it the loss blows
up — and the rule "minimum / 10" depends on how far the curve runs past its valley; the
steepest descent is where a step in the learning rate buys the most progress, which is
what training at that rate exploits (Smith's range test).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import math
import warnings
from typing import Any, Iterator

import numpy as np
import pandas as pd
import torch

from ..data.batches import unpack
from ..data.forms import FitData, prepare_data
from ..data.peek import first_batch
from ..devices.placement import place_parts
from ..devices.plan import Plan, make_plan
from ..devices.runtime import build_runtime
from ..helpers.plots import new_figure
from ..helpers.protocols import TrainableModel
from ..settings import DataSettings, DeviceSettings, FinderSettings, FitSettings, StepSettings
from ..strategies import strategy_for_net
from ..training.callback_list import CallbackList
from ..training.first_batch import check_batch
from ..training.loop import FitStep
from ..training.model_checks import check_loss_fn
from ..training.schedulers import hyperparameters_kept, updates_per_epoch
from ..training.snapshot import training_snapshot


@dataclasses.dataclass
class LRFinderResult:
    """What ``lr_find`` saw: ``history`` (columns ``lr``, ``loss`` smoothed, ``raw_loss``) and
    ``suggestion`` (see the module docstring). In Jupyter it displays as its plot."""

    history: pd.DataFrame
    suggestion: float

    def plot(self) -> Any:
        """The smoothed loss against the learning rate (log scale), the suggestion marked; a matplotlib Figure."""
        fig = new_figure(figsize=(5.5, 3.4), layout="constrained")
        ax = fig.subplots()
        ax.plot(self.history["lr"], self.history["raw_loss"], color="lightgray", linewidth=1, label="loss")
        ax.plot(self.history["lr"], self.history["loss"], linewidth=2, label="smoothed loss")
        ax.axvline(self.suggestion, color="crimson", linestyle="--", linewidth=1)
        ax.plot(
            [self.suggestion],
            [np.interp(math.log(self.suggestion), np.log(self.history["lr"]), self.history["loss"])],
            "o",
            color="crimson",
            label=f"suggestion {self.suggestion:.2g}",
        )
        ax.set_xscale("log")
        # The curve up to where it blows up: the last steps' losses would flatten everything else.
        smoothed = self.history["loss"]
        low, start = float(smoothed.min()), float(smoothed.iloc[0])
        ax.set_ylim(low - 0.1 * (start - low), start + 0.4 * (start - low) if start > low else None)
        ax.set_xlabel("learning rate")
        ax.set_ylabel("loss")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
        return fig

    def _repr_png_(self) -> bytes:
        buffer = io.BytesIO()
        self.plot().savefig(buffer, format="png", dpi=80)
        return buffer.getvalue()

    def __repr__(self) -> str:
        return f"LRFinderResult(suggestion={self.suggestion:.3g}, steps={len(self.history)})"


def lr_find(
    model: TrainableModel, data: FitData, devices: DeviceSettings, data_settings: DataSettings, finder: FinderSettings
) -> LRFinderResult:
    """The learning-rate range test (see the module docstring); the model is left exactly as it was."""
    check_loss_fn(model)
    plan = make_plan(devices, model.net)
    if plan.where == "workers":  # one process is enough to find a rate: the first of the devices asked for
        plan = dataclasses.replace(plan, where="here", devices=plan.devices[:1], strategy=strategy_for_net(model.net))
    train_loader, _ = prepare_data(
        data,
        data_settings.batch_size,
        data_settings.shuffle,
        data_settings.validation_split,
        keep_float64=plan.precision == "64-true",
        pin_memory=plan.device_type == "cuda",
    )
    lrs = np.geomspace(finder.start_lr, finder.end_lr, finder.num_steps)
    smoothing = finder.smoothing
    raw: list[float] = []
    with training_snapshot(model, [train_loader]):
        runtime = build_runtime(plan)
        try:
            place_parts(model, runtime)
            check_batch(model, first_batch(train_loader, "train_data"), runtime, "train_data")
            steps = FitStep(model, runtime, StepSettings(), CallbackList([], model, {}))
            model.fit_step = steps
            model.net.train()
            steps.start_epoch(None)
            batches = _endless(train_loader)
            best, average = math.inf, 0.0
            for step, lr in enumerate(lrs):
                for group in model.optimizer.param_groups:
                    group["lr"] = float(lr)
                batch = next(batches)
                loss, _, _ = steps.run(0, runtime.to_device(batch))
                value = float(loss.detach())
                if not math.isfinite(value):
                    check_finite_batch(batch, step)
                    break
                raw.append(value)
                average = smoothing * average + (1 - smoothing) * value
                smoothed = average / (1 - smoothing ** (step + 1))
                best = min(best, smoothed)
                if smoothed > finder.diverge * best:
                    break
        finally:
            model.fit_step = None
            runtime.teardown()
    if not raw:  # the first step's loss comes before any update: the learning rate played no part
        raise ValueError(
            "lr_find: the loss of the first batch is NaN or infinite before any weight changed, so no learning "
            "rate can be measured. The net or the loss produce it on this data: look at the first batch "
            "(model.doctor(train_data) checks for NaN inputs and labels, outputs and the loss)."
        )
    if len(raw) < 3:
        raise ValueError(
            f"lr_find stopped after {len(raw)} step(s): the loss diverged at once from start_lr={finder.start_lr}. "
            "Try a smaller start_lr, and check the data with model.doctor(...)."
        )
    history = pd.DataFrame({"lr": lrs[: len(raw)], "loss": _smoothed(raw, smoothing), "raw_loss": raw})
    suggestion = steepest_descent(history["lr"].to_numpy(), history["loss"].to_numpy())
    if not descends(history["loss"].to_numpy()):
        warnings.warn(
            f"lr_find: the smoothed loss never went down over the {len(raw)} rates it tried (from start_lr="
            f"{finder.start_lr:g} to {history['lr'].iloc[-1]:.3g}): it was lowest in the first steps, so there is no "
            f"descent to read a rate from, and the suggestion ({suggestion:.3g}, one of the rates tried) is a guess. "
            "Try a start_lr 100x smaller, more steps (num_steps=100 or more, on more batches), and check the data "
            "with model.doctor(...).",
            UserWarning,
            stacklevel=3,
        )
    if plan.where == "rank":  # every process of the job gets rank 0's answer
        suggestion = _from_rank_zero(suggestion)
    return LRFinderResult(history, suggestion)


def finder_for_fit(
    data: FitData, settings: FitSettings
) -> tuple[FitData, DeviceSettings, DataSettings, FinderSettings]:
    """What ``fit_one_cycle`` hands ``lr_find`` when it chooses ``max_lr``: the same training data,
    devices and batches as the fit that follows (the validation rows left out), the default range."""
    data_settings = DataSettings(settings.data.batch_size, settings.data.shuffle, settings.data.validation_split)
    return FitData(data.train, None, data.y, data.sample_weight), settings.devices, data_settings, FinderSettings()


@dataclasses.dataclass(frozen=True)
class OneCycle:
    """``fit_one_cycle``'s schedule: torch's ``OneCycleLR`` peaking at ``max_lr``, stepped after every
    optimizer step, over the steps one process takes in the whole run."""

    max_lr: float

    def scheduler(self, optimizer: torch.optim.Optimizer, total_steps: int) -> Any:
        return torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=self.max_lr, total_steps=total_steps)


@contextlib.contextmanager
def scheduled_for_this_run(
    model: TrainableModel, lr_schedule: Any, settings: FitSettings, plan: Plan, train_loader: Any
) -> Iterator[FitSettings]:
    """The model's scheduler replaced by ``lr_schedule``'s for the run, stepped after every optimizer
    step; the settings say so. Nothing changes without a schedule.

    When the run ends (also early, on Ctrl-C or an error) the model gets its own scheduler settings
    back and the optimizer its learning rates, momentum and betas as they were: torch's ``OneCycleLR``
    leaves the rate at a tiny fraction of ``max_lr``, and a ``fit`` after ``fit_one_cycle`` would
    otherwise train at that rate."""
    if lr_schedule is None:
        yield settings
        return
    steps = updates_per_epoch(train_loader, plan.num_processes, settings)
    if steps is None:
        raise ValueError(
            "fit_one_cycle plans its schedule from the number of batches in an epoch, and this training "
            "data has no length: pass steps_per_epoch=..."
        )
    epochs = settings.epochs - settings.initial_epoch  # the epochs this run trains
    own = model.lr_scheduler, model.lr_scheduler_interval
    with hyperparameters_kept(model.optimizer):
        model.lr_scheduler = lr_schedule.scheduler(model.optimizer, total_steps=epochs * steps)
        model.lr_scheduler_interval = "step"
        try:
            yield dataclasses.replace(settings, step=dataclasses.replace(settings.step, scheduler_interval="step"))
        finally:
            model.lr_scheduler, model.lr_scheduler_interval = own


def steepest_descent(lrs: np.ndarray, losses: np.ndarray) -> float:
    """The learning rate where ``losses`` fall fastest against ``log10(lrs)``, before their minimum:
    always one of ``lrs``, the rates tried.

    The slope at a point is measured across ``k = len // 20`` points on each side (at least
    one), so that batch-to-batch noise, large against the small steps of ``log10(lr)``, does
    not pass for a descent. A curve that never descends (:func:`descends`) gives the rate tried
    closest below a tenth of its lowest point (the lowest rate tried, at worst).

    >>> lrs = np.geomspace(1e-4, 1, 5)
    >>> steepest_descent(lrs, np.array([2.0, 1.9, 1.0, 0.8, 3.0]))
    0.01
    >>> steepest_descent(lrs, np.array([1.0, 1.5, 2.0, 3.0, 4.0]))  # never descends: the lowest rate tried
    0.0001
    """
    lowest = int(np.argmin(losses))
    span = max(1, len(losses) // 20)
    if not descends(losses):
        below = np.flatnonzero(lrs <= lrs[lowest] / 10)
        return float(lrs[below[-1]] if len(below) else lrs[0])
    logs = np.log10(lrs)
    points = np.arange(span, lowest - span + 1)
    slopes = (losses[points + span] - losses[points - span]) / (logs[points + span] - logs[points - span])
    return float(lrs[int(points[np.argmin(slopes)])])


def descends(losses: np.ndarray) -> bool:
    """Whether a curve of losses goes down before its minimum: its lowest point comes after the first
    ``2 * k`` points (``k = len // 20``, at least one), where a descent can be measured.

    >>> descends(np.array([2.0, 1.9, 1.0, 0.8, 3.0])), descends(np.array([1.0, 0.99, 2.0, 3.0]))
    (True, False)
    """
    return int(np.argmin(losses)) >= 2 * max(1, len(losses) // 20)


def _smoothed(raw: list[float], smoothing: float) -> list[float]:
    out, average = [], 0.0
    for step, value in enumerate(raw):
        average = smoothing * average + (1 - smoothing) * value
        out.append(average / (1 - smoothing ** (step + 1)))
    return out


def check_finite_batch(batch: Any, step: int) -> None:
    """A NaN or infinite loss on a batch that holds NaN or infinite numbers: name the data, not the rate."""
    inputs, kwargs, labels = unpack(batch)[:3]
    for part, tensor in [("inputs", t) for t in (*inputs, *kwargs.values())] + [("labels", labels)]:
        if isinstance(tensor, torch.Tensor) and tensor.is_floating_point() and not bool(tensor.isfinite().all()):
            bad = int((~tensor.isfinite()).sum())
            raise ValueError(
                f"lr_find: train_data's batch {step + 1} holds {bad} NaN or infinite value(s) in its {part}, "
                "which make the loss NaN whatever the learning rate. Fill or drop the missing values before "
                "training (e.g. df.fillna(...) or df.dropna(); model.doctor(train_data) looks at the data too)."
            )


def _endless(loader: Any):
    while True:
        empty = True
        for batch in loader:
            empty = False
            yield batch
        if empty:
            raise ValueError("train_data produced no batches.")


def _from_rank_zero(value: float) -> float:
    box = [value]
    torch.distributed.broadcast_object_list(box, src=0)
    return float(box[0])


__all__ = [
    "LRFinderResult",
    "OneCycle",
    "descends",
    "finder_for_fit",
    "lr_find",
    "scheduled_for_this_run",
    "steepest_descent",
]
