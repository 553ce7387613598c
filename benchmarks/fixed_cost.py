"""What does one ``fit`` call cost before and around its training, in forward passes of the net?

A ``fit`` call checks before any weight changes: the first training batch (and the first
validation batch) through the net and the loss, copies of the metrics on it, the
arguments; and it sets up the runtime and the callbacks. This measures that fixed cost
on one batch of data — ``fit(epochs=1)`` on a loader of a single batch against a bare
loop over the same batch (forward, backward, step) — and divides the difference by the
time of one forward pass of the net.

    python benchmarks/fixed_cost.py [--repeats 20]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import kerastorch as kt
from kerastorch.examples import create_cnn


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    x, y = torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,))
    loader = DataLoader(TensorDataset(x, y), batch_size=64)
    net = create_cnn()
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)

    def forward():
        with torch.no_grad():
            net(x)

    def bare():
        for xb, yb in loader:
            loss = loss_fn(net(xb), yb)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()

    model = kt.KerasModel(net, loss_fn, optimizer=optimizer)

    def fit():
        model.fit(loader, epochs=1, verbose=0, patience=None)

    for fn in (forward, bare, fit):  # warm up
        fn()
    forward_s, bare_s, fit_s = (timed(fn, args.repeats) for fn in (forward, bare, fit))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; seed 003's CNN, one batch of 64 (28x28)")
    print(f"forward pass        {forward_s * 1e3:8.2f} ms")
    print(f"bare loop, 1 batch  {bare_s * 1e3:8.2f} ms")
    print(f"fit, 1 batch        {fit_s * 1e3:8.2f} ms")
    print(f"fixed cost of fit   {(fit_s - bare_s) * 1e3:8.2f} ms = {(fit_s - bare_s) / forward_s:.2f} forward passes")


if __name__ == "__main__":
    main()
