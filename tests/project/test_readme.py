"""The README's set-up commands and CONTRIBUTING's checks are the ones CI runs; the demo keeps
its promise: a test accuracy on digits that training never saw."""

from __future__ import annotations

import configparser
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def bash_blocks(path: Path) -> list[str]:
    return re.findall(r"^```bash\n(.*?)^```", path.read_text(), flags=re.M | re.S)


def ci_commands() -> list[str]:
    return [
        line
        for line in (ROOT / ".ci" / "run").read_text().splitlines()
        if line and not line.startswith(("#", "set ", "cd "))
    ]


def test_ci_runs_the_readmes_two_commands_and_contributings_checks():
    readme = [line for block in bash_blocks(ROOT / "README.md") for line in block.splitlines() if line]
    contributing = "\n".join(bash_blocks(ROOT / "CONTRIBUTING.md"))
    commands = ci_commands()
    # The README's first block installs for users and runs the demo; its second runs the tests.
    assert readme[0] == commands[0] and readme[1] == commands[-1]
    assert "[dev]" not in readme[0] and '".[examples]"' in readme[0]
    assert readme[0].startswith("pip install torch==2.13.0 && ")  # a bare torch pulls a CUDA build
    for command in commands[1:-1]:
        assert command in contributing, f"CONTRIBUTING.md does not show the CI command {command!r}"
    for check in ("ruff check", "ruff format --check", "mypy", "mkdocs build --strict"):
        assert check in contributing and not any(check in line for line in readme), check


def test_the_examples_extra_brings_what_the_examples_need_and_no_tool():
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    extras = setup["options.extras_require"]
    examples = [line.strip() for line in extras["examples"].splitlines() if line.strip()]
    assert [name.split(">")[0] for name in examples] == ["scikit-learn"]
    assert not any("torchvision" in value for value in extras.values())


def test_the_digits_come_in_three_parts_that_share_no_digit():
    from kerastorch.examples import digits_datasets, digits_loaders

    parts = digits_datasets(size=8)
    rows = [{tuple(image.flatten().tolist()) for image, _ in part} for part in parts]
    assert [len(part) for part in parts] == [1348, 225, 224]
    assert not (rows[0] & rows[1]) and not (rows[0] & rows[2]) and not (rows[1] & rows[2])
    dl_train, dl_val, dl_test = digits_loaders(batch_size=64, size=8)
    assert [len(dl.dataset) for dl in (dl_train, dl_val, dl_test)] == [1348, 225, 224]
    first, again = next(iter(dl_test)), next(iter(dl_test))
    assert torch.equal(first[0], again[0])  # the test loader keeps its order


@pytest.mark.slow
def test_the_demo_reports_a_test_accuracy_on_digits_it_never_saw(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "kerastorch.demo", "--plot", str(tmp_path / "history.png")],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    found = re.search(r"test accuracy on 224 digits it never saw: (\S+)", result.stdout)
    assert found, result.stdout
    assert 0.9 <= float(found.group(1)) <= 1.0
    assert (tmp_path / "history.png").stat().st_size > 1000


@pytest.mark.slow
def test_import_needs_none_of_the_optional_extras():
    code = (
        "import sys; import kerastorch; import kerastorch.callbacks; "
        "bad = [m for m in ('IPython', 'lightning', 'sklearn', 'tensorboard', 'mlflow', 'optuna', 'wandb') "
        "if m in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
