"""The script every task of examples/slurm/train.sbatch runs: ``srun python train.py``.

It is an ordinary kerastorch script: ``fit`` finds out from SLURM's variables that it is
one rank of a job (``kt.cluster_environment()`` says which, and fit's first printed line),
trains on its share of the data, and only rank 0 prints and writes ``--ckpt-path``. With ``resume=True`` the training
state of every finished epoch is kept beside the checkpoint, so a requeued job continues
where it stopped.

Try it on one machine, as two tasks of a pretend job on the CPU:

    for r in 0 1; do
      SLURM_JOB_ID=1 SLURM_STEP_ID=0 SLURM_NODELIST=localhost SLURM_NTASKS=2 SLURM_PROCID=$r \
      SLURM_LOCALID=$r python examples/slurm/train.py --accelerator cpu --epochs 2 \
        --ckpt-path /tmp/kerastorch-slurm/best.safetensors &
    done; wait
"""

import argparse
import signal
import subprocess

import torch
import torchmetrics
from torch import nn

import kerastorch as kt
from kerastorch.examples import create_cnn, digits_loaders


def requeue_on_sigusr1(cluster: kt.devices.ClusterEnvironment) -> None:
    """Before the time limit (sbatch --signal=USR1@90), put this job back in the queue.

    Requeueing stops every task; the job starts again later and resumes from the last
    finished epoch. Rank 0 asks once; the other tasks just wait to be stopped.
    """

    def requeue(signum, frame):
        if cluster.rank == 0 and cluster.job_id:
            print(f"Time limit near: requeueing SLURM job {cluster.job_id}.", flush=True)
            try:
                subprocess.run(["scontrol", "requeue", cluster.job_id], check=False)
            except OSError as error:  # no scontrol here: not really a SLURM node
                print(f"Could not requeue: {error}", flush=True)

    signal.signal(signal.SIGUSR1, requeue)


def main() -> None:
    parser = argparse.ArgumentParser(description="Train seed 003's CNN on the digits, as one task of a SLURM job.")
    parser.add_argument("--ckpt-path", required=True, help="on a filesystem every node sees")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--accelerator", default="auto", help="'cpu' on a cluster without GPUs")
    args = parser.parse_args()

    cluster = kt.cluster_environment()  # what fit will find: SLURM job 1234, rank 5 of 8 (local 1) on 2 nodes
    requeue_on_sigusr1(cluster)

    torch.manual_seed(0)
    dl_train, dl_val = digits_loaders(batch_size=64)  # plain loaders: fit gives each rank its share
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
