"""torchkeras's words for fit's options, turned into kerastorch's: ``quiet=True`` is ``verbose=0``,
``mixed_precision="fp16"`` is ``precision="16-mixed"``, ``cpu=True`` is ``accelerator="cpu"``.

The door (:mod:`kerastorch.arguments`) translates a call with :func:`in_kerastorch_words` before
anything else reads it, so that a torchkeras program changes only its import and nothing past
the door hears these words.

>>> in_kerastorch_words({"verbose": 1, "quiet": True, "precision": "32-true", "mixed_precision": "fp16"})
{'verbose': 0, 'precision': '16-mixed'}
>>> in_kerastorch_words({"accelerator": "auto", "cpu": True})
{'accelerator': 'cpu'}
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from ..devices.words import parse_accelerator_word, parse_precision

MIXED_PRECISION_WORDS = {"no": "32-true", "fp16": "16-mixed", "bf16": "bf16-mixed"}


def in_kerastorch_words(called: Mapping[str, Any]) -> dict[str, Any]:
    """A call's arguments with torchkeras's ``quiet``, ``mixed_precision`` and ``cpu`` replaced by
    what they mean in ``verbose``, ``precision`` and ``accelerator``; a method that does not take
    one of them keeps its arguments as they are."""
    words = dict(called)
    if "quiet" in words:
        words["verbose"] = verbose_from_quiet(words["verbose"], words.pop("quiet"))
    if "mixed_precision" in words:
        words["precision"] = precision_from_mixed_precision(words["precision"], words.pop("mixed_precision"))
    if "cpu" in words:
        words["accelerator"] = accelerator_from_cpu(words["accelerator"], words.pop("cpu"))
    return words


def verbose_from_quiet(verbose: Any, quiet: Optional[bool]) -> Any:
    """``quiet=True`` is ``verbose=0``; ``quiet=False`` or None leaves ``verbose`` as it is."""
    if quiet is None:
        return verbose
    return 0 if quiet else verbose


def precision_from_mixed_precision(precision: Any, mixed_precision: Optional[str]) -> Any:
    """The precision that ``mixed_precision="no"|"fp16"|"bf16"`` names, beside Lightning's ``precision``
    (as given): they must not disagree. Without ``mixed_precision``, ``precision`` as given."""
    if mixed_precision is None:
        return precision
    if not isinstance(mixed_precision, str) or mixed_precision.strip().lower() not in MIXED_PRECISION_WORDS:
        raise ValueError(
            f"mixed_precision={mixed_precision!r} is not supported; use 'no', 'fp16' or 'bf16' "
            "(or Lightning's precision= with '32-true', '16-mixed', 'bf16-mixed', ...)."
        )
    from_mixed = MIXED_PRECISION_WORDS[mixed_precision.strip().lower()]
    canonical = parse_precision(precision)
    if canonical != "32-true" and canonical != from_mixed:
        raise ValueError(
            f"precision={precision!r} and mixed_precision={mixed_precision!r} disagree; pass only one of them."
        )
    return from_mixed


def accelerator_from_cpu(accelerator: Any, cpu: bool) -> Any:
    """``cpu=True`` is ``accelerator="cpu"``; it disagrees with any accelerator but "auto" and "cpu".
    Without ``cpu=True``, ``accelerator`` as given."""
    if not cpu:
        return accelerator
    if parse_accelerator_word(accelerator) not in ("auto", "cpu"):
        raise ValueError(f"cpu=True and accelerator={accelerator!r} disagree; pass only one of them.")
    return "cpu"


__all__ = [
    "MIXED_PRECISION_WORDS",
    "accelerator_from_cpu",
    "in_kerastorch_words",
    "precision_from_mixed_precision",
    "verbose_from_quiet",
]
