"""torchkeras's words for fit's options, turned into kerastorch's: ``quiet=True`` is ``verbose=0``,
``mixed_precision="fp16"`` is ``precision="16-mixed"``, ``cpu=True`` is ``accelerator="cpu"``.

The door (:mod:`kerastorch.arguments`) and the word parsers (:mod:`kerastorch.devices.words`)
call these, so that a torchkeras program changes only its import.

>>> verbose_from_quiet(1, True), precision_from_mixed_precision("32-true", "fp16"), accelerator_from_cpu("auto", True)
(0, '16-mixed', 'cpu')
"""

from __future__ import annotations

from typing import Any, Optional

MIXED_PRECISION_WORDS = {"no": "32-true", "fp16": "16-mixed", "bf16": "bf16-mixed"}


def verbose_from_quiet(verbose: Any, quiet: Optional[bool]) -> Any:
    """``quiet=True`` is ``verbose=0``; ``quiet=False`` or None leaves ``verbose`` as it is."""
    if quiet is None:
        return verbose
    return 0 if quiet else verbose


def precision_from_mixed_precision(canonical: str, mixed_precision: Optional[str], precision: Any = None) -> str:
    """The precision that ``mixed_precision="no"|"fp16"|"bf16"`` names, next to Lightning's ``precision``
    (already made ``canonical``; ``precision`` as given, for messages)."""
    if mixed_precision is None:
        return canonical
    if not isinstance(mixed_precision, str) or mixed_precision.strip().lower() not in MIXED_PRECISION_WORDS:
        raise ValueError(
            f"mixed_precision={mixed_precision!r} is not supported; use 'no', 'fp16' or 'bf16' "
            "(or Lightning's precision= with '32-true', '16-mixed', 'bf16-mixed', ...)."
        )
    from_mixed = MIXED_PRECISION_WORDS[mixed_precision.strip().lower()]
    if canonical != "32-true" and canonical != from_mixed:
        raise ValueError(
            f"precision={precision if precision is not None else canonical!r} and "
            f"mixed_precision={mixed_precision!r} disagree; pass only one of them."
        )
    return from_mixed


def accelerator_from_cpu(word: str, cpu: bool, accelerator: Any = None) -> str:
    """``cpu=True`` is ``accelerator="cpu"``; it disagrees with any accelerator but "auto" and "cpu"."""
    if not cpu:
        return word
    if word not in ("auto", "cpu"):
        raise ValueError(
            f"cpu=True and accelerator={accelerator if accelerator is not None else word!r} disagree; "
            "pass only one of them."
        )
    return "cpu"


__all__ = ["MIXED_PRECISION_WORDS", "accelerator_from_cpu", "precision_from_mixed_precision", "verbose_from_quiet"]
