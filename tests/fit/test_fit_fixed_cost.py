"""What a fit call spares itself (benchmarks/peers.py's ``startup`` workload measures it), each
shown not to change what the run gives: no accelerate ``Accelerator`` for a run alone on the CPU
unless something asks for one, two copies of each metric in a model's first fit (instead of four)
and none in its later runs, no ``.to`` for a net already on its device and dtype, a history
frame built from whole columns with column labels made once, and no second fetch of the
validation batch the checks before training fetched."""

from __future__ import annotations

import copy

import numpy as np
import pandas as pd
import pytest
import torch
import torchmetrics
from accelerate.state import AcceleratorState, PartialState
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import kerastorch as kt
from kerastorch.training.history import history_frame


def loaders(n=96, batch_size=32):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=g)
    y = (x[:, 0] > 0).long()
    return DataLoader(TensorDataset(x, y), batch_size=batch_size), DataLoader(
        TensorDataset(-x, y), batch_size=batch_size
    )


def make_model(metrics=None):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    return kt.KerasModel(net, nn.CrossEntropyLoss(), metrics, torch.optim.SGD(net.parameters(), lr=0.1))


def test_a_run_alone_on_the_cpu_builds_accelerate_state_only_when_asked():
    seen = {}

    class Look(kt.Callback):
        def __init__(self, ask):
            self.ask = ask

        def on_epoch_end(self, epoch, logs=None):
            seen["state before asking"] = bool(PartialState._shared_state)
            if self.ask:
                seen["type"] = type(self.model.accelerator).__name__
                seen["state after asking"] = bool(PartialState._shared_state)

    train, _ = loaders()
    make_model().fit(train, epochs=1, verbose=0, callbacks=[Look(ask=False)])
    assert seen == {"state before asking": False}
    seen.clear()
    make_model().fit(train, epochs=1, verbose=0, callbacks=[Look(ask=True)])
    assert seen == {"state before asking": False, "type": "Accelerator", "state after asking": True}
    assert not PartialState._shared_state and not AcceleratorState._shared_state  # forgotten after the run


class CountingCopies:
    """Counts the deep copies made of one object (and copies as ever)."""

    def __init__(self, monkeypatch, watched):
        self.watched, self.count = watched, 0
        real_deepcopy = copy.deepcopy

        def counting_deepcopy(obj, *args, **kwargs):
            if obj is self.watched:
                self.count += 1
            return real_deepcopy(obj, *args, **kwargs)

        monkeypatch.setattr(copy, "deepcopy", counting_deepcopy)


def accuracy_by_hand(net, loader):
    with torch.no_grad():
        x, y = loader.dataset.tensors
        return (net(x).argmax(1) == y).float().mean().item()


def test_each_metric_is_copied_twice_and_the_checks_copy_carries_nothing_into_the_epoch(monkeypatch):
    train, val = loaders()
    accuracy = torchmetrics.Accuracy(task="multiclass", num_classes=2)
    model = make_model({"acc": accuracy, "acc_fn": lambda preds, labels: (preds.argmax(1) == labels).float().mean()})
    copies = CountingCopies(monkeypatch, accuracy)
    history = model.fit(train, val, epochs=2, verbose=0, monitor="val_loss", restore_best_weights=False)
    assert copies.count == 2  # the training meter's and the validation meter's
    # The copies the first-batch checks updated came back reset: the stateful metric's epoch
    # values equal the plain function's, computed over the same samples.
    for stage in ("train", "val"):
        assert history[f"{stage}_acc"].tolist() == pytest.approx(history[f"{stage}_acc_fn"].tolist(), abs=1e-6)
    # The last epoch's validation accuracy, by hand with the weights that stay.
    assert history["val_acc"].iloc[-1] == pytest.approx(accuracy_by_hand(model.net, val), abs=1e-6)
    assert accuracy.update_count == 0  # the user's metric itself was never updated


def test_a_models_later_runs_copy_no_metric_and_carry_nothing_from_the_earlier_ones(monkeypatch):
    train, val = loaders()
    accuracy = torchmetrics.Accuracy(task="multiclass", num_classes=2)
    model = make_model({"acc": accuracy})
    accuracy(torch.tensor([[0.0, 1.0]]), torch.tensor([0]))  # the user's own use: one wrong answer in its state
    model.fit(train, val, epochs=1, verbose=0, monitor="val_loss")
    copies = CountingCopies(monkeypatch, accuracy)
    for _ in range(2):
        history = model.fit(train, val, epochs=1, verbose=0, monitor="val_loss", restore_best_weights=False)
        # Each run's value is its own epoch's alone, by hand with the weights the net holds now.
        assert history["val_acc"].iloc[-1] == pytest.approx(accuracy_by_hand(model.net, val), abs=1e-6)
        assert model.evaluate(val)["val_acc"] == pytest.approx(accuracy_by_hand(model.net, val), abs=1e-6)
    assert copies.count == 0
    # A metric put in place of the first gets copies of its own, not the first one's.
    recall = torchmetrics.Recall(task="multiclass", num_classes=2, average="macro")
    model.metrics_dict = {"acc": recall}
    copies.watched = recall
    history = model.fit(train, val, epochs=1, verbose=0, monitor="val_loss", restore_best_weights=False)
    assert copies.count == 2
    x, y = val.dataset.tensors
    with torch.no_grad():
        by_hand = torchmetrics.functional.recall(model.net(x), y, task="multiclass", num_classes=2, average="macro")
    assert history["val_acc"].iloc[-1] == pytest.approx(by_hand.item(), abs=1e-6)
    assert accuracy.update_count == 1 and recall.update_count == 0  # the user's metrics as they were


