"""A step that runs out of memory is redone as micro-batches, with the same update.

The nets here hold a layer that raises torch's own ``torch.OutOfMemoryError`` when it gets more
rows than it allows, as a GPU does for a batch too large; each run is compared with the same run
(same data, same seed) whose layer allows every batch: the final weights and the history are the
same, within float tolerance (the micro-batches' sums come in another order).
"""

from __future__ import annotations

import json
import os
import time
import weakref
from typing import Optional

import pandas as pd
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import kerastorch as kt
from kerastorch.data.batches import BatchError, WeightedSample, batch_rows, joined_rows, samples_in_batch

OOM = "CUDA out of memory. Tried to allocate 2.00 GiB (this test's layer refuses larger batches)"
SAMPLES, BATCH = 96, 16


class RunsOut(nn.Module):
    """The identity, which runs out of memory for a batch of more than ``rows`` rows: in its forward
    pass when training (``backward=False``), in its backward pass (``backward=True``), and in
    evaluation too when ``in_eval``. ``after``: only from the ``after``-th training pass on; ``rank``:
    only in the process of that rank. ``seen`` keeps the rows of the training passes that ran."""

    def __init__(self, rows: Optional[int], backward=False, in_eval=False, after=0, rank=None):
        super().__init__()
        self.rows, self.backward, self.in_eval, self.after, self.rank = rows, backward, in_eval, after, rank
        self.seen: list[int] = []

    def too_many(self, rows: int) -> bool:
        here = self.rank is None or os.environ.get("RANK") == str(self.rank)
        return self.rows is not None and rows > self.rows and len(self.seen) >= self.after and here

    def forward(self, x):
        training, too_many = torch.is_grad_enabled(), self.too_many(x.shape[0])
        if too_many and not self.backward and (training or self.in_eval):
            raise torch.OutOfMemoryError(OOM)
        if not training:
            return x
        self.seen.append(x.shape[0])
        return RunsOutInBackward.apply(x, too_many) if self.backward else x


class RunsOutInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, too_many):
        ctx.too_many = too_many
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        if ctx.too_many:
            raise torch.OutOfMemoryError(OOM)
        return grad, None


def data(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(SAMPLES, 6, generator=generator)
    return x, (x[:, 0] > 0).long() + (x[:, 1] > 0).long()


def net_with(layer: nn.Module, *middle: nn.Module) -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), *middle, layer, nn.Linear(16, 3))


def accuracy(preds, labels):
    return (preds.argmax(1) == labels).float().mean()


def train(layer: RunsOut, *middle: nn.Module, model_class=kt.KerasModel, **fit_options):
    """A fresh run: the history, the final weights, and the model."""
    x, y = data()
    net = net_with(layer, *middle)
    model = model_class(net, nn.CrossEntropyLoss(), {"acc": accuracy}, torch.optim.Adam(net.parameters(), lr=1e-2))
    kt.seed_everything(0)
    options = {"epochs": 2, "batch_size": BATCH, "verbose": 0, "validation_data": data(seed=1), **fit_options}
    history = model.fit(x, y, **options)
    return history, {k: v.clone() for k, v in net.state_dict().items()}, model


