"""One training script for every rank of a job that SLURM, MPI, Kubeflow, torchrun or Ray Train started.

The script names the environment it finds (``kt.cluster_environment()``) and trains with
``fit`` on the CPU (gloo), with the environment as the launcher left it: ``fit`` reads the
launcher's variables itself. Each rank writes what it saw, the history it got and fit's
first printed line, so that a test can compare the ranks with each other and with a
torchrun run.

    # two processes as srun would start them, on this machine
    SLURM_JOB_ID=7 SLURM_STEP_ID=0 SLURM_NODELIST=localhost SLURM_NTASKS=2 SLURM_PROCID=0 SLURM_LOCALID=0 \
        python tests/cluster_train_script.py OUT_DIR &
    SLURM_JOB_ID=7 SLURM_STEP_ID=0 SLURM_NODELIST=localhost SLURM_NTASKS=2 SLURM_PROCID=1 SLURM_LOCALID=1 \
        python tests/cluster_train_script.py OUT_DIR

Pass ``--export`` to export the resolved rank layout as torch's ``env://`` variables first
(what ``torchrun`` would have set), as a script had to before ``fit`` read them itself;
``--resume-in DIR`` to train with ``resume=True``, each rank keeping its files in its own
folder (as on machines without a shared disk); ``--epochs N`` for another number of epochs.

:func:`train_in_ray_worker` is the same training as ``train_loop_per_worker`` of Ray Train's
``TorchTrainer`` (tests/devices/test_ray.py).
"""

import argparse
import contextlib
import io
import json
import os
import tempfile
import time
from typing import Optional

import torch
import torchmetrics
from torch import nn

import kerastorch as kt
from kerastorch.examples import digits_loaders


def digits_model(rank: int) -> kt.KerasModel:
    torch.manual_seed(100 + rank)  # different on purpose: DDP starts every rank from rank 0's weights
    net = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    return kt.KerasModel(
        net,
        nn.CrossEntropyLoss(),
        {"acc": torchmetrics.Accuracy(task="multiclass", num_classes=10)},
        torch.optim.Adam(net.parameters(), lr=1e-2),
    )


def fit_and_record(
    model: kt.KerasModel, out_dir: str, rank: int, epochs: int = 3, also: Optional[dict] = None, **fit_options
) -> None:
    """Train on the CPU and write ``rank{rank}.json``: what this rank saw, trained and got (and ``also``)."""
    cluster = kt.cluster_environment()
    dl_train, dl_val, _ = digits_loaders(batch_size=64, size=8)
    begun = EpochsBegun()
    fit_options["callbacks"] = [begun, *fit_options.get("callbacks", [])]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        history = model.fit(dl_train, dl_val, epochs=epochs, accelerator="cpu", verbose=2, **fit_options)
    seen = {
        "environment": cluster.name,
        "described": cluster.describe(),
        "rank": cluster.rank,
        "world_size": cluster.world_size,
        "num_processes": model.runtime.num_processes if model.runtime else None,
        "backend": torch.distributed.get_backend() if torch.distributed.is_initialized() else None,
        "history": history.to_dict("list"),
        "begun": begun.epochs,
        "first_line": printed.getvalue().partition("\n")[0],
        "printed": printed.getvalue(),
        "weights": {name: tensor.tolist() for name, tensor in model.net.state_dict().items()},
        **(also or {}),
    }
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(seen, f)


class EpochsBegun(kt.Callback):
    """The epochs this process trained (a resumed run begins after the restored one)."""

    reads_ckpt_path = False  # fit's files may be written while training goes on, as in a run without it

    def __init__(self):
        self.epochs: list[int] = []

    def on_epoch_begin(self, epoch, logs=None):
        self.epochs.append(epoch)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("--export", action="store_true", help="export the rank layout in torchrun's words first")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--resume-in", help="resume=True, each rank with its own folder in this one (no shared disk)")
    args = parser.parse_args()
    cluster = kt.cluster_environment()
    if args.export:
        os.environ.update(cluster.torch_env())
    options = {}
    if args.resume_in:
        options.update(ckpt_path=os.path.join(args.resume_in, f"rank{cluster.rank}", "best.safetensors"), resume=True)
    fit_and_record(digits_model(cluster.rank), args.out_dir, cluster.rank, args.epochs, **options)
    if torch.distributed.is_initialized():  # close gloo before exit, not in the interpreter's teardown
        torch.distributed.destroy_process_group()


class FailOnce(kt.Callback):
    """Kill this process in the middle of epoch 2, once (the marker file remembers that it happened).

    It dies ``wait_s`` seconds into the batch: Ray Train's controller takes the workers' reports
    when it polls them (every ``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S``), and a report it has not
    taken yet dies with the worker, so the restart would begin from the report before.
    """

    reads_ckpt_path = False

    def __init__(self, marker: str, wait_s: float = 0.0):
        self.marker = marker
        self.wait_s = wait_s
        self.epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if self.epoch == 2 and batch == 3 and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            time.sleep(self.wait_s)
            os._exit(1)  # as a crash or a preempted node: no Python cleanup


def write_states_late(seconds: float) -> None:
    """Every training state's write, in this process, begins ``seconds`` late."""
    from kerastorch.callbacks import training_state

    write = training_state.write_plain_state

    def late(plain: dict, path: str) -> None:
        time.sleep(seconds)
        write(plain, path)

    training_state.write_plain_state = late


def train_in_ray_worker(config: dict) -> None:
    """``train_loop_per_worker``: the same training as :func:`main`, in a worker of Ray Train.

    ``config``: ``out_dir``; ``resume`` (keep the training state, in a new folder each time the
    worker starts, so whatever is resumed comes from Ray's checkpoint); ``fail_marker`` (rank 1
    dies once in epoch 2, ``fail_wait_s`` seconds into a batch); ``slow_state_writes_s`` (each
    training state's write begins that late, as on a slow disk). ``rank{rank}.json`` says too
    which checkpoint Ray restarted the worker from.
    """
    import ray.train

    torch.set_num_threads(1)
    if config.get("slow_state_writes_s"):
        write_states_late(config["slow_state_writes_s"])
    rank = ray.train.get_context().get_world_rank()
    options: dict = {}
    if config.get("fail_marker") and rank == 1:
        options["callbacks"] = [FailOnce(config["fail_marker"], config.get("fail_wait_s", 0.0))]
    if config.get("resume"):
        folder = tempfile.mkdtemp(prefix="kerastorch-ray-worker-")
        options.update(ckpt_path=os.path.join(folder, "best.safetensors"), resume=True)
    restarted_from = ray.train.get_checkpoint()
    also = {"restarted_from": restarted_from and restarted_from.path}
    fit_and_record(digits_model(rank), config["out_dir"], rank, also=also, **options)


if __name__ == "__main__":
    main()
