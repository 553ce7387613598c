"""Checks of single values, shared by the settings' builders (fit's keywords) and by the callbacks' own arguments,
each raising an error that says what was wrong and what to pass.

>>> check_whole_number("epochs", 3, minimum=0), check_flag("shuffle", True)
(3, True)
"""

from __future__ import annotations

import math
import numbers
from typing import Any


def check_whole_number(name: str, value: Any, minimum: int, hint: str = "") -> int:
    """``value`` as an int when it is a whole number >= ``minimum`` (not a bool); else a ValueError saying so."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name}={value!r} must be a whole number >= {minimum}{hint}.")
    return int(value)


def check_real_number(name: str, value: Any, hint: str = "") -> float:
    """``value`` as a float when it is a real number (not a bool); else a TypeError saying so."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}={value!r} must be a number{hint}.")
    if math.isnan(value):  # every comparison with NaN is False: a min_delta of NaN lets no epoch improve
        raise ValueError(
            f"{name}=nan is not a number, and every comparison with it is False: pass a real number{hint}."
        )
    return float(value)


def check_verbose(verbose: Any, hint: str = "") -> int:
    """``verbose`` as an int (True is 1); a TypeError for anything but a whole number >= 0."""
    if isinstance(verbose, bool):
        return int(verbose)
    if not isinstance(verbose, numbers.Integral) or verbose < 0:
        raise TypeError(f"verbose={verbose!r} must be 0 (silent) or 1 (say what it does){hint}.")
    return int(verbose)


def check_verbose_level(verbose: Any) -> int:
    """Keras's ``verbose`` for ``fit``, ``evaluate`` and ``predict``: 0, 1 or 2 (True and False too)."""
    if verbose not in (0, 1, 2, False, True):
        raise ValueError(f"verbose={verbose!r}; use 0 (silent), 1 (progress bars) or 2 (one line per epoch).")
    return int(verbose)


def check_batch_size(name: str, size: Any) -> Any:
    """A number of samples per batch, or None for the default (32, or sized from the steps)."""
    if size is not None and (not isinstance(size, int) or size < 1 or isinstance(size, bool)):
        raise ValueError(f"{name}={size!r}; use a whole number of samples >= 1, e.g. 32.")
    return size


def check_steps(name: str, steps: Any) -> Any:
    """Keras's ``steps_per_epoch``, ``validation_steps`` and ``steps``: a number of batches, or None for
    a whole pass."""
    if steps is not None:
        check_whole_number(name, steps, minimum=1, hint=" (or None for a whole pass over the data)")
    return steps


MODES = ("min", "max")


def check_mode(mode: Any) -> str:
    """``"min"``, ``"max"`` or ``"auto"``: which way a monitored value is better."""
    if mode not in (*MODES, "auto"):
        raise ValueError(
            f"mode={mode!r} is not supported; use 'min' (lower is better, e.g. a loss), 'max' (e.g. accuracy), or "
            "'auto' (from the monitored name)."
        )
    return mode


def check_flag(name: str, value: Any, error: type[Exception] = ValueError) -> bool:
    """True or False, nothing else."""
    if not isinstance(value, bool):
        raise error(f"{name}={value!r} must be True or False.")
    return value


__all__ = [
    "check_batch_size",
    "MODES",
    "check_flag",
    "check_mode",
    "check_real_number",
    "check_steps",
    "check_verbose",
    "check_verbose_level",
    "check_whole_number",
]
