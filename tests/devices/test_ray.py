"""fit inside Ray Train: two workers of a real TorchTrainer on this machine train as one job.

One local Ray instance (``ray.init(num_cpus=2)``) serves every test of this module. The
workers run ``train_in_ray_worker`` of ``tests/cluster_train_script.py``, the same training as
the torchrun run of tests/devices/test_cluster_launchers.py, so their history must equal it. fit
reports every epoch to Ray by itself: ``result.metrics`` is the last row, every report carries
a checkpoint, and a worker group that Ray restarts after a crash continues from it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cluster_train_script import train_in_ray_worker
from safetensors.torch import load_file
from test_cluster_launchers import clean_environment, free_port

ray = pytest.importorskip("ray", reason='Ray Train is optional: pip install "ray[train]" (in the test extra)')
from ray.train import FailureConfig, RunConfig, ScalingConfig  # noqa: E402
from ray.train.torch import TorchTrainer  # noqa: E402

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]
TESTS = REPO_ROOT / "tests"
# How often Ray Train's controller polls the workers, and so takes their reports (2 s by default).
POLL_INTERVAL = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"
POLL_INTERVAL_S = 0.25


@pytest.fixture(scope="module")
def ray_instance():
    """A local Ray instance of two CPUs; its workers import this checkout and the tests' scripts."""
    saved = {name: os.environ.get(name) for name in ("PYTHONPATH", POLL_INTERVAL)}
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), str(TESTS), saved["PYTHONPATH"]) if p)
    os.environ[POLL_INTERVAL] = str(POLL_INTERVAL_S)  # Ray Train passes it on to its controller
    # Ray Train's trainer leaves its own Ctrl-C handler installed after fit returns, which then fails
    # (its controller is gone): the tests that press Ctrl-C in a later fit need the caller's back.
    handler = signal.getsignal(signal.SIGINT)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()
        signal.signal(signal.SIGINT, handler)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name)
            else:
                os.environ[name] = value


@pytest.fixture(scope="module")
def torchrun_history(tmp_path_factory) -> dict:
    """The same training under torchrun --nproc_per_node=2."""
    out_dir = tmp_path_factory.mktemp("torchrun")
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port(29600)}"]
    result = subprocess.run(
        [*command, str(TESTS / "cluster_train_script.py"), str(out_dir)],
        env=clean_environment(),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads((out_dir / "rank0.json").read_text())["history"]


def train_with_ray(out_dir: Path, storage: Path, **config):
    out_dir.mkdir()
    trainer = TorchTrainer(
        train_in_ray_worker,
        train_loop_config={"out_dir": str(out_dir), **config},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="digits", storage_path=str(storage), failure_config=FailureConfig(max_failures=1)),
    )
    result = trainer.fit()
    return result, [json.loads((out_dir / f"rank{rank}.json").read_text()) for rank in (0, 1)]


def last_row(history: dict) -> dict:
    return {name: values[-1] for name, values in history.items()}


def test_two_ray_workers_train_as_one_job_and_report_every_epoch(ray_instance, torchrun_history, tmp_path):
    result, ranks = train_with_ray(tmp_path / "out", tmp_path / "storage")
    assert result.error is None
    for rank, seen in enumerate(ranks):
        assert (seen["environment"], seen["rank"], seen["num_processes"], seen["backend"]) == ("ray", rank, 2, "gloo")
        assert seen["history"] == torchrun_history
    assert ranks[0]["first_line"].startswith("kerastorch: Ray Train, rank 0 of 2 (local 0): training on 2 processes")
    assert [(seen["begun"], seen["restarted_from"]) for seen in ranks] == [([1, 2, 3], None)] * 2
    # result.metrics is the last epoch's row, from the reports that carried a checkpoint: one per epoch.
    assert result.metrics == last_row(torchrun_history)
    assert [metrics["epoch"] for _, metrics in result.best_checkpoints] == [1, 2, 3]
    # Without a ckpt_path, the checkpoint holds the best weights, which fit put back into the net.
    assert sorted(os.listdir(result.checkpoint.path)) == ["best.safetensors"]
    best = load_file(os.path.join(result.checkpoint.path, "best.safetensors"))
    final = {name: torch.tensor(values) for name, values in ranks[0]["weights"].items()}
    assert best.keys() == final.keys() and all(torch.equal(best[k], final[k]) for k in best)


def test_a_worker_group_restarted_after_a_crash_resumes_from_rays_checkpoint(ray_instance, torchrun_history, tmp_path):
    marker = tmp_path / "crashed-once"
    # Worker 1 dies in epoch 2, once Ray's controller has surely taken epoch 1's report. Rank 0's disk
    # is slow: each epoch's report copies its training state, which must be whole by then.
    result, ranks = train_with_ray(
        tmp_path / "out", tmp_path / "storage", resume=True, fail_marker=str(marker), fail_wait_s=8 * POLL_INTERVAL_S,
        slow_state_writes_s=0.5,
    )  # fmt: skip
    assert marker.exists() and result.error is None  # Ray started both workers again
    assert all(seen["restarted_from"] for seen in ranks)
    # Each worker began again in a new, empty folder: what it resumed from came from Ray's checkpoint.
    assert [seen["begun"] for seen in ranks] == [[2, 3], [2, 3]]
    assert "Resuming after epoch 1" in ranks[0]["printed"]
    assert [seen["history"] for seen in ranks] == [torchrun_history, torchrun_history]
    assert result.metrics == last_row(torchrun_history)
    assert sorted(os.listdir(result.checkpoint.path)) == ["best.safetensors", "best.safetensors.state"]


def test_importing_kerastorch_does_not_import_ray():
    code = "import sys, kerastorch, kerastorch.callbacks; print(sorted(m for m in sys.modules if m.split('.')[0] == 'ray'))"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stdout + result.stderr
