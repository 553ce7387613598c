"""What a ``fit`` (or ``evaluate``, ``predict``, ``lr_find``) call asked for, grouped by concern
into small frozen dataclasses.

Each group is built by its own ``from_keywords``, beside its fields: it takes the call's keywords
by name (keyword-only), checks their values, and leaves the other groups' keywords alone. The door
(:mod:`kerastorch.arguments`) hands every group the whole call, in kerastorch's words, and checks
only what joins keywords of several groups or needs the model: each keyword's value is checked in
one place. The run, the checks and the callbacks each take the group they need, and trust it.

A new keyword of ``fit`` is therefore the method's parameter (its signature and docstring in
:mod:`kerastorch.model`), a field and its check here, the code that reads it, and a test.

>>> OutputSettings.from_keywords(verbose=2, plot=False, wandb=False, epochs=3)
OutputSettings(verbose=2, plot=False, wandb=False)
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Optional, Sequence, Union

import torch

from .devices.words import parse_accelerator_word, parse_precision
from .files.state import training_state_path
from .files.writable import check_writable
from .helpers.values import (
    check_batch_size,
    check_flag,
    check_mode,
    check_real_number,
    check_steps,
    check_verbose_level,
    check_whole_number,
)
from .strategies import Strategy, parse_strategy

DEFAULT_BATCH_SIZE = 32  # Keras's, for the loaders kerastorch builds from arrays and Datasets
DEFAULT_PATIENCE = 5  # fit's patience="auto" when a value is monitored
ON_OOM_CHOICES = ("split", "split_batchnorm", "raise")  # fit(on_oom=...): what a step that runs out of memory does
AUTO = "auto"  # the word for "kerastorch decides" (monitor, patience, mode)


@dataclasses.dataclass(frozen=True)
class MonitorSettings:
    """Which value picks the best epoch, and what follows from it."""

    # None: nothing monitored, the last epoch's weights stay. from_keywords keeps "auto" (for monitor and
    # mode), which callbacks.monitor.monitor_for_run decides for the run, at the door.
    monitor: Optional[str] = "val_loss"
    mode: str = "min"  # "min" or "max"
    min_delta: float = 0.0
    patience: Optional[int] = DEFAULT_PATIENCE  # None: never stop early
    ckpt_path: Optional[Union[str, os.PathLike]] = None
    resume: bool = False
    mode_was_auto: bool = False  # mode chosen by fit, from the metric or the name (fit's first line says so)
    restore_best_weights: bool = True  # False: the best epoch is marked and written, the last one's weights stay
    monitor_was_auto: bool = False  # monitor="auto": a custom train_step without a loss makes it None
    mode_source: str = "from its name"  # where a mode chosen by fit came from, for its first line

    @classmethod
    def from_keywords(
        cls,
        *,
        monitor: Any,
        mode: Any,
        min_delta: Any,
        patience: Any,
        ckpt_path: Any,
        resume: Any,
        restore_best_weights: Any,
        **other_groups: Any,
    ) -> MonitorSettings:
        """fit's keywords on the value that picks the best epoch, checked. ``monitor="auto"`` and
        ``mode="auto"`` stay words here: what they mean depends on the run (its validation data, its
        metrics), and :func:`~kerastorch.callbacks.monitor.monitor_for_run` decides it at the door.
        ``patience="auto"`` is 5 epochs, or none when nothing is monitored."""
        check_patience(patience)
        check_mode(mode)
        check_real_number("min_delta", min_delta)
        check_flag("restore_best_weights", restore_best_weights, error=TypeError)
        if ckpt_path is not None:
            check_writable(ckpt_path)
        check_resume(resume, ckpt_path)
        if monitor is None:
            if patience is not None and patience != AUTO:
                raise ValueError(
                    f"patience={patience!r} stops a run when the monitored value stops improving, but monitor=None "
                    "monitors nothing. Name the value to watch (monitor='val_loss', or a value your train_step "
                    "returns, e.g. monitor='train_g_loss'), or leave patience out."
                )
            mode, patience = "min", None
        elif not isinstance(monitor, str) or not monitor:
            raise TypeError(
                f"monitor={monitor!r}; give the name of a history column (e.g. 'val_acc'), 'auto' (val_loss, or "
                "train_loss without validation data) or None (nothing monitored: the last epoch's weights stay)."
            )
        elif patience == AUTO:
            patience = DEFAULT_PATIENCE
        return cls(
            monitor=monitor,
            mode=mode,
            min_delta=min_delta,
            patience=patience,
            ckpt_path=ckpt_path,
            resume=resume,
            restore_best_weights=restore_best_weights,
        )


def check_patience(patience: Any) -> None:
    """A whole number of epochs, None (never stop early) or "auto"; a path in its place (Keras's order
    puts patience fourth, where torchkeras programs passed the checkpoint's path) says so."""
    if isinstance(patience, (str, os.PathLike)) and patience != AUTO:
        if not isinstance(patience, str) or looks_like_a_path(patience):
            raise TypeError(
                f"patience={patience!r} looks like a file path. fit's fourth argument is patience (Keras's "
                "order), not the checkpoint's path. Pass it by name: fit(train_data, val_data, epochs, "
                f"ckpt_path={os.fspath(patience)!r})."
            )
        number = f"patience={patience.strip()}" if patience.strip().isdigit() else "e.g. patience=5"
        raise TypeError(
            f"patience={patience!r} is a string, but it must be a whole number of epochs >= 0 (or patience=None "
            f"to never stop early): {number}."
        )
    if patience is not None and patience != AUTO:
        check_whole_number("patience", patience, minimum=0, hint=" (or patience=None to never stop early)")


def check_resume(resume: Any, ckpt_path: Any) -> None:
    """``resume=True`` keeps the training state beside ``ckpt_path``, which it therefore needs."""
    if not isinstance(resume, bool):
        raise TypeError(f"resume={resume!r} must be True or False.")
    if not resume:
        return
    if ckpt_path is None:
        raise ValueError(
            "resume=True needs a ckpt_path: the best weights go to that file and the training state "
            "beside it. Try fit(..., ckpt_path='runs/best.safetensors', resume=True), which keeps the "
            "state in 'runs/best.safetensors.state'."
        )
    state_path = training_state_path(ckpt_path)
    if os.path.isdir(state_path):
        raise ValueError(
            f"The training state goes to {state_path!r}, which is a folder. Move it away, or choose another ckpt_path."
        )


def looks_like_a_path(value: str) -> bool:
    """A string with a folder or a file extension in it ('best.pt', 'runs/best'), and not a number ('5', '2.5')."""
    try:
        float(value)
        return False
    except ValueError:
        return "/" in value or os.sep in value or bool(os.path.splitext(value)[1])


@dataclasses.dataclass(frozen=True)
class OutputSettings:
    """What the run shows: progress (``verbose`` 0, 1, 2), the live plot, Weights & Biases."""

    verbose: int = 1
    plot: bool = False
    wandb: Union[bool, dict] = False

    @classmethod
    def from_keywords(cls, *, verbose: Any, plot: Any, wandb: Any, **other_groups: Any) -> OutputSettings:
        """fit's display keywords, checked (torchkeras's ``quiet=True`` reaches here as ``verbose=0``)."""
        return cls(verbose=check_verbose_level(verbose), plot=plot, wandb=wandb)

    def silenced(self) -> OutputSettings:
        """For every process but the main one: nothing printed, drawn or logged."""
        return dataclasses.replace(self, verbose=0, plot=False, wandb=False)


@dataclasses.dataclass(frozen=True)
class DeviceSettings:
    """Lightning's words, parsed: the accelerator word, the devices as given, the canonical precision,
    the strategy asked for (None: "auto") and ``torch.compile``'s arguments (None: eager)."""

    accelerator: str = "auto"
    devices: Any = "auto"
    precision: str = "32-true"
    strategy: Optional[Strategy] = None
    compile: Optional[dict] = None

    @classmethod
    def from_keywords(
        cls,
        *,
        accelerator: Any = "auto",
        devices: Any = "auto",
        precision: Any = "32-true",
        strategy: Any = "auto",
        compile: Any = False,
        fsdp_wrap: Any = None,
        **other_groups: Any,
    ) -> DeviceSettings:
        """Lightning's words for where and how the run trains, parsed without touching the hardware
        (:mod:`kerastorch.devices.plan` matches them against the machine; ``devices`` is checked
        there, against the devices it finds). ``lr_find`` takes no strategy nor compile: theirs are
        the defaults."""
        return cls(
            accelerator=parse_accelerator_word(accelerator),
            devices=devices,
            precision=parse_precision(precision),
            strategy=parse_strategy(strategy, fsdp_wrap),
            compile=parse_compile(compile),
        )


def parse_compile(compile: Any = False) -> Optional[dict]:
    """Return the keyword arguments for ``torch.compile``, or None when the net runs eagerly.

    ``True`` compiles with torch's defaults, a dict is passed to ``torch.compile``, and
    ``"strict"`` adds ``{"strict": True}``: a failure to compile raises instead of warning.

    >>> parse_compile(False) is None
    True
    >>> parse_compile({"mode": "reduce-overhead"})
    {'mode': 'reduce-overhead'}
    >>> parse_compile("strict")
    {'strict': True}
    """
    if compile is False or compile is None:
        return None
    if compile is True:
        return {}
    if isinstance(compile, str) and compile.strip().lower() == "strict":
        return {"strict": True}
    if isinstance(compile, dict) and all(isinstance(key, str) for key in compile):
        return dict(compile)
    raise ValueError(
        f"compile={compile!r} is not understood; expected True, False, 'strict' or a dict of "
        "torch.compile arguments such as {'mode': 'max-autotune'}."
    )


@dataclasses.dataclass(frozen=True)
class StepSettings:
    """How gradients become updates."""

    accumulation_steps: int = 1
    clip_val: Optional[float] = None
    clip_algorithm: str = "norm"
    scheduler_interval: str = "epoch"
    monitor: Optional[str] = "val_loss"  # what a ReduceLROnPlateau scheduler is stepped with
    on_oom: str = "split"  # out of memory: "split" (micro-batches), "split_batchnorm" (BatchNorm too) or "raise"

    @classmethod
    def from_keywords(
        cls,
        *,
        gradient_accumulation_steps: Any,
        gradient_clip_val: Any,
        gradient_clip_algorithm: Any,
        lr_scheduler: Any,
        lr_scheduler_interval: str,
        monitoring: MonitorSettings,
        on_oom: Any,
        **other_groups: Any,
    ) -> StepSettings:
        """fit's keywords on how gradients become updates, checked; the model's scheduler is stepped
        at its ``lr_scheduler_interval``, a ``ReduceLROnPlateau`` with the monitored value."""
        check_whole_number("gradient_accumulation_steps", gradient_accumulation_steps, minimum=1)
        if on_oom not in ON_OOM_CHOICES:
            raise ValueError(
                f"on_oom={on_oom!r}; use 'split' (the default: a batch that runs out of memory is trained as "
                "micro-batches with the same update), 'split_batchnorm' (the same for a net with BatchNorm layers, "
                "which then normalise over micro-batches) or 'raise' (torch's error, as it comes)."
            )
        if monitoring.monitor is None and isinstance(lr_scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
            raise ValueError(
                "The lr_scheduler is a ReduceLROnPlateau, which fit steps with the monitored value, but monitor=None "
                "monitors nothing. Name the value it should follow (monitor='val_loss'), or use "
                "callbacks=[kt.callbacks.ReduceLROnPlateau('val_loss')] with its own monitor."
            )
        clip_val = gradient_clip_val
        if clip_val is not None and (
            not isinstance(clip_val, (int, float)) or isinstance(clip_val, bool) or clip_val <= 0
        ):
            raise ValueError(f"gradient_clip_val={clip_val!r} must be a positive number (or None for no clipping).")
        if gradient_clip_algorithm not in ("norm", "value"):
            raise ValueError(f"gradient_clip_algorithm={gradient_clip_algorithm!r}; use 'norm' or 'value'.")
        return cls(
            accumulation_steps=gradient_accumulation_steps,
            clip_val=clip_val,
            clip_algorithm=gradient_clip_algorithm,
            scheduler_interval=lr_scheduler_interval,
            monitor=monitoring.monitor,
            on_oom=on_oom,
        )


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

    @classmethod
    def from_keywords(
        cls,
        *,
        batch_size: Any = None,
        shuffle: Any = True,
        validation_split: Any = 0.0,
        class_weight: Any = None,
        steps_per_epoch: Any = None,
        validation_freq: Any = 1,
        validation_steps: Any = None,
        validation_batch_size: Any = None,
        x: Any = None,
        validation_data: Any = None,
        **other_groups: Any,
    ) -> DataSettings:
        """Keras's words for how arrays and Datasets become batches and how long an epoch is, checked;
        the messages name the data by the keyword it came with (``x`` or ``train_data``...). ``lr_find``
        and ``doctor`` take fewer of these: the others are the defaults."""
        check_batch_size("batch_size", batch_size)
        check_batch_size("validation_batch_size", validation_batch_size)
        check_flag("shuffle", shuffle, error=TypeError)
        if (
            not isinstance(validation_split, (int, float))
            or isinstance(validation_split, bool)
            or not 0 <= validation_split < 1
        ):
            raise ValueError(
                f"validation_split={validation_split!r}; use a fraction in [0, 1), e.g. 0.2 for the last 20 %."
            )
        check_steps("steps_per_epoch", steps_per_epoch)
        check_steps("validation_steps", validation_steps)
        if validation_split:
            val_name = "the validation split"
        else:
            val_name = "validation_data" if validation_data is not None else "val_data"
        return cls(
            batch_size=batch_size,
            shuffle=shuffle,
            validation_split=validation_split,
            class_weight=class_weight,
            steps_per_epoch=steps_per_epoch,
            validation_freq=check_validation_freq(validation_freq),
            validation_steps=validation_steps,
            validation_batch_size=validation_batch_size,
            train_name="x" if x is not None else "train_data",
            val_name=val_name,
        )


def check_validation_freq(validation_freq: Any) -> Union[int, tuple[int, ...]]:
    """Every n epochs (a whole number >= 1), or Keras's list of the epochs to validate (1-based)."""
    if isinstance(validation_freq, (list, tuple)):
        if not validation_freq or not all(
            isinstance(epoch, int) and not isinstance(epoch, bool) and epoch >= 1 for epoch in validation_freq
        ):
            raise ValueError(
                f"validation_freq={validation_freq!r}: a list names the epochs to validate, 1-based, e.g. "
                "validation_freq=[1, 5, 10]; or give a whole number n to validate every n epochs."
            )
        return tuple(sorted(set(validation_freq)))
    check_whole_number(
        "validation_freq", validation_freq, minimum=1, hint=" (every n epochs), or a list of epochs like [1, 5, 10]"
    )
    return int(validation_freq)


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

    @classmethod
    def from_keywords(
        cls, *, batch_size: Any, verbose: Any, steps: Any, callbacks: Sequence[Any], return_dict: Any, **data: Any
    ) -> EvaluateSettings:
        """``evaluate``'s keywords but the data, checked (the callbacks come in as kerastorch callbacks)."""
        return cls(
            batch_size=check_batch_size("batch_size", batch_size),
            verbose=check_verbose_level(verbose),
            steps=check_steps("steps", steps),
            callbacks=callbacks,
            return_dict=check_flag("return_dict", return_dict, error=TypeError),
        )


@dataclasses.dataclass(frozen=True)
class PredictSettings:
    """What a ``predict`` call asked for, besides the data (Keras's keywords, and ``concatenate``)."""

    batch_size: Optional[int] = None
    verbose: int = 1  # 0: no progress bar; 1: one when predicting takes a while
    steps: Optional[int] = None
    callbacks: Sequence[Any] = ()
    concatenate: bool = True  # False: a list with each batch's outputs (Lightning's trainer.predict)

    @classmethod
    def from_keywords(
        cls, *, batch_size: Any, verbose: Any, steps: Any, callbacks: Sequence[Any], concatenate: Any, **data: Any
    ) -> PredictSettings:
        """``predict``'s keywords but the data, checked (the callbacks come in as kerastorch callbacks)."""
        return cls(
            batch_size=check_batch_size("batch_size", batch_size),
            verbose=check_verbose_level(verbose),
            steps=check_steps("steps", steps),
            callbacks=callbacks,
            concatenate=check_flag("concatenate", concatenate, error=TypeError),
        )


@dataclasses.dataclass(frozen=True)
class FinderSettings:
    """``lr_find``'s range test: the rates tried and when it stops."""

    start_lr: float = 1e-7
    end_lr: float = 10.0
    num_steps: int = 100
    smoothing: float = 0.98
    diverge: float = 4.0

    @classmethod
    def from_keywords(
        cls, *, start_lr: Any, end_lr: Any, num_steps: Any, smoothing: Any, diverge: Any, **other_groups: Any
    ) -> FinderSettings:
        """``lr_find``'s range-test keywords, checked."""
        if not (
            isinstance(start_lr, (int, float))
            and isinstance(end_lr, (int, float))
            and not isinstance(start_lr, bool)
            and 0 < start_lr < end_lr
        ):
            raise ValueError(f"lr_find needs 0 < start_lr < end_lr; got start_lr={start_lr!r}, end_lr={end_lr!r}.")
        if not isinstance(num_steps, int) or isinstance(num_steps, bool) or num_steps < 5:
            raise ValueError(f"num_steps={num_steps!r}; lr_find needs at least 5 steps (100 is usual).")
        if not isinstance(smoothing, (int, float)) or not 0 <= smoothing < 1:
            raise ValueError(f"smoothing={smoothing!r}; use a number in [0, 1), e.g. 0.98.")
        if not isinstance(diverge, (int, float)) or not diverge > 1:
            raise ValueError(f"diverge={diverge!r}; use a factor > 1, e.g. 4 (stop when the loss is 4x its best).")
        return cls(
            start_lr=float(start_lr),
            end_lr=float(end_lr),
            num_steps=num_steps,
            smoothing=float(smoothing),
            diverge=float(diverge),
        )


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
