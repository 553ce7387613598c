"""fit makes no more host syncs per training step than a bare loop does.

A host sync is a read that makes the host wait for a number from the device (``.item()``,
``float(t)``, ``if t:``, ``.tolist()``, ``nonzero``...); on a GPU each one stalls the queue
every step. :mod:`host_syncs` counts them on the CPU. Each guard runs ``fit`` twice, with
8 and 24 training batches per epoch (two epochs each), and takes the difference: what
happens once per fit or per epoch (the set-up, the first-batch checks, the epoch's values,
the sampler's shuffle) cancels, what happens per step remains. The same is done for a bare
loop with the same features written by hand; the two must be equal. Adam's own step
counter (a CPU tensor, read once per parameter per step) is in both.

Reads at the epoch's end and at a progress bar's redraws (which follow the clock, not the
steps) are allowed: the redraws are told apart by their stack and counted separately.
"""

from __future__ import annotations

import collections
import io
import json
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import pytest
import torch
import torchmetrics
from host_syncs import StepSyncs, count_cuda_syncs, count_host_syncs, syncs_per_step
from torch import nn
from torch.nn import functional as F
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from torch.utils.data import DataLoader, Subset, TensorDataset

import kerastorch as kt
from helpers import TorchkerasAccuracy, accuracy
from kerastorch import KerasModel
from kerastorch.callbacks import ProgressBar
from kerastorch.compat.accelerator import LocalAccelerator
from tests.conftest import make_mlp

EPOCHS = 2
BATCH = 32
STEPS = (EPOCHS * 8, EPOCHS * 24)  # training steps of the two runs compared
EMA_DECAY = 0.9
CLIP = 1.0
ACCUMULATE = 4
REDRAW = "ProgressBar.on_train_batch_end"  # where the progress bar reads the running values
# With several processes, the preemption watch reads the answer of its last all-reduce of the
# processes' signal flags: a CPU tensor in a gloo group on every device (never a device read),
# exchanged about every CHECK_EVERY_SECONDS, not every step. Time-throttled like a redraw.
PREEMPTION_CHECK = "SharedPreemption._take_previous_answer"


def is_redraw(sync) -> bool:
    """A read made at a time-throttled point (a progress redraw, the processes' preemption check)."""
    return sync.passes_through(REDRAW) or sync.passes_through(PREEMPTION_CHECK)


# -- the two loops compared ----------------------------------------------------------------


def adam(net: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.Adam(net.parameters(), lr=1e-3)  # torch's defaults: foreach off on the CPU


def step_scheduler(optimizer: torch.optim.Optimizer) -> Any:
    return torch.optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.9)


