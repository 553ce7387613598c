"""What does ``fit`` cost over a training loop that logs nothing?

Runs, in one process and interleaved, several ways to train the same net on the same
data with validation every epoch:

* ``bare``: forward, backward, step; a validation forward pass; nothing logged. Over the user's
  loaders, ``DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True)`` and its validation twin.
* ``bare, kt loaders``: the same loop over the loaders ``fit`` builds of the same tensors given as
  arrays, which read each batch with one index per array (``kerastorch/data/loaders.py``): the
  same batches, sooner.
* ``seed loop``: the hand-written loop of seed 003 (tqdm bars, ``.item()`` per step,
  a torchmetrics call per step, early stopping and a checkpoint file).
* ``fit``: ``KerasModel.fit`` over the user's loaders (the very ones ``bare`` goes over) with the
  same metric, validation, early stopping, a checkpoint file and its progress bar.
* ``fit core``: ``fit`` with nothing optional (no metric, no progress bar, no checkpoint file,
  no early stopping): the loop's own cost, apart from its features'.
* ``fit, arrays``: the same ``fit`` given the tensors themselves, over the loaders it builds:
  ``fit(x=..., y=..., validation_data=(x_val, y_val), batch_size=64)``.
* ``fit compile``: the same ``fit`` with ``compile=True`` (``torch.compile``'s defaults),
  timed from its second epoch, since the first holds the compilation (whose extra time is
  printed apart). Leave it out with ``--no-compile``.

Prints seconds per epoch (median and fastest over repeats) and the ratio to the bare loop for
(a) a tiny MLP, where per-step overhead dominates, and (b) seed 003's CNN on 28x28
inputs, where compute dominates; and the ratio to the bare loop of the same round (the loops
of a round run back to back, so a busy machine slows them alike): its median, min and max
over the rounds. Targets, on the CPU, each said met, not met or undecided from the rounds' ratios
with a 95 % interval for their median (``verdicts.py``: a round's ratio moves by several per cent
on a busy machine, as much as the targets' margins; it needs at least 6 rounds, so the default is
7): ``fit`` over the bare loop over the same loaders, (a) <= 1.10x, (b) <= 1.02x; ``fit, arrays``
over the bare loop over the user's loaders of the same tensors, <= 1.00x. Below the table,
``fit, arrays`` over ``bare, kt loaders`` is ``fit``'s own cost over the loaders it builds.
On a GPU (the default where there is one) a transformer follows, 2 encoder layers of width 256
over 128 tokens (on the CPU, a smaller one, only with ``--only transformer``). ``--precision
bf16-mixed`` runs every loop in it: the bare and seed loops under ``torch.autocast``, ``fit`` with
``precision="bf16-mixed"``.

Then, on the CPU, (c): the loop's own cost per training step in microseconds: ``fit core``
against the bare loop over the same loader on a one-layer net with batches of 4, where a step is
nearly all Python, so the difference is the step's bookkeeping and little else (one torch thread;
the median over rounds of the two in turn). Leave it out with ``--only mlp`` or ``--only cnn``.

``--only features`` prints (d) instead: what each of ``fit``'s features in (a) (the metric, the
checkpoint file, the progress output, early stopping) adds alone to ``fit core``'s epoch.

    python benchmarks/overhead.py [--repeats 7] [--epochs 3] [--device cpu|cuda] [--no-compile]
        [--precision 32-true|bf16-mixed] [--only mlp|cnn|transformer|step|features]
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import torch
import torchmetrics
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from tqdm import tqdm
from verdicts import verdict

import kerastorch as kt
from kerastorch.data.forms import FitData, prepare_data
from kerastorch.examples import create_cnn, digits_datasets


def tiny_mlp_task():
    gen = torch.Generator().manual_seed(0)
    teacher = torch.randn(32, 10, generator=gen)
    x = torch.randn(16384 + 4096, 32, generator=gen)
    y = (x @ teacher).argmax(1)
    train, val = TensorDataset(x[:16384], y[:16384]), TensorDataset(x[16384:], y[16384:])
    make_net = lambda: nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    return "tiny MLP, 16k samples, batch 64", train, val, make_net, 64


def cnn_task():
    train, val, _ = digits_datasets(size=28)
    return "seed 003 CNN, 28x28 digits, batch 64", train, val, create_cnn, 64


class TinyTransformer(nn.Module):
    """A pre-norm transformer encoder over token ids, classifying from the first position."""

    def __init__(self, vocab: int, width: int, heads: int, layers: int, length: int, classes: int = 10):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.position = nn.Parameter(torch.randn(length, width) * 0.02)
        layer = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens) + self.position)[:, 0])


def transformer_task(on_gpu: bool):
    """Transformer blocks' worth of compute per step: 2 layers of width 256 over 128 tokens on a
    GPU; 2 layers of width 64 over 32 tokens on the CPU, so that a CPU run ends."""
    vocab, width, heads, layers, length, samples = (
        (1000, 256, 8, 2, 128, 4096) if on_gpu else (1000, 64, 4, 2, 32, 2048)
    )
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, vocab, (samples + samples // 4, length), generator=gen)
    labels = tokens[:, 0] % 10  # the class is read off the first token: learnable, cheap to make
    train = TensorDataset(tokens[:samples], labels[:samples])
    val = TensorDataset(tokens[samples:], labels[samples:])
    make_net = lambda: TinyTransformer(vocab, width, heads, layers, length)
    return f"transformer, {layers} layers of width {width} over {length} tokens, batch 64", train, val, make_net, 64


def autocast(device, precision):
    """The bare and seed loops' forward pass in ``precision``, as torch's AMP recipe writes it."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16-mixed")


