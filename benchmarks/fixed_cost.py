"""What does one ``fit`` call cost before and around its training, in forward passes of the net?

A ``fit`` call checks before any weight changes — the arguments, the first training batch
through the net, the loss and copies of the metrics (inside the real first step, between
its forward pass and its backward), and the first validation batch when there is one —
and it sets up the runtime and the callbacks. This measures that fixed cost on one batch
of data: ``fit(epochs=1)`` on a loader of a single batch against a bare loop over the
same batch (forward, backward, step), divided by the time of one forward pass of the net.
The three are timed in turn, round after round, so a busy machine slows them alike; the
medians are compared. The target is at most 1.5 forward passes.

    python benchmarks/fixed_cost.py [--repeats 30]
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


def interleaved_medians(fns, repeats: int) -> list[float]:
    """The median time of each function, timed in turn within each round."""
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, record in zip(fns, times):
            start = time.perf_counter()
            fn()
            record.append(time.perf_counter() - start)
    return [statistics.median(record) for record in times]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=30)
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
    forward_s, bare_s, fit_s = interleaved_medians((forward, bare, fit), args.repeats)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; seed 003's CNN, one batch of 64 (28x28)")
    print(f"forward pass        {forward_s * 1e3:8.2f} ms")
    print(f"bare loop, 1 batch  {bare_s * 1e3:8.2f} ms")
    print(f"fit, 1 batch        {fit_s * 1e3:8.2f} ms")
    print(f"fixed cost of fit   {(fit_s - bare_s) * 1e3:8.2f} ms = {(fit_s - bare_s) / forward_s:.2f} forward passes")


if __name__ == "__main__":
    main()
