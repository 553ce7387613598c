"""The API reference site builds with ``mkdocs build --strict``, and a broken reference fails it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mkdocs", reason="the docs extra builds the site (pip install kerastorch[docs])")
pytest.importorskip("mkdocstrings")

pytestmark = pytest.mark.slow
REPO_ROOT = Path(__file__).resolve().parents[2]


def build(root: Path, site: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(root)}
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)]
    return subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=300)


def copy_of_the_docs(destination: Path) -> Path:
    """What the build reads: mkdocs.yml, docs/, the README, the notebooks, the examples the pages include
    and the package."""
    destination.mkdir()
    for name in ("mkdocs.yml", "README.md"):
        shutil.copy(REPO_ROOT / name, destination / name)
    ignore = shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints")
    for name in ("docs", "notebooks", "examples", "kerastorch"):
        shutil.copytree(REPO_ROOT / name, destination / name, symlinks=True, ignore=ignore)
    return destination


def test_the_site_builds_strictly_with_every_public_name(tmp_path):
    result = build(copy_of_the_docs(tmp_path / "repo"), tmp_path / "site")
    assert result.returncode == 0, result.stdout + result.stderr
    site = tmp_path / "site"
    keras_model = (site / "api" / "keras-model" / "index.html").read_text()
    for argument in ("train_data", "patience", "gradient_accumulation_steps", "strategy", "fsdp_wrap", "compile"):
        assert argument in keras_model, argument
    callbacks = (site / "api" / "callbacks" / "index.html").read_text()
    import kerastorch.callbacks

    for name in kerastorch.callbacks.__all__:
        assert f'id="kerastorch.callbacks.{name}"' in callbacks, name
    assert (site / "notebooks" / "01_quick_start" / "index.html").exists()  # the tutorials, with outputs
    assert "★ best" in (site / "notebooks" / "01_quick_start" / "index.html").read_text()
    assert "Coming from" in (site / "coming-from" / "index.html").read_text()
    # The menu: the first tutorial right after Home, the other tutorials above Performance, titles
    # as nav gives them (a notebook's heading with code in it would lose its words there).
    glossary = (site / "glossary" / "index.html").read_text()  # a page without sections: the menu alone
    menu = re.findall(r'class="md-nav__link[^"]*"[^>]*>\s*(?:<span[^>]*>)?\s*([^<]+?)\s*<', glossary)
    menu = list(dict.fromkeys(menu))  # each title once, in order
    assert menu.index("Tutorial 01: start here") == menu.index("Home") + 1
    assert menu.index("Tutorial 06: doctor and interpret") < menu.index("Performance")
    assert menu.index("Performance") < menu.index("How kerastorch works")
    assert "stylesheets/extra.css" in glossary


def test_a_broken_reference_fails_the_strict_build(tmp_path):
    repo = copy_of_the_docs(tmp_path / "repo")
    page = repo / "docs" / "coming-from.md"
    page.write_text(page.read_text() + "\nSee [the missing page](no-such-page.md).\n")
    result = build(repo, tmp_path / "site")
    assert result.returncode != 0
    assert "no-such-page.md" in result.stdout + result.stderr
