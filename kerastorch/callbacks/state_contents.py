"""What a training state holds besides the run's position, and how each part is taken and put back.

- **Every optimizer, scheduler and grad scaler the model holds**: fit's (``model.optimizer``,
  ``model.lr_scheduler``, the grad scaler of ``precision="16-mixed"``) and the model's own, found
  among its attributes: an attribute that is a torch optimizer, an lr scheduler or a
  ``torch.amp.GradScaler`` (a GAN's ``self.d_optimizer``), or a list, tuple or dict attribute of
  them (``self.optimizers = [...]``). They are saved under their attribute names (``d_optimizer``,
  ``optimizers[1]``, ``optimizers['critic']``) and put back bit for bit.
- A loss that is a module: its parameters and buffers (a learned temperature).
- Each callback's ``state_dict()``, by class name (``EarlyStopping``, ``EarlyStopping#2`` ...).
- The training data's shape: the batch size and the batches of an epoch (one process's), which a
  resumed run must share (:func:`~kerastorch.callbacks.resume_checks.check_same_batches`).

A ``train_step`` of the user's own may update parameters with an optimizer kept elsewhere (a
variable of the notebook): the state could not restore it. Such a run is refused before training
(:func:`check_optimizers_found`), saying to keep it as an attribute of the model.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Optional

import torch

from ..data.peek import num_batches
from ..data.resumable import innermost_dataloader
from ..files.state import to_plain
from ..strategies import strategy_of, unwrap
from ..training.snapshot import model_attributes

# -- the model's own optimizers, schedulers and grad scalers ------------------------------------


def attributes_state(model: Any) -> dict[str, dict]:
    """The state of each of :func:`model_attributes`: ``{name: {"type", "state"[, "param_shapes"]}}``
    (an optimizer's with whole tensors, as the strategy gathers them)."""
    strategy = strategy_of(model)
    saved = {}
    for name, value in model_attributes(model).items():
        if isinstance(value, torch.optim.Optimizer):
            entry = {"state": strategy.whole_optimizer_state(value), "param_shapes": param_shapes(value)}
        else:
            entry = {"state": value.state_dict()}
        saved[name] = {"type": type(value).__name__, **entry}
    return saved


def load_attributes_state(model: Any, saved: Optional[dict]) -> None:
    """Put back what :func:`attributes_state` saved (checked first by
    :func:`~kerastorch.callbacks.resume_checks.check_same_attributes`)."""
    strategy = strategy_of(model)
    for name, value in model_attributes(model).items():
        state = (saved or {})[name]["state"]
        if isinstance(value, torch.optim.Optimizer):
            strategy.load_whole_optimizer_state(value, state)
        elif state or not isinstance(value, torch.amp.GradScaler):  # a disabled scaler saves {} and loads nothing
            value.load_state_dict(state)


def check_optimizers_found(model: Any) -> None:
    """Refuse, before training, a ``train_step`` of the user's own whose net has parameters that no
    optimizer the state keeps updates: the optimizer that does would restart from scratch on resume."""
    if getattr(model, "uses_default_train_step", True):
        return  # fit's step updates model.optimizer's parameters only
    known = [model.optimizer, *(v for v in model_attributes(model).values() if isinstance(v, torch.optim.Optimizer))]
    covered = {id(p) for optimizer in known for group in optimizer.param_groups for p in group["params"]}
    left = [name for name, p in unwrap(model.net).named_parameters() if p.requires_grad and id(p) not in covered]
    if not left:
        return
    more = f" (and {len(left) - 3} more)" if len(left) > 3 else ""
    raise ValueError(
        f"The net's parameters {', '.join(left[:3])}{more} are in no optimizer the model holds, and this model "
        "trains with a train_step of its own. A training state (BackupAndRestore, resume=True) keeps "
        "model.optimizer and the optimizers, lr schedulers and grad scalers kept as attributes of the model (or "
        "in a list or dict attribute); an optimizer kept elsewhere would restart from scratch when the run "
        "resumes. Keep it on the model in __init__, e.g. self.d_optimizer = torch.optim.Adam(...) (and its "
        "scheduler as self.d_scheduler), or freeze parameters that are not trained (requires_grad_(False))."
    )


def check_serializable(model: Any, callbacks: Iterable[Any]) -> None:
    """Raise before training if some part of the state could not be written safely, naming it."""
    to_plain(strategy_of(model).whole_optimizer_state(model.optimizer), "optimizer.state_dict()")
    scheduler = model.lr_scheduler
    to_plain(scheduler.state_dict() if scheduler is not None else None, "lr_scheduler.state_dict()")
    for name, value in model_attributes(model).items():
        if not isinstance(value, torch.optim.Optimizer):  # an optimizer's state is tensors and numbers
            to_plain(value.state_dict(), f"model.{name}.state_dict()")
    for key, cb in keyed_callbacks(callbacks).items():
        to_plain(cb.state_dict(), f"the {key} callback's state_dict()")


def param_shapes(optimizer: Any) -> list[list[list[int]]]:
    """The shapes of an optimizer's parameters, group by group."""
    return [[list(p.shape) for p in group["params"]] for group in optimizer.param_groups]


def describe_groups(groups: list) -> str:
    """Parameter groups in a few words: ``4 tensors (2337 numbers)``."""
    return " + ".join(f"{len(g)} tensors ({sum(math.prod(s) for s in g)} numbers)" for g in groups) or "no parameters"


# -- the callbacks ----------------------------------------------------------------------------


def keyed_callbacks(callbacks: Iterable[Any]) -> dict[str, Any]:
    """Callbacks by class name (``EarlyStopping``, ``EarlyStopping#2`` ...), the key their state is saved under."""
    keyed: dict[str, Any] = {}
    for cb in callbacks:
        name = type(cb).__name__
        key, n = name, 1
        while key in keyed:
            n += 1
            key = f"{name}#{n}"
        keyed[key] = cb
    return keyed


# -- a loss that is a module: its learned parameters and buffers ----------------------------------


def loss_state(model: Any) -> Optional[dict]:
    """The loss's parameters and buffers (a learned temperature, a running count), or None for a
    loss that keeps nothing: its optimizer moments are in the optimizer's state already."""
    loss_fn = model.loss_fn
    if not isinstance(loss_fn, torch.nn.Module):
        return None
    state = {k: v.detach().to("cpu", copy=True) for k, v in loss_fn.state_dict().items()}
    return state or None


def load_loss_state(model: Any, state: Optional[dict]) -> None:
    """Put back what :func:`loss_state` saved; a loss that keeps nothing has nothing to load."""
    if state is None:
        return
    if not isinstance(model.loss_fn, torch.nn.Module):
        raise ValueError(
            f"The training state holds the state of a loss module ({', '.join(state)}), but this model's loss_fn "
            f"is a {type(model.loss_fn).__name__}. Resume with the same loss, or pass resume=False to start fresh."
        )
    model.loss_fn.load_state_dict(state)


# -- the training data's shape ------------------------------------------------------------------


def data_shape(loader: Any) -> tuple[Optional[int], Optional[int]]:
    """``(batch size, batches per epoch)`` of one process's training data; None where unknown (a
    loader without a length, batches that a ``batch_sampler`` sizes as it likes)."""
    torch_loader = innermost_dataloader(loader)
    size = getattr(torch_loader, "batch_size", None)
    if size is None:
        size = getattr(getattr(torch_loader, "batch_sampler", None), "batch_size", None)
    return (size if isinstance(size, int) else None), num_batches(loader) if loader is not None else None


__all__ = [
    "attributes_state",
    "check_optimizers_found",
    "check_serializable",
    "data_shape",
    "keyed_callbacks",
    "load_attributes_state",
    "model_attributes",
]
