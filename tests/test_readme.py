"""The README's set-up commands are the ones CI runs."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_ci_runs_exactly_the_readme_commands():
    readme = (ROOT / "README.md").read_text()
    ci_commands = [
        line
        for line in (ROOT / ".ci" / "run").read_text().splitlines()
        if line and not line.startswith(("#", "set ", "cd ")) and not line.startswith("#!")
    ]
    assert len(ci_commands) == 3  # install and demo; lint, format and types; the tests
    for command in ci_commands:
        assert command in readme, f"README does not show the CI command {command!r}"


@pytest.mark.slow
def test_import_needs_none_of_the_optional_extras():
    import subprocess
    import sys

    code = (
        "import sys; import kerastorch; import kerastorch.callbacks; "
        "bad = [m for m in ('IPython', 'lightning', 'sklearn', 'tensorboard', 'mlflow', 'optuna', 'wandb') "
        "if m in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
