"""kerastorch beside the libraries a user would pick instead, on the same work, in one process.

Needs the ``bench`` extra (poutyne, Lightning, Keras 3, torchkeras), which CI never installs;
a library that is missing is left out of the table. Every run uses the CPU, torch's default
threads, and the same nets, data, initial weights and optimizer (Adam, lr 1e-3; Keras's own
Adam for Keras), with what every loop here does: a validation pass after each epoch and an
accuracy metric (torchmetrics where the library takes torch metrics, the library's own
``"accuracy"`` for poutyne and Keras). Each library's loop is written the way its docs show:

* ``bare``: forward, backward, step; a validation forward pass; nothing logged (the unit).
* ``seed loop``: seed 003's hand-written loop (``benchmarks/overhead.py``: tqdm bars,
  ``.item()`` per step, a metric call per step, early stopping and a checkpoint file).
* ``torchkeras``: ``torchkeras.KerasModel(...).fit(train_data, val_data, ...)`` with
  ``plot=False``; it always writes its checkpoint and draws its tqdm bars.
* ``Lightning``: a ``LightningModule`` logging its loss and torchmetrics accuracy with
  ``self.log``; ``Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
  enable_model_summary=False)``, its other defaults (two sanity-check validation batches).
* ``poutyne``: ``Model(net, optimizer, loss, batch_metrics=["accuracy"]).fit_generator(...)``.
* ``Keras 3``: the torch net in a ``keras.layers.TorchModuleWrapper``, compiled with Keras's
  Adam, ``SparseCategoricalCrossentropy(from_logits=True)`` and ``metrics=["accuracy"]``;
  ``model.fit(torch DataLoader, validation_data=...)`` on the torch backend.
* ``kerastorch``: ``KerasModel(net, loss, {"acc": Accuracy}, optimizer).fit(dl_train, dl_val,
  patience=None)``.

Progress output is off wherever a library can turn it off (``--progress default`` leaves
each at its default instead; the seed loop and torchkeras always draw theirs); all of it is
sent to /dev/null. Three workloads, timed in turn, round after round, so a busy machine
slows all alike:

1. seconds per epoch ÷ the bare loop's, on the tiny MLP (16k samples, batch 64) and seed
   003's CNN (``overhead.py``'s tasks); a library's epochs are timed from its first
   epoch's begin hook to the return of its fit call, so its set-up is left out;
2. the fixed cost of one fit call: one epoch on one training batch and one validation
   batch, of the tiny MLP (where nearly all of it is the library's own work) and of the CNN,
   the model built once beforehand (median milliseconds, and over the bare loop's), and
   whether kerastorch's call is at most 2x poutyne's, from the rounds' ratios and their noise
   (``verdicts.py``);
3. host syncs per training step on the tiny MLP, counted with the tests' counter
   (``tests/host_syncs.py``): two runs of 8 and 24 steps, the difference per step.

    python benchmarks/peers.py [--repeats 5] [--epochs 3] [--only mlp cnn startup syncs] [--threads 1] 2>/dev/null
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.util
import logging
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Optional

os.environ.setdefault("KERAS_BACKEND", "torch")  # before anything imports keras

import torch
import torchmetrics
from overhead import cnn_task, make_parts, run_bare, run_seed_loop, tiny_mlp_task
from torch import nn
from torch.utils.data import DataLoader, Subset
from verdicts import verdict

import kerastorch as kt

# The tests' counter: one definition of a host sync for the guard test and this table.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from host_syncs import syncs_per_step

LOOPS = ["bare", "seed loop", "torchkeras", "Lightning", "poutyne", "Keras 3", "kerastorch"]
NEEDS = {"torchkeras": "torchkeras", "Lightning": "lightning", "poutyne": "poutyne", "Keras 3": "keras"}
LR = 1e-3
FIXED_COST_TARGET = 2.0  # the most a one-batch fit call may take, in poutyne's calls


def accuracy_metric() -> torchmetrics.Metric:
    return torchmetrics.Accuracy(task="multiclass", num_classes=10)


class Clock:
    """When a library's first epoch began (its epoch-begin hook sets ``start``)."""

    def __init__(self) -> None:
        self.start: Optional[float] = None

    def tick(self) -> None:
        if self.start is None:
            self.start = time.perf_counter()


# -- one function per library: build (not timed), and the fit call (timed) -------------------------
# build(make_net) -> model; fit(model, dl_train, dl_val, epochs, clock, progress) -> None


def build_kerastorch(make_net: Callable) -> Any:
    torch.manual_seed(0)
    net = make_net()
    return kt.KerasModel(net, nn.CrossEntropyLoss(), {"acc": accuracy_metric()}, torch.optim.Adam(net.parameters(), LR))


