"""Samples per second of one CPU process against two, on seed 003's CNN.

Trains ``kerastorch.examples.create_cnn`` on the 28x28 digits with
``fit(accelerator="cpu", devices=1)`` (with torch's default threads, then with one
thread) and then ``devices=2`` (two processes forked by ``fit``, gloo all-reduce of the
gradients, the cores shared out between them by accelerate), and prints the training throughput of
each: samples of one epoch over the seconds of its training phase (validation
excluded), median over the epochs after the first. It also prints the wall time of the
whole ``fit`` call, which for two processes includes starting them.

There is no target: on a 2-core machine two processes share the cores that one
process's threads would use, so the number says what DDP costs or gains here, not what
it gains on a machine with a core (or a GPU) per process.

    python benchmarks/processes.py [--epochs 4] [--batch-size 64]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch
from torch import nn
from torch.utils.data import DataLoader

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kerastorch as kt
from kerastorch.examples import create_cnn, digits_datasets


class TrainingTimer(kt.Callback):
    """Times the training phase of each epoch; the main process writes the times to ``path``."""

    def __init__(self, path: str):
        self.path = path
        self.seconds: list[float] = []
        self._start = 0.0

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.perf_counter()

    def on_test_begin(self, logs=None):
        self.seconds.append(time.perf_counter() - self._start)

    def on_train_end(self, logs=None):
        if self.model.is_main_process:
            with open(self.path, "w") as f:
                json.dump(self.seconds, f)


def measure(devices: int, epochs: int, batch_size: int, threads: int) -> dict:
    ds_train, ds_val, _ = digits_datasets(size=28)
    torch.manual_seed(0)
    dl_train = DataLoader(ds_train, batch_size=batch_size, shuffle=True)
    dl_val = DataLoader(ds_val, batch_size=256)
    net = create_cnn()
    model = kt.KerasModel(net, nn.CrossEntropyLoss(), {}, torch.optim.Adam(net.parameters(), lr=1e-3))
    default_threads = torch.get_num_threads()
    torch.set_num_threads(threads)  # in one process; accelerate gives each of several processes its share
    with tempfile.TemporaryDirectory() as folder:
        times_file = os.path.join(folder, "times.json")
        start = time.perf_counter()
        model.fit(
            dl_train,
            dl_val,
            epochs=epochs,
            patience=None,
            accelerator="cpu",
            devices=devices,
            verbose=0,
            callbacks=[TrainingTimer(times_file)],
        )
        wall = time.perf_counter() - start
        with open(times_file) as f:
            seconds = json.load(f)
    torch.set_num_threads(default_threads)
    steady = statistics.median(seconds[1:] if len(seconds) > 1 else seconds)
    return {
        "devices": devices,
        "threads": threads if devices == 1 else max(1, threads // devices),
        "samples_per_second": len(ds_train) / steady,
        "epoch_seconds": steady,
        "fit_wall_seconds": wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()
    print(
        f"seed 003 CNN, 28x28 digits ({len(digits_datasets(size=28)[0])} training samples), batch {args.batch_size}, "
        f"{args.epochs} epochs, torch {torch.__version__}, {os.cpu_count()} CPU cores"
    )
    cores = torch.get_num_threads()
    # One process with all the cores' threads, one with one thread, then two processes sharing the cores.
    runs = [(1, cores), (1, 1), (2, cores)] if cores > 1 else [(1, 1), (2, 1)]
    results = [measure(devices, args.epochs, args.batch_size, threads) for devices, threads in runs]
    one = results[0]["samples_per_second"]
    print(
        f"{'processes':>9}  {'threads each':>12}  {'samples/s':>10}  {'vs first':>8}  {'s/epoch':>8}  "
        f"{'fit wall s':>10}"
    )
    for r in results:
        print(
            f"{r['devices']:>9}  {r['threads']:>12}  {r['samples_per_second']:>10.0f}  "
            f"{r['samples_per_second'] / one:>7.2f}x  {r['epoch_seconds']:>8.2f}  {r['fit_wall_seconds']:>10.1f}"
        )


if __name__ == "__main__":
    main()
