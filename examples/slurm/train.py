"""The script every task of examples/slurm/train.sbatch runs: ``srun python train.py``.

It is an ordinary kerastorch script: ``fit`` finds out from SLURM's variables that it is
one rank of a job (``kt.cluster_environment()`` says which, and fit's first printed line),
trains on its share of the data, and only rank 0 prints and writes ``--ckpt-path``. With ``resume=True`` the training
state of every finished epoch is kept beside the checkpoint. When SLURM sends SIGUSR1 before
the time limit (``--signal=USR1@90``), fit finishes the batch, writes the state, runs
``scontrol requeue`` and raises ``kt.Preempted``: the requeued job continues from that batch.
The script needs no signal handler of its own.

Try it on one machine, as two tasks of a pretend job on the CPU:

    for r in 0 1; do
      SLURM_JOB_ID=1 SLURM_STEP_ID=0 SLURM_NODELIST=localhost SLURM_NTASKS=2 SLURM_PROCID=$r \
      SLURM_LOCALID=$r python examples/slurm/train.py --accelerator cpu --epochs 2 \
        --ckpt-path /tmp/kerastorch-slurm/best.safetensors &
    done; wait
"""

import argparse

import torch
import torchmetrics
from torch import nn

import kerastorch as kt
from kerastorch.examples import create_cnn, digits_loaders


def main() -> None:
    parser = argparse.ArgumentParser(description="Train seed 003's CNN on the digits, as one task of a SLURM job.")
    parser.add_argument("--ckpt-path", required=True, help="on a filesystem every node sees")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--accelerator", default="auto", help="'cpu' on a cluster without GPUs")
    args = parser.parse_args()

    torch.manual_seed(0)
    dl_train, dl_val, _ = digits_loaders(batch_size=64)  # plain loaders: fit gives each rank its share
    net = create_cnn()
    model = kt.KerasModel(
        net,
        nn.CrossEntropyLoss(),
        {"acc": torchmetrics.Accuracy(task="multiclass", num_classes=10)},
        torch.optim.Adam(net.parameters(), lr=1e-3),
    )
    model.fit(  # its first line names the job and the rank layout
        dl_train,
        dl_val,
        epochs=args.epochs,
        accelerator=args.accelerator,
        ckpt_path=args.ckpt_path,
        resume=True,
        monitor="val_acc",
        mode="max",
        verbose=2,
    )
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
