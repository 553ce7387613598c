"""Callbacks written for other libraries, made to work as kerastorch callbacks."""

from __future__ import annotations

from typing import Any

from .base import Callback, HOOKS


def as_callback(obj: Any) -> Callback:
    """Accept a :class:`Callback`, or refuse with a message that says what a callback is."""
    if isinstance(obj, Callback):
        return obj
    raise TypeError(
        f"callbacks holds a {type(obj).__name__}, which is not a kerastorch Callback. Subclass "
        f"kerastorch.Callback and override any of: {', '.join(HOOKS)}."
    )