def fit_kerastorch(model: Any, dl_train: Any, dl_val: Any, epochs: int, clock: Clock, progress: bool) -> None:
    class EpochBegins(kt.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            clock.tick()

    model.fit(dl_train, dl_val, epochs=epochs, patience=None, verbose=int(progress), callbacks=[EpochBegins()])


def build_torchkeras(make_net: Callable) -> Any:
    import torchkeras

    torch.manual_seed(0)
    net = make_net()
    return torchkeras.KerasModel(
        net,
        nn.CrossEntropyLoss(),
        metrics_dict={"acc": accuracy_metric()},
        optimizer=torch.optim.Adam(net.parameters(), LR),
    )


def fit_torchkeras(model: Any, dl_train: Any, dl_val: Any, epochs: int, clock: Clock, progress: bool) -> None:
    class FitStarts:  # torchkeras's callbacks have no epoch-begin hook; fit starts right before epoch 1
        def on_fit_start(self, model):
            clock.tick()

    model.from_scratch = True  # torchkeras's fit reloads its checkpoint, after which it would run an epoch 0
    with tempfile.TemporaryDirectory() as folder:
        model.fit(
            train_data=dl_train,
            val_data=dl_val,
            epochs=epochs,
            ckpt_path=os.path.join(folder, "checkpoint"),
            patience=epochs,
            monitor="val_acc",
            mode="max",
            plot=False,  # plot=True draws in a notebook; without it torchkeras draws tqdm bars
            callbacks=[FitStarts()],
        )


def build_lightning(make_net: Callable) -> Any:
    import lightning as L
    from torch.nn import functional as F

    class LitClassifier(L.LightningModule):
        """Lightning's docs' classifier: the loss and a torchmetrics accuracy logged with self.log."""

        def __init__(self, net: nn.Module):
            super().__init__()
            self.net = net
            self.train_acc, self.val_acc = accuracy_metric(), accuracy_metric()

        def training_step(self, batch, batch_idx):
            x, y = batch
            logits = self.net(x)
            loss = F.cross_entropy(logits, y)
            self.train_acc(logits, y)
            self.log("train_loss", loss)
            self.log("train_acc", self.train_acc, on_step=False, on_epoch=True)
            return loss

        def validation_step(self, batch, batch_idx):
            x, y = batch
            logits = self.net(x)
            self.val_acc(logits, y)
            self.log("val_loss", F.cross_entropy(logits, y))
            self.log("val_acc", self.val_acc)

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), LR)

    torch.manual_seed(0)
    return LitClassifier(make_net())


def fit_lightning(model: Any, dl_train: Any, dl_val: Any, epochs: int, clock: Clock, progress: bool) -> None:
    import lightning as L

    class EpochBegins(L.Callback):
        def on_train_epoch_start(self, trainer, pl_module):
            clock.tick()

    trainer = L.Trainer(
        max_epochs=epochs,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=progress,
        callbacks=[EpochBegins()],
    )
    trainer.fit(model, dl_train, dl_val)


def build_poutyne(make_net: Callable) -> Any:
    import poutyne

    torch.manual_seed(0)
    net = make_net()
    return poutyne.Model(
        net, torch.optim.Adam(net.parameters(), LR), nn.CrossEntropyLoss(), batch_metrics=["accuracy"], device="cpu"
    )


def fit_poutyne(model: Any, dl_train: Any, dl_val: Any, epochs: int, clock: Clock, progress: bool) -> None:
    import poutyne

    class EpochBegins(poutyne.Callback):
        def on_epoch_begin(self, epoch_number, logs):
            clock.tick()

    model.fit_generator(dl_train, dl_val, epochs=epochs, verbose=progress, callbacks=[EpochBegins()])


