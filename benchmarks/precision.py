"""Seconds per epoch of seed 003's CNN in 32-true, bf16-mixed and 16-mixed.

The digits are scaled to 28x28 and repeated up to ``--samples`` images so that an
epoch is long enough to time; the batch size should fill the GPU. Each precision
trains a fresh net with ``KerasModel.fit`` (validation included); the epoch time is
the median over the epochs after the first (which pays for cuDNN's warm-up).

    python benchmarks/precision.py --batch-size 4096 --samples 120000 --epochs 4
    python benchmarks/precision.py --device cpu --samples 4000 --epochs 2   # a smoke run
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import kerastorch as kt
from kerastorch.examples import create_cnn, digits_datasets


class EpochTimer(kt.Callback):
    """Wall time of each epoch, measured after the device has finished its work."""

    def __init__(self):
        self.seconds: list[float] = []

    def on_epoch_begin(self, epoch, logs=None):
        _synchronize()
        self._start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        _synchronize()
        self.seconds.append(time.perf_counter() - self._start)


def _synchronize():
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def repeated(dataset: TensorDataset, samples: int) -> TensorDataset:
    x, y = dataset.tensors
    times = -(-samples // len(y))
    return TensorDataset(x.repeat(times, 1, 1, 1)[:samples], y.repeat(times)[:samples])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=4096)
    parser.add_argument("--samples", type=int, default=120_000)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--precisions", default="32-true,bf16-mixed,16-mixed")
    args = parser.parse_args()

    train, val, _ = digits_datasets(size=28)
    train = repeated(train, args.samples)
    pin = args.device == "cuda"
    dl_train = DataLoader(train, batch_size=args.batch_size, shuffle=True, pin_memory=pin, num_workers=2)
    dl_val = DataLoader(val, batch_size=args.batch_size, pin_memory=pin)
    print(f"seed 003 CNN, {len(train)} images 1x28x28, batch {args.batch_size}, {args.epochs} epochs, {args.device}")
    for precision in args.precisions.split(","):
        torch.manual_seed(0)
        net = create_cnn()
        model = kt.KerasModel(net, nn.CrossEntropyLoss(), optimizer=torch.optim.Adam(net.parameters(), lr=3e-3))
        timer = EpochTimer()
        history = model.fit(
            dl_train,
            dl_val,
            epochs=args.epochs,
            patience=None,
            verbose=0,
            callbacks=[timer],
            accelerator=args.device,
            devices=1,
            precision=precision,
        )
        steady = timer.seconds[1:] or timer.seconds
        print(
            f"{precision:>10}: {statistics.median(steady):7.3f} s/epoch (first {timer.seconds[0]:.3f} s), "
            f"ran as {model.runtime.precision}, final val_loss {history['val_loss'].iloc[-1]:.4f}"
        )


if __name__ == "__main__":
    main()
