"""What a thread that has run a torch op costs the training loop while it lives.

Why ``fit`` does no torch work on a thread of its own (its best-weights file is written on one
that only hands tensors to the file, and lives for the run): times the bare loop of
``overhead.py``'s tiny MLP alone, then beside a thread that ran one op and waits, and again once
that thread has ended. The ops: none; a small one; a copy large enough for torch to split it
over its threads; and one ``torchmetrics`` accuracy update of 4,096 rows, the work a standing
worker for the metrics would do. With torch on OpenMP, a thread that ran a split op keeps a team
of OpenMP threads of its own while it lives, beside the training thread's.

    python benchmarks/thread_beside.py [--epochs 4]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import torch
import torchmetrics
from overhead import run_bare, tiny_mlp_task
from torch.utils.data import DataLoader


def run_then_wait(op, done: threading.Event) -> None:
    op()
    done.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=4, help="epochs timed in each state")
    args = parser.parse_args()
    title, train, val, make_net, batch_size = tiny_mlp_task()
    dl_train, dl_val = DataLoader(train, batch_size=batch_size, shuffle=True), DataLoader(val, batch_size=batch_size)
    cpu = torch.device("cpu")

    def epoch_ms() -> float:
        return statistics.median(run_bare(make_net, dl_train, dl_val, 1, cpu) * 1e3 for _ in range(args.epochs))

    big = torch.randn(8_000_000)
    metric = torchmetrics.Accuracy(task="multiclass", num_classes=10)
    preds, labels = torch.randn(4096, 10), torch.randint(0, 10, (4096,))
    ops = {
        "no torch op": lambda: None,
        "a small op (100 numbers)": lambda: torch.ones(100).add(1),
        "a copy of 8M numbers": lambda: big.clone(),
        "an Accuracy update, 4,096 rows": lambda: metric.update(preds, labels),
    }
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads ({torch.__config__.parallel_info().split()[-1]})"
    )
    print(f"{title}: the bare loop's epoch, ms (median of {args.epochs})")
    run_bare(make_net, dl_train, dl_val, 1, cpu)  # warm-up
    print(f"{'alone':<60}{epoch_ms():>8.1f}")
    for name, op in ops.items():
        done = threading.Event()
        thread = threading.Thread(target=run_then_wait, args=(op, done))
        thread.start()
        time.sleep(0.05)  # the op has run; the thread waits
        beside = epoch_ms()
        done.set()
        thread.join()
        print(f"{'beside a thread that ran ' + name:<60}{beside:>8.1f}   after it ended {epoch_ms():>6.1f}")


if __name__ == "__main__":
    main()
