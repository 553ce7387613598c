"""The one door for the keywords of ``fit``, ``fit_one_cycle``, ``lr_find``, ``doctor``, ``evaluate``
and ``predict``.

Users type the words Keras, torchkeras and Lightning taught them: ``x=`` or ``train_data=``,
``validation_data=`` or ``val_data=``, ``quiet=True`` or ``verbose=0``, ``mixed_precision="bf16"``
or ``precision="bf16-mixed"``, ``strategy="fsdp"`` or ``strategy=kt.strategies.FSDP(...)``. This
module is the only place that checks a keyword's value and resolves ``"auto"`` (the monitored
value and its mode, the strategy's word), and the only reader of the raw keywords: what leaves
it is frozen settings (:mod:`kerastorch.settings`) and the data as given (:class:`FitData`).
Everything downstream trusts them.

``KerasModel``'s methods take the same keywords, with the same defaults, and hand them here
unchanged (a test holds the two signatures equal). Adding a keyword touches this door, the
method's signature and docstring, the consumer, and a test.

Checks that need the data as loaders, the net or the first batch are not about keywords:
they live in :mod:`kerastorch.checks`.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import warnings
from typing import Any, Optional, Sequence, Union

import torch

from .callbacks.base import Callback, logs_added_by
from .callbacks.monitor import auto_mode_and_source, check_mode
from .callbacks.training_state import training_state_path
from .checks.values import check_flag, check_real_number, check_whole_number
from .compat.arguments import verbose_from_quiet
from .compat.callbacks import as_callback
from .compat.runners import program_runners
from .data.forms import EvalData, FitData, keras_positional
from .data.sample_weights import check_sample_weight
from .devices.words import parse_accelerator_word, parse_precision
from .files.writable import check_writable
from .settings import (
    AUTO,
    DEFAULT_PATIENCE,
    DataSettings,
    DeviceSettings,
    EvaluateSettings,
    FinderSettings,
    FitSettings,
    MonitorSettings,
    OutputSettings,
    PredictSettings,
    StepSettings,
    describe_validated,
    is_validated,
)
from .strategies import Strategy, parse_strategy
from .training.history import history_columns
from .training.metric_meters import is_stateful_metric


def fit_arguments(
    model: Any,
    train_data: Any = None,
    val_data: Any = None,
    epochs: int = 10,
    patience: Union[int, str, None] = "auto",
    monitor: Optional[str] = "auto",
    mode: str = "auto",
    min_delta: float = 0.0,
    ckpt_path: Optional[Union[str, os.PathLike]] = None,
    resume: bool = False,
    callbacks: Optional[Sequence] = None,
    verbose: int = 1,
    plot: bool = False,
    quiet: Optional[bool] = None,
    wandb: Union[bool, dict] = False,
    accelerator: str = "auto",
    devices: Any = "auto",
    precision: Any = "32-true",
    strategy: Union[str, Strategy] = "auto",
    mixed_precision: Optional[str] = None,
    cpu: bool = False,
    gradient_accumulation_steps: int = 1,
    gradient_clip_val: Optional[float] = None,
    gradient_clip_algorithm: str = "norm",
    *,
    restore_best_weights: bool = True,
    x: Any = None,
    y: Any = None,
    validation_data: Any = None,
    batch_size: Optional[int] = None,
    shuffle: bool = True,
    validation_split: float = 0.0,
    class_weight: Union[dict, str, None] = None,
    sample_weight: Any = None,
    steps_per_epoch: Optional[int] = None,
    validation_freq: Union[int, Sequence[int]] = 1,
    initial_epoch: int = 0,
    validation_steps: Optional[int] = None,
    validation_batch_size: Optional[int] = None,
    weighted_metrics: Optional[dict] = None,
    doctor: bool = False,
    compile: Union[bool, str, dict] = False,
    fsdp_wrap: Optional[Sequence[type]] = None,
) -> tuple[FitData, FitSettings]:
    """``KerasModel.fit``'s keywords, checked, as the data given and the run's settings (see
    ``KerasModel.fit`` for what each means)."""
    data = fit_data(train_data, val_data, x, y, validation_data, sample_weight)
    data_settings = data_arguments(
        batch_size,
        shuffle,
        validation_split,
        class_weight,
        steps_per_epoch,
        validation_freq,
        validation_steps,
        validation_batch_size,
    )
    train_name, val_name = data_names(x, validation_data, validation_split)
    data_settings = dataclasses.replace(data_settings, train_name=train_name, val_name=val_name)
    if validation_split and data.val is not None:
        raise ValueError("Both validation_split and val_data/validation_data were given; pass only one of them.")
    check_whole_number("epochs", epochs, minimum=0)
    check_initial_epoch(initial_epoch, epochs, resume)
    check_weighted_metrics(weighted_metrics, model.metrics_dict)
    has_val = data.val is not None or bool(validation_split)
    check_validation_freq(data_settings.validation_freq, epochs, has_val, initial_epoch)
    for name, value in (("validation_steps", validation_steps), ("validation_batch_size", validation_batch_size)):
        if value is not None and not has_val:
            raise ValueError(
                f"{name}={value} applies to validation data, and there is none: pass validation_data=(X_val, y_val) "
                f"or validation_split=0.2, or drop {name}."
            )
    metric_names = [*model.metrics_dict, *(weighted_metrics or {})]
    users_callbacks = callback_arguments(callbacks)
    monitoring = monitor_arguments(
        model,
        monitor,
        mode,
        min_delta,
        patience,
        ckpt_path,
        resume,
        has_val,
        metric_names,
        weighted_metrics,
        restore_best_weights,
        added_logs=logs_added_by(users_callbacks),
    )
    step = step_arguments(
        gradient_accumulation_steps,
        gradient_clip_val,
        gradient_clip_algorithm,
        model.lr_scheduler_interval,
        monitoring.monitor,
        model.lr_scheduler,
    )
    settings = FitSettings(
        epochs=epochs,
        callbacks=users_callbacks,
        monitoring=monitoring,
        output=output_arguments(verbose, quiet, plot, wandb),
        devices=device_arguments(accelerator, devices, precision, mixed_precision, cpu, strategy, compile, fsdp_wrap),
        step=step,
        data=data_settings,
        doctor=check_flag("doctor", doctor),
        weighted_metrics=weighted_metrics,
        initial_epoch=initial_epoch,
    )
    return data, settings


def evaluate_arguments(
    model: Any,
    data: Any = None,
    y: Any = None,
    batch_size: Optional[int] = None,
    verbose: int = 1,
    sample_weight: Any = None,
    steps: Optional[int] = None,
    callbacks: Optional[Sequence] = None,
    return_dict: bool = True,
    *,
    x: Any = None,
    val_data: Any = None,
    quiet: Optional[bool] = None,
) -> tuple[EvalData, EvaluateSettings]:
    """``KerasModel.evaluate``'s keywords, checked: the data given, and how it is evaluated (Keras's
    keywords in Keras's order; ``x=`` and torchkeras's ``val_data=`` name the data, ``quiet=True``
    is ``verbose=0``)."""
    data = one_of("data", one_of("data", data, "x", x), "val_data", val_data)
    if data is None:
        raise ValueError(
            "evaluate needs data: evaluate(X, y), evaluate((X, y)), evaluate(dataset) or evaluate(loader)."
        )
    settings = EvaluateSettings(
        batch_size=batch_size_argument("batch_size", batch_size),
        verbose=verbose_argument(verbose, quiet),
        steps=steps_argument("steps", steps),
        callbacks=callback_arguments(callbacks),
        return_dict=check_flag("return_dict", return_dict, error=TypeError),
    )
    return EvalData(data, y, sample_weight), settings


def predict_arguments(
    model: Any,
    data: Any = None,
    batch_size: Optional[int] = None,
    verbose: int = 1,
    steps: Optional[int] = None,
    callbacks: Optional[Sequence] = None,
    *,
    x: Any = None,
    concatenate: bool = True,
) -> tuple[EvalData, PredictSettings]:
    """``KerasModel.predict``'s keywords, checked (Keras's, in Keras's order; ``x=`` names the data;
    ``concatenate=False`` asks for a list of each batch's outputs)."""
    data = one_of("data", data, "x", x)
    if data is None:
        raise ValueError("predict needs data: predict(X), predict([X1, X2]), predict(dataset) or predict(loader).")
    settings = PredictSettings(
        batch_size=batch_size_argument("batch_size", batch_size),
        verbose=verbose_argument(verbose, None),
        steps=steps_argument("steps", steps),
        callbacks=callback_arguments(callbacks),
        concatenate=check_flag("concatenate", concatenate, error=TypeError),
    )
    return EvalData(data), settings


