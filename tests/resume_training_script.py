"""A small training run for tests/callbacks/test_resume.py, started as a real subprocess.

    python resume_training_script.py OUT_DIR CKPT_PATH [--kill-at EPOCH BATCH] [--kill-in-write N]

It trains with dropout, a shuffled DataLoader, numpy and python randomness in the data,
momentum SGD, a StepLR scheduler and metrics of both kinds (functions, a torchmetrics one), with ``resume=True``, and writes the history
(``history.json``) and the final weights (``final.safetensors``) to OUT_DIR.
``--kill-at`` kills the process with SIGKILL before the given batch of the given epoch;
``--kill-in-write`` kills it in the middle of writing the N-th training-state file.
"""

import argparse
import json
import os
import random
import signal

import numpy as np
import torch
import torchmetrics
from safetensors.torch import save_file
from torch import nn
from torch.utils.data import DataLoader, Dataset

import kerastorch as kt
import kerastorch.files.state
from helpers import accuracy
from kerastorch.files.atomic import atomic_path


class NoisyPoints(Dataset):
    """Points in 3 classes; each read adds numpy noise and, at random (python), flips the sign of a feature."""

    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 8, generator=g)
        self.y = (self.x[:, 0] + self.x[:, 1] > 0).long() + (self.x[:, 2] > 1).long()

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        x = self.x[i] + torch.from_numpy(np.random.normal(0, 0.05, size=8).astype(np.float32))
        if random.random() < 0.1:
            x = x.clone()
            x[7] = -x[7]
        return x, self.y[i]


class KillAt(kt.Callback):
    def __init__(self, epoch, batch):
        self.kill_epoch, self.kill_batch, self.epoch = epoch, batch, None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if (self.epoch, batch) == (self.kill_epoch, self.kill_batch):
            os.kill(os.getpid(), signal.SIGKILL)


def die_in_the_nth_write(n):
    """Make the n-th training-state write stop halfway through, as a kill would leave it."""
    real_write, calls = kerastorch.files.state.atomic_write, [0]

    def write(path, write_file):
        calls[0] += 1
        if calls[0] < n:
            return real_write(path, write_file)
        with atomic_path(path) as tmp:
            write_file(tmp)
            os.truncate(tmp, os.path.getsize(tmp) // 2)
            os.kill(os.getpid(), signal.SIGKILL)

    kerastorch.files.state.atomic_write = write


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("ckpt_path")
    parser.add_argument("--kill-at", nargs=2, type=int)
    parser.add_argument("--kill-in-write", type=int)
    args = parser.parse_args()

    torch.set_num_threads(1)
    kt.seed_everything(0)
    dl_train = DataLoader(NoisyPoints(384, seed=1), batch_size=32, shuffle=True)
    dl_val = DataLoader(NoisyPoints(128, seed=2), batch_size=64)
    net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 3))
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    metrics = {
        "acc": accuracy,
        # a function that is not a mean over samples, beside a stateful metric: its epoch value is the
        # same however a run's batches reach the metrics (the first batch of a process's first epoch alone)
        "spread": lambda preds, labels: preds[:, 0].std(),
        "tm_acc": torchmetrics.Accuracy(task="multiclass", num_classes=3),
    }
    model = kt.KerasModel(net, nn.CrossEntropyLoss(), metrics, optimizer, lr_scheduler=scheduler)
    callbacks = [KillAt(*args.kill_at)] if args.kill_at else []
    if args.kill_in_write:
        die_in_the_nth_write(args.kill_in_write)
    history = model.fit(
        dl_train,
        dl_val,
        epochs=6,
        patience=4,
        monitor="val_acc",
        mode="max",
        ckpt_path=args.ckpt_path,
        resume=True,
        verbose=0,
        callbacks=callbacks,
    )
    with open(os.path.join(args.out_dir, "history.json"), "w") as f:
        json.dump(history.to_dict(orient="list"), f)
    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, os.path.join(args.out_dir, "final.safetensors"))


if __name__ == "__main__":
    main()
