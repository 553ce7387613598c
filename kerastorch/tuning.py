"""Which learning rate? ``lr_find`` answers without changing anything, and ``fit_one_cycle``
trains with torch's one-cycle schedule around the answer.

``lr_find`` trains for at most ``num_steps`` batches while the learning rate rises
exponentially from ``start_lr`` to ``end_lr``, records the loss of every step (and an
exponentially smoothed copy, debiased as in Adam), and stops once the smoothed loss
exceeds ``diverge`` times its best. Then everything goes back as it was
(:func:`~kerastorch.snapshot.training_snapshot`): weights, buffers, optimizer state and
learning rates, scheduler and every RNG, so ``lr_find`` followed by ``fit`` trains exactly
as ``fit`` alone.

The suggestion is the learning rate where the smoothed loss falls fastest per unit of
``log10(lr)`` (the steepest descent), looked for between the start and the lowest point
of the curve. The lowest point itself is too large a rate — just past it the loss blows
up — and the rule "minimum / 10" depends on how far the curve runs past its valley; the
steepest descent is where a step in the learning rate buys the most progress, which is
what training at that rate exploits (Smith's range test).
"""

from __future__ import annotations

import dataclasses
import io
import math
from typing import Any

import numpy as np
import pandas as pd
import torch

from .callbacks.callback_list import CallbackList
from .checks import check_first_batch, check_loader
from .data import FitData, num_batches, prepare_data
from .parts import check_loss_fn
from .placement import place_parts
from .plan import make_plan
from .plots import new_figure
from .protocols import TrainableModel
from .runtime import build_runtime
from .settings import DataSettings, DeviceSettings, StepSettings
from .snapshot import training_snapshot
from .step import FitStep


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
    model: TrainableModel,
    data: FitData,
    devices: DeviceSettings,
    data_settings: DataSettings,
    start_lr: float = 1e-7,
    end_lr: float = 10.0,
    num_steps: int = 100,
    smoothing: float = 0.98,
    diverge: float = 4.0,
) -> LRFinderResult:
    """The learning-rate range test (see the module docstring); the model is left exactly as it was."""
    _check_range(start_lr, end_lr, num_steps, smoothing, diverge)
    check_loss_fn(model)  # type: ignore[arg-type]
    plan = make_plan(devices, model.net)
    if plan.where == "workers":  # one process is enough to find a rate: the first of the devices asked for
        plan = dataclasses.replace(plan, where="here", devices=plan.devices[:1])
    train_loader, _ = prepare_data(
        data, data_settings, keep_float64=plan.precision == "64-true", pin_memory=plan.device_type == "cuda"
    )
    check_loader(train_loader, "train_data")
    lrs = np.geomspace(start_lr, end_lr, num_steps)
    raw: list[float] = []
    with training_snapshot(model, [train_loader]):
        runtime = build_runtime(plan)
        try:
            place_parts(model, runtime)
            check_first_batch(model, train_loader, runtime, "train_data")
            steps = FitStep(model, runtime, StepSettings(), CallbackList([], model, {}))
            model.fit_step = steps
            model.net.train()
            steps.start_epoch(None)
            batches = _endless(train_loader)
            best, average = math.inf, 0.0
            for step, lr in enumerate(lrs):
                for group in model.optimizer.param_groups:
                    group["lr"] = float(lr)
                loss, _, _ = steps.run(0, runtime.to_device(next(batches)))
                value = float(loss.detach())
                if not math.isfinite(value):
                    break
                raw.append(value)
                average = smoothing * average + (1 - smoothing) * value
                smoothed = average / (1 - smoothing ** (step + 1))
                best = min(best, smoothed)
                if smoothed > diverge * best:
                    break
        finally:
            model.fit_step = None
            runtime.teardown()
    if len(raw) < 3:
        raise ValueError(
            f"lr_find stopped after {len(raw)} step(s): the loss diverged at once from start_lr={start_lr}. "
            "Try a smaller start_lr, and check the data with model.doctor(...)."
        )
    history = pd.DataFrame({"lr": lrs[: len(raw)], "loss": _smoothed(raw, smoothing), "raw_loss": raw})
    suggestion = steepest_descent(history["lr"].to_numpy(), history["loss"].to_numpy())
    if plan.where == "rank":  # every process of the job gets rank 0's answer
        suggestion = _from_rank_zero(suggestion)
    return LRFinderResult(history, suggestion)


