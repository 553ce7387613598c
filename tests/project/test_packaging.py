"""What the installed package carries: one version, type information, the license."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import kerastorch

ROOT = Path(__file__).resolve().parents[2]


def test_the_installed_version_is_the_packages_own():
    assert importlib.metadata.version("kerastorch") == kerastorch.__version__
    assert "attr: kerastorch.__version__" in (ROOT / "setup.cfg").read_text()  # the one source


def test_the_package_says_it_is_typed_and_ships_that_marker():
    assert (Path(kerastorch.__file__).parent / "py.typed").is_file()
    assert "kerastorch = py.typed" in (ROOT / "setup.cfg").read_text()


def test_the_license_file_is_the_declared_apache_2():
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "license = Apache-2.0" in (ROOT / "setup.cfg").read_text()
