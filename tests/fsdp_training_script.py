"""A small sharded training run for tests/strategies/test_fsdp.py, started as a real subprocess.

    python fsdp_training_script.py OUT_DIR [--devices K] [--kill-at EPOCH BATCH] [--compile]
    torchrun --nproc_per_node 2 fsdp_training_script.py OUT_DIR

It trains a net of two residual blocks with ``strategy="fsdp"`` (the blocks sharded by
``FSDP(wrap=...)``), Adam, a StepLR scheduler, dropout and a shuffled loader, with
``ckpt_path=OUT_DIR/best.safetensors`` and ``resume=True``, and writes the history
(``history.json``), the final weights (``final.safetensors``) and each process's number
of parameter elements (``elements<rank>.txt``). ``--kill-at`` kills the whole process
group (the script and its workers) with SIGKILL before the given batch of the given epoch.
"""

import argparse
import json
import os
import signal

import torch
from safetensors.torch import save_file
from torch import nn
from torch.distributed.tensor import DTensor
from torch.utils.data import DataLoader, TensorDataset

import kerastorch as kt
from helpers import accuracy


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.layer = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Dropout(0.1))

    def forward(self, x):
        return x + self.layer(x)


def make_net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), Block(32), Block(32), nn.Linear(32, 3))


class CountShards(kt.Callback):
    """Each process writes how many parameter elements it holds while training."""

    def __init__(self, folder):
        self.folder = folder

    def on_train_begin(self, logs=None):
        elements = sum(
            p.to_local().numel() if isinstance(p, DTensor) else p.numel() for p in self.model.net.parameters()
        )
        rank = int(os.environ.get("RANK", "0"))
        with open(os.path.join(self.folder, f"elements{rank}.txt"), "w") as f:
            f.write(str(elements))


class KillAt(kt.Callback):
    def __init__(self, epoch, batch):
        self.kill_epoch, self.kill_batch, self.epoch = epoch, batch, None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if (self.epoch, batch) == (self.kill_epoch, self.kill_batch):
            os.killpg(0, signal.SIGKILL)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--kill-at", nargs=2, type=int)
    parser.add_argument("--compile", action="store_true")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)

    g = torch.Generator().manual_seed(1)
    x = torch.randn(400, 8, generator=g)
    y = (x[:, 0] + x[:, 1] > 0).long() + (x[:, 2] > 1).long()
    torch.manual_seed(2)  # the shuffling order
    train = DataLoader(TensorDataset(x[:320], y[:320]), batch_size=32, shuffle=True)
    val = DataLoader(TensorDataset(x[320:], y[320:]), batch_size=30)  # 80 samples: 2 and 1 batches per process

    net = make_net()
    optimizer = torch.optim.Adam(net.parameters(), lr=3e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    model = kt.KerasModel(net, nn.CrossEntropyLoss(), {"acc": accuracy}, optimizer, lr_scheduler=scheduler)
    callbacks = [CountShards(args.out)]
    if args.kill_at:
        callbacks.append(KillAt(*args.kill_at))
    history = model.fit(
        train,
        val,
        epochs=5,
        patience=None,
        monitor="val_acc",
        ckpt_path=os.path.join(args.out, "best.safetensors"),
        resume=True,
        accelerator="cpu",
        devices=args.devices,
        strategy=kt.strategies.FSDP(wrap=[Block]),
        compile=args.compile,
        verbose=0,
        callbacks=callbacks,
    )
    if int(os.environ.get("RANK", "0")) == 0:
        with open(os.path.join(args.out, "history.json"), "w") as f:
            json.dump(history.to_dict("list"), f)
        save_file({k: v.contiguous() for k, v in net.state_dict().items()}, os.path.join(args.out, "final.safetensors"))


if __name__ == "__main__":
    main()
