"""One training script for every rank of a job that SLURM, MPI, Kubeflow or torchrun started.

The script names the environment it finds (``kt.cluster_environment()``), exports the
resolved rank layout as torch's ``env://`` variables (what ``torchrun`` would have set),
then trains with ``fit`` on the CPU (gloo). Each rank writes what it saw and the history
it got, so that a test can compare the ranks with each other and with a torchrun run.

    # two processes as srun would start them, on this machine
    SLURM_JOB_ID=7 SLURM_STEP_ID=0 SLURM_NODELIST=localhost SLURM_NTASKS=2 SLURM_PROCID=0 SLURM_LOCALID=0 \
        python tests/cluster_train_script.py OUT_DIR &
    SLURM_JOB_ID=7 SLURM_STEP_ID=0 SLURM_NODELIST=localhost SLURM_NTASKS=2 SLURM_PROCID=1 SLURM_LOCALID=1 \
        python tests/cluster_train_script.py OUT_DIR

Pass ``--no-export`` to train with the environment as the launcher left it.
"""

import json
import os
import sys

import torch
import torchmetrics
from torch import nn

import kerastorch as kt
from kerastorch.examples import digits_loaders


def main(out_dir: str, export: bool) -> None:
    cluster = kt.cluster_environment()
    if export:
        os.environ.update(cluster.torch_env())
    torch.manual_seed(100 + cluster.rank)  # different on purpose: DDP starts every rank from rank 0's weights
    dl_train, dl_val = digits_loaders(batch_size=64, size=8)
    net = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    model = kt.KerasModel(
        net,
        nn.CrossEntropyLoss(),
        {"acc": torchmetrics.Accuracy(task="multiclass", num_classes=10)},
        torch.optim.Adam(net.parameters(), lr=1e-2),
    )
    history = model.fit(dl_train, dl_val, epochs=3, accelerator="cpu", verbose=0)
    seen = {
        "environment": cluster.name,
        "described": cluster.describe(),
        "rank": cluster.rank,
        "world_size": cluster.world_size,
        "num_processes": model.runtime.num_processes if model.runtime else None,
        "backend": torch.distributed.get_backend() if torch.distributed.is_initialized() else None,
        "history": history.to_dict("list"),
    }
    with open(os.path.join(out_dir, f"rank{cluster.rank}.json"), "w") as f:
        json.dump(seen, f)
    if torch.distributed.is_initialized():  # close gloo before exit, not in the interpreter's teardown
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], export="--no-export" not in sys.argv[2:])
