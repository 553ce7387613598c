"""Where output goes: a Jupyter kernel, a terminal, or a log file.

Progress bars and the live plot ask this module once per ``fit`` and pick their form:
an output and an image updated in place in Jupyter, a text bar in a terminal, one line
per epoch (and a PNG file) in a CI log or any other output that is not a terminal.
"""

from __future__ import annotations

import sys
from typing import Optional, TextIO


def in_notebook() -> bool:
    """True inside a Jupyter kernel (JupyterLab, classic Notebook, VS Code, Colab).

    The kernel's shell is what matters, not the front end: a plain ``ipython`` prompt in a
    terminal is not a notebook.
    """
    ipython = sys.modules.get("IPython")
    if ipython is None:  # never imported: certainly not a kernel
        return False
    try:
        shell = ipython.get_ipython()
    except AttributeError:
        return False
    if shell is None:
        return False
    # ipykernel's shell, or a subclass of it such as Colab's.
    return "IPKernelApp" in getattr(shell, "config", {}) or any(
        cls.__name__ == "ZMQInteractiveShell" for cls in type(shell).__mro__
    )


def is_terminal(stream: Optional[TextIO] = None) -> bool:
    """True when ``stream`` (default ``sys.stderr``, where progress bars go) is a terminal."""
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def output_style(stream: Optional[TextIO] = None) -> str:
    """``"notebook"`` (an output updated in place), ``"terminal"`` (text bars redrawn with ``\\r``) or ``"lines"``.

    ``"lines"`` is for everything that is not read live on a screen (CI logs, files,
    pipes): there a redrawn bar would leave one line per redraw, so an epoch is one line.
    """
    if in_notebook():
        return "notebook"
    return "terminal" if is_terminal(stream) else "lines"


__all__ = ["in_notebook", "is_terminal", "output_style"]