def assert_same_run(run, reference):
    pd.testing.assert_frame_equal(run[0], reference[0], check_exact=False, rtol=1e-5, atol=1e-6)
    for name, value in run[1].items():
        torch.testing.assert_close(value, reference[1][name], rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("backward", [False, True], ids=["in the forward pass", "in the backward pass"])
def test_a_batch_that_runs_out_of_memory_trains_as_micro_batches_with_the_same_update(backward, capsys):
    reference = train(RunsOut(None))
    layer = RunsOut(5, backward=backward, in_eval=True)
    run = train(layer, verbose=1)

    assert_same_run(run, reference)
    # 16 rows ran out, then 8 (in the backward pass, after their forward ran): pieces of 4 from then on.
    trained = layer.seen[2:] if backward else layer.seen
    assert layer.seen[:2] == ([16, 8] if backward else [4, 4])
    assert set(trained) == {4} and sum(trained) == 2 * SAMPLES  # every sample once an epoch: none lost, none twice
    said = capsys.readouterr().out
    assert said.count("micro-batches of 4 samples") == 1 and "the same update" in said and "batch_size stays 16" in said
    if not backward:  # (the layer that runs out in backward passes has none in evaluation)
        assert said.count("Validation ran out of memory on a batch of 16 samples: it goes on in pieces of 4") == 1


def test_the_failed_attempt_is_freed_before_the_batch_is_trained_again():
    class Holds(nn.Module):
        """Holds an activation when it runs out, and looks whether it is gone at the next pass."""

        def __init__(self):
            super().__init__()
            self.held: list = []
            self.alive_at_next_pass: list[bool] = []

        def forward(self, x):
            activation = x * 2
            if self.held:
                self.alive_at_next_pass.append(self.held[-1]() is not None)
            if torch.is_grad_enabled() and x.shape[0] > 8:
                self.held.append(weakref.ref(activation))
                raise torch.OutOfMemoryError(OOM)
            return activation / 2

    holds = Holds()
    train(holds, epochs=1)
    assert holds.alive_at_next_pass and not any(holds.alive_at_next_pass)


def test_with_accumulation_a_later_batch_of_a_group_splits_exactly_and_refuses_a_spoilt_backward():
    options = {"gradient_accumulation_steps": 2}
    reference = train(RunsOut(None), **options)
    layer = RunsOut(5, after=1)  # the first batch of the group runs whole; the second runs out
    assert_same_run(train(layer, **options), reference)
    assert layer.seen[:3] == [16, 4, 4]  # (16 and 8 ran out before they were counted)

    spoilt = RunsOut(5, backward=True, after=1)
    with pytest.raises(torch.OutOfMemoryError, match=r"after 1 earlier batch.*accumulation group") as caught:
        train(spoilt, **options)
    assert "batch_size=8, gradient_accumulation_steps=4" in str(caught.value) and OOM in str(caught.value)


def test_evaluate_and_predict_go_on_in_pieces_with_the_same_values(capsys):
    x, y = data()
    net = net_with(RunsOut(None, in_eval=True))
    model = kt.KerasModel(net, nn.CrossEntropyLoss(), {"acc": accuracy})
    values, outputs = model.evaluate(x, y, batch_size=32, verbose=0), model.predict(x, batch_size=32, verbose=0)

    net[2].rows = 7
    assert model.evaluate(x, y, batch_size=32) == pytest.approx(values, rel=1e-6)
    assert "evaluate ran out of memory on a batch of 32 samples: it goes on in pieces of 4" in capsys.readouterr().out
    torch.testing.assert_close(model.predict(x, batch_size=32, verbose=0), outputs)
    listed = model.predict(x, batch_size=32, verbose=0, concatenate=False)
    assert [len(batch) for batch in listed] == [32, 32, 32]  # pieces are joined back into their batch


def test_on_oom_raise_gives_torch_s_error_with_nothing_changed():
    layer = RunsOut(5)
    x, y = data()
    net = net_with(layer)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    model = kt.KerasModel(net, nn.CrossEntropyLoss())
    with pytest.raises(torch.OutOfMemoryError) as caught:
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, on_oom="raise")
    assert str(caught.value) == OOM and not layer.seen
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())
    with pytest.raises(ValueError, match=r"on_oom='later'; use 'split'.*'split_batchnorm'.*'raise'"):
        model.fit(x, y, on_oom="later")


def test_what_cannot_be_split_says_so_and_what_to_do():
    with pytest.raises(torch.OutOfMemoryError, match="micro-batches of one sample: one sample alone does not fit"):
        train(RunsOut(0))

    class OwnStep(kt.KerasModel):
        def train_step(self, batch):
            with self.autocast():
                loss, preds, labels = self.forward_batch(batch)
            self.backward(loss)
            self.optimizer_step()
            return loss, preds, labels

    with pytest.raises(
        torch.OutOfMemoryError, match=r"your train_step.*model.backward and model.optimizer_step"
    ) as own:
        train(RunsOut(5), model_class=OwnStep)
    assert "fit(..., batch_size=8, gradient_accumulation_steps=2)" in str(own.value)

    class StepRunsOut(torch.optim.Adam):
        def step(self, closure=None):
            raise torch.OutOfMemoryError(OOM)

    x, y = data()
    net = net_with(RunsOut(None))
    model = kt.KerasModel(net, nn.CrossEntropyLoss(), optimizer=StepRunsOut(net.parameters()))
    with pytest.raises(torch.OutOfMemoryError, match="in the optimizer's step. Micro-batches cannot help"):
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)


def test_a_net_with_batchnorm_is_split_only_when_asked():
    with pytest.raises(torch.OutOfMemoryError, match=r"BatchNorm layers.*\(2\).*on_oom='split_batchnorm'"):
        train(RunsOut(5), nn.BatchNorm1d(16))
    layer = RunsOut(5)
    history = train(layer, nn.BatchNorm1d(16), on_oom="split_batchnorm")[0]
    assert list(history["epoch"]) == [1, 2] and set(layer.seen) == {4}
    # A frozen BatchNorm (in eval mode) normalises each sample alone: nothing to refuse.
    frozen = nn.BatchNorm1d(16).eval()
    reference = train(RunsOut(None), frozen)
    assert_same_run(train(RunsOut(5), nn.BatchNorm1d(16).eval()), reference)