def steepest_descent(lrs: np.ndarray, losses: np.ndarray) -> float:
    """The learning rate where ``losses`` fall fastest against ``log10(lrs)``, before their minimum.

    The slope at a point is measured across ``k = len // 20`` points on each side (at least
    one), so that batch-to-batch noise, large against the small steps of ``log10(lr)``, does
    not pass for a descent.

    >>> lrs = np.geomspace(1e-4, 1, 5)
    >>> steepest_descent(lrs, np.array([2.0, 1.9, 1.0, 0.8, 3.0]))
    0.01
    """
    lowest = int(np.argmin(losses))
    span = max(1, len(losses) // 20)
    if lowest < 2 * span:
        return float(lrs[lowest] / 10)  # no descent to measure: a tenth of the lowest point
    logs = np.log10(lrs)
    points = np.arange(span, lowest - span + 1)
    slopes = (losses[points + span] - losses[points - span]) / (logs[points + span] - logs[points - span])
    return float(lrs[int(points[np.argmin(slopes)])])


def one_cycle_steps(model: TrainableModel, data: FitData, fit_arguments: dict) -> int:
    """How many optimizer steps ``fit`` will take per epoch (per process): what OneCycleLR must count."""
    settings = DataSettings(
        batch_size=fit_arguments.get("batch_size"),
        shuffle=fit_arguments.get("shuffle", True),
        validation_split=fit_arguments.get("validation_split", 0.0),
        steps_per_epoch=fit_arguments.get("steps_per_epoch"),
    )
    if settings.steps_per_epoch is not None:
        batches = settings.steps_per_epoch
    else:
        loader, _ = prepare_data(data, settings, keep_float64=False, pin_memory=False)
        batches = num_batches(loader) or 0
        if not batches:
            raise ValueError(
                "fit_one_cycle plans its schedule from the number of batches in an epoch, and this training "
                "data has no length: pass steps_per_epoch=..."
            )
        devices = fit_arguments.get("devices", "auto")
        accelerator = fit_arguments.get("accelerator", "auto")
        plan = make_plan(DeviceSettings(accelerator=accelerator, devices=devices), model.net)
        batches = math.ceil(batches / plan.num_processes)  # each process gets its share, padded to equal
    return math.ceil(batches / fit_arguments.get("gradient_accumulation_steps", 1))


def _check_range(start_lr: float, end_lr: float, num_steps: int, smoothing: float, diverge: float) -> None:
    if not (isinstance(start_lr, (int, float)) and isinstance(end_lr, (int, float)) and 0 < start_lr < end_lr):
        raise ValueError(f"lr_find needs 0 < start_lr < end_lr; got start_lr={start_lr!r}, end_lr={end_lr!r}.")
    if not isinstance(num_steps, int) or isinstance(num_steps, bool) or num_steps < 5:
        raise ValueError(f"num_steps={num_steps!r}; lr_find needs at least 5 steps (100 is usual).")
    if not 0 <= smoothing < 1:
        raise ValueError(f"smoothing={smoothing!r}; use a number in [0, 1), e.g. 0.98.")
    if not diverge > 1:
        raise ValueError(f"diverge={diverge!r}; use a factor > 1, e.g. 4 (stop when the loss is 4x its best).")


def _smoothed(raw: list[float], smoothing: float) -> list[float]:
    out, average = [], 0.0
    for step, value in enumerate(raw):
        average = smoothing * average + (1 - smoothing) * value
        out.append(average / (1 - smoothing ** (step + 1)))
    return out


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


__all__ = ["LRFinderResult", "lr_find", "one_cycle_steps", "steepest_descent"]
