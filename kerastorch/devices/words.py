"""Lightning's words for where and how a run trains, parsed without touching the hardware.

``fit(accelerator=..., devices=..., precision=...)`` are turned into canonical values here
(torchkeras's ``mixed_precision=`` and ``cpu=`` are translated into these words at the door, by
:mod:`kerastorch.compat.arguments`). Nothing in this module asks which devices exist: :mod:`kerastorch.devices.plan` matches the parsed values
against the machine, and :mod:`kerastorch.devices.runtime` builds what the loop talks to.
"""

from __future__ import annotations

import numbers
from typing import Any, Sequence, Union

import torch

ACCELERATORS = ("auto", "cpu", "gpu", "cuda", "mps")

PRECISIONS = ("32-true", "16-mixed", "bf16-mixed", "16-true", "bf16-true", "64-true")
_PRECISION_ALIASES: dict[Any, str] = {
    32: "32-true",
    "32": "32-true",
    64: "64-true",
    "64": "64-true",
    16: "16-mixed",
    "16": "16-mixed",
    "bf16": "bf16-mixed",
}

AUTOCAST_DTYPES = {"16-mixed": torch.float16, "bf16-mixed": torch.bfloat16}
PARAM_DTYPES = {"16-true": torch.float16, "bf16-true": torch.bfloat16, "64-true": torch.float64}
TRUE_PRECISION_OF = {dtype: name for name, dtype in PARAM_DTYPES.items()}  # torch.float64 -> "64-true"

DevicesArg = Union[int, str, Sequence[int]]


def parse_precision(precision: Any = "32-true") -> str:
    """Return the canonical precision name (one of :data:`PRECISIONS`).

    Accepts Lightning's names and aliases (``32``, ``"16"``, ``"bf16"`` ...).

    >>> parse_precision(64), parse_precision("bf16"), parse_precision(" 16-Mixed ")
    ('64-true', 'bf16-mixed', '16-mixed')
    """
    allowed = f"{', '.join(repr(p) for p in PRECISIONS)} or the aliases 32, 64, 16, '32', '64', '16', 'bf16'"
    if isinstance(precision, str):
        precision = precision.strip().lower()
    canonical = None
    if isinstance(precision, (str, int)) and not isinstance(precision, bool):
        canonical = precision if precision in PRECISIONS else _PRECISION_ALIASES.get(precision)
    if canonical is None:
        raise ValueError(f"precision={precision!r} is not supported; use {allowed}.")
    return canonical


def parse_accelerator_word(accelerator: Any = "auto") -> str:
    """Return the accelerator word, lower-cased: one of :data:`ACCELERATORS`.

    >>> parse_accelerator_word(" GPU "), parse_accelerator_word("auto")
    ('gpu', 'auto')
    """
    if not isinstance(accelerator, str) or accelerator.strip().lower() not in ACCELERATORS:
        raise ValueError(
            f"accelerator={accelerator!r} is not known; use one of {', '.join(repr(a) for a in ACCELERATORS)}."
        )
    return accelerator.strip().lower()


_DEVICES_ACCEPTED = (
    "an int k (the first k devices), -1 (all), a list of indices like [0, 2], "
    "or a string: '2' (the first 2), '-1' (all), '0, 2' or '2,' (those indices), 'auto'"
)


