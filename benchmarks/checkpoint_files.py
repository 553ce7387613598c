"""What a large net's files cost a run: written in the loop, or on a thread while training goes on.

Trains the net of ``kept_weights.py`` (24 ``Linear(2048, 2048)`` layers, about 100M parameters,
400 MB) for 6 epochs of ``--batches`` batches of 64 (default 1) on the CPU, with a file at every
epoch's end:

* ``--files checkpoint`` (the default): SGD, with ``ModelCheckpoint("e{epoch}.safetensors",
  keep_last=2)``, a 400 MB file;
* ``--files state``: Adam, with ``BackupAndRestore(folder, delete_checkpoint=False)``, the training
  state, 1.6 GB (the weights, Adam's two moments, the best epoch's weights).

Each run also has a callback of the user's that does nothing. One that may read files
(``reads_ckpt_path`` left True) has ``fit`` write each file before the callbacks after the one that
writes it are called, in the loop; one that says it never reads them lets the file be written on a
thread of its own while the next epoch trains. Prints the time of the whole ``fit`` (which waits for
the last file) for each, in turn, in fresh processes.

A file can be written on a thread only while there is training to overlap it: with epochs of one
batch the next file soon waits for it, and a state's copy costs as much as it saves.

    python benchmarks/checkpoint_files.py [--rounds 3] [--files checkpoint|state] [--batches 1]
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


def measure(files: str, batches: int, on_thread: bool) -> float:
    torch.manual_seed(0)
    net = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])
    samples = 64 * batches
    loader = DataLoader(TensorDataset(torch.randn(samples, WIDTH), torch.zeros(samples, WIDTH)), batch_size=64)
    if files == "state":  # Adam's moments make the state three times the net, and the best weights a fourth
        optimizer: torch.optim.Optimizer = torch.optim.Adam(net.parameters(), lr=1e-5)
    else:
        optimizer = torch.optim.SGD(net.parameters(), lr=1e-3)
    model = kt.KerasModel(net, nn.MSELoss(), optimizer=optimizer)
    with tempfile.TemporaryDirectory() as folder:
        if files == "state":
            writer: kt.Callback = kt.callbacks.BackupAndRestore(folder, delete_checkpoint=False)
            expected = ["training.state"]
        else:
            writer = kt.callbacks.ModelCheckpoint(os.path.join(folder, "e{epoch}.safetensors"), keep_last=2)
            expected = [f"e{EPOCHS - 1}.safetensors", f"e{EPOCHS}.safetensors"]
        users = NeverReadsFiles() if on_thread else MayReadFiles()
        start = time.perf_counter()
        model.fit(loader, epochs=EPOCHS, monitor="train_loss", patience=None, verbose=0, callbacks=[writer, users])
        seconds = time.perf_counter() - start
        assert sorted(os.listdir(folder)) == expected, os.listdir(folder)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--files", choices=["checkpoint", "state"], default="checkpoint")
    parser.add_argument("--batches", type=int, default=1, help="batches of 64 in an epoch")
    args = parser.parse_args()
    optimizer, kind = ("Adam", "a training state") if args.files == "state" else ("SGD", "a ModelCheckpoint file")
    print(
        f"torch {torch.__version__}; {LAYERS} x Linear({WIDTH}, {WIDTH}), {optimizer}, {EPOCHS} epochs of "
        f"{args.batches} batches, {kind} at each"
    )
    times: dict[str, list[float]] = {"in the loop": [], "on its thread": []}
    for round_ in range(args.rounds):
        ways = list(times) if round_ % 2 == 0 else list(reversed(times))
        for way in ways:
            one = [sys.executable, __file__, "--one", args.files, str(args.batches), str(int(way == "on its thread"))]
            times[way].append(float(subprocess.run(one, check=True, capture_output=True, text=True).stdout))
    for way, seconds in times.items():
        each = " ".join(f"{s:.2f}" for s in seconds)
        print(f"files written {way:<14} fit {statistics.median(seconds):5.2f} s (median; each: {each})")


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--one":
        print(measure(sys.argv[2], int(sys.argv[3]), bool(int(sys.argv[4]))))
    else:
        main()