def finder_arguments(
    model: Any,
    train_data: Any = None,
    y: Any = None,
    *,
    start_lr: float = 1e-7,
    end_lr: float = 10.0,
    num_steps: int = 100,
    smoothing: float = 0.98,
    diverge: float = 4.0,
    x: Any = None,
    batch_size: Optional[int] = None,
    shuffle: bool = True,
    validation_split: float = 0.0,
    sample_weight: Any = None,
    accelerator: str = "auto",
    devices: Any = "auto",
    precision: Any = "32-true",
    mixed_precision: Optional[str] = None,
    cpu: bool = False,
) -> tuple[FitData, DeviceSettings, DataSettings, FinderSettings]:
    """``KerasModel.lr_find``'s keywords, checked: the data, where it runs, how batches are made,
    and the range test's settings."""
    data = fit_data(train_data, None, x, y, None, sample_weight)
    data_settings = data_arguments(batch_size, shuffle, validation_split)
    device_settings = device_arguments(accelerator, devices, precision, mixed_precision, cpu)
    return data, device_settings, data_settings, finder_range(start_lr, end_lr, num_steps, smoothing, diverge)


def finder_range(start_lr: float, end_lr: float, num_steps: int, smoothing: float, diverge: float) -> FinderSettings:
    """The range test's settings, checked."""
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
    return FinderSettings(float(start_lr), float(end_lr), num_steps, float(smoothing), float(diverge))


