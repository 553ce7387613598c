"""KerasModel.fit on real data: it learns, the history is exact, the best weights come back."""

from __future__ import annotations

import math
import os
import re

import pandas as pd
import pytest
import torch
import torchmetrics
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import kerastorch as kt
from conftest import make_mlp
from helpers import TorchkerasAccuracy, accuracy


def accuracy_metric():
    return torchmetrics.Accuracy(task="multiclass", num_classes=10)


def test_fit_learns_and_returns_history_in_the_documented_shape(loaders, mlp, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    dl_train, dl_val = loaders
    model = kt.KerasModel(
        mlp, nn.CrossEntropyLoss(), {"acc": accuracy_metric()}, torch.optim.Adam(mlp.parameters(), lr=1e-2)
    )
    history = model.fit(dl_train, dl_val, epochs=6, monitor="val_acc", mode="max", verbose=0)

    assert isinstance(history, pd.DataFrame)
    assert list(history.columns) == ["epoch", "train_loss", "train_acc", "lr", "val_loss", "val_acc"]
    assert history["epoch"].tolist() == list(range(1, 7))
    assert all(isinstance(v, float) for v in history.iloc[0, 1:])
    assert history["val_acc"].max() > 0.9  # chance is 0.1
    assert history["train_loss"].iloc[-1] < history["train_loss"].iloc[0]
    assert model.history.equals(history)
    assert os.listdir(tmp_path) == []  # best weights kept in memory: no stray files


def test_restored_weights_are_the_best_epochs(loaders, mlp):
    dl_train, dl_val = loaders
    model = kt.KerasModel(
        mlp, nn.CrossEntropyLoss(), {"acc": accuracy_metric()}, torch.optim.SGD(mlp.parameters(), lr=0.5)
    )  # a high lr makes val_loss jump about
    history = model.fit(dl_train, dl_val, epochs=8, patience=None, verbose=0)

    best = history.loc[history["val_loss"].idxmin()]
    scores = model.evaluate(dl_val, quiet=True)
    assert scores["val_loss"] == pytest.approx(best["val_loss"], rel=1e-6)
    assert scores["val_acc"] == pytest.approx(best["val_acc"], rel=1e-6)


class WatchKeptCopies(kt.Callback):
    """After the keepers of weights (order 0 > theirs): where each epoch's kept copy lives, and the net's
    weights at that epoch."""

    def __init__(self, kept_copy):
        self.kept_copy = kept_copy  # callback -> the copy its keeper holds now
        self.addresses, self.weights = [], []

    def on_epoch_end(self, epoch, logs=None):
        copy = self.kept_copy(self)
        self.addresses.append({k: v.data_ptr() for k, v in copy.items()})
        self.weights.append({k: v.detach().clone() for k, v in self.model.net.state_dict().items()})
        assert all(torch.equal(copy[k], w) for k, w in self.weights[-1].items())  # the copy is this epoch's


@pytest.mark.parametrize("keeper", ["fit", "EarlyStopping(restore_best_weights=True)"])
def test_each_better_epoch_is_written_over_the_one_host_copy_and_the_best_comes_back(loaders, mlp, keeper):
    dl_train, dl_val = loaders
    model = kt.KerasModel(mlp, nn.CrossEntropyLoss(), optimizer=torch.optim.Adam(mlp.parameters(), lr=1e-2))
    if keeper == "fit":
        watch = WatchKeptCopies(lambda cb: cb.params["best"].best_weights)
        callbacks = [watch]
    else:
        stopper = kt.callbacks.EarlyStopping(monitor="train_loss", patience=10, restore_best_weights=True)
        watch = WatchKeptCopies(lambda cb: stopper.best_weights)
        callbacks = [stopper, watch]
    # The training loss falls every epoch: each epoch is the best so far, and its weights are kept.
    history = model.fit(dl_train, dl_val, epochs=4, monitor="train_loss", patience=None, callbacks=callbacks, verbose=0)

    assert history["train_loss"].is_monotonic_decreasing
    # One copy in host memory, written over at each better epoch: never a new one beside the old.
    assert all(addresses == watch.addresses[0] for addresses in watch.addresses[1:])
    # What comes back is the last copy's values: the best (last) epoch's weights.
    assert all(torch.equal(v, watch.weights[-1][k]) for k, v in mlp.state_dict().items())


def test_early_stopping_stops_exactly_patience_epochs_after_the_best(loaders, mlp):
    dl_train, dl_val = loaders
    model = kt.KerasModel(mlp, nn.CrossEntropyLoss(), optimizer=torch.optim.Adam(mlp.parameters(), lr=1e-2))
    # The training loss falls every epoch, so with mode="max" epoch 1 stays the best.
    history = model.fit(dl_train, dl_val, epochs=20, patience=3, monitor="train_loss", mode="max", verbose=0)
    assert history["epoch"].tolist() == [1, 2, 3, 4]
    assert history["train_loss"].is_monotonic_decreasing


def test_best_weights_are_written_to_ckpt_path_and_load_into_a_fresh_model(loaders, mlp, tmp_path):
    dl_train, dl_val = loaders
    ckpt = tmp_path / "sub" / "best.safetensors"
    model = kt.KerasModel(mlp, nn.CrossEntropyLoss(), {"acc": accuracy_metric()})
    history = model.fit(dl_train, dl_val, epochs=3, ckpt_path=ckpt, monitor="val_acc", mode="max", verbose=0)
    assert ckpt.is_file()
    assert [p.name for p in ckpt.parent.iterdir()] == ["best.safetensors"]  # no temp files left

    fresh = kt.KerasModel(make_mlp(seed=1), nn.CrossEntropyLoss(), {"acc": accuracy_metric()})
    fresh.load_ckpt(ckpt)
    assert fresh.evaluate(dl_val, quiet=True)["val_acc"] == pytest.approx(history["val_acc"].max())


class TiedTagger(nn.Module):
    """Token ids in, a score per vocabulary entry out, the output layer's weights tied to the embedding's."""

    def __init__(self, vocabulary=12, width=8):
        super().__init__()
        self.embed = nn.Embedding(vocabulary, width)
        self.head = nn.Linear(width, vocabulary, bias=False)
        self.head.weight = self.embed.weight  # one tensor under two names in the state dict

    def forward(self, tokens):
        return self.head(torch.tanh(self.embed(tokens)))


@pytest.mark.parametrize("name", ["best.safetensors", "best.pt"])
def test_tied_weights_are_written_to_ckpt_path_and_by_save_ckpt_and_load_back(tmp_path, name):
    torch.manual_seed(0)
    tokens = torch.randint(0, 12, (96,))
    loader = DataLoader(TensorDataset(tokens, (tokens + 1) % 12), batch_size=32)  # learn the next id
    net = TiedTagger()
    model = kt.KerasModel(net, nn.CrossEntropyLoss(), optimizer=torch.optim.Adam(net.parameters(), lr=0.05))
    history = model.fit(loader, loader, epochs=5, ckpt_path=tmp_path / name, verbose=0)
    model.save_ckpt(tmp_path / f"saved_{name}")
    assert history["val_loss"].min() < history["val_loss"].iloc[0]

    for path in (tmp_path / name, tmp_path / f"saved_{name}"):
        fresh = kt.KerasModel(TiedTagger(), nn.CrossEntropyLoss())
        fresh.load_ckpt(path)
        assert fresh.net.head.weight is fresh.net.embed.weight  # still tied
        assert torch.equal(fresh.net.embed.weight, net.embed.weight)  # the best epoch's, which the net holds
        assert fresh.evaluate(loader, quiet=True)["val_loss"] == pytest.approx(history["val_loss"].min(), rel=1e-6)


def test_epoch_values_are_exact_over_samples_not_means_of_batch_means():
    torch.manual_seed(0)
    x, y = torch.randn(10, 3), torch.randn(10, 1)
    net = nn.Linear(3, 1)
    loader = DataLoader(TensorDataset(x, y), batch_size=4)  # batches of 4, 4 and 2

    def mean_abs_error(preds, labels):
        return (preds - labels).abs().mean()

    model = kt.KerasModel(
        net,
        nn.MSELoss(),
        {"mae": mean_abs_error, "mse": torchmetrics.MeanSquaredError()},
        torch.optim.SGD(net.parameters(), lr=0.01),
    )
    history = model.fit(loader, loader, epochs=1, verbose=0)
    with torch.no_grad():
        preds = net(x)
    assert history["val_loss"][0] == pytest.approx(nn.functional.mse_loss(preds, y).item(), rel=1e-6)
    assert history["val_mae"][0] == pytest.approx((preds - y).abs().mean().item(), rel=1e-6)
    assert history["val_mse"][0] == pytest.approx(history["val_loss"][0], rel=1e-6)
    batch_means = [nn.functional.mse_loss(net(x[i : i + 4]), y[i : i + 4]).item() for i in (0, 4, 8)]
    assert history["val_loss"][0] != pytest.approx(sum(batch_means) / 3, rel=1e-6)


def test_a_function_metric_is_its_batch_values_averaged_over_samples_however_the_epoch_is_read():
    # A function that is not a mean over samples (the spread of the outputs): its epoch value is
    # sum f(batch) * n / N, whether or not something reads the logs between batches.
    torch.manual_seed(0)
    x, y = torch.randn(203, 3), torch.randint(0, 2, (203,))
    loader = DataLoader(TensorDataset(x, y), batch_size=8)  # 25 batches of 8 and one of 3

    def spread(preds, labels):
        return preds[:, 1].std()

    class ReadsTheLogs(kt.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch % 5 == 4:
                logs["train_loss"]  # a read: the waiting batches go to the metrics now

    values = []
    for callbacks in ([], [ReadsTheLogs()]):
        torch.manual_seed(1)
        net = nn.Linear(3, 2)
        model = kt.KerasModel(net, nn.CrossEntropyLoss(), {"spread": spread}, torch.optim.SGD(net.parameters(), lr=0.0))
        history = model.fit(loader, epochs=1, callbacks=callbacks, verbose=0)
        with torch.no_grad():
            by_hand = sum(spread(net(xb), yb).item() * len(xb) for xb, yb in loader) / len(x)
        assert history["train_spread"][0] == pytest.approx(by_hand, rel=1e-6)
        values.append(history["train_spread"][0])
    assert values[0] == values[1]


def test_the_loss_of_many_batches_is_the_mean_over_samples_to_float64_precision():
    """The batch losses reach the epoch's sum in groups (not one kernel a step): over 600 batches
    (several groups), a short last one among them, the epoch loss is still each batch's loss times its
    size, summed in float64, over the samples."""
    torch.manual_seed(0)
    x, y = torch.randn(1799, 3), torch.randn(1799, 1)
    net = nn.Linear(3, 1)
    loader = DataLoader(TensorDataset(x, y), batch_size=3)  # 599 batches of 3 and one of 2
    model = kt.KerasModel(net, nn.MSELoss())
    scores = model.evaluate(loader, verbose=0)
    with torch.no_grad():
        losses = [nn.functional.mse_loss(net(bx), by) for bx, by in loader]
    by_hand = sum(loss.double().item() * len(by) for loss, (_, by) in zip(losses, loader)) / len(x)
    assert scores["val_loss"] == pytest.approx(by_hand, rel=1e-12)


class CorrectOverTotal(torch.nn.Module):
    """A stateful metric's state and value: counts in buffers, their ratio; subclasses count in ``update``."""

    def __init__(self):
        super().__init__()
        self.register_buffer("correct", torch.tensor(0.0))
        self.register_buffer("total", torch.tensor(0.0))

    def compute(self):
        return self.correct / self.total

    def reset(self):
        self.correct.zero_()
        self.total.zero_()


class PixelAccuracy(CorrectOverTotal):
    """Every copy of it records, in the class, how many output elements each update was handed."""

    update_sizes: list = []  # on the class: the run's copies of the metric all add to it

    def update(self, preds, labels):
        PixelAccuracy.update_sizes.append(preds.numel())
        self.correct += (preds.argmax(1) == labels).sum()
        self.total += labels.numel()


def test_large_outputs_reach_the_metrics_in_bounded_groups_and_stay_exact():
    """Metric updates are grouped over steps, but a segmentation net's outputs must not pile up on
    the device: a group holds at most FLUSH_ELEMENTS output elements."""
    from kerastorch.training.meters import FLUSH_ELEMENTS

    torch.manual_seed(0)
    x = torch.randn(64, 1, 256, 256)
    y = (x[:, 0] > 0).long()  # one label per pixel
    net = nn.Conv2d(1, 2, 1)  # 8 x 2 x 256 x 256 = 1M output elements a batch
    loader = DataLoader(TensorDataset(x, y), batch_size=8)
    model = kt.KerasModel(
        net, nn.CrossEntropyLoss(), {"pixel_acc": PixelAccuracy()}, torch.optim.SGD(net.parameters(), lr=0.1)
    )
    PixelAccuracy.update_sizes.clear()
    history = model.fit(loader, loader, epochs=1, verbose=0)
    one_batch = 8 * 2 * 256 * 256
    # Grouped (updates of several batches), each group within the bound: never the 7 or 8 batches
    # an epoch holds after the first (which the first-batch check updated on its own).
    assert one_batch < max(PixelAccuracy.update_sizes) <= min(FLUSH_ELEMENTS, 4 * one_batch)
    with torch.no_grad():
        by_hand = (net(x).argmax(1) == y).float().mean().item()
    assert history["val_pixel_acc"][0] == pytest.approx(by_hand, abs=1e-6)


class CountedAccuracy(CorrectOverTotal):
    """Every copy of it records, in the class, how many samples each update was handed."""

    update_sizes: list = []

    def update(self, preds, labels):
        CountedAccuracy.update_sizes.append(len(labels))
        self.correct += (preds.argmax(1) == labels).sum()
        self.total += labels.numel()


def test_small_outputs_reach_the_metrics_a_few_times_an_epoch_and_stay_exact():
    """A metric update between training steps costs more than a small net's step: the outputs of
    FLUSH_EVERY steps go to the metrics at once, and the epoch's value is still over every sample."""
    from kerastorch.training.meters import FLUSH_EVERY

    torch.manual_seed(0)
    x = torch.randn(4 * 600, 5)
    y = (x[:, 0] > 0).long()
    net = nn.Linear(5, 2)
    loader = DataLoader(TensorDataset(x, y), batch_size=4)  # 600 batches
    model = kt.KerasModel(
        net, nn.CrossEntropyLoss(), {"acc": CountedAccuracy()}, torch.optim.SGD(net.parameters(), lr=0.1)
    )
    CountedAccuracy.update_sizes.clear()
    model.fit(loader, epochs=1, verbose=0)
    sizes = list(CountedAccuracy.update_sizes)
    # The first batch alone (on the first-batch check's copy), then the meter's groups.
    assert sizes[0] == 4 and sum(sizes[1:]) == len(x)
    assert len(sizes) == 1 + math.ceil(600 / FLUSH_EVERY) and FLUSH_EVERY >= 256
    scores = model.evaluate(loader, verbose=0)
    with torch.no_grad():
        by_hand = (net(x).argmax(1) == y).float().mean().item()
    assert scores["val_acc"] == pytest.approx(by_hand, abs=1e-6)
    assert len(CountedAccuracy.update_sizes) - len(sizes) <= 1 + math.ceil(600 / FLUSH_EVERY)


class TokenAccuracy(CorrectOverTotal):
    """Over tokens, padding (-100) left out; every copy records, in the class, each update's batch and
    sequence length."""

    update_lengths: list = []

    def update(self, preds, labels):
        TokenAccuracy.update_lengths.append((preds.shape[0], preds.shape[-1]))
        real = labels != -100
        self.correct += ((preds.argmax(1) == labels) & real).sum()
        self.total += real.sum()


def test_sequence_outputs_of_several_lengths_reach_the_metrics_exactly():
    """A token tagger's batches are padded to each batch's longest sequence, so outputs differ beyond
    the batch dimension from batch to batch: the waiting batches cannot be concatenated as one. Each
    run of neighbours of one length still goes to the metric as one update, and the value is exact."""
    torch.manual_seed(0)
    lengths = [5, 5, 5, 9, 9, 5, 7, 7]  # one length per batch of 4 sequences
    xs = [torch.randn(4, 3, length) for length in lengths]
    ys = [(x[:, 0] > 0).long() for x in xs]
    for y in ys:
        y[:, -1] = -100  # the last position of every sequence is padding
    batches = list(zip(xs, ys))
    net = nn.Conv1d(3, 2, 1)  # (N, 3, L) -> (N, 2, L): per-token logits, as CrossEntropyLoss takes them
    model = kt.KerasModel(
        net,
        nn.CrossEntropyLoss(ignore_index=-100),
        {"token_acc": TokenAccuracy()},
        torch.optim.SGD(net.parameters(), lr=0.1),
    )
    TokenAccuracy.update_lengths.clear()
    history = model.fit(batches, batches, epochs=1, verbose=0)
    # The checks' trials on the first training and validation batches; then each epoch's batches in
    # one flush: runs of one length joined.
    assert TokenAccuracy.update_lengths == [
        (4, 5),
        (4, 5),
        *[(12, 5), (8, 9), (4, 5), (8, 7)],
        *[(12, 5), (8, 9), (4, 5), (8, 7)],
    ]
    with torch.no_grad():
        correct = sum(((net(x).argmax(1) == y) & (y != -100)).sum().item() for x, y in batches)
        total = sum((y != -100).sum().item() for _, y in batches)
    assert history["val_token_acc"][0] == pytest.approx(correct / total, abs=1e-6)


class DtypeAccuracy(CorrectOverTotal):
    """Every copy records, in the class, each update's dtype of the predictions and number of samples."""

    updates: list = []

    def update(self, preds, labels):
        DtypeAccuracy.updates.append((preds.dtype, len(labels)))
        self.correct += (preds.argmax(1) == labels).sum()
        self.total += labels.numel()


class OutputsInInputsDtype(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(3, 2)

    def forward(self, x):
        return self.linear(x.float()).to(x.dtype)


def test_outputs_of_several_dtypes_reach_the_metrics_as_they_came():
    """A group of waiting batches whose outputs differ in dtype is not concatenated as one (torch.cat
    would turn them all into the widest dtype): each run of neighbours of one dtype is one update."""
    torch.manual_seed(0)
    dtypes = [torch.float32, torch.float32, torch.float64, torch.float64, torch.float32]
    xs = [torch.randn(4, 3, dtype=dtype) for dtype in dtypes]
    batches = [(x, (x[:, 0] > 0).long()) for x in xs]
    net = OutputsInInputsDtype()
    model = kt.KerasModel(
        net, nn.CrossEntropyLoss(), {"acc": DtypeAccuracy()}, torch.optim.SGD(net.parameters(), lr=0.1)
    )
    DtypeAccuracy.updates.clear()
    history = model.fit(batches, batches, epochs=1, verbose=0)
    f32, f64 = torch.float32, torch.float64
    # The checks' trials on the first training and validation batches, then each epoch's batches in
    # one flush: the runs of one dtype joined.
    assert DtypeAccuracy.updates == [
        (f32, 4),
        (f32, 4),
        *[(f32, 8), (f64, 8), (f32, 4)],
        *[(f32, 8), (f64, 8), (f32, 4)],
    ]
    with torch.no_grad():
        correct = sum((net(x).argmax(1) == y).sum().item() for x, y in batches)
    assert history["val_acc"][0] == pytest.approx(correct / 20, abs=1e-6)


class StepHook(kt.Callback):
    def on_after_optimizer_step(self, optimizer):
        pass  # a step hook: the default step goes through FitStep.backward and optimizer_step


def test_the_default_step_updates_the_weights_as_a_bare_loop_does_with_a_step_hook_or_without():
    """With nothing between the backward pass and the update, the default step makes the update
    itself; with a step hook, through ``FitStep``'s calls. Both give a bare loop's weights, bit for bit."""
    torch.manual_seed(0)
    x = torch.randn(64, 5)
    loader = DataLoader(TensorDataset(x, (x[:, 0] > 0).long()), batch_size=8)
    loss_fn = nn.CrossEntropyLoss()

    def net_and_optimizer():
        torch.manual_seed(1)
        net = nn.Linear(5, 2)
        return net, torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)

    bare, optimizer = net_and_optimizer()
    for _ in range(2):
        for xb, yb in loader:
            loss_fn(bare(xb), yb).backward()
            optimizer.step()
            optimizer.zero_grad()
    for callbacks in ([], [StepHook()]):
        net, optimizer = net_and_optimizer()
        model = kt.KerasModel(net, loss_fn, None, optimizer)
        model.fit(loader, epochs=2, monitor=None, verbose=0, callbacks=callbacks)
        assert all(torch.equal(a, b) for a, b in zip(bare.parameters(), net.parameters()))


def test_an_x_y_batch_trains_as_the_general_reading_of_its_layout_does():
    """``forward_batch`` reads an ``(x, y)`` batch without the general calls; it must read it as they
    do: the same weights and history, bit for bit, as with ``labels_at=-1`` (which goes through them)
    and as dict batches with a ``labels`` key."""
    torch.manual_seed(0)
    x = torch.randn(64, 5)
    y = (x[:, 0] > 0).long()

    def trained(data, labels_at=None):
        torch.manual_seed(1)
        net = nn.Linear(5, 2)
        optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
        model = kt.KerasModel(net, nn.CrossEntropyLoss(), {"acc": accuracy}, optimizer, labels_at=labels_at)
        history = model.fit(data, data, epochs=2, monitor=None, verbose=0)
        return list(net.parameters()), history

    pairs = DataLoader(TensorDataset(x, y), batch_size=8)
    dicts = [{"input": x[i : i + 8], "labels": y[i : i + 8]} for i in range(0, 64, 8)]
    weights, history = trained(pairs)
    for other in (trained(pairs, labels_at=-1), trained(dicts)):
        assert all(torch.equal(a, b) for a, b in zip(weights, other[0]))
        pd.testing.assert_frame_equal(history, other[1])


def test_three_metric_forms_agree(loaders, mlp):
    dl_train, dl_val = loaders
    metrics = {"tm": accuracy_metric(), "tk": TorchkerasAccuracy(), "fn": accuracy}
    model = kt.KerasModel(mlp, nn.CrossEntropyLoss(), metrics)
    history = model.fit(dl_train, dl_val, epochs=2, verbose=0)
    for stage in ("train", "val"):
        tm, tk, fn = (history[f"{stage}_{m}"] for m in ("tm", "tk", "fn"))
        assert tm.tolist() == pytest.approx(tk.tolist(), abs=1e-6)
        assert tm.tolist() == pytest.approx(fn.tolist(), abs=1e-6)
    assert model.metrics_dict["tk"].total.item() == 0  # the user's object is never touched


class TwoInputNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(64, 10), nn.Linear(64, 10)

    def forward(self, x1, x2):
        return self.a(x1) + self.b(x2)


class DictDataset(torch.utils.data.Dataset):
    def __init__(self, ds):
        self.ds = ds

    def __len__(self):
        return len(self.ds)

    def __getitem__(self, i):
        x, y = self.ds[i]
        return {"x1": x, "x2": x.flip(0), "labels": y}


def test_batch_forms_tuple_multi_input_and_dict(digits8):
    ds_train, ds_val = digits8
    x, y = ds_train.tensors
    multi = DataLoader(TensorDataset(x, x.flip(1), y), batch_size=64, shuffle=True)
    as_dict = DataLoader(DictDataset(ds_train), batch_size=64, shuffle=True)
    for loader in (multi, as_dict):
        net = TwoInputNet()
        model = kt.KerasModel(
            net, nn.CrossEntropyLoss(), {"acc": accuracy}, torch.optim.Adam(net.parameters(), lr=1e-2)
        )
        history = model.fit(loader, epochs=3, verbose=0)
        assert history["train_acc"].iloc[-1] > 0.8
        preds = model.predict(loader)
        assert preds.shape == (len(ds_train), 10)


def test_a_batch_without_labels_is_refused_before_any_weight_changes(digits8, mlp):
    x = digits8[0].tensors[0]
    before = [p.clone() for p in mlp.parameters()]
    model = kt.KerasModel(mlp, nn.CrossEntropyLoss())
    with pytest.raises(ValueError, match=r"bare tensor of shape \(64, 64\).*\(x, y\)"):
        model.fit(DataLoader(x, batch_size=64), epochs=1, verbose=0)
    assert all(torch.equal(a, b) for a, b in zip(before, mlp.parameters()))


def test_wrong_monitor_lists_the_names_the_run_will_produce(loaders, mlp):
    dl_train, dl_val = loaders
    model = kt.KerasModel(mlp, nn.CrossEntropyLoss(), {"acc": accuracy})
    with pytest.raises(ValueError, match="available: train_loss, train_acc, lr, val_loss, val_acc"):
        model.fit(dl_train, dl_val, monitor="val_accuracy", verbose=0)
    with pytest.raises(ValueError, match="mode='maximum'"):
        model.fit(dl_train, dl_val, mode="maximum", verbose=0)


def test_a_metric_that_is_not_callable_is_refused_naming_its_key(mlp):
    with pytest.raises(TypeError, match=r"metrics_dict\['acc'\] is a str"):
        kt.KerasModel(mlp, nn.CrossEntropyLoss(), {"acc": "accuracy"})


def test_predict_returns_cpu_outputs_in_data_order_for_labelled_and_unlabelled_loaders(loaders, digits8, mlp):
    dl_train, _ = loaders
    model = kt.KerasModel(mlp, nn.CrossEntropyLoss())
    model.fit(dl_train, epochs=1, verbose=0)
    x, _ = digits8[1].tensors
    with torch.no_grad():
        expected = mlp.eval()(x)
    from_inputs = model.predict(DataLoader(x, batch_size=33))
    from_pairs = model.predict(DataLoader(digits8[1], batch_size=33))
    assert from_inputs.device.type == "cpu"
    torch.testing.assert_close(from_inputs, expected)
    torch.testing.assert_close(from_pairs, expected)


class RecordingCallback(kt.Callback):
    def __init__(self):
        self.calls = []

    def on_train_begin(self, logs=None):
        self.calls.append("train_begin")

    def on_epoch_begin(self, epoch, logs=None):
        self.calls.append(f"epoch_begin {epoch}")

    def on_train_batch_end(self, batch, logs=None):
        if batch == 0:
            self.calls.append(f"batch_end loss>0={logs['train_loss'] > 0}")

    def on_epoch_end(self, epoch, logs=None):
        self.calls.append(f"epoch_end {epoch} {sorted(logs)}")
        if epoch == 2:
            self.model.stop_training = True

    def on_train_end(self, logs=None):
        self.calls.append("train_end")


def test_user_callbacks_see_hooks_with_one_based_epochs_and_can_stop(loaders, mlp):
    dl_train, dl_val = loaders
    recorder = RecordingCallback()
    model = kt.KerasModel(mlp, nn.CrossEntropyLoss())
    history = model.fit(dl_train, dl_val, epochs=5, callbacks=[recorder], verbose=0)
    keys = ["epoch", "lr", "train_loss", "val_loss"]
    assert recorder.calls == [
        "train_begin",
        "epoch_begin 1",
        "batch_end loss>0=True",
        f"epoch_end 1 {keys}",
        "epoch_begin 2",
        "batch_end loss>0=True",
        f"epoch_end 2 {keys}",
        "train_end",
    ]
    assert len(history) == 2


def test_seed_everything_makes_two_runs_identical(digits8):
    histories, weights = [], []
    for _ in range(2):
        kt.seed_everything(123)
        net = nn.Sequential(nn.Linear(64, 32), nn.Dropout(0.2), nn.ReLU(), nn.Linear(32, 10))
        loader = DataLoader(digits8[0], batch_size=64, shuffle=True)
        model = kt.KerasModel(net, nn.CrossEntropyLoss(), optimizer=torch.optim.SGD(net.parameters(), lr=0.1))
        histories.append(model.fit(loader, epochs=2, verbose=0))
        weights.append([p.detach().clone() for p in net.parameters()])
    pd.testing.assert_frame_equal(histories[0], histories[1])
    assert all(torch.equal(a, b) for a, b in zip(*weights))


def test_verbose_prints_progress_and_the_device_line(loaders, mlp, capsys):
    dl_train, dl_val = loaders
    model = kt.KerasModel(mlp, nn.CrossEntropyLoss())
    model.fit(dl_train, dl_val, epochs=2, verbose=2)
    out = capsys.readouterr()
    text = out.out + out.err
    assert "training on cpu in precision 32-true" in text
    assert re.search(r"Epoch 2/2\b.*train_loss=.*val_loss=", text), text