class CountedAccuracy(torchmetrics.classification.MulticlassAccuracy):
    """Accuracy that counts the computes of all its copies."""

    computes = 0

    def compute(self):
        type(self).computes += 1
        return super().compute()


def test_a_metric_is_computed_by_the_checks_once_per_kind_of_outputs_and_still_refused_when_it_gives_no_number():
    train, val = loaders()
    model = make_model({"acc": CountedAccuracy(num_classes=2, average="micro")})
    CountedAccuracy.computes = 0
    history = model.fit(train, val, epochs=1, verbose=0)
    # The training batch's check computes it; the validation batch's, on outputs of the same kind,
    # does not; each epoch read computes it once.
    assert CountedAccuracy.computes == 1 + 2
    assert history["val_acc"].iloc[-1] == pytest.approx(accuracy_by_hand(model.net, val), abs=1e-6)
    CountedAccuracy.computes = 0
    model.fit(train, val, epochs=1, verbose=0)
    assert CountedAccuracy.computes == 2  # a later run: the reads alone
    # Outputs of another kind (float64 from a float64 net) are computed on again.
    model.net.double()
    wide = [DataLoader(TensorDataset(*(t.double() if t.is_floating_point() else t for t in d.dataset.tensors)),
                       batch_size=32) for d in (train, val)]  # fmt: skip
    CountedAccuracy.computes = 0
    model.fit(*wide, epochs=1, verbose=0, precision="64-true")
    assert CountedAccuracy.computes == 1 + 2
    # A metric that computes no single number is refused before training, in a later run too.
    model = make_model({"acc": CountedAccuracy(num_classes=2, average="micro")})
    model.fit(train, val, epochs=1, verbose=0)
    before = copy.deepcopy(model.net.state_dict())
    model.metrics_dict = {"acc": CountedAccuracy(num_classes=2, average=None)}
    with pytest.raises(ValueError, match=r"Metric 'acc' failed on the first batch of train_data.*shape \(2,\)"):
        model.fit(train, val, epochs=1, verbose=0)
    assert all(torch.equal(v, model.net.state_dict()[k]) for k, v in before.items())


def row_by_row(rows, columns=None):
    """The frame as pandas builds it from rows, reindexed: what history_frame gives, more slowly."""
    frame = pd.DataFrame(rows)
    if columns is not None and rows:
        frame = frame.reindex(columns=[*columns, *(c for c in frame.columns if c not in columns)])
    if "epoch" in frame:
        frame["epoch"] = frame["epoch"].astype(int)
    return frame


@pytest.mark.parametrize(
    "rows, columns",
    [
        ([], ["epoch", "train_loss"]),
        ([{"epoch": 1, "train_loss": 0.5, "lr": 0.1, "val_loss": 0.4}], ["epoch", "train_loss", "lr", "val_loss"]),
        # validation_freq=2: the first epoch has no val_* values; a callback added a column of its own
        (
            [{"epoch": 1, "train_loss": 0.5, "lr": 0.1}, {"epoch": 2, "train_loss": 0.4, "lr": 0.1, "val_loss": 0.3}],
            ["epoch", "train_loss", "lr", "val_loss"],
        ),
        (
            [{"epoch": 1, "train_loss": 0.5, "note": "warm-up"}, {"epoch": 2, "train_loss": 0.4}],
            ["epoch", "train_loss"],
        ),
        ([{"epoch": 1.0, "train_loss": 0.5}], None),  # a run's results sent back from a worker
        # the epoch among the floats, and a float column a callback added to the second row only
        (
            [{"train_loss": 0.5, "epoch": 3, "lr": 0.1}, {"train_loss": 0.4, "epoch": 4, "lr": 0.05, "ema": 0.2}],
            None,
        ),
        ([{"epoch": 1}, {"epoch": 2}], ["epoch"]),
    ],
)
def test_the_history_frame_is_the_one_pandas_builds_row_by_row(rows, columns):
    frame = history_frame(rows, columns)
    pd.testing.assert_frame_equal(frame, row_by_row(rows, columns))
    if rows:
        assert frame["epoch"].dtype == "int64"