def build_keras(make_net: Callable) -> Any:
    import keras

    torch.manual_seed(0)
    net = make_net()
    shape = tuple(_INPUT_SHAPES[make_net])
    model = keras.Sequential([keras.Input(shape=shape), keras.layers.TorchModuleWrapper(net)])
    model.compile(
        optimizer=keras.optimizers.Adam(LR),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def fit_keras(model: Any, dl_train: Any, dl_val: Any, epochs: int, clock: Clock, progress: bool) -> None:
    import keras

    class EpochBegins(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            clock.tick()

    model.fit(
        dl_train, validation_data=dl_val, epochs=epochs, verbose="auto" if progress else 0, callbacks=[EpochBegins()]
    )


LIBRARIES = {
    "torchkeras": (build_torchkeras, fit_torchkeras),
    "Lightning": (build_lightning, fit_lightning),
    "poutyne": (build_poutyne, fit_poutyne),
    "Keras 3": (build_keras, fit_keras),
    "kerastorch": (build_kerastorch, fit_kerastorch),
}
_INPUT_SHAPES: dict = {}  # make_net -> the shape of one sample, for Keras's Input


def available_loops() -> list[str]:
    missing = [name for name, module in NEEDS.items() if importlib.util.find_spec(module) is None]
    for name in missing:
        print(f"({name} is not installed: left out. pip install 'kerastorch[bench]')")
    return [name for name in LOOPS if name not in missing]


@contextlib.contextmanager
def quiet():
    """Everything the loops print goes nowhere; warnings about worker counts and the like too."""
    with (
        open(os.devnull, "w") as sink,
        contextlib.redirect_stdout(sink),
        contextlib.redirect_stderr(sink),
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("ignore")
        yield


def silence_loggers() -> None:
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "accelerate"):
        logging.getLogger(name).setLevel(logging.ERROR)


# -- the workloads ------------------------------------------------------------------------------------


def seconds_per_epoch(
    name: str, make_net: Callable, dl_train: Any, dl_val: Any, epochs: int, progress: bool, ckpt: str
) -> float:
    device = torch.device("cpu")
    if name == "bare":
        return run_bare(make_net, dl_train, dl_val, epochs, device)
    if name == "seed loop":
        return run_seed_loop(make_net, dl_train, dl_val, epochs, device, ckpt)
    build, fit = LIBRARIES[name]
    model, clock = build(make_net), Clock()
    fit(model, dl_train, dl_val, epochs, clock, progress)
    assert clock.start is not None, f"{name}'s epoch hook never ran"
    return (time.perf_counter() - clock.start) / epochs


def epoch_ratios(task: Callable, loops: list[str], repeats: int, epochs: int, progress: bool) -> dict:
    title, train, val, make_net, batch_size = task()
    _INPUT_SHAPES[make_net] = train[0][0].shape
    dl_train = DataLoader(train, batch_size=batch_size, shuffle=True)
    dl_val = DataLoader(val, batch_size=batch_size)
    times: dict[str, list[float]] = {name: [] for name in loops}
    with tempfile.TemporaryDirectory() as folder, quiet():
        ckpt = os.path.join(folder, "best.pt")
        for name in loops:  # warm-up: imports, allocator, thread pools, Keras's traced functions
            seconds_per_epoch(name, make_net, dl_train, dl_val, 1, progress, ckpt)
        for _ in range(repeats):
            for name in loops:
                times[name].append(seconds_per_epoch(name, make_net, dl_train, dl_val, epochs, progress, ckpt))
    bare, fastest_bare = statistics.median(times["bare"]), min(times["bare"])
    print(f"\n{title}: {repeats} runs of {epochs} epochs; bare loop {bare:.3f} s/epoch (median)")
    print(f"{'loop':<12}{'median s/epoch':>16}{'x bare':>9}{'fastest s/epoch':>17}{'x bare':>9}")
    for name in loops:
        median, fastest = statistics.median(times[name]), min(times[name])
        print(f"{name:<12}{median:>16.4f}{median / bare:>9.3f}{fastest:>17.4f}{fastest / fastest_bare:>9.3f}")
    # The table shows the median's ratio and, in brackets, the fastest run's: the one least slowed
    # by whatever else the machine was doing.
    return {
        name: f"{statistics.median(times[name]) / bare:.2f} ({min(times[name]) / fastest_bare:.2f})" for name in loops
    }


def fixed_costs(task: Callable, loops: list[str], repeats: int, progress: bool) -> dict:
    """Milliseconds of one fit call: one epoch of one training batch and one validation batch."""
    title, train, _, make_net, batch_size = task()
    _INPUT_SHAPES[make_net] = train[0][0].shape
    one_batch = DataLoader(Subset(train, range(batch_size)), batch_size=batch_size)
    with tempfile.TemporaryDirectory() as folder, quiet():
        ckpt = os.path.join(folder, "best.pt")
        calls = {}
        for name in loops:
            if name in ("bare", "seed loop"):  # their net, optimizer and metric built beforehand too
                loop = run_bare if name == "bare" else functools.partial(run_seed_loop, ckpt_path=ckpt)
                parts = make_parts(make_net)
                calls[name] = lambda loop=loop, parts=parts: loop(
                    make_net, one_batch, one_batch, 1, torch.device("cpu"), parts=parts
                )
            else:
                build, fit = LIBRARIES[name]
                model = build(make_net)
                calls[name] = lambda fit=fit, model=model: fit(model, one_batch, one_batch, 1, Clock(), progress)
        times: dict[str, list[float]] = {name: [] for name in loops}
        for _ in range(3):  # warm-up
            for call in calls.values():
                call()
        for _ in range(repeats):
            for name, call in calls.items():
                start = time.perf_counter()
                call()
                times[name].append(time.perf_counter() - start)
    bare = statistics.median(times["bare"]) * 1e3
    print(f"\nOne fit call on one training and one validation batch ({title}): median of {repeats}, ms")
    print(f"{'loop':<12}{'ms':>8}{'over bare':>11}{'min ms':>9}{'max ms':>9}")
    for name in loops:
        ms = [t * 1e3 for t in times[name]]
        print(
            f"{name:<12}{statistics.median(ms):>8.1f}{statistics.median(ms) - bare:>11.1f}{min(ms):>9.1f}{max(ms):>9.1f}"
        )
    if "kerastorch" in times and "poutyne" in times:  # the rounds' ratios, with their noise (verdicts.py)
        rounds = [ours / theirs for ours, theirs in zip(times["kerastorch"], times["poutyne"])]
        print(f"target, kerastorch's call <= {FIXED_COST_TARGET:g}x poutyne's: {verdict(rounds, FIXED_COST_TARGET)}")
    return {name: f"{statistics.median(times[name]) * 1e3:.1f} ({min(times[name]) * 1e3:.1f})" for name in loops}


def host_syncs_per_step(loops: list[str], progress: bool) -> dict:
    title, train, val, make_net, batch_size = tiny_mlp_task()
    _INPUT_SHAPES[make_net] = train[0][0].shape
    dl_val = DataLoader(Subset(val, range(2 * batch_size)), batch_size=batch_size)
    per_step = {}
    with tempfile.TemporaryDirectory() as folder, quiet():
        ckpt = os.path.join(folder, "best.pt")
        for name in loops:

            def run(steps: int, name: str = name) -> None:
                dl_train = DataLoader(Subset(train, range(steps * batch_size)), batch_size=batch_size, shuffle=True)
                seconds_per_epoch(name, make_net, dl_train, dl_val, 1, progress, ckpt)

            run(2)  # warm-up: first calls build things once
            counted = syncs_per_step(run, (8, 24))
            per_step[name] = counted.per_step
            where[name] = counted.describe()
    print(f"\nHost syncs per training step ({title}; two runs of 8 and 24 steps, the difference per step)")
    for name in loops:
        added = per_step[name] - per_step["bare"]
        print(f"{name:<12}{per_step[name]:>6g}  ({added:+g} over the bare loop)")
    return per_step


where: dict[str, str] = {}  # the reads per step of each loop, by site (printed with --where)


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--startup-repeats", type=int, default=30)
    parser.add_argument("--only", nargs="+", choices=["mlp", "cnn", "startup", "syncs"], default=None)
    parser.add_argument("--progress", choices=["off", "default"], default="off")
    parser.add_argument("--where", action="store_true", help="print where each loop's per-step syncs come from")
    parser.add_argument("--threads", type=int, default=None, help="torch's threads (default: torch's own choice)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    progress = args.progress == "default"
    silence_loggers()
    loops = available_loops()
    versions = {"torch": torch.__version__, "kerastorch": kt.__version__}
    for name, module in NEEDS.items():
        if name in loops:
            with quiet():
                versions[module] = getattr(__import__(module), "__version__", "?")
    print(
        ", ".join(f"{k} {v}" for k, v in versions.items()),
        f"; {torch.get_num_threads()} threads; progress {args.progress}",
    )
    wanted = args.only or ["mlp", "cnn", "startup", "syncs"]
    rows: dict[str, dict] = {}
    if "mlp" in wanted:
        rows["tiny MLP, 16k samples, batch 64: x bare, median (fastest)"] = epoch_ratios(
            tiny_mlp_task, loops, args.repeats, args.epochs, progress
        )
    if "cnn" in wanted:
        rows["seed 003's CNN: x bare, median (fastest)"] = epoch_ratios(
            cnn_task, loops, args.repeats, args.epochs, progress
        )
    if "startup" in wanted:
        rows["one fit call on one batch of the tiny MLP: ms, median (fastest)"] = fixed_costs(
            tiny_mlp_task, loops, args.startup_repeats, progress
        )
        rows["one fit call on one batch of the CNN: ms, median (fastest)"] = fixed_costs(
            cnn_task, loops, args.startup_repeats, progress
        )
    if "syncs" in wanted:
        rows["host syncs per training step"] = host_syncs_per_step(loops, progress)
        if args.where:
            for name in loops:
                print(f"\n{name}:\n{where[name]}")
    print("\n| workload | " + " | ".join(loops) + " |")
    print("| --- " * (len(loops) + 1) + "|")
    for workload, values in rows.items():
        print(
            f"| {workload} | "
            + " | ".join(f"{values[name]:g}" if isinstance(values[name], float) else values[name] for name in loops)
            + " |"
        )


if __name__ == "__main__":
    main()
