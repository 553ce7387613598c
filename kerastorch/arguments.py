"""The one door for the keywords of ``fit``, ``fit_one_cycle``, ``lr_find``, ``doctor``, ``evaluate``
and ``predict``.

``KerasModel``'s methods hand the door their arguments as they were called: every parameter by
name, its default filled in by Python from the method's own signature, the only one written.
The door puts the call in kerastorch's words (torchkeras's ``quiet``, ``mixed_precision`` and
``cpu`` translated by :mod:`kerastorch.compat.arguments`, Keras's ``x=`` and ``validation_data=``
merged with ``train_data`` and ``val_data``, callbacks written for torchkeras wrapped), then hands
the whole call to each settings group: its ``from_keywords`` checks the keywords it reads
(:mod:`kerastorch.settings`). The door itself checks only what joins keywords of several groups,
or a keyword and the model (``initial_epoch`` and ``epochs``, ``weighted_metrics`` and the
model's metrics), and :func:`~kerastorch.callbacks.monitor.monitor_for_run` decides what
``monitor="auto"`` and ``mode="auto"`` mean for the run.

What leaves the door is the data as given (:class:`FitData`) and frozen settings; everything
downstream trusts them. Checks that need the data as loaders, the net or the first batch are not
about keywords: they live in :mod:`kerastorch.training.model_checks` and
:mod:`kerastorch.training.first_batch`.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Union

from .callbacks.monitor import monitor_for_run
from .compat.arguments import in_kerastorch_words
from .compat.callbacks import as_callback
from .compat.runners import program_runners
from .data.forms import EvalData, FitData, keras_positional
from .data.sample_weights import check_sample_weight
from .helpers.values import check_flag, check_whole_number
from .settings import (
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
from .training.callback import Callback, logs_added_by
from .training.metric_meters import is_stateful_metric


def fit_arguments(model: Any, called: Mapping[str, Any]) -> tuple[FitData, FitSettings]:
    """``KerasModel.fit``'s arguments as it was called, checked: the data given and the run's settings
    (see ``KerasModel.fit`` for what each keyword means)."""
    given = in_kerastorch_words(called)
    data = fit_data(**given)
    data_settings = DataSettings.from_keywords(**given)
    if data_settings.validation_split and data.val is not None:
        raise ValueError("Both validation_split and val_data/validation_data were given; pass only one of them.")
    epochs, initial_epoch, weighted_metrics = given["epochs"], given["initial_epoch"], given["weighted_metrics"]
    check_whole_number("epochs", epochs, minimum=0)
    check_initial_epoch(initial_epoch, epochs, given["resume"])
    check_weighted_metrics(weighted_metrics, model.metrics_dict)
    has_val = data.val is not None or bool(data_settings.validation_split)
    check_validation_freq(data_settings.validation_freq, epochs, has_val, initial_epoch)
    for name in ("validation_steps", "validation_batch_size"):
        if given[name] is not None and not has_val:
            raise ValueError(
                f"{name}={given[name]} applies to validation data, and there is none: pass validation_data=(X_val, "
                f"y_val) or validation_split=0.2, or drop {name}."
            )
    users_callbacks = callback_arguments(given["callbacks"])
    monitoring = monitor_for_run(
        MonitorSettings.from_keywords(**given),
        has_val=has_val,
        metrics={**model.metrics_dict, **(weighted_metrics or {})},
        added_logs=logs_added_by(users_callbacks),
        # A program's own step (its StepRunner class, or an overridden train_step) names its values on
        # its first batch: the monitored name is checked then.
        names_known=program_runners(model) is None and getattr(model, "uses_default_train_step", True),
        lr_groups=len(getattr(model.optimizer, "param_groups", ())) or 1,  # a wrong optimizer is refused later
    )
    step = StepSettings.from_keywords(
        **given,
        lr_scheduler=model.lr_scheduler,
        lr_scheduler_interval=model.lr_scheduler_interval,
        monitoring=monitoring,
    )
    settings = FitSettings(
        epochs=epochs,
        callbacks=users_callbacks,
        monitoring=monitoring,
        output=OutputSettings.from_keywords(**given),
        devices=DeviceSettings.from_keywords(**given),
        step=step,
        data=data_settings,
        doctor=check_flag("doctor", given["doctor"]),
        weighted_metrics=weighted_metrics,
        initial_epoch=initial_epoch,
    )
    return data, settings


def evaluate_arguments(called: Mapping[str, Any]) -> tuple[EvalData, EvaluateSettings]:
    """``KerasModel.evaluate``'s arguments as it was called, checked: the data given, and how it is
    evaluated (``x=`` and torchkeras's ``val_data=`` name the data, ``quiet=True`` is ``verbose=0``)."""
    given = in_kerastorch_words(called)
    data = one_of("data", one_of("data", given["data"], "x", given["x"]), "val_data", given["val_data"])
    if data is None:
        raise ValueError(
            "evaluate needs data: evaluate(X, y), evaluate((X, y)), evaluate(dataset) or evaluate(loader)."
        )
    given["callbacks"] = callback_arguments(given["callbacks"])
    return EvalData(data, given["y"], given["sample_weight"]), EvaluateSettings.from_keywords(**given)


def predict_arguments(called: Mapping[str, Any]) -> tuple[EvalData, PredictSettings]:
    """``KerasModel.predict``'s arguments as it was called, checked (``x=`` names the data;
    ``concatenate=False`` asks for a list of each batch's outputs)."""
    given = dict(called)
    data = one_of("data", given["data"], "x", given["x"])
    if data is None:
        raise ValueError("predict needs data: predict(X), predict([X1, X2]), predict(dataset) or predict(loader).")
    given["callbacks"] = callback_arguments(given["callbacks"])
    return EvalData(data), PredictSettings.from_keywords(**given)


def finder_arguments(
    called: Mapping[str, Any],
) -> tuple[FitData, DeviceSettings, DataSettings, FinderSettings]:
    """``KerasModel.lr_find``'s arguments as it was called, checked: the data, where it runs, how
    batches are made, and the range test's settings."""
    given = in_kerastorch_words(called)
    data = fit_data(**given)
    return (
        data,
        DeviceSettings.from_keywords(**given),
        DataSettings.from_keywords(**given),
        FinderSettings.from_keywords(**given),
    )


def max_lr_argument(max_lr: Any) -> Optional[float]:
    """``fit_one_cycle``'s peak learning rate: a positive number, or None to let ``lr_find`` choose."""
    if max_lr is None:
        return None
    if not isinstance(max_lr, (int, float)) or isinstance(max_lr, bool) or max_lr <= 0:
        raise ValueError(f"max_lr={max_lr!r}; use a positive learning rate, or None to let lr_find choose.")
    return float(max_lr)


def doctor_arguments(called: Mapping[str, Any]) -> tuple[FitData, DataSettings]:
    """``KerasModel.doctor``'s arguments as it was called, checked: the data and how its batches are made."""
    check_whole_number("num_batches", called["num_batches"], minimum=1)
    check_whole_number("overfit_steps", called["overfit_steps"], minimum=1)
    return fit_data(**called), DataSettings.from_keywords(**called)


# -- what joins keywords --------------------------------------------------------------------------


def fit_data(
    *,
    train_data: Any,
    val_data: Any = None,
    x: Any = None,
    y: Any = None,
    validation_data: Any = None,
    sample_weight: Any = None,
    **settings: Any,
) -> FitData:
    """The data as given, under one name each: Keras's ``x`` / ``validation_data`` are ``train_data`` /
    ``val_data``, and ``fit(X, y)`` puts the labels in ``val_data``'s place. ``lr_find`` and ``doctor``
    take fewer of these."""
    train = one_of("train_data", train_data, "x", x)
    y, val = keras_positional(train, val_data, y)
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
    "doctor_arguments",
    "evaluate_arguments",
    "finder_arguments",
    "fit_arguments",
    "max_lr_argument",
    "predict_arguments",
]
