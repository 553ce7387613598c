"""What a ``fit`` (or ``evaluate``, ``predict``) call asked for, grouped by concern into small frozen
dataclasses.

:mod:`kerastorch.arguments` (the one door for the keywords) checks every keyword and builds
these; the run, the checks and the callback builder each take the one group they need, and
trust its values.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Optional, Sequence, Union

from .strategies import Strategy

DEFAULT_BATCH_SIZE = 32  # Keras's, for the loaders kerastorch builds from arrays and Datasets
DEFAULT_PATIENCE = 5  # fit's patience="auto" when a value is monitored
AUTO = "auto"  # the word for "kerastorch decides" (monitor, patience, mode)


@dataclasses.dataclass(frozen=True)
class MonitorSettings:
    """Which value picks the best epoch, and what follows from it."""

    monitor: Optional[str] = "val_loss"  # None: nothing monitored, the last epoch's weights stay
    mode: str = "min"  # "min" or "max": "auto" is resolved at the door
    min_delta: float = 0.0
    patience: Optional[int] = DEFAULT_PATIENCE  # None: never stop early
    ckpt_path: Optional[Union[str, os.PathLike]] = None
    resume: bool = False
    mode_was_auto: bool = False  # mode chosen by fit, from the metric or the name (fit's first line says so)
    restore_best_weights: bool = True  # False: the best epoch is marked and written, the last one's weights stay
    monitor_was_auto: bool = False  # monitor="auto": a custom train_step without a loss makes it None
    mode_source: str = "from its name"  # where a mode chosen by fit came from, for its first line


@dataclasses.dataclass(frozen=True)
class OutputSettings:
    """What the run shows: progress (``verbose`` 0, 1, 2), the live plot, Weights & Biases."""

    verbose: int = 1
    plot: bool = False
    wandb: Union[bool, dict] = False

    def silenced(self) -> OutputSettings:
        """For every process but the main one: nothing printed, drawn or logged."""
        return OutputSettings(verbose=0, plot=False, wandb=False)


@dataclasses.dataclass(frozen=True)
class DeviceSettings:
    """Lightning's words, parsed: the accelerator word, the devices as given, the canonical precision,
    the strategy asked for (None: "auto") and ``torch.compile``'s arguments (None: eager)."""

    accelerator: str = "auto"
    devices: Any = "auto"
    precision: str = "32-true"
    strategy: Optional[Strategy] = None
    compile: Optional[dict] = None


@dataclasses.dataclass(frozen=True)
class StepSettings:
    """How gradients become updates."""

    accumulation_steps: int = 1
    clip_val: Optional[float] = None
    clip_algorithm: str = "norm"
    scheduler_interval: str = "epoch"
    monitor: Optional[str] = "val_loss"  # what a ReduceLROnPlateau scheduler is stepped with


@dataclasses.dataclass(frozen=True)
class DataSettings:
    """How arrays and Datasets become batches, and how much of them an epoch is (Keras's words)."""

    batch_size: Optional[int] = None  # None: 32 for the loaders kerastorch builds
    shuffle: bool = True  # training data only
    validation_split: float = 0.0  # the last fraction of the samples, before shuffling
    class_weight: Any = None  # {class: weight} or "balanced"
    steps_per_epoch: Optional[int] = None  # None: one pass over the training data
    validation_freq: Union[int, tuple[int, ...]] = 1  # validate every n epochs, or (Keras's list) the epochs listed
    validation_steps: Optional[int] = None  # None: every validation batch; else the first n of each validation
    validation_batch_size: Optional[int] = None  # None: batch_size's
    train_name: str = "train_data"  # what messages call the data: the keyword it came with
    val_name: str = "val_data"  # "validation_data", or "the validation split"


def is_validated(epoch: int, validation_freq: Union[int, Sequence[int]]) -> bool:
    """Whether ``epoch`` (1-based) is validated: every n-th (Keras's n, 2n, ...), or one of those listed
    (Keras's ``validation_freq=[1, 5, 10]``)."""
    if isinstance(validation_freq, int):
        return epoch % validation_freq == 0
    return epoch in validation_freq


def describe_validated(validation_freq: Union[int, Sequence[int]]) -> str:
    """The validated epochs, in words: "epochs 4, 8, ..." or "epochs 1, 5, 10"."""
    if isinstance(validation_freq, int):
        return f"epochs {validation_freq}, {2 * validation_freq}, ..."
    return "epochs " + ", ".join(map(str, validation_freq))


@dataclasses.dataclass(frozen=True)
class EvaluateSettings:
    """What an ``evaluate`` call asked for, besides the data (Keras's keywords)."""

    batch_size: Optional[int] = None  # None: 32 for the loaders kerastorch builds (or from steps)
    verbose: int = 1  # 0: nothing printed; 1 or 2: the values
    steps: Optional[int] = None  # None: every batch; else the first n
    callbacks: Sequence[Any] = ()
    return_dict: bool = True  # False: Keras's list (or a single number)


@dataclasses.dataclass(frozen=True)
class PredictSettings:
    """What a ``predict`` call asked for, besides the data (Keras's keywords, and ``concatenate``)."""

    batch_size: Optional[int] = None
    verbose: int = 1  # 0: no progress bar; 1: one when predicting takes a while
    steps: Optional[int] = None
    callbacks: Sequence[Any] = ()
    concatenate: bool = True  # False: a list with each batch's outputs (Lightning's trainer.predict)


@dataclasses.dataclass(frozen=True)
class FinderSettings:
    """``lr_find``'s range test: the rates tried and when it stops."""

    start_lr: float = 1e-7
    end_lr: float = 10.0
    num_steps: int = 100
    smoothing: float = 0.98
    diverge: float = 4.0


@dataclasses.dataclass(frozen=True)
class FitSettings:
    """Everything one ``fit`` call asked for, besides the model and the data."""

    epochs: int
    callbacks: Sequence[Any]
    monitoring: MonitorSettings
    output: OutputSettings
    devices: DeviceSettings
    step: StepSettings
    data: DataSettings = DataSettings()
    doctor: bool = False  # run model.doctor first and stop on an error
    weighted_metrics: Optional[dict] = None  # {name: f(preds, labels)}, averaged with the sample weights
    initial_epoch: int = 0  # Keras's: epochs already done; the first epoch trained is initial_epoch + 1

    def metric_names(self, metrics_dict: dict) -> list[str]:
        """The run's metric names: the model's metrics, then the weighted ones."""
        return [*metrics_dict, *(self.weighted_metrics or {})]


__all__ = [
    "AUTO",
    "DEFAULT_PATIENCE",
    "DataSettings",
    "DeviceSettings",
    "EvaluateSettings",
    "FinderSettings",
    "FitSettings",
    "MonitorSettings",
    "OutputSettings",
    "PredictSettings",
    "StepSettings",
    "describe_validated",
    "is_validated",
]