def make_parts(make_net, lr=1e-3):
    torch.manual_seed(0)
    net = make_net()
    return (
        net,
        nn.CrossEntropyLoss(),
        torch.optim.Adam(net.parameters(), lr=lr),
        torchmetrics.Accuracy(task="multiclass", num_classes=10),
    )


def run_bare(make_net, dl_train, dl_val, epochs, device, parts=None, precision="32-true"):
    """``parts``: ``make_parts(make_net)`` built beforehand (to time the loop alone), else built here."""
    net, loss_fn, optimizer, _ = parts or make_parts(make_net)
    net.to(device)
    start = time.perf_counter()
    for _ in range(epochs):
        net.train()
        for x, y in dl_train:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            with autocast(device, precision):
                loss = loss_fn(net(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        net.eval()
        with torch.no_grad(), autocast(device, precision):
            for x, y in dl_val:
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                loss_fn(net(x), y)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / epochs


def run_seed_loop(make_net, dl_train, dl_val, epochs, device, ckpt_path, parts=None, precision="32-true"):
    """Seed 003's hand-written loop, its bugs (step9) fixed, on `device` (``parts`` as in run_bare)."""
    net, loss_fn, optimizer, metric = parts or make_parts(make_net)
    net.to(device)
    metrics_dict = {"acc": metric.to(device)}
    history, monitor, patience, mode = {}, "val_acc", 5, "max"
    start = time.perf_counter()
    for epoch in range(1, epochs + 1):
        net.train()
        total_loss, step = 0, 0
        loop = tqdm(enumerate(dl_train), total=len(dl_train), file=sys.stderr)
        train_metrics_dict = copy.deepcopy(metrics_dict)
        for i, (features, labels) in loop:
            features, labels = features.to(device), labels.to(device)
            with autocast(device, precision):
                preds = net(features)
                loss = loss_fn(preds, labels)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            step_metrics = {"train_" + n: m(preds, labels).item() for n, m in train_metrics_dict.items()}
            step_log = dict({"train_loss": loss.item()}, **step_metrics)
            total_loss += loss.item()
            step += 1
            if i != len(dl_train) - 1:
                loop.set_postfix(**step_log)
            else:
                epoch_log = dict(
                    {"train_loss": total_loss / step},
                    **{"train_" + n: m.compute().item() for n, m in train_metrics_dict.items()},
                )
                loop.set_postfix(**epoch_log)
                for m in train_metrics_dict.values():
                    m.reset()
        for name, value in epoch_log.items():
            history[name] = history.get(name, []) + [value]
        net.eval()
        total_loss, step = 0, 0
        loop = tqdm(enumerate(dl_val), total=len(dl_val), file=sys.stderr)
        val_metrics_dict = copy.deepcopy(metrics_dict)
        with torch.no_grad(), autocast(device, precision):
            for i, (features, labels) in loop:
                features, labels = features.to(device), labels.to(device)
                preds = net(features)
                loss = loss_fn(preds, labels)
                step_metrics = {"val_" + n: m(preds, labels).item() for n, m in val_metrics_dict.items()}
                step_log = dict({"val_loss": loss.item()}, **step_metrics)
                total_loss += loss.item()
                step += 1
                if i != len(dl_val) - 1:
                    loop.set_postfix(**step_log)
                else:
                    epoch_log = dict(
                        {"val_loss": total_loss / step},
                        **{"val_" + n: m.compute().item() for n, m in val_metrics_dict.items()},
                    )
                    loop.set_postfix(**epoch_log)
                    for m in val_metrics_dict.values():
                        m.reset()
        epoch_log["epoch"] = epoch
        for name, value in epoch_log.items():
            history[name] = history.get(name, []) + [value]
        scores = history[monitor]
        best = np.argmax(scores) if mode == "max" else np.argmin(scores)
        if best == len(scores) - 1:
            torch.save(net.state_dict(), ckpt_path)
        if len(scores) - best > patience:
            break
    return (time.perf_counter() - start) / epochs


class EpochClock(kt.Callback):
    """Times the epochs themselves, not fit's one-off set-up (from ``first_epoch`` on). It never reads
    the checkpoint file, and says so: ``fit`` writes the file while the next epoch trains, as in a run
    with no callbacks of the user's (not before calling a callback that may read it)."""

    reads_ckpt_path = False

    def __init__(self, first_epoch=1):
        self.first_epoch = first_epoch
        self.epoch_times = []

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch_start = time.perf_counter()
        if epoch == self.first_epoch:
            self.start = self.epoch_start

    def on_epoch_end(self, epoch, logs=None):
        self.end = time.perf_counter()
        self.epochs = epoch - self.first_epoch + 1
        self.epoch_times.append(self.end - self.epoch_start)


# What `fit` is asked to do in this benchmark beyond the bare loop, each of which can be left out.
FEATURES = ("metric", "checkpoint", "progress", "early stopping")


def run_fit(
    make_net,
    dl_train,
    dl_val,
    epochs,
    device,
    ckpt_path,
    precision="32-true",
    verbose=1,
    compile=False,
    core=False,
    features=FEATURES,
    arrays=None,
):
    """``core=True``: fit with nothing optional (no metric, no progress bar, no checkpoint file, no
    early stopping; the best weights by val_loss still kept in memory), to tell the loop's own
    cost from its features'. ``features``: those of :data:`FEATURES` that are on (all, by default).
    ``arrays``: fit's keywords for the tensors themselves (:func:`as_arrays`), given instead of the loaders."""
    on = set() if core else set(features)
    net, loss_fn, optimizer, metric = make_parts(make_net)
    model = kt.KerasModel(net, loss_fn, {"acc": metric} if "metric" in on else None, optimizer)
    clock = EpochClock(first_epoch=2 if compile else 1)
    data = arrays if arrays is not None else {"train_data": dl_train, "val_data": dl_val}
    model.fit(
        **data,
        epochs=epochs,
        patience=5 if "early stopping" in on else None,
        monitor="val_acc" if "metric" in on else "val_loss",
        mode="max" if "metric" in on else "min",
        ckpt_path=ckpt_path if "checkpoint" in on else None,
        callbacks=[clock],
        accelerator=device.type,
        precision=precision,
        verbose=verbose if "progress" in on else 0,
        compile="strict" if compile else False,
    )
    seconds = (clock.end - clock.start) / clock.epochs
    if compile:
        compile_seconds.append(clock.epoch_times[0] - seconds)  # the first epoch's extra time
    return seconds


compile_seconds: list = []

# The most fit's time may be of the bare loop's over the same loaders on the CPU: (a) and (b).
TARGETS = {"mlp": 1.10, "cnn": 1.02}
# The most fit's time over arrays may be of the bare loop's over DataLoader(TensorDataset) of the same tensors.
ARRAYS_TARGET = 1.00


def as_arrays(train, val, batch_size):
    """fit's keywords for the tensors of two TensorDatasets given as arrays, as a Keras user gives them."""
    (x, y), (x_val, y_val) = train.tensors, val.tensors
    return {"x": x, "y": y, "validation_data": (x_val, y_val), "batch_size": batch_size}


def kt_loaders(train, val, batch_size, pin):
    """The loaders fit builds of those arrays (shuffled training batches, validation in order)."""
    (x, y), (x_val, y_val) = train.tensors, val.tensors
    data = FitData(x, (x_val, y_val), y=y)
    return prepare_data(data, batch_size, shuffle=True, validation_split=0.0, keep_float64=False, pin_memory=pin)


def measure(task, repeats, epochs, device, compile=True, precision="32-true", target=None):
    """``target``: the most ``fit``'s time may be of the bare loop's, said met or not from the rounds'
    ratios and their noise (:mod:`verdicts`)."""
    title, train, val, make_net, batch_size = task()
    pin = device.type == "cuda"
    dl_train = DataLoader(train, batch_size=batch_size, shuffle=True, pin_memory=pin)
    dl_val = DataLoader(val, batch_size=batch_size, pin_memory=pin)
    # fit over the arrays builds loaders that read each batch with one index per array: the bare loop
    # over those tells fit's own cost there from that of the data.
    arrays, (kt_train, kt_val) = as_arrays(train, val, batch_size), kt_loaders(train, val, batch_size, pin)
    times = {
        "bare": [],
        "bare, kt loaders": [],
        "seed loop": [],
        "fit": [],
        "fit core": [],
        "fit, arrays": [],
        **({"fit compile": []} if compile else {}),
    }
    compile_seconds.clear()
    with tempfile.TemporaryDirectory() as folder:
        ckpt = os.path.join(folder, "best.pt")
        # warm-up: allocator, kernels, thread pools
        run_bare(make_net, dl_train, dl_val, 1, device, precision=precision)
        for _ in range(repeats):
            times["bare"].append(run_bare(make_net, dl_train, dl_val, epochs, device, precision=precision))
            times["bare, kt loaders"].append(run_bare(make_net, kt_train, kt_val, epochs, device, precision=precision))
            times["fit"].append(run_fit(make_net, dl_train, dl_val, epochs, device, ckpt, precision))
            times["fit core"].append(run_fit(make_net, dl_train, dl_val, epochs, device, ckpt, precision, core=True))
            times["fit, arrays"].append(run_fit(make_net, None, None, epochs, device, ckpt, precision, arrays=arrays))
            times["seed loop"].append(
                run_seed_loop(make_net, dl_train, dl_val, epochs, device, ckpt, precision=precision)
            )
            if compile:
                times["fit compile"].append(
                    run_fit(make_net, dl_train, dl_val, epochs, device, ckpt, precision, compile=True)
                )
    # The median is the headline; the fastest run shows the overhead with the least noise
    # from whatever else the machine is doing.
    medians = {k: statistics.median(v) for k, v in times.items()}
    fastest = {k: min(v) for k, v in times.items()}
    print(f"\n{title} on {device}, {precision} ({repeats} runs of {epochs} epochs each)")
    print(
        f"{'loop':<17}{'median s/epoch':>16}{'x bare':>9}{'fastest s/epoch':>17}{'x bare':>9}"
        f"{'x bare of its round: median (min-max)':>40}"
    )
    for name in times:
        rounds = [t / bare for t, bare in zip(times[name], times["bare"])]
        print(
            f"{name:<17}{medians[name]:>16.4f}{medians[name] / medians['bare']:>9.3f}"
            f"{fastest[name]:>17.4f}{fastest[name] / fastest['bare']:>9.3f}"
            f"{statistics.median(rounds):>23.3f} ({min(rounds):.3f}-{max(rounds):.3f})"
        )
    own = [t / bare for t, bare in zip(times["fit, arrays"], times["bare, kt loaders"])]
    print(
        f"fit, arrays over the bare loop over the loaders fit builds of them (bare, kt loaders): "
        f"{statistics.median(own):.3f}x ({min(own):.3f}-{max(own):.3f})"
    )
    if target is not None:
        rounds = [t / bare for t, bare in zip(times["fit"], times["bare"])]
        print(
            f"target, fit over the user's loaders <= {target:g}x of the bare loop over them: {verdict(rounds, target)}"
        )
        rounds = [t / bare for t, bare in zip(times["fit, arrays"], times["bare"])]
        print(
            f"target, fit over arrays <= {ARRAYS_TARGET:.2f}x of the bare loop over DataLoader(TensorDataset) of "
            f"them: {verdict(rounds, ARRAYS_TARGET)}"
        )
    if compile:
        cached = statistics.median(compile_seconds[1:]) if len(compile_seconds) > 1 else float("nan")
        print(
            f"(fit compile: epochs 2 to {epochs}; compiling added {compile_seconds[0]:.1f} s to the first run's "
            f"epoch 1, {cached:.1f} s to later runs, which reuse torch's compile cache)"
        )
    return medians


def feature_costs(repeats: int, epochs: int, device: torch.device) -> dict:
    """(d): what each of `fit`'s features adds to an epoch of (a), alone on top of ``fit core``:
    milliseconds per epoch over ``fit core``'s, median over rounds of all the variants in turn."""
    title, train, val, make_net, batch_size = tiny_mlp_task()
    dl_train = DataLoader(train, batch_size=batch_size, shuffle=True)
    dl_val = DataLoader(val, batch_size=batch_size)
    variants = {"fit core": (), **{f"+ {name}": (name,) for name in FEATURES}, "fit (all)": FEATURES}
    times: dict[str, list[float]] = {"bare": [], **{name: [] for name in variants}}
    with tempfile.TemporaryDirectory() as folder:
        ckpt = os.path.join(folder, "best.pt")
        run_bare(make_net, dl_train, dl_val, 1, device)
        for _ in range(repeats):
            times["bare"].append(run_bare(make_net, dl_train, dl_val, epochs, device))
            for name, features in variants.items():
                times[name].append(run_fit(make_net, dl_train, dl_val, epochs, device, ckpt, features=features))
    core = statistics.median(times["fit core"])
    print(f"\n(d) {title} on {device}: each feature alone over fit core ({repeats} runs of {epochs} epochs)")
    print(f"{'loop':<18}{'median ms/epoch':>16}{'over fit core':>15}{'x bare of its round':>21}")
    for name, values in times.items():
        rounds = statistics.median([t / bare for t, bare in zip(values, times["bare"])])
        median = statistics.median(values)
        print(f"{name:<18}{median * 1e3:>16.2f}{(median - core) * 1e3:>+15.2f}{rounds:>21.3f}")
    return {name: statistics.median(values) for name, values in times.items()}


def step_cost(repeats: int, epochs: int = 3) -> float:
    """(c): microseconds per training step that ``fit core`` adds to the bare loop, on the CPU with one
    torch thread, a one-layer net and batches of 4 (512 steps an epoch)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(2048, 4, generator=gen), torch.randint(0, 2, (2048,), generator=gen)
    loader = DataLoader(TensorDataset(x, y), batch_size=4)
    make_net = lambda: nn.Linear(4, 2)
    cpu = torch.device("cpu")

    def bare() -> float:  # over the same loader as fit: the difference is the loop's, not the data's
        return run_bare(make_net, loader, [], epochs, cpu)

    def fit_core() -> float:
        net, loss_fn, optimizer, _ = make_parts(make_net)
        model = kt.KerasModel(net, loss_fn, None, optimizer)
        clock = EpochClock()
        model.fit(loader, epochs=epochs, patience=None, monitor="train_loss", verbose=0, callbacks=[clock])
        return (clock.end - clock.start) / clock.epochs

    try:
        bare(), fit_core()  # warm-up
        extra = []
        for _ in range(3 * repeats):
            base = bare()
            extra.append(fit_core() - base)
    finally:
        torch.set_num_threads(threads)
    per_step = statistics.median(extra) / len(loader) * 1e6
    print(
        f"\n(c) the loop's own cost: fit core over the bare loop, one-layer net, batches of 4, one thread: "
        f"{per_step:.1f} us per step (median of {len(extra)} rounds; min {min(extra) / len(loader) * 1e6:.1f}, "
        f"max {max(extra) / len(loader) * 1e6:.1f})"
    )
    return per_step


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--only",
        choices=["mlp", "cnn", "transformer", "step", "features"],
        default=None,
        help="features: (d), only when asked; transformer: on the CPU only when asked",
    )
    parser.add_argument("--no-compile", action="store_true", help="leave out the compile=True column")
    parser.add_argument(
        "--precision",
        choices=["32-true", "bf16-mixed"],
        default="32-true",
        help="of every loop (autocast in the others)",
    )
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, kerastorch {kt.__version__}")
    if device.type == "cuda":
        print(f"{torch.cuda.get_device_name(device)}")
    on_gpu = device.type == "cuda"
    tasks = {"mlp": tiny_mlp_task, "cnn": cnn_task, "transformer": lambda: transformer_task(on_gpu)}
    for name, task in tasks.items():
        # the transformer is (a)'s and (b)'s GPU companion: on the CPU, only when asked
        if args.only == name or (args.only is None and (name != "transformer" or on_gpu)):
            target = TARGETS.get(name) if device.type == "cpu" else None  # the targets are the CPU's
            measure(task, args.repeats, args.epochs, device, not args.no_compile, args.precision, target)
    if args.only == "step" or (args.only is None and not on_gpu):  # (c) is a CPU figure
        step_cost(args.repeats)
    if args.only == "features":
        feature_costs(args.repeats, args.epochs, device)


if __name__ == "__main__":
    main()
