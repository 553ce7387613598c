"""What keeping the best weights costs a run of a large net: time per kept epoch and host memory.

``fit`` keeps a copy of the best epoch's weights in host memory (and writes it to ``ckpt_path``
when given). This trains a stack of 24 ``Linear(2048, 2048)`` layers (about 100M parameters,
400 MB) with SGD for 6 epochs of one batch on the CPU; its training loss falls every epoch, so
every epoch is the best so far and its weights are kept. It prints the time of each keep
(the copy, and with ``ckpt_path`` the wait for the previous epoch's file, which is written on a
thread while training goes on), the time of the whole ``fit`` (which waits for the last file)
and how much the process's peak resident memory grew during ``fit``: the gradients (400 MB)
plus what the keeping holds. Each configuration runs in a fresh process, so that the peak is
its own.

    python benchmarks/kept_weights.py
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import kerastorch as kt
from kerastorch.callbacks.kept_weights import KeptWeights

WIDTH, LAYERS, EPOCHS = 2048, 24, 6


def measure(with_file: bool) -> None:
    torch.manual_seed(0)
    net = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])
    x = torch.randn(64, WIDTH)
    loader = DataLoader(TensorDataset(x, torch.zeros(64, WIDTH)), batch_size=64)
    spent: list[float] = []
    keep = KeptWeights.keep

    def timed_keep(self: KeptWeights, model: object) -> dict:
        start = time.perf_counter()
        try:
            return keep(self, model)
        finally:
            spent.append(time.perf_counter() - start)

    KeptWeights.keep = timed_keep  # type: ignore[method-assign]
    model = kt.KerasModel(net, nn.MSELoss(), optimizer=torch.optim.SGD(net.parameters(), lr=1e-3))
    with tempfile.TemporaryDirectory() as folder:
        ckpt_path = os.path.join(folder, "best.safetensors") if with_file else None
        peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        start = time.perf_counter()
        history = model.fit(loader, epochs=EPOCHS, monitor="train_loss", patience=None, ckpt_path=ckpt_path, verbose=0)
        seconds = time.perf_counter() - start  # with the last file's write, which fit waits for
        grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_before  # KiB on Linux
    assert history["train_loss"].is_monotonic_decreasing and len(spent) == EPOCHS
    size = sum(p.numel() * p.element_size() for p in net.parameters()) / 2**20
    label = "with ckpt_path" if with_file else "in memory only"
    keeps = " ".join(f"{s * 1e3:.0f}" for s in spent)
    print(
        f"{label:<16} keeps (ms): {keeps:<32} fit {seconds:5.2f} s   peak memory grew {grown / 1024:6.0f} MB "
        f"(net {size:.0f} MB)"
    )


def main() -> None:
    print(f"torch {torch.__version__}; {LAYERS} x Linear({WIDTH}, {WIDTH}), SGD, {EPOCHS} epochs, each the best")
    for with_file in (False, True):
        subprocess.run([sys.executable, __file__, "--one", str(int(with_file))], check=True)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--one":
        measure(bool(int(sys.argv[2])))
    else:
        main()
