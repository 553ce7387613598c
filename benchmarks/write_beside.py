"""What writing the best-weights file costs an epoch of training, on a thread of its own or not.

Times the bare loop of ``overhead.py``'s tiny MLP for one epoch, in paired rounds (the variants in
turn, their order reversed every other round): alone; with the net's weights file written by
``fit``'s writer (:class:`kerastorch.files.background.BackgroundWriter`, started as the epoch starts);
with the same file written on the loop's thread just before the epoch; and with the weights only
serialized into memory (``torch.save`` to a buffer), no file. Prints each variant's epoch minus the
epoch alone of its round: the median and a 95 % interval for it (``verdicts.py``).

    python benchmarks/write_beside.py [--rounds 100]
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import tempfile
import time

import torch
from overhead import make_parts, run_bare, tiny_mlp_task
from torch.utils.data import DataLoader
from verdicts import median_interval

from kerastorch.files.background import BackgroundWriter
from kerastorch.files.weights import save_weights


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=100)
    args = parser.parse_args()
    title, train, val, make_net, batch_size = tiny_mlp_task()
    dl_train, dl_val = DataLoader(train, batch_size=batch_size, shuffle=True), DataLoader(val, batch_size=batch_size)
    cpu = torch.device("cpu")
    parts = make_parts(make_net)
    weights = {name: tensor.detach().clone() for name, tensor in parts[0].state_dict().items()}
    folder = tempfile.mkdtemp()
    path = os.path.join(folder, "best.pt")
    writer = BackgroundWriter()

    def on_the_thread() -> None:
        writer.start(lambda: save_weights(weights, path))

    variants = {
        "alone": lambda: None,
        "the file written on fit's writer thread": on_the_thread,
        "the file written just before, on the loop's thread": lambda: save_weights(weights, path),
        "the weights serialized into memory, no file": lambda: torch.save(weights, io.BytesIO()),
    }

    def epoch(before) -> float:
        start = time.perf_counter()
        before()
        run_bare(make_net, dl_train, dl_val, 1, cpu, parts=parts)
        writer.wait()
        return time.perf_counter() - start

    epoch(variants["alone"])  # warm-up
    times: dict[str, list[float]] = {name: [] for name in variants}
    for round_ in range(args.rounds):
        names = list(variants) if round_ % 2 == 0 else list(reversed(variants))
        for name in names:
            times[name].append(epoch(variants[name]))
    writer.close()
    size = os.path.getsize(path)
    print(f"{title}: the bare loop's epoch {statistics.median(times['alone']) * 1e3:.1f} ms alone (median)")
    print(f"weights file {size / 1e3:.1f} kB; each variant's epoch minus the epoch alone, ms ({args.rounds} rounds)")
    for name in list(variants)[1:]:
        extra = [(t - alone) * 1e3 for t, alone in zip(times[name], times["alone"])]
        interval = median_interval(extra)
        within = f" ({interval[0]:+.2f} to {interval[1]:+.2f})" if interval else ""
        print(f"{name:<55}{statistics.median(extra):+7.2f}{within}")


if __name__ == "__main__":
    main()
