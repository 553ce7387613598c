"""How much of a net does each process hold: one process, two with DDP, two with FSDP?

Trains a stack of 12 ``Linear(2048, 2048)`` layers (about 50M parameters) with Adam for
two steps per process on random data, and after the second backward pass (when the
gradients and Adam's two moments all exist) each process counts the bytes of the
parameters, the gradients and the optimizer state it holds — for a sharded net, its local
shards. The ``strategy="fsdp"`` figure per process should be at most 0.55 of DDP's.

    python benchmarks/memory.py
"""

from __future__ import annotations

import json
import os
import tempfile

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.utils.data import DataLoader, TensorDataset

import kerastorch as kt

WIDTH, LAYERS = 2048, 12


def local_bytes(tensor: torch.Tensor) -> int:
    local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    return local.numel() * local.element_size()


class CountBytes(kt.Callback):
    """After the second backward pass, each process writes what it holds to ``rank<r>.json``."""

    def __init__(self, folder: str):
        self.folder = folder
        self.done = False

    def on_after_backward(self) -> None:
        optimizer = self.model.optimizer
        if self.done or not optimizer.state:  # Adam's state exists after the first step
            return
        params = list(self.model.net.parameters())
        held = {
            "parameters": sum(local_bytes(p) for p in params),
            "gradients": sum(local_bytes(p.grad) for p in params if p.grad is not None),
            "optimizer state": sum(
                local_bytes(v) for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v)
            ),
        }
        with open(os.path.join(self.folder, f"rank{os.environ.get('RANK', '0')}.json"), "w") as f:
            json.dump(held, f)
        self.done = True


def measure(devices: int, strategy: str) -> dict:
    torch.manual_seed(0)
    net = nn.Sequential(*[nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU()) for _ in range(LAYERS)])
    model = kt.KerasModel(net, nn.MSELoss(), optimizer=torch.optim.Adam(net.parameters(), lr=1e-4))
    x = torch.randn(16 * 2 * devices, WIDTH)
    loader = DataLoader(TensorDataset(x, x), batch_size=16)
    with tempfile.TemporaryDirectory() as folder:
        model.fit(
            loader,
            epochs=1,
            patience=None,
            accelerator="cpu",
            devices=devices,
            strategy=strategy,
            verbose=0,
            callbacks=[CountBytes(folder)],
        )
        with open(os.path.join(folder, "rank0.json")) as f:
            held = json.load(f)
    held["total"] = sum(held.values())
    held["parameter count"] = sum(p.numel() for p in net.parameters())
    return held


def main() -> None:
    runs = {
        "1 process": measure(1, "auto"),
        "2 processes, DDP": measure(2, "ddp"),
        "2 processes, FSDP": measure(2, "fsdp"),
    }
    count = runs["1 process"]["parameter count"]
    print(f"torch {torch.__version__}; {LAYERS} x Linear({WIDTH}, {WIDTH}): {count / 1e6:.1f}M parameters, Adam")
    print("MB per process (rank 0)     parameters  gradients  optimizer state    total  vs DDP")
    ddp_total = runs["2 processes, DDP"]["total"]
    for name, held in runs.items():
        mb = {k: v / 2**20 for k, v in held.items()}
        print(
            f"{name:<26} {mb['parameters']:11.1f} {mb['gradients']:10.1f} {mb['optimizer state']:16.1f} "
            f"{mb['total']:8.1f} {held['total'] / ddp_total:7.2f}"
        )


if __name__ == "__main__":
    main()
