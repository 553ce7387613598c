"""One process, the whole net on one device: the strategy of every run that does not ask for more."""

from __future__ import annotations

from .base import Strategy


class SingleDevice(Strategy):
    """One process trains the whole net on one device (the CPU, a GPU or an Apple GPU)."""

    name = "single device"


__all__ = ["SingleDevice"]
