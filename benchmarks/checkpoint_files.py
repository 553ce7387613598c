"""What a ``ModelCheckpoint`` costs a run of a large net: its files written in the loop or on a thread.

Trains the net of ``kept_weights.py`` (24 ``Linear(2048, 2048)`` layers, about 100M parameters,
400 MB) with SGD for 6 epochs of one batch on the CPU, with
``ModelCheckpoint("e{epoch}.safetensors", keep_last=2)``: a 400 MB file at every epoch's end. Each
run also has a callback of the user's that does nothing. One that may read files
(``reads_ckpt_path`` left True) has ``fit`` write each file before the callbacks after the
checkpoint are called, in the loop; one that says it never reads them lets the file be written on
the checkpoint's thread while the next epoch trains. Prints the time of the whole ``fit`` (which
waits for the last file) for each, in turn, in fresh processes.

    python benchmarks/checkpoint_files.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import kerastorch as kt

WIDTH, LAYERS, EPOCHS = 2048, 24, 6


class MayReadFiles(kt.Callback):
    """A callback of the user's: for all fit knows, it reads the files at the epoch's end."""

    def on_epoch_end(self, epoch, logs=None):
        pass


class NeverReadsFiles(MayReadFiles):
    reads_ckpt_path = False


def measure(on_thread: bool) -> float:
    torch.manual_seed(0)
    net = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])
    loader = DataLoader(TensorDataset(torch.randn(64, WIDTH), torch.zeros(64, WIDTH)), batch_size=64)
    model = kt.KerasModel(net, nn.MSELoss(), optimizer=torch.optim.SGD(net.parameters(), lr=1e-3))
    with tempfile.TemporaryDirectory() as folder:
        checkpoint = kt.callbacks.ModelCheckpoint(os.path.join(folder, "e{epoch}.safetensors"), keep_last=2)
        users = NeverReadsFiles() if on_thread else MayReadFiles()
        start = time.perf_counter()
        model.fit(loader, epochs=EPOCHS, monitor="train_loss", patience=None, verbose=0, callbacks=[checkpoint, users])
        seconds = time.perf_counter() - start
        assert sorted(os.listdir(folder)) == [f"e{EPOCHS - 1}.safetensors", f"e{EPOCHS}.safetensors"]
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"torch {torch.__version__}; {LAYERS} x Linear({WIDTH}, {WIDTH}), SGD, {EPOCHS} epochs, a file at each")
    times: dict[str, list[float]] = {"in the loop": [], "on its thread": []}
    for round_ in range(args.rounds):
        ways = list(times) if round_ % 2 == 0 else list(reversed(times))
        for way in ways:
            one = [sys.executable, __file__, "--one", str(int(way == "on its thread"))]
            times[way].append(float(subprocess.run(one, check=True, capture_output=True, text=True).stdout))
    for way, seconds in times.items():
        each = " ".join(f"{s:.2f}" for s in seconds)
        print(f"files written {way:<14} fit {statistics.median(seconds):5.2f} s (median; each: {each})")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--one":
        print(measure(bool(int(sys.argv[2]))))
    else:
        main()
