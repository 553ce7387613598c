"""Execute the tutorial notebooks in a real Jupyter kernel and save them with their outputs.

    python notebooks/run_notebooks.py                      # every notebook, in place
    python notebooks/run_notebooks.py 01_quick_start.ipynb # some of them

Each notebook runs top to bottom in a fresh ``python3`` kernel whose ``PYTHONPATH``
starts with this repository, so the kerastorch being executed is the one beside this
file. The kernel's working directory is a temporary folder, so the checkpoints and
scripts the tutorials write never land in the repository. A cell that raises stops
the run with the error (and the notebook on disk is left as it was).

The test suite (``tests/project/test_notebooks.py``) calls :func:`execute_notebook` on copies.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

NOTEBOOKS_DIR = Path(__file__).resolve().parent
REPO_ROOT = NOTEBOOKS_DIR.parent


def tutorial_notebooks() -> list[Path]:
    """The tutorials, in reading order (their names start with a number)."""
    return sorted(p for p in NOTEBOOKS_DIR.glob("[0-9]*.ipynb"))


def kernel_environment() -> dict:
    """The environment for the kernel: this repository first on ``PYTHONPATH``."""
    env = os.environ.copy()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    # The kernel chooses its own inline matplotlib backend; a backend set for a headless
    # shell (MPLBACKEND=Agg in CI) would stop pandas' plots from showing in the outputs.
    env.pop("MPLBACKEND", None)
    return env


def execute_notebook(source: Path, destination: Optional[Path] = None, timeout: int = 600, allow_errors: bool = False):
    """Run ``source`` top to bottom and write it, with outputs, to ``destination``
    (default: over ``source``). Returns the executed notebook (an ``nbformat`` node).

    Raises ``nbclient.exceptions.CellExecutionError`` on the first cell that fails, unless
    ``allow_errors``: then errors are kept as the cells' outputs and the run goes on.
    """
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(source, as_version=4)
    with tempfile.TemporaryDirectory(prefix="kerastorch_notebook_") as workdir:
        client = NotebookClient(
            notebook,
            kernel_name="python3",
            timeout=timeout,
            record_timing=False,
            allow_errors=allow_errors,
            store_widget_state=True,
            resources={"metadata": {"path": workdir}},
        )
        client.execute(env=kernel_environment())
    nbformat.validate(notebook)
    nbformat.write(notebook, destination or source)
    return notebook


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help="notebook file names in notebooks/ (default: all tutorials)")
    parser.add_argument(
        "--allow-errors", action="store_true", help="keep going after a failing cell and save the error as its output"
    )
    args = parser.parse_args(argv)
    paths = [NOTEBOOKS_DIR / name for name in args.names] if args.names else tutorial_notebooks()
    for path in paths:
        start = time.monotonic()
        execute_notebook(path, allow_errors=args.allow_errors)
        size_kb = path.stat().st_size / 1024
        print(f"{path.name}: executed in {time.monotonic() - start:.1f}s, {size_kb:.0f} KB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
