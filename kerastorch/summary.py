"""``from kerastorch.summary import summary``, as torchkeras programs import it.

The function lives in :mod:`kerastorch.tools.summary` and is also ``kerastorch.summary``.
"""

from .tools.summary import summary

__all__ = ["summary"]