def test_a_resumed_run_trains_in_the_micro_batches_the_run_had_reached(tmp_path):
    class CrashAt(kt.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            if self.model.fit_step.epochs_done == 2 and batch == 3:
                raise RuntimeError("crash")

    backup = lambda: kt.callbacks.BackupAndRestore(tmp_path / "backup", save_freq=2)
    reference = train(RunsOut(None))
    with pytest.raises(RuntimeError, match="crash"):
        train(RunsOut(5), callbacks=[backup(), CrashAt()])
    roomy = RunsOut(None)  # memory enough now: the resumed run still trains in micro-batches of 4
    resumed = train(roomy, callbacks=[backup()])
    assert_same_run(resumed, reference)
    assert set(roomy.seen) == {4} and sum(roomy.seen) == SAMPLES - 2 * BATCH  # from batch 3 of epoch 2 on


def test_a_batch_is_cut_by_samples_and_joined_back_as_it_was():
    weights = torch.arange(5.0)
    batch = WeightedSample(
        ({"x": torch.arange(10).reshape(5, 2), "ids": ["a", "b", "c", "d", "e"], "t": torch.tensor(0.5)}, weights),
        weights,
    )
    assert samples_in_batch((torch.zeros(5, 2), [{"boxes": torch.zeros(2, 4)}] * 5)) == 5
    pieces = [batch_rows(batch, start, min(start + 2, 5), 5) for start in range(0, 5, 2)]
    assert type(pieces[0]) is WeightedSample and pieces[1].sample[0]["ids"] == ["c", "d"]
    assert pieces[2].weight.tolist() == [4.0] and pieces[2].sample[0]["t"] is batch.sample[0]["t"]
    joined = joined_rows(pieces, [2, 2, 1])
    assert torch.equal(joined.sample[0]["x"], batch.sample[0]["x"]) and joined.sample[0]["ids"] == list("abcde")
    # (x1, x2) with a row per sample each is two inputs, not two samples, even in a batch of two:
    two = ((torch.zeros(2, 3), torch.ones(2, 3)), torch.tensor([0, 1]))
    assert [t.shape for t in batch_rows(two, 0, 1, 2)[0]] == [torch.Size([1, 3])] * 2

    text = (torch.tensor([0, 1]), torch.arange(7), torch.tensor([0, 3]))  # labels, flat tokens, offsets
    with pytest.raises(BatchError, match=r"batch\[1\] has 7 rows, but the batch holds 2 samples"):
        batch_rows(text, 0, 1, 2)


# -- several processes ------------------------------------------------------------------------


class WithBuffer(nn.Module):
    """A layer with a buffer, which DDP broadcasts at the start of its forward passes."""

    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.ones(16))

    def forward(self, x):
        return x * self.scale


class RecordsMicroBatches(kt.Callback):
    """Writes, in each process, the micro-batch size after each epoch and the rows the epoch trained."""

    def __init__(self, folder, layer):
        self.folder, self.layer = folder, layer

    def on_epoch_begin(self, epoch, logs=None):
        self.before = len(self.layer.seen)

    def on_epoch_end(self, epoch, logs=None):
        rank = os.environ.get("RANK", "0")
        record = {"micro_batch": self.model.fit_step.micro_batch, "seen": self.layer.seen[self.before :]}
        (self.folder / f"rank{rank}-epoch{epoch}.json").write_text(json.dumps(record))


@pytest.mark.slow
@pytest.mark.parametrize("accumulate", [1, 2], ids=["its gradients exchanged", "inside an accumulation group"])
def test_two_processes_where_one_runs_out_train_as_two_that_never_did(tmp_path, accumulate):
    """Only process 1 runs out, on its second batch: it trains that batch (whose gradients the processes
    exchange, or not yet) in pieces alone, and the gradient exchange and DDP's buffer broadcasts still
    match process 0's whole batches; at the epoch's end both take the micro-batch size."""

    def two_processes(layer, folder):
        x, y = data()
        net = net_with(layer, WithBuffer())
        model = kt.KerasModel(net, nn.CrossEntropyLoss(), {"acc": accuracy}, torch.optim.SGD(net.parameters(), 0.1))
        kt.seed_everything(0)
        loader = DataLoader(TensorDataset(x, y), batch_size=BATCH, shuffle=True)
        val = DataLoader(TensorDataset(*data(seed=1)), batch_size=BATCH)
        folder.mkdir()
        history = model.fit(
            loader,
            val,
            epochs=2,
            verbose=0,
            accelerator="cpu",
            devices=2,
            gradient_accumulation_steps=accumulate,
            callbacks=[RecordsMicroBatches(folder, layer)],
        )
        return history, {k: v.clone() for k, v in net.state_dict().items()}

    reference = two_processes(RunsOut(None), tmp_path / "reference")
    # Process 1 runs out from its third training pass on: after DDP's look for unused parameters, and batch 0.
    run = two_processes(RunsOut(5, in_eval=True, after=2, rank=1), tmp_path / "run")
    assert_same_run(run, reference)
    records = {
        (rank, epoch): json.loads((tmp_path / "run" / f"rank{rank}-epoch{epoch}.json").read_text())
        for rank in (0, 1)
        for epoch in (1, 2)
    }
    assert records[1, 1]["seen"] == [16] + [4] * 8 and records[1, 1]["micro_batch"] == 4  # process 1 split alone
    assert records[0, 1]["seen"] == [16] * 3 and records[0, 1]["micro_batch"] == 4  # and process 0 follows
    assert records[0, 2]["seen"] == records[1, 2]["seen"] == [4] * 12  # from epoch 2 on