def max_lr_argument(max_lr: Any) -> Optional[float]:
    """``fit_one_cycle``'s peak learning rate: a positive number, or None to let ``lr_find`` choose."""
    if max_lr is None:
        return None
    if not isinstance(max_lr, (int, float)) or isinstance(max_lr, bool) or max_lr <= 0:
        raise ValueError(f"max_lr={max_lr!r}; use a positive learning rate, or None to let lr_find choose.")
    return float(max_lr)


def doctor_arguments(
    model: Any,
    train_data: Any = None,
    val_data: Any = None,
    *,
    y: Any = None,
    batch_size: Optional[int] = None,
    num_batches: int = 4,
    overfit_steps: int = 60,
) -> tuple[FitData, DataSettings]:
    """``KerasModel.doctor``'s keywords, checked: the data and how its batches are made."""
    check_whole_number("num_batches", num_batches, minimum=1)
    check_whole_number("overfit_steps", overfit_steps, minimum=1)
    return fit_data(train_data, val_data, None, y, None, None), data_arguments(batch_size, shuffle=True)


# -- the groups ----------------------------------------------------------------------------------


def fit_data(train: Any, val: Any, x: Any, y: Any, validation_data: Any, sample_weight: Any) -> FitData:
    """The data as given, under one name each: Keras's ``x`` / ``validation_data`` are ``train_data`` /
    ``val_data``, and ``fit(X, y)`` puts the labels in ``val_data``'s place."""
    train = one_of("train_data", train, "x", x)
    y, val = keras_positional(train, val, y)
    val = one_of("val_data", val, "validation_data", validation_data)
    check_sample_weight(sample_weight)
    return FitData(train, val, y, sample_weight)


def one_of(name: str, value: Any, alias: str, alias_value: Any) -> Any:
    """The value of a keyword that has two names; giving both is an error."""
    if alias_value is None:
        return value
    if value is not None:
        raise ValueError(f"Both {name} and {alias} were given; they are the same argument: pass one.")
    return alias_value


def data_names(x: Any, validation_data: Any, validation_split: Any) -> tuple[str, str]:
    """What the run's messages call the training and validation data: the words the user passed them with."""
    train_name = "x" if x is not None else "train_data"
    if validation_split:
        return train_name, "the validation split"
    return train_name, "validation_data" if validation_data is not None else "val_data"


