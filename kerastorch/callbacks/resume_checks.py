"""What a saved training state must match to be resumed, checked before anything of it is loaded.

A state goes on with the run that wrote it: the same net, optimizer and lr scheduler, the same
optimizers, schedulers and grad scalers kept as attributes of the model, the same metrics and
monitored values, as many processes, and training data of the same batch size and number of
batches per epoch. Each check refuses a state that does not match with what differs and the two
ways out: resume with what the saved run had, or delete the state (``resume=False``) to start fresh.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional

from ..files.state import describe_position
from ..strategies import unwrap
from ..training.snapshot import model_attributes
from .monitor import MonitorCallback
from .state_contents import describe_groups, keyed_callbacks, param_shapes


def _fresh(path: str) -> str:
    return f"delete {path!r} (or pass resume=False) to start fresh"


def check_state_fits(state: dict, model: Any, path: str) -> None:
    """Refuse a state saved from another net, optimizer or scheduler."""
    fresh = f"Resume with the same net, optimizer and lr_scheduler, or {_fresh(path)}."
    saved, current = state["net"], unwrap(model.net).state_dict()
    problems = [f"{k} is missing from the saved state" for k in current if k not in saved]
    problems += [f"{k} is in the saved state but not in this net" for k in saved if k not in current]
    problems += [
        f"{k} has shape {tuple(saved[k].shape)} there and {tuple(current[k].shape)} here"
        for k in current
        if k in saved and tuple(saved[k].shape) != tuple(current[k].shape)
    ]
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise ValueError(
            f"The training state in {path!r} was saved from a different net: {'; '.join(problems[:3])}{more}. " + fresh
        )
    optimizer = model.optimizer
    if state["optimizer_type"] != type(optimizer).__name__:
        raise ValueError(
            f"The training state in {path!r} was saved with a {state['optimizer_type']} optimizer, but "
            f"this model has a {type(optimizer).__name__}. " + fresh
        )
    saved_shapes = [[list(s) for s in g] for g in state["optimizer_param_shapes"]]
    if saved_shapes != param_shapes(optimizer):
        raise ValueError(
            f"The training state in {path!r} was saved with an optimizer over other parameters: "
            f"{describe_groups(saved_shapes)} there, {describe_groups(param_shapes(optimizer))} here. " + fresh
        )
    scheduler_type = type(model.lr_scheduler).__name__ if model.lr_scheduler is not None else None
    if state.get("lr_scheduler_type") != scheduler_type:
        raise ValueError(
            f"The training state in {path!r} was saved with lr_scheduler={state.get('lr_scheduler_type')}, "
            f"but this model has lr_scheduler={scheduler_type}. " + fresh
        )


def check_same_attributes(state: dict, model: Any, path: str) -> None:
    """The optimizers, schedulers and grad scalers the model holds as attributes are those the state
    kept, of the same types (an optimizer over parameters of the same shapes)."""
    saved = state.get("model_attributes") or {}
    current = model_attributes(model)
    fix = f"Resume with the model that wrote it, or {_fresh(path)}."
    if set(saved) != set(current):
        there = ", ".join(f"{name} ({saved[name]['type']})" for name in saved)
        here = ", ".join(f"{name} ({type(value).__name__})" for name, value in current.items())
        kept = f"the model's own {there}" if there else "none of the model's own optimizers, schedulers or grad scalers"
        raise ValueError(
            f"The training state in {path!r} keeps {kept}; this model holds {here or 'none'}, so one of them could not "
            "go on where it was. " + fix
        )
    for name, value in current.items():
        if saved[name]["type"] != type(value).__name__:
            raise ValueError(
                f"The training state in {path!r} was saved with model.{name} a {saved[name]['type']}, and this "
                f"model's is a {type(value).__name__}. " + fix
            )
        shapes = saved[name].get("param_shapes")
        if shapes is not None and [[list(s) for s in g] for g in shapes] != param_shapes(value):
            raise ValueError(
                f"The training state in {path!r} was saved with model.{name} over other parameters: "
                f"{describe_groups(shapes)} there, {describe_groups(param_shapes(value))} here. " + fix
            )


def check_same_processes(state: dict, model: Any, path: str) -> None:
    """A state holds each process's random state and data position: it resumes under as many processes."""
    saved = len(state["processes"])
    runtime = getattr(model, "runtime", None)
    current = runtime.num_processes if runtime is not None else 1
    if saved != current and not state.get("any_processes"):
        raise ValueError(
            f"The training state in {path!r} was saved by {saved} process(es), and this run has {current}: each "
            f"process's random state and place in the data are part of it. Resume with devices={saved} (or the "
            f"same launcher command), or delete it (or pass resume=False) to start fresh."
        )


