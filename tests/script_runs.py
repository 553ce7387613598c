"""The backup training script run as a real process, killed and started again, and the runs it leaves
compared (tests/callbacks/test_backup.py, tests/training/test_preemption.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pandas as pd
import torch
from safetensors.torch import load_file

from kerastorch.files.state import load_state_file

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO_ROOT, "tests", "backup_training_script.py")
ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join([REPO_ROOT, os.path.join(REPO_ROOT, "tests")]),
    "OMP_NUM_THREADS": "1",
}


def start_script(out_dir, *args, env=None) -> subprocess.Popen:
    # A session of its own, so that a kill of the process group ends the script and its workers, not pytest.
    return subprocess.Popen(
        [sys.executable, SCRIPT, str(out_dir), *map(str, args)],
        env=env or ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def finish(process: subprocess.Popen) -> tuple[int, str]:
    output, _ = process.communicate(timeout=300)
    return process.returncode, output


def run_script(out_dir, *args, env=None) -> tuple[int, str]:
    return finish(start_script(out_dir, *args, env=env))


def read_run(out_dir) -> tuple[pd.DataFrame, dict]:
    with open(os.path.join(out_dir, "history.json")) as f:
        history = pd.DataFrame(json.load(f))
    return history, load_file(os.path.join(out_dir, "final.safetensors"))


def backup_of(out_dir) -> dict:
    return load_state_file(os.path.join(out_dir, "backup", "training.state"))


def assert_same_run(out_dir, reference_dir, why=""):
    history, weights = read_run(out_dir)
    reference_history, reference_weights = read_run(reference_dir)
    assert history["epoch"].tolist() == [1, 2, 3], why
    pd.testing.assert_frame_equal(history, reference_history, check_exact=True, obj=f"history {why}")
    assert weights.keys() == reference_weights.keys()
    for name in weights:
        assert torch.equal(weights[name], reference_weights[name]), f"{name} {why}"