def data_arguments(
    batch_size: Any = None,
    shuffle: Any = True,
    validation_split: Any = 0.0,
    class_weight: Any = None,
    steps_per_epoch: Any = None,
    validation_freq: Any = 1,
    validation_steps: Any = None,
    validation_batch_size: Any = None,
) -> DataSettings:
    """Keras's words for how arrays and Datasets become batches, and how long an epoch is."""
    batch_size_argument("batch_size", batch_size)
    batch_size_argument("validation_batch_size", validation_batch_size)
    check_flag("shuffle", shuffle, error=TypeError)
    if (
        not isinstance(validation_split, (int, float))
        or isinstance(validation_split, bool)
        or not 0 <= validation_split < 1
    ):
        raise ValueError(
            f"validation_split={validation_split!r}; use a fraction in [0, 1), e.g. 0.2 for the last 20 %."
        )
    steps_argument("steps_per_epoch", steps_per_epoch)
    validation_freq = validation_freq_argument(validation_freq)
    steps_argument("validation_steps", validation_steps)
    return DataSettings(
        batch_size,
        shuffle,
        validation_split,
        class_weight,
        steps_per_epoch,
        validation_freq,
        validation_steps,
        validation_batch_size,
    )


def validation_freq_argument(validation_freq: Any) -> Union[int, tuple[int, ...]]:
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


def batch_size_argument(name: str, size: Any) -> Optional[int]:
    """A number of samples per batch, or None for the default (32, or sized from ``steps``)."""
    if size is not None and (not isinstance(size, int) or size < 1 or isinstance(size, bool)):
        raise ValueError(f"{name}={size!r}; use a whole number of samples >= 1, e.g. 32.")
    return size


def steps_argument(name: str, steps: Any) -> Optional[int]:
    """Keras's ``steps_per_epoch``, ``validation_steps`` and ``steps``: a number of batches, or None for
    a whole pass."""
    if steps is not None:
        check_whole_number(name, steps, minimum=1, hint=" (or None for a whole pass over the data)")
    return steps


def looks_like_a_path(value: str) -> bool:
    """A string with a folder or a file extension in it ('best.pt', 'runs/best'), and not a number ('5', '2.5')."""
    try:
        float(value)
        return False
    except ValueError:
        return "/" in value or os.sep in value or bool(os.path.splitext(value)[1])


def monitor_arguments(
    model: Any,
    monitor: Optional[str],
    mode: str,
    min_delta: float,
    patience: Any,
    ckpt_path: Any,
    resume: Any,
    has_val: bool,
    metric_names: list[str],
    weighted_metrics: Optional[dict],
    restore_best_weights: Any = True,
    added_logs: Sequence[str] = (),
) -> MonitorSettings:
    """Which value picks the best epoch (``"auto"``: ``val_loss``, or ``train_loss`` without validation
    data; None: nothing, the last epoch's weights stay), in which direction (``"auto"``: from the metric
    or the name), and what follows: early stopping (``patience="auto"``: 5 epochs, or none when
    nothing is monitored) and the best weights put back."""
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
        return MonitorSettings(None, "min", min_delta, None, ckpt_path, resume, False, restore_best_weights)
    monitor_was_auto = monitor == AUTO
    if monitor_was_auto:
        monitor = "val_loss" if has_val else "train_loss"
    elif not isinstance(monitor, str) or not monitor:
        raise TypeError(
            f"monitor={monitor!r}; give the name of a history column (e.g. 'val_acc'), 'auto' (val_loss, or "
            "train_loss without validation data) or None (nothing monitored: the last epoch's weights stay)."
        )
    # A program's own step (its StepRunner class, or an overridden train_step) names its values on
    # its first batch: the monitored name is checked then.
    if program_runners(model) is None and getattr(model, "uses_default_train_step", True):
        check_monitor(monitor, metric_names, has_val, added_logs)
    mode_was_auto = mode == "auto"
    metrics = {**model.metrics_dict, **(weighted_metrics or {})}
    mode_source = ""
    if mode_was_auto:
        mode, mode_source = auto_mode_and_source(monitor, metrics)
    else:
        check_mode_against_metric(monitor, mode, metrics)
    return MonitorSettings(
        monitor,
        mode,
        min_delta,
        DEFAULT_PATIENCE if patience == AUTO else patience,
        ckpt_path,
        resume,
        mode_was_auto,
        restore_best_weights,
        monitor_was_auto,
        mode_source,
    )


