"""fit inside Ray Train: two workers train as one job, report every epoch, and survive a failure.

    pip install "ray[train]"
    python examples/ray_train.py               # 2 CPU workers on this machine
    python examples/ray_train.py --fail-once   # worker 1 dies at the start of epoch 2; Ray restarts
                                               # both workers and fit continues from epoch 1's state

Each worker of ``TorchTrainer`` runs ``train_loop_per_worker``, which calls ``model.fit``.
Ray has already made the process group (gloo on the CPU, NCCL on GPUs) and set ``RANK``,
``WORLD_SIZE`` and ``LOCAL_RANK``: ``fit`` runs as one rank of that job, as under torchrun
(``kt.cluster_environment()`` names it ``"ray"``). Nothing in the loop talks to Ray: fit
reports each epoch's row of the history with ``ray.train.report`` by itself, with worker 0's
best weights and training state attached as a ``ray.train.Checkpoint``, so ``result.metrics``
holds the last epoch; and a worker group restarted by ``FailureConfig(max_failures=...)``
finds its files in ``ray.train.get_checkpoint()``, so ``fit(resume=True)`` continues where
the job stopped and ends with the history of an uninterrupted run.

On a Ray cluster, call ``ray.init()`` without ``num_cpus``, give ``ScalingConfig``
``use_gpu=True`` for one GPU per worker, and give ``RunConfig`` a ``storage_path`` that
every node can reach (a shared filesystem or ``s3://...``).
"""

import argparse
import os
import shutil
import tempfile
import time

import ray
import ray.train
import torch
import torchmetrics
from ray.train import FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer
from torch import nn

import kerastorch as kt
from kerastorch.examples import digits_loaders


class FailOnce(kt.Callback):
    """Kill worker 1 at the start of epoch 2, once (the marker file remembers that it happened).

    It waits a few seconds first: Ray's controller collects the workers' reports when it polls
    them (every 2 s), and a report it has not collected yet is lost with the worker (the run
    would then start again from the report before, here from scratch).
    """

    def __init__(self, marker: str):
        self.marker = marker

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == 2 and ray.train.get_context().get_world_rank() == 1 and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            time.sleep(5)
            os._exit(1)  # as a crash or a preempted node: no Python cleanup


def train_loop_per_worker(config: dict):
    # Each worker keeps its files on its own machine; after a restart fit brings them back from Ray's checkpoint.
    workdir = tempfile.mkdtemp(prefix="kerastorch-ray-")
    torch.manual_seed(0)
    dl_train, dl_val, _ = digits_loaders(batch_size=64, size=8)
    net = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    model = kt.KerasModel(
        net,
        nn.CrossEntropyLoss(),
        {"acc": torchmetrics.Accuracy(task="multiclass", num_classes=10)},
        torch.optim.Adam(net.parameters(), lr=1e-2),
    )
    callbacks = [FailOnce(config["fail_marker"])] if config.get("fail_marker") else []
    history = model.fit(
        dl_train,
        dl_val,
        epochs=config["epochs"],
        accelerator="cpu",
        ckpt_path=os.path.join(workdir, "best.safetensors"),
        resume=True,
        callbacks=callbacks,
        verbose=2,
    )
    shutil.rmtree(workdir, ignore_errors=True)
    return history  # worker 0's comes back as result.return_value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--fail-once", action="store_true", help="kill worker 1 at the start of epoch 2, once")
    args = parser.parse_args()

    storage = tempfile.mkdtemp(prefix="kerastorch-ray-results-")
    config = {"epochs": args.epochs, "fail_marker": os.path.join(storage, "failed-once") if args.fail_once else None}
    ray.init(num_cpus=2)
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(
            name="kerastorch-digits",
            storage_path=storage,
            failure_config=FailureConfig(max_failures=1),
        ),
    )
    result = trainer.fit()
    print("history (worker 0):")
    print(result.return_value)
    print("result.metrics (the last epoch's report):", result.metrics)
    print("reports with a checkpoint:", [metrics["epoch"] for _, metrics in result.best_checkpoints])
    print("last checkpoint:", sorted(os.listdir(result.checkpoint.path)), "in", result.checkpoint.path)
    ray.shutdown()


if __name__ == "__main__":
    main()
