"""A small training run for tests/callbacks/test_backup.py and tests/training/test_preemption.py, started as a real process.

    python backup_training_script.py OUT_DIR [--devices K] [--workers N] [--accumulate A]
                                     [--save-freq N] [--act EPOCH BATCH WHAT]

It trains with dropout, a shuffled DataLoader (with ``--workers`` worker processes), a Dataset
that draws from numpy, python's ``random`` and a numpy Generator of its own, momentum SGD with an
lr scheduler stepped after every optimizer step, ``--accumulate`` batches per optimizer step, a
plain-function metric and a stateful one, and ``BackupAndRestore(OUT_DIR/backup, save_freq,
delete_checkpoint=False)``. It writes the history (``history.json``) and the final weights
(``final.safetensors``) to OUT_DIR. A ``kt.Preempted`` is not caught: the script ends with it, as a
user's would.

``--act EPOCH BATCH WHAT`` acts before that batch of that epoch (in the process of rank 0):
``kill`` (SIGKILL to the whole process group), ``term`` (SIGTERM to this process), or
``term-parent`` / ``usr1-parent`` (SIGTERM / SIGUSR1 to the process that started the workers).
"""

import argparse
import json
import os
import random
import signal

import numpy as np
import torch
from safetensors.torch import save_file
from torch import nn
from torch.utils.data import DataLoader, Dataset

import kerastorch as kt
from helpers import TorchkerasAccuracy, accuracy


class NoisyPoints(Dataset):
    """Points in 3 classes; each read adds numpy noise, a jitter from its own Generator and, at
    random (python), flips the sign of a feature."""

    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 8, generator=g)
        self.y = (self.x[:, 0] + self.x[:, 1] > 0).long() + (self.x[:, 2] > 1).long()
        self.jitter = np.random.default_rng(seed)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        noise = np.random.normal(0, 0.05, size=8) + self.jitter.normal(0, 0.02, size=8)
        x = self.x[i] + torch.from_numpy(noise.astype(np.float32))
        if random.random() < 0.1:
            x = x.clone()
            x[7] = -x[7]
        return x, self.y[i]


class ActAt(kt.Callback):
    def __init__(self, epoch, batch, what):
        self.at, self.what, self.epoch = (epoch, batch), what, None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if (self.epoch, batch) != self.at or int(os.environ.get("RANK", "0")) != 0:
            return
        if self.what == "kill":
            os.killpg(0, signal.SIGKILL)
        elif self.what == "term":
            os.kill(os.getpid(), signal.SIGTERM)
        else:  # the process that forked the workers, as a cluster or `docker stop` would signal it
            os.kill(os.getppid(), signal.SIGTERM if self.what == "term-parent" else signal.SIGUSR1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--accumulate", type=int, default=1)
    parser.add_argument("--save-freq", type=int, default=3)
    parser.add_argument("--act", nargs=3)
    args = parser.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)

    torch.set_num_threads(1)
    kt.seed_everything(0)
    dl_train = DataLoader(NoisyPoints(192, seed=1), batch_size=16, shuffle=True, num_workers=args.workers)
    dl_val = DataLoader(NoisyPoints(64, seed=2), batch_size=32)
    net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 3))
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.8)
    model = kt.KerasModel(
        net,
        nn.CrossEntropyLoss(),
        {"acc": accuracy, "counted_acc": TorchkerasAccuracy()},
        optimizer,
        lr_scheduler=scheduler,
        lr_scheduler_interval="step",
    )
    backup = kt.callbacks.BackupAndRestore(
        os.path.join(args.out_dir, "backup"), save_freq=args.save_freq, delete_checkpoint=False
    )
    callbacks = [backup]
    if args.act:
        callbacks.append(ActAt(int(args.act[0]), int(args.act[1]), args.act[2]))
    history = model.fit(
        dl_train,
        dl_val,
        epochs=3,
        patience=None,
        verbose=0,
        devices=args.devices,
        accelerator="cpu",
        gradient_accumulation_steps=args.accumulate,
        callbacks=callbacks,
    )
    with open(os.path.join(args.out_dir, "history.json"), "w") as f:
        json.dump(history.to_dict(orient="list"), f)
    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, os.path.join(args.out_dir, "final.safetensors"))


if __name__ == "__main__":
    main()
