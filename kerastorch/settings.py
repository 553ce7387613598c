"""``fit``'s flat keywords, grouped once by concern into small frozen dataclasses.

Users type the flat words that Keras, torchkeras and Lightning taught them; the run,
the checks and the callback builder each take the one group they need. The
torchkeras spellings (``quiet``, ``mixed_precision``, ``cpu``) are mapped here, and
the words for devices and precision are parsed here (without touching hardware).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Optional, Sequence, Union

from .options import parse_accelerator_word, parse_compile, parse_fsdp_wrap, parse_precision, parse_strategy


@dataclasses.dataclass(frozen=True)
class MonitorSettings:
    """Which value picks the best epoch, and what follows from it."""

    monitor: str = "val_loss"
    mode: str = "min"  # "min" or "max": fit resolves "auto" before the run
    min_delta: float = 0.0
    patience: Optional[int] = 5  # None: never stop early
    ckpt_path: Optional[Union[str, os.PathLike]] = None
    resume: bool = False
    mode_was_auto: bool = False  # mode chosen from the monitored name (fit's first line says so)


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
    """Lightning's words, parsed: the accelerator word, the devices as given, the canonical precision."""

    accelerator: str = "auto"
    devices: Any = "auto"
    precision: str = "32-true"
    strategy: str = "auto"
    compile: Optional[dict] = None  # torch.compile's arguments, or None to run eagerly
    fsdp_wrap: tuple[type, ...] = ()  # the module classes strategy="fsdp" shards as blocks


@dataclasses.dataclass(frozen=True)
class StepSettings:
    """How gradients become updates."""

    accumulation_steps: int = 1
    clip_val: Optional[float] = None
    clip_algorithm: str = "norm"
    scheduler_interval: str = "epoch"
    monitor: str = "val_loss"  # what a ReduceLROnPlateau scheduler is stepped with


DEFAULT_BATCH_SIZE = 32  # Keras's, for the loaders kerastorch builds from arrays and Datasets


@dataclasses.dataclass(frozen=True)
class DataSettings:
    """How arrays and Datasets become batches, and how much of them an epoch is (Keras's words)."""

    batch_size: Optional[int] = None  # None: 32 for the loaders kerastorch builds
    shuffle: bool = True  # training data only
    validation_split: float = 0.0  # the last fraction of the samples, before shuffling
    class_weight: Any = None  # {class: weight} or "balanced"
    steps_per_epoch: Optional[int] = None  # None: one pass over the training data
    validation_freq: int = 1  # validate every n epochs


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

    def metric_names(self, metrics_dict: dict) -> list[str]:
        """The run's metric names: the model's metrics, then the weighted ones."""
        return [*metrics_dict, *(self.weighted_metrics or {})]


def fit_settings(
    *,
    has_val_data: bool,
    scheduler_interval: str,
    epochs: int,
    patience: Optional[int],
    monitor: Optional[str],
    mode: str,
    min_delta: float,
    ckpt_path: Any,
    resume: Any,
    callbacks: Any,
    verbose: Any,
    plot: bool,
    quiet: Optional[bool],
    wandb: Any,
    accelerator: Any,
    devices: Any,
    precision: Any,
    mixed_precision: Optional[str],
    cpu: bool,
    strategy: Any,
    gradient_accumulation_steps: Any,
    gradient_clip_val: Any,
    gradient_clip_algorithm: Any,
    data: Optional[DataSettings] = None,
    compile: Any = False,
    fsdp_wrap: Any = None,
) -> FitSettings:
    """Group ``fit``'s keywords. Words are parsed here; numbers are checked by :mod:`kerastorch.checks`."""
    if quiet is not None:  # torchkeras's quiet=True is verbose=0
        verbose = 0 if quiet else verbose
    monitor = monitor or ("val_loss" if has_val_data else "train_loss")
    strategy = parse_strategy(strategy)
    return FitSettings(
        epochs=epochs,
        callbacks=callbacks,
        monitoring=MonitorSettings(monitor, mode, min_delta, patience, ckpt_path, resume),
        output=OutputSettings(verbose, plot, wandb),
        devices=DeviceSettings(
            parse_accelerator_word(accelerator, cpu),
            devices,
            parse_precision(precision, mixed_precision),
            strategy,
            parse_compile(compile),
            parse_fsdp_wrap(fsdp_wrap, strategy),
        ),
        step=StepSettings(
            gradient_accumulation_steps, gradient_clip_val, gradient_clip_algorithm, scheduler_interval, monitor
        ),
        data=data or DataSettings(),
    )


def fit_settings_devices(
    accelerator: Any, devices: Any, precision: Any, mixed_precision: Optional[str], cpu: bool, strategy: Any = "auto"
) -> DeviceSettings:
    """The devices group alone (for ``lr_find``), parsed as :func:`fit_settings` parses it."""
    return DeviceSettings(
        parse_accelerator_word(accelerator, cpu),
        devices,
        parse_precision(precision, mixed_precision),
        parse_strategy(strategy),
    )


__all__ = ["DeviceSettings", "FitSettings", "MonitorSettings", "OutputSettings", "StepSettings", "fit_settings"]