def training_data(ds_train: Any, steps: int) -> Subset:
    """The first samples of ``ds_train``: ``steps / EPOCHS`` batches per epoch."""
    return Subset(ds_train, range(steps // EPOCHS * BATCH))


def validation_loader(ds_val: Any, pin_memory: bool = False) -> DataLoader:
    """Three batches, the last one short: validation runs, and is the same in both runs compared."""
    return DataLoader(Subset(ds_val, range(3 * BATCH - 4)), batch_size=BATCH, pin_memory=pin_memory)


def with_weights(dataset: Any) -> TensorDataset:
    """``(x, y, w)`` samples: a weight per sample, from 0.5 to 1.5."""
    x, y = (torch.stack(column) for column in zip(*(dataset[i] for i in range(len(dataset)))))
    return TensorDataset(x, y, torch.linspace(0.5, 1.5, len(y)))


def bare_loop(
    digits8: tuple,
    accumulate: int = 1,
    clip: bool = False,
    scheduler: bool = False,
    ema: Any = False,
    weights: Optional[str] = None,
    metric: Optional[Callable] = None,
    device: str = "cpu",
    precision: str = "32-true",
) -> Callable[[int], None]:
    """A loop written by hand, with what a fit case adds, done the way torch's docs do it:
    forward, backward, clip, step, scheduler; a validation pass per epoch; nothing logged.
    ``ema=True``: an EMA of the weights with torch's foreach lerp after each step (the copy made
    up front); ``ema="torch"``: torch's ``AveragedModel`` with its EMA function, as its docs show.
    ``weights``: "sample" (a weight per sample in the batch) or "class".
    On a GPU (``device="cuda"``) batches are copied without blocking, from pinned memory, and
    ``precision`` "bf16-mixed" or "16-mixed" runs the forward pass under autocast ("16-mixed"
    with a GradScaler), as torch's AMP recipe does."""
    ds_train, ds_val = digits8
    half = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(precision)
    pin = device == "cuda"

    def run(steps: int) -> None:
        net = make_mlp().to(device)
        optimizer = adam(net)
        scaler = torch.amp.GradScaler(device) if precision == "16-mixed" else None
        schedule = step_scheduler(optimizer) if scheduler else None
        averaged = (
            AveragedModel(net, multi_avg_fn=get_ema_multi_avg_fn(EMA_DECAY), use_buffers=True)
            if ema == "torch"
            else [p.detach().clone() for p in net.parameters()]
            if ema
            else None
        )
        data = training_data(ds_train, steps)
        train = DataLoader(
            with_weights(data) if weights == "sample" else data, batch_size=BATCH, shuffle=True, pin_memory=pin
        )
        class_weights = torch.linspace(0.5, 1.5, 10, device=device)
        for _ in range(EPOCHS):
            net.train()
            for i, batch in enumerate(train, 1):
                x, y = (t.to(device, non_blocking=True) for t in batch[:2])
                with torch.autocast(device, dtype=half, enabled=half is not None):
                    preds = net(x)
                    if weights == "sample":
                        w = batch[2].to(device, non_blocking=True)
                        loss = (F.cross_entropy(preds, y, reduction="none") * w).mean()
                    elif weights == "class":
                        loss = (F.cross_entropy(preds, y, reduction="none") * class_weights[y]).mean()
                    else:
                        loss = F.cross_entropy(preds, y)
                if metric is not None:
                    metric(preds, y)
                loss = loss / accumulate
                (scaler.scale(loss) if scaler else loss).backward()
                if i % accumulate == 0 or i == len(train):
                    if clip:
                        if scaler:
                            scaler.unscale_(optimizer)
                        nn.utils.clip_grad_norm_(net.parameters(), CLIP)
                    if scaler:
                        scaler.step(optimizer)
                        scaler.update()
                    else:
                        optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                    if schedule is not None:
                        schedule.step()
                    if isinstance(averaged, AveragedModel):
                        averaged.update_parameters(net)
                    elif averaged is not None:
                        torch._foreach_lerp_(averaged, [p.detach() for p in net.parameters()], 1 - EMA_DECAY)
            net.eval()
            with torch.no_grad(), torch.autocast(device, dtype=half, enabled=half is not None):
                for x, y in validation_loader(ds_val, pin_memory=pin):
                    F.cross_entropy(net(x.to(device, non_blocking=True)), y.to(device, non_blocking=True))

    return run


def fit_run(
    digits8: tuple,
    metrics: Optional[Callable[[], dict]] = None,
    scheduler: bool = False,
    callbacks: Callable[[], list] = list,
    arrays_with_sample_weight: bool = False,
    **fit_arguments: Any,
) -> Callable[[int], None]:
    """``KerasModel.fit`` on the same data, with a fresh net, optimizer and metrics each run."""
    ds_train, ds_val = digits8

    def run(steps: int) -> None:
        net = make_mlp()
        optimizer = adam(net)
        model = KerasModel(
            net,
            nn.CrossEntropyLoss(),
            metrics() if metrics else None,
            optimizer,
            step_scheduler(optimizer) if scheduler else None,
            lr_scheduler_interval="step" if scheduler else "epoch",
        )
        data = training_data(ds_train, steps)
        if arrays_with_sample_weight:  # Keras's fit(x, y, sample_weight=...): fit builds the loader
            x, y, w = with_weights(data).tensors
            model.fit(
                x=x,
                y=y,
                sample_weight=w,
                batch_size=BATCH,
                validation_data=validation_loader(ds_val, fit_arguments.get("accelerator") == "cuda"),
                epochs=EPOCHS,
                callbacks=callbacks(),
                **fit_arguments,
            )
            return
        pin = fit_arguments.get("accelerator") == "cuda"  # as the bare loop's on a GPU
        train = DataLoader(data, batch_size=BATCH, shuffle=True, pin_memory=pin)
        model.fit(train, validation_loader(ds_val, pin), epochs=EPOCHS, callbacks=callbacks(), **fit_arguments)

    return run


_BARE_LOOPS: dict = {}  # the bare loops' counts, measured once per set of features


def bare_loop_syncs(digits8: tuple, **features: Any) -> StepSyncs:
    key = tuple(sorted(features.items()))
    if key not in _BARE_LOOPS:
        _BARE_LOOPS[key] = syncs_per_step(bare_loop(digits8, **features), STEPS)
    return _BARE_LOOPS[key]


def assert_no_added_syncs(fit: Callable[[int], None], bare_syncs: StepSyncs) -> None:
    fit_syncs = syncs_per_step(fit, STEPS, ignore=is_redraw)
    added = fit_syncs.per_step - bare_syncs.per_step
    assert added == 0, (
        f"fit made {fit_syncs.per_step:g} host syncs per training step and the bare loop "
        f"{bare_syncs.per_step:g}: fit added {added:+g} per step, here:\n{fit_syncs.added_over(bare_syncs)}\n"
        f"All reads that grow with the steps, in fit:\n{fit_syncs.describe()}\n"
        f"in the bare loop:\n{bare_syncs.describe()}"
    )


# -- the counter and the baseline ------------------------------------------------------------


@pytest.mark.parametrize(
    "read, op",
    [
        (lambda t: t.sum().item(), "aten._local_scalar_dense"),
        (lambda t: float(t.sum()), "aten._local_scalar_dense"),
        (lambda t: bool(t.sum() > 0), "aten._local_scalar_dense"),
        (lambda t: 1 if t.any() else 0, "aten._local_scalar_dense"),
        (lambda t: [0, 1, 2][t.argmax()], "aten._local_scalar_dense"),
        (lambda t: t.tolist(), "tolist"),
        (lambda t: t.sum().tolist(), "tolist"),
        (lambda t: np.asarray(t), "__array__"),
        (lambda t: f"{t.sum():.3f}", "__format__"),
        (lambda t: t.nonzero(), "aten.nonzero"),
        (lambda t: torch.where(t > 0), "aten.nonzero"),
        (lambda t: t[t > 0], "aten.index"),
        (lambda t: t.masked_select(t > 0), "aten.masked_select"),
        (lambda t: torch.equal(t, t), "aten.equal"),
        (lambda t: t.unique(), "aten._unique2"),
        (lambda t: torch.repeat_interleave(torch.tensor([1, 2])), "aten.repeat_interleave"),
    ],
)
def test_each_read_of_the_device_counts_once(read, op):
    t = torch.tensor([0.5, 0.0, 2.0])
    with count_host_syncs() as syncs:
        read(t)
    assert syncs.ops() == [op]
    assert syncs[0].site.startswith("tests/training/test_host_syncs.py:")


def test_work_that_stays_on_the_device_counts_nothing():
    t = torch.tensor([0.5, 0.0, 2.0])
    with count_host_syncs() as syncs:
        total = (t * 2 + 1).sum()
        t[torch.tensor([0, 2])]
        torch.repeat_interleave(torch.tensor([1, 2]), output_size=3)
        t.clamp_min(0.1).log().mean()
        total.to("cpu")
    assert len(syncs) == 0


@pytest.mark.parametrize("options, reads_per_step", [({}, 4), ({"foreach": True}, 8), ({"fused": True}, 0), ("sgd", 0)])
def test_the_bare_loop_reads_only_adams_step_counter(digits8, options, reads_per_step):
    """The baseline: Adam on the CPU reads its step counter once per parameter (the MLP has 4)
    per step; foreach reads it twice; fused and SGD not at all. fit uses whichever optimizer
    it is given, so this is in both loops of every comparison."""
    ds_train, _ = digits8

    def run(steps: int) -> None:
        net = make_mlp()
        optimizer = (
            torch.optim.SGD(net.parameters(), lr=0.1)
            if options == "sgd"
            else torch.optim.Adam(net.parameters(), lr=1e-3, **options)
        )
        for _ in range(EPOCHS):
            for x, y in DataLoader(training_data(ds_train, steps), batch_size=BATCH):
                F.cross_entropy(net(x), y).backward()
                optimizer.step()
                optimizer.zero_grad()

    counted = syncs_per_step(run, STEPS)
    assert counted.per_step == reads_per_step, counted.describe()
    assert all("_get_value" in site for _, site in counted.grew())


# -- the guards ----------------------------------------------------------------------------------


def torchmetrics_accuracy() -> dict:
    return {"acc": torchmetrics.Accuracy(task="multiclass", num_classes=10)}


def sample_accuracy(preds: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return (preds.argmax(dim=-1) == labels).float()  # one value per sample, for weighted_metrics


FIT_CASES = {
    # name: (fit_run's arguments, bare_loop's arguments)
    "default": ({}, {}),
    "torchmetrics metric": ({"metrics": torchmetrics_accuracy}, {}),
    "torchkeras-style metric module": ({"metrics": lambda: {"acc": TorchkerasAccuracy()}}, {}),
    "plain function metric": ({"metrics": lambda: {"acc": accuracy}}, {}),
    "class_weight": ({"class_weight": {c: 0.5 + c / 9 for c in range(10)}}, {"weights": "class"}),
    "sample_weight": ({"arrays_with_sample_weight": True}, {"weights": "sample"}),
    "weighted_metrics": (
        {"arrays_with_sample_weight": True, "weighted_metrics": {"wacc": sample_accuracy}},
        {"weights": "sample"},
    ),
    "gradient accumulation": ({"gradient_accumulation_steps": ACCUMULATE}, {"accumulate": ACCUMULATE}),
    "gradient clipping": ({"gradient_clip_val": CLIP}, {"clip": True}),
    "per-step scheduler": ({"scheduler": True}, {"scheduler": True}),
    "EMA": ({"callbacks": lambda: [kt.callbacks.EMA(decay=EMA_DECAY)]}, {"ema": True}),
    "checkpoint, early stopping, monitor": (
        {"metrics": torchmetrics_accuracy, "monitor": "val_acc", "patience": 1, "ckpt_path": "CKPT"},
        {},
    ),
}


@pytest.mark.parametrize("case", FIT_CASES)
def test_fit_adds_no_host_sync_per_step(digits8, tmp_path, case):
    fit_arguments, bare_arguments = FIT_CASES[case]
    if fit_arguments.get("ckpt_path") == "CKPT":
        fit_arguments = {**fit_arguments, "ckpt_path": tmp_path / "best.pt"}
    fit = fit_run(digits8, verbose=0, **fit_arguments)
    assert_no_added_syncs(fit, bare_loop_syncs(digits8, **bare_arguments))


def test_torchs_averaged_model_reads_its_counter_at_each_update_and_fits_ema_does_not(digits8):
    """torch's ``AveragedModel`` tests its ``n_averaged`` counter twice per update (``bool(n == 0)``,
    ``n > 0``), and on a GPU copies it to the device, which waits for the step; ``kt.callbacks.EMA``
    (same arithmetic) reads it once per fit. Per step: torch's EMA 2 reads more than the loop
    without one, fit with ``EMA`` none more."""
    plain = bare_loop_syncs(digits8)
    assert bare_loop_syncs(digits8, ema="torch").per_step == plain.per_step + 2
    ema = lambda: [kt.callbacks.EMA(decay=EMA_DECAY)]
    fit_syncs = syncs_per_step(fit_run(digits8, verbose=0, callbacks=ema), STEPS, ignore=is_redraw)
    assert fit_syncs.per_step == plain.per_step, fit_syncs.added_over(plain)


def test_verbose_1_in_a_log_adds_no_host_sync_per_step(digits8, capsys):
    # pytest captures the output, which is not a terminal: one line per epoch, no bar.
    assert_no_added_syncs(fit_run(digits8, verbose=1), bare_loop_syncs(digits8))
    assert capsys.readouterr().out.count("Epoch 2/2") == 2


def test_the_terminal_bar_reads_only_when_it_redraws(digits8):
    """A bar that redraws every 10 ms at most: its reads are apart from the step's, which add none."""
    bar = lambda: [ProgressBar(mininterval=0.01, style="terminal", file=io.StringIO())]
    assert_no_added_syncs(fit_run(digits8, verbose=0, callbacks=bar), bare_loop_syncs(digits8))


def test_a_redraw_is_one_read(digits8):
    # A bar that redraws at every step reads once per step, in its redraw, and nowhere else.
    bar = lambda: [ProgressBar(mininterval=0.0, style="terminal", file=io.StringIO())]
    counted = syncs_per_step(fit_run(digits8, verbose=0, callbacks=bar), STEPS)
    redraws = syncs_per_step(fit_run(digits8, verbose=0, callbacks=bar), STEPS, ignore=lambda s: not is_redraw(s))
    assert redraws.per_step == 1, redraws.describe()
    assert counted.per_step == bare_loop_syncs(digits8).per_step + 1, counted.describe()


def test_an_epoch_reads_its_values_once_per_stage(digits8, capsys):
    """At an epoch's end fit reads the training values (loss and every metric) in one read and
    the validation values in another, whatever the metrics' forms; the epoch's printed line,
    the best weights and early stopping use those floats. Reads made in torch's own code
    (the DataLoader's shuffling, Adam's step counter) are left out: they are the bare loop's too."""
    ds_train, ds_val = digits8
    three_forms = lambda: {**torchmetrics_accuracy(), "module": TorchkerasAccuracy(), "fn": accuracy}

    def run(epochs: int) -> None:
        net = make_mlp()
        model = KerasModel(net, nn.CrossEntropyLoss(), three_forms(), adam(net))
        train = DataLoader(training_data(ds_train, EPOCHS * 8), batch_size=BATCH, shuffle=True)
        model.fit(train, validation_loader(ds_val), epochs=epochs, monitor="val_acc", verbose=1)

    made_in_torch = lambda sync: not sync.stack or sync.stack[0].in_torch
    per_epoch = syncs_per_step(run, (1, 3), ignore=made_in_torch)
    assert per_epoch.per_step == 2, per_epoch.describe()
    assert capsys.readouterr().out.count("Epoch 3/3") == 1


# -- torchkeras's StepRunner ----------------------------------------------------------------------


class ItemStepRunner:
    """torchkeras's StepRunner as its README writes it: it reads its loss and metric with ``.item()``."""

    returns_tensors = False

    def __init__(
        self, net, loss_fn, accelerator=None, stage="train", metrics_dict=None, optimizer=None, lr_scheduler=None
    ):
        self.net, self.loss_fn, self.accelerator, self.stage = net, loss_fn, accelerator, stage
        self.metrics_dict, self.optimizer = metrics_dict, optimizer

    def __call__(self, batch):
        features, labels = batch
        preds = self.net(features)
        loss = self.loss_fn(preds, labels)
        if self.stage == "train":
            self.accelerator.backward(loss)
            self.optimizer.step()
            self.optimizer.zero_grad()
        values = {f"{self.stage}_{name}": metric(preds, labels) for name, metric in self.metrics_dict.items()}
        if self.returns_tensors:
            return {f"{self.stage}_loss": loss.detach()}, values
        return {f"{self.stage}_loss": loss.item()}, {name: value.item() for name, value in values.items()}


class TensorStepRunner(ItemStepRunner):
    """The same runner returning its loss and metric as tensors, leaving the reading to fit."""

    returns_tensors = True


@pytest.mark.parametrize("runner, fit_reads_per_step", [(ItemStepRunner, 0), (TensorStepRunner, 2)])
def test_a_torchkeras_step_runner_costs_one_read_per_tensor_it_returns(
    digits8, monkeypatch, runner, fit_reads_per_step
):
    """fit turns each value a program's StepRunner returns into a float at every step (the
    history and the bar need the numbers, and the runner's dicts are all fit gets): a value
    returned as a tensor is read there, one sync per value per step; a value the runner read
    itself (torchkeras's ``loss.item()``) costs fit nothing more."""
    monkeypatch.setattr(KerasModel, "StepRunner", runner)
    ds_train, ds_val = digits8
    metrics = lambda: {"acc": TorchkerasAccuracy()}

    def fit(steps: int) -> None:
        net = make_mlp()
        train = DataLoader(training_data(ds_train, steps), batch_size=BATCH, shuffle=True)
        model = KerasModel(net, nn.CrossEntropyLoss(), metrics(), adam(net))
        model.fit(train, validation_loader(ds_val), epochs=EPOCHS, verbose=0)

    def runner_in_a_bare_loop(steps: int) -> None:  # the runner's own reads, and Adam's
        net = make_mlp()
        step = runner(net, nn.CrossEntropyLoss(), LocalAccelerator(net), "train", metrics(), adam(net))
        for _ in range(EPOCHS):
            for batch in DataLoader(training_data(ds_train, steps), batch_size=BATCH, shuffle=True):
                step(batch)

    fit_syncs = syncs_per_step(fit, STEPS, ignore=is_redraw)
    bare_syncs = syncs_per_step(runner_in_a_bare_loop, STEPS)
    assert fit_syncs.per_step - bare_syncs.per_step == fit_reads_per_step, (
        f"fit: {fit_syncs.per_step:g} per step, the runner alone: {bare_syncs.per_step:g}; fit's own reads:\n"
        f"{fit_syncs.added_over(bare_syncs)}"
    )


# -- several processes and CUDA ---------------------------------------------------------------------


class CountInThisProcess(kt.Callback):
    """Counts the host syncs of this process's training (each of fit's workers runs its own
    copy of this callback) and writes them to ``folder/rank<k>-<steps>.json``."""

    def __init__(self, folder: Path, steps: int):
        self.folder, self.steps = folder, steps

    def on_train_begin(self, logs=None):
        self.counting = count_host_syncs()
        self.syncs = self.counting.__enter__()

    def on_train_end(self, logs=None):
        self.counting.__exit__(None, None, None)
        rank = self.model.runtime.accelerator.process_index
        reads = [sync.op for sync in self.syncs if not is_redraw(sync)]
        sites = [sync.site for sync in self.syncs if not is_redraw(sync)]
        (self.folder / f"rank{rank}-{self.steps}.json").write_text(json.dumps({"ops": reads, "sites": sites}))


@pytest.mark.slow
def test_two_processes_add_no_host_sync_per_step_in_either(digits8, tmp_path):
    """devices=2: two gloo processes, each counted in itself. Every process runs the same
    number of steps (half the batches each); per step, each reads what the bare loop reads."""
    ds_train, ds_val = digits8
    batch = BATCH // 2  # twice the batches of the one-process runs, from the same samples
    for steps in STEPS:
        net = make_mlp()
        train = DataLoader(Subset(ds_train, range(2 * steps // EPOCHS * batch)), batch_size=batch, shuffle=True)
        model = KerasModel(net, nn.CrossEntropyLoss(), torchmetrics_accuracy(), adam(net))
        model.fit(
            train,
            validation_loader(ds_val),
            epochs=EPOCHS,
            accelerator="cpu",
            devices=2,
            verbose=0,
            callbacks=[CountInThisProcess(tmp_path, steps)],
        )
    bare = bare_loop_syncs(digits8).per_step
    for rank in (0, 1):
        short, long = (json.loads((tmp_path / f"rank{rank}-{steps}.json").read_text()) for steps in STEPS)
        grew = collections.Counter(zip(long["ops"], long["sites"]))
        grew.subtract(collections.Counter(zip(short["ops"], short["sites"])))
        per_step = sum(grew.values()) / (STEPS[1] - STEPS[0])
        assert per_step == bare, f"rank {rank}: {per_step:g} per step, the bare loop {bare:g}; growing: " + "; ".join(
            f"{count / (STEPS[1] - STEPS[0]):g} per step: {op} at {site}" for (op, site), count in grew.items() if count
        )


@pytest.mark.gpu
def test_on_cuda_the_default_path_never_syncs_after_the_first_step(digits8):
    """On a GPU torch itself tells: after the first step (whose checks read the device once),
    any synchronising call raises. Adam's step counter stays on the CPU there, and
    validation and the epoch's values are read at the epoch's end, after training: the
    debug mode is on for the training steps only."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")

    class SyncsRaiseDuringTraining(kt.Callback):
        """From the end of the first step to the end of each epoch's last step."""

        def on_epoch_begin(self, epoch, logs=None):
            if epoch > 1:
                torch.cuda.set_sync_debug_mode("error")

        def on_train_batch_end(self, batch, logs=None):
            last = batch + 1 == self.params["steps"]
            torch.cuda.set_sync_debug_mode("default" if last else "error")

    ds_train, ds_val = digits8
    net = make_mlp()
    model = KerasModel(net, nn.CrossEntropyLoss(), torchmetrics_accuracy(), adam(net))
    train = DataLoader(ds_train, batch_size=BATCH, shuffle=True, pin_memory=True)
    try:
        history = model.fit(
            train,
            validation_loader(ds_val),
            epochs=EPOCHS,
            accelerator="cuda",
            verbose=0,
            callbacks=[SyncsRaiseDuringTraining()],
        )
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert history["val_loss"].iloc[-1] < history["val_loss"].iloc[0]


# On a GPU each case of FIT_CASES, and the two mixed precisions, counted by torch itself.
CUDA_CASES = {
    **FIT_CASES,
    "bf16-mixed": ({"precision": "bf16-mixed"}, {"precision": "bf16-mixed"}),
    "16-mixed (GradScaler)": ({"precision": "16-mixed"}, {"precision": "16-mixed"}),
}


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() == 0, reason="needs a CUDA GPU")
@pytest.mark.parametrize("case", CUDA_CASES)
def test_on_cuda_fit_adds_no_synchronizing_call_per_step(digits8, tmp_path, case):
    """The guard above, counted on a GPU by torch's own sync check ("warn" mode): every read of a
    GPU value, blocking copy and synchronize, wherever made (kernels and C++ included). Where
    torch's own parts sync at every step (the GradScaler's inf check) the bare loop makes the
    same calls; fit must add none."""
    fit_arguments, bare_arguments = CUDA_CASES[case]
    if fit_arguments.get("ckpt_path") == "CKPT":
        fit_arguments = {**fit_arguments, "ckpt_path": tmp_path / "best.pt"}
    fit = fit_run(digits8, verbose=0, accelerator="cuda", **fit_arguments)
    bare = bare_loop(digits8, device="cuda", **bare_arguments)
    fit_syncs = syncs_per_step(fit, STEPS, counter=count_cuda_syncs)
    bare_syncs = syncs_per_step(bare, STEPS, counter=count_cuda_syncs)
    assert fit_syncs.per_step == bare_syncs.per_step, (
        f"on CUDA fit made {fit_syncs.per_step:g} synchronizing calls per training step and the bare loop "
        f"{bare_syncs.per_step:g}; fit's own:\n{fit_syncs.added_over(bare_syncs)}\n"
        f"all that grow with the steps, in fit:\n{fit_syncs.describe()}\nin the bare loop:\n{bare_syncs.describe()}"
    )
