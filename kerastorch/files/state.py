"""Training-state files: what they hold, written atomically, read without ever running code from the file.

A training state is a nest of dicts, lists and tuples whose leaves are tensors, numbers
and strings. It is written with ``torch.save`` (to a temporary file that is fsynced and
renamed, see :func:`~kerastorch.files.weights.atomic_write`) and read with
``torch.load(weights_only=True)``, which rebuilds only such plain values and refuses
any pickled object that would call a function, so a crafted file cannot run code.

Anything else in the state (a lambda in a scheduler, a custom object in a callback's
``state_dict``) is refused when it is *written*, naming where it sits, so a state that
could not be read back safely is never left on disk.

What a training state holds (``format`` ``"kerastorch.training_state"``, ``version`` 2):

- where the run is: ``epoch`` (finished epochs), ``batches`` (trained of the next one, 0 after an
  epoch), ``epoch_lr`` (that epoch's learning rates by history column: ``lr``, ``lr_1``...; a float
  in a state saved before), ``stopped`` (stopped early), ``history`` (the rows so far);
- what trains: ``net`` (the whole weights), ``loss_fn`` (a loss module's state, or None),
  ``optimizer`` with ``optimizer_type`` and ``optimizer_param_shapes``, ``lr_scheduler`` with
  ``lr_scheduler_type``, ``grad_scaler``, and ``model_attributes``: the optimizers, schedulers and
  grad scalers the model holds besides (a GAN's ``self.d_optimizer``), by attribute name, each as
  ``{"type", "state"}`` (and ``"param_shapes"`` for an optimizer);
- ``callbacks`` (each callback's ``state_dict()`` by class name) and ``monitors`` (what each
  monitoring callback watches);
- the data: ``batch_size`` and ``batches_per_epoch`` of one process's training data (None where
  unknown);
- ``processes``: each process's ``rng`` (every random generator), ``data`` (its place in the
  data) and ``meters`` (the epoch's partial sums), in rank order.

:func:`read_training_state` reads a file, upgrades a version-1 state and refuses anything else
before a single value of it is used; a key added after version 2 first shipped
(``model_attributes``, ``batch_size``, ``batches_per_epoch``) may be missing from an older file.

Example::

    save_state_file({"epoch": 3, "weights": net.state_dict()}, "run.state")
    state = load_state_file("run.state")
"""

from __future__ import annotations

import collections
import os
from typing import Any

import numpy as np
import torch

from .atomic import atomic_write
from .weights import load_plain


def training_state_path(ckpt_path: str | os.PathLike) -> str:
    """Where ``fit(ckpt_path=..., resume=True)`` keeps the training state: ``ckpt_path + ".state"``."""
    return os.fspath(ckpt_path) + ".state"


STATE_FORMAT = "kerastorch.training_state"
STATE_VERSION = 2
REQUIRED_KEYS = ("epoch", "history", "net", "optimizer_type", "optimizer_param_shapes", "optimizer", "processes")

_PLAIN_LEAVES = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device, torch.Size)


def to_plain(obj: Any, where: str = "state", copy: bool = False) -> Any:
    """A copy of ``obj`` made only of values that ``torch.load(weights_only=True)`` reads back.

    Tensors are detached and moved to the CPU; numpy scalars become python numbers.
    Anything else raises a ``TypeError`` that names its place, e.g. ``state['lr_scheduler']['lr_lambdas'][0]``.
    ``copy=True`` copies every tensor, those already in host memory too: for a state written while
    training goes on changing the optimizer's and the net's tensors in place.
    """
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True) if copy else obj.detach().cpu()
    if type(obj) in _PLAIN_LEAVES:
        return obj
    if isinstance(obj, np.generic):
        return obj.item()
    if type(obj) in (dict, collections.OrderedDict):
        plain = type(obj)()
        for key, value in obj.items():
            if type(key) not in (str, int):
                raise TypeError(
                    f"{where} has the key {key!r} (a {type(key).__name__}); a training state's keys must "
                    "be strings or ints."
                )
            plain[key] = to_plain(value, f"{where}[{key!r}]", copy)
        return plain
    if type(obj) in (list, tuple):
        return type(obj)(to_plain(value, f"{where}[{i}]", copy) for i, value in enumerate(obj))
    raise TypeError(
        f"{where} is a {type(obj).__name__}, which a training state cannot hold: it could only be read back by "
        "running code stored in the file. A state_dict() should return tensors, numbers, strings and "
        "dicts/lists of them (for a LambdaLR, use a plain function rather than a lambda or a callable object)."
    )


