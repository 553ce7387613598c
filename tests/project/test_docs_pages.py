"""Every user page runs as pasted: its ```python blocks (with the files it includes), in order,
in one fresh process, as a reader pastes them into one fresh notebook. The output a page shows
has the report fit printed ("What the curves say:") where the run printed one. And its code fits
the site's column.

A block that cannot run on a CPU laptop (a cluster launch, a GPU) starts with
``# not run here: <why>``; at most one block in seven may.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # each page trains on the digits in a process of its own

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
USER_PAGES = [
    "README.md",
    "docs/index.md",
    "docs/fit.md",
    "docs/data.md",
    "docs/callbacks.md",
    "docs/tuning.md",
    "docs/doctor.md",
    "docs/reading-your-run.md",
    "docs/performance.md",
    "docs/glossary.md",
    "docs/devices.md",
    "docs/several-processes.md",
    "docs/several-machines.md",
    "docs/resume.md",
    "docs/coming-from.md",
    "docs/keras-example.md",
    "docs/huggingface.md",
    "docs/custom-steps.md",
]
NOT_RUN = "# not run here:"
WIDTH = 88
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)
SNIPPET = re.compile(r'^[ \t]*--8<--[ \t]+"([^"]+)"[ \t]*$', re.M)


def expand_snippets(text: str) -> str:
    """The page as mkdocs' snippets extension makes it: ``--8<-- "path"`` and ``--8<-- "path:section"``
    lines replaced by that file, or by that section of it, paths from the repository's root."""

    def included(match: re.Match) -> str:
        path, _, section = match.group(1).partition(":")
        content = (ROOT / path).read_text()
        if section:
            content = content.split(f"--8<-- [start:{section}]", 1)[1].split(f"--8<-- [end:{section}]", 1)[0]
            content = content.split("\n", 1)[1].rsplit("\n", 1)[0]  # the marker lines themselves
        return expand_snippets(content.rstrip("\n"))

    return SNIPPET.sub(included, text)


def code_blocks(page: str) -> list[tuple[str, str]]:
    """(language, code) of each fenced block of the page, in order, snippets included."""
    return [(m.group(1), m.group(2)) for m in FENCE.finditer(expand_snippets((ROOT / page).read_text()))]


def python_blocks(page: str) -> list[str]:
    return [code for language, code in code_blocks(page) if language == "python"]


REPORT = "What the curves say:"


def shown_after_each_run_block(page: str) -> list[str | None]:
    """For each python block that runs: the ```text block right after it (the output the page
    shows), or None when the page shows none."""
    blocks = code_blocks(page)
    return [
        blocks[i + 1][1] if i + 1 < len(blocks) and blocks[i + 1][0] == "text" else None
        for i, (language, code) in enumerate(blocks)
        if language == "python" and not code.lstrip().startswith(NOT_RUN)
    ]


# One globals for the whole page, as one notebook: each block runs after the ones above it.
RUNNER = """
import sys
blocks, page = {blocks!r}, {page!r}
for number, code in enumerate(blocks, 1):
    print(f"--- {{page}}, block {{number}}", flush=True)
    exec(compile(code, f"{{page}}, block {{number}}", "exec"), globals())
"""


def test_every_user_page_is_run():
    pages = {f"docs/{path.name}" for path in DOCS.glob("*.md")}
    assert pages == {page for page in USER_PAGES if page.startswith("docs/")}, "list the new page in USER_PAGES"


@pytest.mark.parametrize("page", USER_PAGES)
def test_the_page_runs_as_pasted_in_one_fresh_process(page, tmp_path):
    blocks = [code for code in python_blocks(page) if not code.lstrip().startswith(NOT_RUN)]
    script = tmp_path / "page.py"
    script.write_text(RUNNER.format(blocks=blocks, page=page))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg", "WANDB_MODE": "offline"}
    result = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900
    )
    assert result.returncode == 0, f"{page} failed:\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    assert result.stdout.count(f"--- {page}, block ") == len(blocks)
    # Where a block printed fit's report, the output the page shows has it too, and only there.
    printed = re.split(rf"^--- {re.escape(page)}, block \d+\n", result.stdout, flags=re.M)[1:]
    for number, (out, shown) in enumerate(zip(printed, shown_after_each_run_block(page)), 1):
        if shown is not None:
            assert (REPORT in out) == (REPORT in shown), f"{page}, block {number}: the run printed\n{out[-1500:]}"


@pytest.mark.parametrize("page", USER_PAGES)
def test_at_most_one_block_in_seven_is_not_run_and_each_says_why(page):
    blocks = python_blocks(page)
    skipped = [code for code in blocks if code.lstrip().startswith(NOT_RUN)]
    assert len(skipped) * 7 <= max(len(blocks), 1), f"{len(skipped)} of {len(blocks)} blocks are not run"
    for code in skipped:
        why = code.lstrip().splitlines()[0][len(NOT_RUN) :].strip()
        assert len(why.split()) >= 2, f"say why the block is not run: {code.splitlines()[0]!r}"


DOCS_PAGES = ["README.md"] + sorted(
    str(path.relative_to(ROOT)) for path in DOCS.rglob("*.md") if "notebooks" not in path.parts
)


@pytest.mark.parametrize("page", DOCS_PAGES)
def test_code_blocks_fit_the_column(page):
    too_wide = [line for _, code in code_blocks(page) for line in code.splitlines() if len(line) > WIDTH]
    assert not too_wide, f"{len(too_wide)} code lines over {WIDTH} characters, the first: {too_wide[0]!r}"
