"""fit's progress in Jupyter: one output, updated in place through an IPython display handle.

Why not tqdm's widgets: they need the ipywidgets front-end extension, and where it is
missing (a JupyterLab without it, some VS Code and Colab set-ups, a static export, a
console) they stay frozen text (``Epochs: 0%|``) for the whole run. A display handle is
plain Jupyter messaging, which every front end handles: the output carries the same
content as HTML (a ``<progress>`` bar) and as text (a ``#``-bar), and each redraw
replaces it. It also keeps the cell steady — one output whose text grows by one line per
finished epoch — and a headless run (nbclient, papermill) saves one output, not one per
redraw. The idea is fastprogress's; this is the few lines kerastorch needs.
"""

from __future__ import annotations

import html
from typing import Any, Optional

BAR_WIDTH = 30  # characters of the text bar


class NotebookProgress:
    """The finished epochs' lines, then the running epoch's bar, as one output updated in place."""

    def __init__(self) -> None:
        from IPython.display import display

        self.lines: list[str] = []
        self.handle: Any = display(self._bundle(None), raw=True, display_id=True)

    def add_line(self, line: str) -> None:
        """A finished epoch's summary (it stays above the bar)."""
        self.lines.append(line)

    def show(self, label: str, done: int, total: Optional[int], values: str = "") -> None:
        """Redraw: the lines so far, then ``label`` with a bar at ``done`` of ``total`` and ``values``."""
        self.handle.update(self._bundle((label, done, total, values)), raw=True)

    def _bundle(self, bar: Optional[tuple[str, int, Optional[int], str]]) -> dict:
        text_lines = list(self.lines)
        # The mark stays with its value when a narrow cell wraps the line.
        html_lines = [html.escape(line).replace(" ★ best", "\u00a0★\u00a0best") for line in self.lines]
        if bar is not None:
            label, done, total, values = bar
            count = f"{done}/{total}" if total else str(done)
            filled = int(BAR_WIDTH * done / total) if total else 0
            text_lines.append(f"{label} [{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {count} {values}".rstrip())
            maximum = f' max="{total}"' if total else ""
            html_lines.append(
                f'{html.escape(label)} <progress value="{done}"{maximum} style="width:12em;vertical-align:middle">'
                f"</progress> {html.escape(count)} {html.escape(values)}".rstrip()
            )
        body = "\n".join(html_lines)
        return {
            "text/plain": "\n".join(text_lines),
            "text/html": f'<pre style="margin:0;white-space:pre-wrap">{body}</pre>',
        }


__all__ = ["NotebookProgress"]