def check_mode_against_metric(monitor: str, mode: str, metrics: dict) -> None:
    """Warn when ``mode`` contradicts the monitored metric's own ``higher_is_better`` (torchmetrics): the
    best weights would be the worst epoch's. Keras accepts any mode, so this is a warning, not a refusal."""
    bare = monitor.split("_", 1)[1] if monitor.startswith(("train_", "val_")) else monitor
    metric = metrics.get(bare)
    higher = getattr(metric, "higher_is_better", None)
    if isinstance(higher, bool) and mode != ("max" if higher else "min"):
        warnings.warn(
            f"mode={mode!r} for {monitor}, but its metric {type(metric).__name__} says higher_is_better={higher}: "
            f"the best weights would be those of the {'lowest' if mode == 'min' else 'highest'} {monitor}, and "
            f"early stopping would wait for it to {'fall' if mode == 'min' else 'rise'}. Pass "
            f"mode={'max' if higher else 'min'!r}, or mode='auto', which follows the metric.",
            UserWarning,
            stacklevel=5,  # the caller of KerasModel.fit
        )


def step_arguments(
    accumulation_steps: Any,
    clip_val: Any,
    clip_algorithm: Any,
    scheduler_interval: str,
    monitor: Optional[str],
    scheduler: Any = None,
) -> StepSettings:
    """How gradients become updates: accumulation, clipping, when the scheduler steps."""
    check_whole_number("gradient_accumulation_steps", accumulation_steps, minimum=1)
    if monitor is None and isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        raise ValueError(
            "The lr_scheduler is a ReduceLROnPlateau, which fit steps with the monitored value, but monitor=None "
            "monitors nothing. Name the value it should follow (monitor='val_loss'), or use "
            "callbacks=[kt.callbacks.ReduceLROnPlateau('val_loss')] with its own monitor."
        )
    if clip_val is not None and (not isinstance(clip_val, (int, float)) or isinstance(clip_val, bool) or clip_val <= 0):
        raise ValueError(f"gradient_clip_val={clip_val!r} must be a positive number (or None for no clipping).")
    if clip_algorithm not in ("norm", "value"):
        raise ValueError(f"gradient_clip_algorithm={clip_algorithm!r}; use 'norm' or 'value'.")
    return StepSettings(accumulation_steps, clip_val, clip_algorithm, scheduler_interval, monitor)


def output_arguments(verbose: Any, quiet: Optional[bool], plot: Any, wandb: Any) -> OutputSettings:
    """What the run shows: progress (``verbose``; ``quiet=True`` is ``verbose=0``), the plot, W&B."""
    return OutputSettings(verbose_argument(verbose, quiet), plot, wandb)


def verbose_argument(verbose: Any, quiet: Optional[bool]) -> int:
    """Keras's ``verbose`` (0, 1 or 2; True and False too); torchkeras's ``quiet=True`` is ``verbose=0``."""
    verbose = verbose_from_quiet(verbose, quiet)
    if verbose not in (0, 1, 2, False, True):
        raise ValueError(f"verbose={verbose!r}; use 0 (silent), 1 (progress bars) or 2 (one line per epoch).")
    return int(verbose)