def parse_devices(
    devices: DevicesArg, num_available: int, interactive: bool = False, kind: str = "device"
) -> list[int]:
    """Turn Lightning's ``devices`` argument into a list of device indices.

    ``num_available`` is how many devices there are to choose from; ``kind`` names them
    in error messages (``"CUDA device"``). Nothing here looks at the hardware, so the
    whole table can be checked on any machine.

    ===========  =======  ==================  ==========================
    devices      type     parsed              meaning
    ===========  =======  ==================  ==========================
    ``3``        int      ``[0, 1, 2]``       first 3 devices
    ``-1``       int      ``[0, 1, ...]``     all available devices
    ``[0]``      list     ``[0]``             device 0
    ``[1, 3]``   list     ``[1, 3]``          devices 1 and 3
    ``"3"``      str      ``[0, 1, 2]``       first 3 devices
    ``"3,"``     str      ``[3]``             device 3 (the comma makes it an index)
    ``"1, 3"``   str      ``[1, 3]``          devices 1 and 3
    ``"-1"``     str      ``[0, 1, ...]``     all available devices
    ``"0"``      str      ``[0]``             device 0 (zero devices is never meant)
    ``"auto"``   str      all, or ``[0]``     all from a script, one when ``interactive``
    ===========  =======  ==================  ==========================

    As in Lightning, a string with a single number is a *count* and a string with a comma
    is a list of *indices*: ``"3"`` is the first three devices, ``"3,"`` is device 3 alone.
    ``0`` (the int) is refused: a run needs at least one device.

    Errors: a count or an index beyond ``num_available`` names how many there are; a
    repeated index is refused; a float, a non-numeric string or a list holding a non-int
    is a ``TypeError``/``ValueError`` that lists the accepted forms.

    >>> parse_devices("3", 4), parse_devices("3,", 4), parse_devices([1, 3], 4), parse_devices(-1, 2)
    ([0, 1, 2], [3], [1, 3], [0, 1])
    """
    plural = f"{kind}s"
    if isinstance(devices, str):
        text = devices.strip()
        if text.lower() == "auto":
            return _first(1 if interactive else num_available, num_available, devices, plural)
        if "," in text:
            parts = [p.strip() for p in text.split(",") if p.strip()]
            if not parts or not all(_is_integer_text(p) for p in parts):
                raise ValueError(
                    f"devices={devices!r} is not a list of device indices; devices takes {_DEVICES_ACCEPTED}."
                )
            return _check_indices([int(p) for p in parts], num_available, devices, plural)
        if not _is_integer_text(text):
            raise ValueError(f"devices={devices!r} is not understood; devices takes {_DEVICES_ACCEPTED}.")
        if int(text) == 0:
            return _check_indices([0], num_available, devices, plural)
        devices = int(text)  # "3" counts like 3; "-1" means all, like -1
    if isinstance(devices, numbers.Integral) and not isinstance(devices, bool):
        count = int(devices)
        if count == -1:
            return _first(num_available, num_available, devices, plural)
        if count == 0:
            raise ValueError(
                f"devices=0 would train on no {kind} at all. Pass devices=1 for one {kind}, [0] or '0,' "
                "for the first one, or accelerator='cpu' to train on the CPU."
            )
        if count < 0:
            raise ValueError(
                f"devices={count} is not a number of {plural}; use a positive count, or -1 for all. "
                f"devices takes {_DEVICES_ACCEPTED}."
            )
        return _first(count, num_available, devices, plural)
    if isinstance(devices, (list, tuple, range)):
        if len(devices) == 0:
            raise ValueError(
                f"devices={devices!r} is empty; name at least one {kind}. devices takes {_DEVICES_ACCEPTED}."
            )
        bad = [d for d in devices if isinstance(d, bool) or not isinstance(d, numbers.Integral)]
        if bad:
            raise TypeError(
                f"devices={devices!r} holds {bad[0]!r}, a {type(bad[0]).__name__}, where a device index "
                f"(an int) belongs; devices takes {_DEVICES_ACCEPTED}."
            )
        return _check_indices([int(d) for d in devices], num_available, devices, plural)
    raise TypeError(f"devices={devices!r} is a {type(devices).__name__}; devices takes {_DEVICES_ACCEPTED}.")


def count_asked(devices: Any) -> int:
    """The k of ``devices=k`` or ``"k"`` (0 for anything else).

    >>> count_asked(4), count_asked(" 2 "), count_asked([0, 1]), count_asked("auto")
    (4, 2, 0, 0)
    """
    if isinstance(devices, str) and _is_integer_text(devices.strip()):
        devices = int(devices.strip())
    if isinstance(devices, numbers.Integral) and not isinstance(devices, bool):
        return max(int(devices), 0)
    return 0


def is_auto(devices: Any) -> bool:
    """True for ``devices="auto"`` (any case, any surrounding spaces)."""
    return isinstance(devices, str) and devices.strip().lower() == "auto"


def _is_integer_text(text: str) -> bool:
    return text.lstrip("+-").isdigit() and text.count("-") + text.count("+") <= 1


def _first(count: int, num_available: int, original: Any, plural: str) -> list[int]:
    if num_available < 1:
        raise ValueError(f"devices={original!r} asks for {plural}, but this machine has none.")
    if count > num_available:
        raise ValueError(
            f"devices={original!r} asks for {count} {plural}, but this machine has {num_available}. "
            f"Use devices={num_available} or -1 for all of them."
        )
    return list(range(count))


def _check_indices(indices: list[int], num_available: int, original: Any, plural: str) -> list[int]:
    repeated = sorted({i for i in indices if indices.count(i) > 1})
    if repeated:
        raise ValueError(
            f"devices={original!r} names {plural[:-1]} {repeated[0]} more than once; name each index once."
        )
    wrong = [i for i in indices if i < 0 or i >= num_available]
    if wrong:
        valid = f"valid indices are 0 to {num_available - 1}" if num_available else "there is nothing to choose from"
        raise ValueError(
            f"devices={original!r} names index {wrong[0]}, but this machine has {num_available} {plural}: {valid}. "
            "Indices count from 0 (with CUDA_VISIBLE_DEVICES set, among the visible devices)."
        )
    return indices


__all__ = [
    "ACCELERATORS",
    "PRECISIONS",
    "parse_accelerator_word",
    "parse_devices",
    "parse_precision",
]