def check_same_batches(state: dict, batch_size: Optional[int], batches_per_epoch: Optional[int], path: str) -> None:
    """The training data's batch size and batches per epoch are the saved run's: its place in the data,
    its data order and its schedule count batches of that size."""
    saved_size, saved_batches = state.get("batch_size"), state.get("batches_per_epoch")
    differs = []
    if None not in (saved_size, batch_size) and saved_size != batch_size:
        differs.append(f"batches of {saved_size} there and of {batch_size} here")
    if None not in (saved_batches, batches_per_epoch) and saved_batches != batches_per_epoch:
        differs.append(f"{saved_batches} batches an epoch there and {batches_per_epoch} here")
    if not differs:
        return
    if state.get("batches"):
        why = f"it stopped {describe_position(state)}: going on from there with these batches would skip rows or train some twice"
    else:
        why = "its data order and its learning-rate schedule count the saved run's batches"
    same = (
        f"batch_size={saved_size}" if saved_size is not None and saved_size != batch_size else "the same training data"
    )
    raise ValueError(
        f"The training state in {path!r} was saved with other training batches: {'; '.join(differs)} (for each "
        f"process), and {why}. Resume with {same} (and the same steps_per_epoch), or {_fresh(path)}."
    )


def check_same_metrics(state: dict, names: Optional[list], path: str) -> None:
    """A resumed run must log the metrics the saved one logged: the history's columns would mix."""
    if names is None or not state.get("history"):
        return
    saved = {k for row in state["history"] for k in row if k.startswith("train_") and k != "train_loss"}
    current = {k for k in names if k.startswith("train_") and k != "train_loss"}
    if saved != current:
        raise ValueError(
            f"The training state in {path!r} was saved with the metrics {sorted(m[6:] for m in saved)}, but this run "
            f"has {sorted(m[6:] for m in current)}: the history would mix columns. Resume with the same metrics_dict, "
            "or delete the state file (or pass resume=False) to start fresh."
        )


def monitored_values(callbacks: Iterable[Any]) -> dict[str, list]:
    """What each monitoring callback (early stopping, best weights) watches: ``{key: [monitor, mode]}``."""
    return {
        key: [cb.monitor, cb.mode] for key, cb in keyed_callbacks(callbacks).items() if isinstance(cb, MonitorCallback)
    }


def check_same_monitors(state: dict, callbacks: Iterable[Any], path: str) -> None:
    """A best score kept for one value must not be compared with another."""
    saved = state.get("monitors", {})
    for key, (monitor, mode) in monitored_values(callbacks).items():
        if key in saved and list(saved[key]) != [monitor, mode]:
            was_monitor, was_mode = saved[key]
            raise ValueError(
                f"The training state in {path!r} was saved with {key} watching monitor={was_monitor!r}, "
                f"mode={was_mode!r}; this run asks for monitor={monitor!r}, mode={mode!r}, so its best score would "
                f"be compared with another value. Resume with monitor={was_monitor!r}, mode={was_mode!r}, or delete "
                f"{path!r} (or pass resume=False) to start fresh."
            )


__all__ = [
    "check_same_attributes",
    "check_same_batches",
    "check_same_metrics",
    "check_same_monitors",
    "check_same_processes",
    "check_state_fits",
    "monitored_values",
]