def device_arguments(
    accelerator: Any = "auto",
    devices: Any = "auto",
    precision: Any = "32-true",
    mixed_precision: Optional[str] = None,
    cpu: bool = False,
    strategy: Any = "auto",
    compile: Any = False,
    fsdp_wrap: Any = None,
) -> DeviceSettings:
    """Lightning's words for where and how the run trains (torchkeras's ``mixed_precision`` and
    ``cpu`` too), parsed without touching the hardware; :mod:`kerastorch.devices.plan` matches them
    against the machine."""
    return DeviceSettings(
        parse_accelerator_word(accelerator, cpu),
        devices,
        parse_precision(precision, mixed_precision),
        parse_strategy(strategy, fsdp_wrap),
        parse_compile(compile),
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


def callback_arguments(callbacks: Any) -> tuple[Callback, ...]:
    """The user's callbacks as kerastorch callbacks (callbacks written for torchkeras are wrapped)."""
    if callbacks is None:
        return ()
    if isinstance(callbacks, Callback) or not isinstance(callbacks, (list, tuple)):
        raise TypeError(
            f"callbacks is a {type(callbacks).__name__}, but it must be a list of callbacks, e.g. "
            "callbacks=[kt.callbacks.EarlyStopping('val_loss', patience=3)]."
        )
    return tuple(as_callback(callback) for callback in callbacks)


# -- single values -------------------------------------------------------------------------------


def check_initial_epoch(initial_epoch: Any, epochs: int, resume: Any) -> None:
    """Keras's ``initial_epoch``: how many epochs are already done, so that ``fit`` trains epochs
    ``initial_epoch + 1 .. epochs`` (1-based, as the history counts them)."""
    check_whole_number("initial_epoch", initial_epoch, minimum=0)
    if not initial_epoch:
        return
    if resume is True:
        raise ValueError(
            f"initial_epoch={initial_epoch} and resume=True were both given. resume=True continues from the epoch its "
            "training state saved (with the weights, optimizer and history of that run); initial_epoch only numbers "
            "the epochs of a run that starts from the weights the net has now. Pass one of them."
        )
    if initial_epoch >= epochs:
        raise ValueError(
            f"initial_epoch={initial_epoch} and epochs={epochs}: epochs is the epoch to end at, as in Keras, so no "
            f"epoch would train. To train {epochs} more epochs, pass epochs={initial_epoch + epochs}."
        )


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


def check_validation_freq(
    validation_freq: Union[int, tuple[int, ...]], epochs: int, has_val: bool, initial_epoch: int = 0
) -> None:
    """Validation data that no epoch would validate: no val_loss, no best weights, no ckpt_path file.
    The run trains epochs ``initial_epoch + 1`` to ``epochs``."""
    trained = range(initial_epoch + 1, epochs + 1)
    if has_val and trained and not any(is_validated(epoch, validation_freq) for epoch in trained):
        which = f"epochs={epochs}" if not initial_epoch else f"epochs {initial_epoch + 1} to {epochs}"
        given = list(validation_freq) if isinstance(validation_freq, tuple) else validation_freq
        raise ValueError(
            f"validation_freq={given} with {which}: no epoch is validated (validation runs after "
            f"{describe_validated(validation_freq)}), so the run would have no val_loss, no best weights and "
            "nothing to write to ckpt_path. Pass a validation_freq that validates one of the epochs trained "
            "(validation_freq=1 validates every epoch), or more epochs."
        )


def check_monitor(monitor: str, metric_names: list[str], has_val: bool, added_logs: Sequence[str] = ()) -> None:
    """``monitor`` names a value the run will produce, known before the first batch: a column of the
    history, or a value a callback says it adds to the logs (``adds_logs``)."""
    names = [*history_columns(metric_names, has_val), *added_logs]
    if monitor in names:
        return
    if monitor.startswith("val_") and not has_val and monitor in history_columns(metric_names, True):
        raise ValueError(
            f"monitor={monitor!r} needs validation data, but val_data is None. Pass val_data=..., "
            f"or monitor one of: {', '.join(names)}."
        )
    close = difflib.get_close_matches(str(monitor), names, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ValueError(
        f"monitor={monitor!r} is not a value this run produces; available: {', '.join(names)}.{hint}"
        f"{WRITTEN_BY_A_CALLBACK}"
    )


# The way out when the value is one a callback of the user's writes into the logs (Keras's pattern).
WRITTEN_BY_A_CALLBACK = " If a callback of yours writes it into the logs, say so on its class: adds_logs = ('name',)."


def check_weighted_metrics(weighted_metrics: Optional[dict], metrics_dict: dict) -> None:
    """Functions under names of their own, apart from the model's metrics."""
    if weighted_metrics is None:
        return
    if not isinstance(weighted_metrics, dict):
        raise TypeError(
            f"weighted_metrics is a {type(weighted_metrics).__name__}; use a dict of name -> function, e.g. "
            "{'wacc': lambda preds, y: (preds.argmax(1) == y).float()}."
        )
    for name, fn in weighted_metrics.items():
        if not isinstance(name, str) or not name or not callable(fn) or is_stateful_metric(fn):
            raise TypeError(
                f"weighted_metrics[{name!r}] must be a function f(preds, labels) returning one value per "
                "sample (or per batch); stateful metric objects cannot be weighted."
            )
        if name in metrics_dict:
            raise ValueError(
                f"weighted_metrics[{name!r}] has the name of a metric in metrics_dict; give it another, "
                f"e.g. 'weighted_{name}'."
            )


__all__ = [
    "device_arguments",
    "doctor_arguments",
    "evaluate_arguments",
    "finder_arguments",
    "fit_arguments",
    "max_lr_argument",
    "parse_compile",
    "predict_arguments",
]