@pytest.mark.slow
def test_fsdp_refuses_to_split_saying_why():
    # Both processes run out (the same batch size, the same net): a process that ran out alone would
    # wait in its error's clean-up for the others, which wait in the forward pass's weight exchange.
    x, y = data()
    net = net_with(RunsOut(5))
    model = kt.KerasModel(net, nn.CrossEntropyLoss())
    with pytest.raises(torch.OutOfMemoryError, match="strategy='fsdp' gathers each block's weights"):
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, accelerator="cpu", devices=2, strategy="fsdp")


# -- a real GPU ---------------------------------------------------------------------------------


class KeepsMicroBatch(kt.Callback):
    def on_train_end(self, logs=None):
        self.micro_batch = self.model.fit_step.micro_batch


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.gpu
def test_on_a_gpu_a_batch_too_large_for_its_memory_splits_and_finishes(capsys):
    """Batches of 128 images of 3x256x256 through two convolutions need about 4 GiB of activations;
    the process may use 1.5 GiB of the GPU (torch's per-process cap): the first-batch check, the
    training steps and the validation run out for real, and the run ends as the uncapped one does."""
    generator = torch.Generator().manual_seed(0)
    x, x_val = torch.randn(256, 3, 256, 256, generator=generator), torch.randn(128, 3, 256, 256, generator=generator)
    y, y_val = torch.randint(0, 10, (256,), generator=generator), torch.randint(0, 10, (128,), generator=generator)

    def run():
        torch.manual_seed(1)
        net = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10),
        )  # fmt: skip
        model = kt.KerasModel(net, nn.CrossEntropyLoss(), optimizer=torch.optim.SGD(net.parameters(), lr=0.1))
        kept = KeepsMicroBatch()
        options = {"batch_size": 128, "epochs": 2, "accelerator": "cuda", "callbacks": [kept]}
        torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        history = model.fit(x, y, validation_data=(x_val, y_val), **options)
        seconds = time.perf_counter() - start
        weights = {k: v.detach().cpu().clone() for k, v in net.state_dict().items()}
        return history, weights, kept.micro_batch, torch.cuda.max_memory_allocated() / 2**30, seconds

    cap = 1.5 * 2**30
    with torch.backends.cudnn.flags(enabled=True, benchmark=False, deterministic=True, allow_tf32=False):
        reference = run()
        capsys.readouterr()
        torch.cuda.empty_cache()
        torch.cuda.set_per_process_memory_fraction(cap / torch.cuda.get_device_properties(0).total_memory)
        try:
            split = run()
        finally:
            torch.cuda.set_per_process_memory_fraction(1.0)
    said = capsys.readouterr().out

    assert reference[2] is None and split[2] is not None and split[2] < 128
    assert "micro-batches of" in said and "Validation ran out of memory" in said
    assert split[3] <= 1.5 < reference[3]
    # (cuDNN may pick another algorithm for another batch size: a looser tolerance than on the CPU)
    pd.testing.assert_frame_equal(split[0], reference[0], check_exact=False, rtol=1e-4, atol=1e-5)
    for name, value in split[1].items():
        torch.testing.assert_close(value, reference[1][name], rtol=1e-4, atol=1e-5, msg=name)
    print(
        f"out of memory on {torch.cuda.get_device_name(0)}: batches of 128 images trained in micro-batches of "
        f"{split[2]} under a cap of 1.5 GiB: peak {split[3]:.2f} GiB, fit {split[4]:.1f} s (the first try of each "
        f"size included); uncapped, whole batches: peak {reference[3]:.2f} GiB, fit {reference[4]:.1f} s"
    )
