"""benchmarks/torchkeras_census.py counts torchkeras names in programs and checks them against kerastorch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a subprocess that imports kerastorch
REPO_ROOT = Path(__file__).resolve().parents[2]


def test_the_census_counts_names_and_says_which_kerastorch_has(tmp_path):
    notebook = {
        "cells": [
            {"cell_type": "code", "source": ["import torchkeras\n", "from torchkeras.metrics import AUC, KS\n"]},
            {"cell_type": "markdown", "source": ["torchkeras.NotCode is prose, not a use"]},
            {
                "cell_type": "code",
                "source": [
                    "model = torchkeras.KerasModel(net, loss_fn)\n",
                    "model.fit(train_data=dl, epochs=3, ckpt_path='c.pt', nonsense=1)\n",
                    "torchkeras.tabular.TabularDataset(df)\n",
                    "KerasModel.StepRunner = MyStepRunner\n",
                    "KerasModel.Nonsense = 1\n",
                ],
            },
        ]
    }
    (tmp_path / "example.ipynb").write_text(json.dumps(notebook))
    (tmp_path / "script.py").write_text("from torchkeras import summary\nsummary(net, input_shape=(3,))\n")
    result = subprocess.run(
        [sys.executable, str(REPO_ROOT / "benchmarks" / "torchkeras_census.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    lines = {line.split()[0]: line.split()[1:] for line in result.stdout.splitlines() if line.startswith("  ")}
    assert lines["torchkeras.KerasModel"] == ["1", "yes"]
    assert lines["torchkeras.metrics.AUC"] == ["1", "yes"] and lines["torchkeras.metrics.KS"] == ["1", "yes"]
    assert lines["torchkeras.summary"] == ["1", "yes"]
    assert lines["torchkeras.tabular.TabularDataset"] == ["1", "NO"]
    assert "torchkeras.NotCode" not in lines  # markdown is not code
    assert lines["ckpt_path"] == ["1", "yes"] and lines["nonsense"] == ["1", "NO"]
    assert lines["StepRunner"] == ["1", "yes"]  # torchkeras's step replacement, which fit runs
    assert lines["Nonsense"] == ["1", "NO"]