def test_a_net_already_in_place_is_not_moved_and_one_in_another_dtype_is(monkeypatch):
    train, val = loaders()
    model = make_model()
    moved = []
    real_to = nn.Module.to

    def counting_to(module, *args, **kwargs):
        moved.append(module)
        return real_to(module, *args, **kwargs)

    monkeypatch.setattr(nn.Module, "to", counting_to)
    model.fit(train, val, epochs=1, verbose=0)
    assert model.net not in moved  # on the CPU in float32 already: .to would walk every module for nothing
    model.net.double()
    with pytest.warns(UserWarning, match="weights are float64.*converted to float32"):
        history = model.fit(train, val, epochs=1, verbose=0)
    assert model.net in moved and {p.dtype for p in model.net.parameters()} == {torch.float32}
    assert history["train_loss"].notna().all()


def test_renaming_one_historys_columns_leaves_the_next_historys_alone():
    rows = [{"epoch": 1, "train_loss": 0.5}]
    first = history_frame(rows, ["epoch", "train_loss"])
    first.columns.name = "values"
    assert history_frame(rows, ["epoch", "train_loss"]).columns.name is None


class CountedReads(TensorDataset):
    """A dataset of its own (a TensorDataset's subclass) that counts its reads, and draws from numpy
    at each read when ``noisy``."""

    def __init__(self, *tensors, noisy=False):
        super().__init__(*tensors)
        self.reads, self.noisy = 0, noisy

    def __getitem__(self, index):
        self.reads += 1
        x, y = super().__getitem__(index)
        return (x + float(np.random.normal(0, 0.01)), y) if self.noisy else (x, y)


class CountedRows(torch.Tensor):
    """A tensor that counts the rows read from it by index (a plain TensorDataset's reads)."""

    rows = 0

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        result = super().__torch_function__(func, types, args, kwargs or {})
        if func is torch.Tensor.__getitem__:
            cls.rows += 1
            return result.as_subclass(torch.Tensor)
        return result


class HalvesInPlace(nn.Module):
    """A net that writes into its input (x /= 2, as some nets scale images)."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 2)

    def forward(self, x):
        return self.linear(x.div_(2))


class WithDropout(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(4, 16), nn.Dropout(0.3), nn.ReLU(), nn.Linear(16, 2))

    def forward(self, x):
        return self.layers(x)


def first_pass_run(net_class, workers, dataset="TensorDataset", validation_steps=None):
    """Two epochs on shuffled data; the validation loader (96 samples) has ``workers``. Returns the
    history, torch's random state and the weights afterwards, and the validation samples read."""
    kt.seed_everything(0)
    train, val = loaders(n=96, batch_size=16)
    x, y = val.dataset.tensors
    CountedRows.rows = 0
    if dataset == "TensorDataset":
        val_set = TensorDataset(x.as_subclass(CountedRows), y)
    else:
        val_set = CountedReads(x, y, noisy=dataset == "draws from numpy")
    net = nn.Sequential(nn.Dropout(0.3), net_class()) if net_class is HalvesInPlace else net_class()
    model = kt.KerasModel(
        net,
        nn.CrossEntropyLoss(),
        {"acc": torchmetrics.Accuracy(task="multiclass", num_classes=2)},
        torch.optim.SGD(net.parameters(), lr=0.1),
    )
    dl_train = DataLoader(train.dataset, batch_size=16, shuffle=True)
    dl_val = DataLoader(val_set, batch_size=32, num_workers=workers)
    history = model.fit(dl_train, dl_val, epochs=2, verbose=0, validation_steps=validation_steps)
    reads = CountedRows.rows if dataset == "TensorDataset" else val_set.reads
    return history, torch.random.get_rng_state(), net.state_dict(), reads


@pytest.mark.parametrize(
    "net_class, dataset, validation_steps",
    [
        (WithDropout, "TensorDataset", None),
        (WithDropout, "a dataset of its own", None),
        (WithDropout, "TensorDataset", 2),
        (HalvesInPlace, "TensorDataset", None),
        (WithDropout, "draws from numpy", None),
    ],
    ids=["TensorDataset", "a dataset of its own", "validation_steps=2", "a net that changes its input", "numpy"],
)
def test_the_checks_batch_is_fetched_apart_and_the_run_is_unchanged(net_class, dataset, validation_steps):
    # The checks before training fetch the first validation batch with every random generator put back
    # afterwards; the first validation fetches it again. With a worker process or without: the same run.
    alone = first_pass_run(net_class, 0, dataset, validation_steps)
    apart = first_pass_run(net_class, 1, dataset, validation_steps)
    per_epoch = 96 if validation_steps is None else 2 * 32
    assert alone[3] == 2 * per_epoch + 32  # each sample read once an epoch, and the checked batch once more
    if dataset == "draws from numpy":  # a worker draws its noise from a generator of its own
        return
    pd.testing.assert_frame_equal(alone[0], apart[0], check_exact=True)
    assert torch.equal(alone[1], apart[1])  # the same random numbers drawn, to the last one
    assert all(torch.equal(alone[2][k], apart[2][k]) for k in alone[2])