def save_state_file(state: dict, path: str | os.PathLike) -> None:
    """Write ``state`` to ``path`` atomically: a kill leaves the old file or the new one, never half of one."""
    write_plain_state(to_plain(state), path)


def write_plain_state(plain: dict, path: str | os.PathLike) -> None:
    """Write a state that :func:`to_plain` made, atomically. It computes nothing with torch (it hands
    host tensors to the file), so it may run on a writer's thread (:mod:`.background`)."""
    atomic_write(path, lambda tmp: torch.save(plain, tmp))


def load_state_file(path: str | os.PathLike) -> dict:
    """Read a file written by :func:`save_state_file`, executing nothing stored in it."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"No training state at {path!r}.")
    state = load_plain(
        path,
        "{path!r} could not be read as a training state, so it was not loaded (only plain "
        "tensors and numbers are read, never code stored in the file): {reason}. If the file "
        "is damaged or not yours, delete it to start fresh, or pass resume=False.",
    )
    if not isinstance(state, dict):
        raise ValueError(
            f"{path!r} holds a {type(state).__name__}, not a training state. Delete it to start fresh, "
            "or pass resume=False."
        )
    return state


def read_training_state(path: str | os.PathLike) -> dict:
    """A training state file, read (:func:`load_state_file`), upgraded to this version and checked to
    be whole: its format, version and keys, and a history that ends at its epoch. The checks against
    the model that resumes it are the caller's."""
    path = os.fspath(path)
    state = upgraded(load_state_file(path))
    if (
        state.get("format") != STATE_FORMAT
        or state.get("version") != STATE_VERSION
        or any(key not in state for key in REQUIRED_KEYS)
    ):
        raise ValueError(
            f"{path!r} is not a kerastorch training state (version {STATE_VERSION}). Delete it to start "
            "fresh, or pass resume=False."
        )
    history, epoch = state.get("history"), state.get("epoch")
    ends_at_its_epoch = isinstance(history, list) and (
        history[-1].get("epoch") == epoch if history else state.get("batches", 0) > 0  # inside the first epoch
    )
    if not ends_at_its_epoch or not isinstance(state.get("processes"), list) or not state["processes"]:
        raise ValueError(
            f"The training state in {path!r} is inconsistent (its history does not end at its epoch). "
            "Delete it to start fresh, or pass resume=False."
        )
    return state


def upgraded(state: dict) -> dict:
    """A state written by version 1 (one random state for every process, epochs only) read as version 2."""
    if state.get("format") == STATE_FORMAT and state.get("version") == 1 and "rng" in state:
        state = dict(state, version=STATE_VERSION, batches=0, epoch_lr=None)
        state["processes"] = [{"rng": state.pop("rng"), "data": {"pass": None, "workers": {}}, "meters": None}]
        state["any_processes"] = True  # version 1 restored its one random state into every process
    return state


def describe_position(state: dict) -> str:
    """``after epoch 3`` or ``in epoch 4 after batch 17``: where a saved run stopped."""
    if state.get("batches"):
        return f"in epoch {state['epoch'] + 1} after batch {state['batches']}"
    return f"after epoch {state['epoch']}"


__all__ = [
    "STATE_FORMAT",
    "STATE_VERSION",
    "describe_position",
    "load_state_file",
    "read_training_state",
    "save_state_file",
    "to_plain",
    "training_state_path",
    "write_plain_state",
]
