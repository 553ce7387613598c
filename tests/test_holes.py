"""Holes an adversarial user found in "errors before damage": each fails before any weight
changes, with a message that says what to do."""

from __future__ import annotations

import pytest
import torch
import torchmetrics
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, TensorDataset, WeightedRandomSampler

import kerastorch as kt
from helpers import accuracy


def data(n=96, classes=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 4, generator=g), torch.randint(0, classes, (n,), generator=g)


def make_model(metrics=None, loss_fn=None, outputs=3):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, outputs))
    return kt.KerasModel(net, loss_fn or nn.CrossEntropyLoss(), metrics, torch.optim.SGD(net.parameters(), lr=0.1))


def unchanged(model, before):
    return all(torch.equal(before[k], v) for k, v in model.net.state_dict().items())


def snapshot(model):
    return {k: v.clone() for k, v in model.net.state_dict().items()}


def test_a_validation_loader_without_labels_fails_before_training():
    x, y = data()
    model = make_model()
    before = snapshot(model)
    test_loader = DataLoader(TensorDataset(x), batch_size=16)  # a test set: inputs only
    with pytest.raises(ValueError, match="has no labels"):
        model.fit(DataLoader(TensorDataset(x, y), batch_size=16), test_loader, epochs=2, verbose=0)
    assert unchanged(model, before)


def test_a_metric_that_does_not_fit_the_outputs_fails_before_training():
    x, y = data()
    model = make_model({"acc": torchmetrics.Accuracy(task="multiclass", num_classes=2)})
    before = snapshot(model)
    with pytest.raises(ValueError, match="Metric 'acc' failed on the first batch of train_data, before training"):
        model.fit(DataLoader(TensorDataset(x, y), batch_size=16), epochs=2, verbose=0)
    assert unchanged(model, before)


def test_a_loss_of_shape_one_is_refused_up_front():
    x, y = data()
    model = make_model(loss_fn=lambda preds, labels: nn.functional.cross_entropy(preds, labels).reshape(1))
    before = snapshot(model)
    with pytest.raises(ValueError, match=r"got \(1,\).*loss\.squeeze\(\)"):
        model.fit(DataLoader(TensorDataset(x, y), batch_size=16), epochs=2, verbose=0)
    assert unchanged(model, before)


def test_a_generator_as_data_is_refused_with_what_to_pass():
    x, y = data()
    model = make_model()
    batches = ((x[i : i + 16], y[i : i + 16]) for i in range(0, 96, 16))
    with pytest.raises(TypeError, match="one-shot iterator.*steps_per_epoch"):
        model.fit(batches, epochs=2, verbose=0)


def test_metric_collections_and_reserved_names_are_refused_when_the_model_is_built():
    collection = torchmetrics.MetricCollection({"acc": torchmetrics.Accuracy(task="multiclass", num_classes=3)})
    with pytest.raises(TypeError, match="MetricCollection.*one by one"):
        make_model({"all": collection})
    for name in ("loss", "lr", "epoch", "val_acc", "train_f1"):
        with pytest.raises(ValueError, match=f"metrics_dict\\['{name}'\\]: the history already has columns"):
            make_model({name: accuracy})
    with pytest.raises(TypeError, match="is the class Accuracy, not a metric"):
        make_model({"acc": torchmetrics.Accuracy})


def test_the_first_batch_check_leaves_a_samplers_own_generator_alone():
    x, y = data()
    dataset = TensorDataset(x, y)

    def order_of_first_epoch(with_fit):
        generator = torch.Generator().manual_seed(5)
        sampler = WeightedRandomSampler(torch.ones(len(x)), num_samples=len(x), generator=generator)
        loader = DataLoader(dataset, batch_size=16, sampler=sampler)
        seen = []

        class Record(kt.Callback):
            def on_train_batch_begin(self, batch, logs=None):
                pass

        model = make_model()
        original = model.net.forward

        def forward(inputs):
            if model.net.training:
                seen.append(inputs[:, 0].clone())
            return original(inputs)

        model.net.forward = forward
        if with_fit:
            model.fit(loader, epochs=1, verbose=0)
            return torch.cat(seen)
        return torch.cat([xb[:, 0] for xb, _ in loader])

    torch.testing.assert_close(order_of_first_epoch(with_fit=True), order_of_first_epoch(with_fit=False))


class Stream(IterableDataset):
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __iter__(self):
        return iter(zip(self.x, self.y))


@pytest.mark.slow
def test_an_iterable_validation_set_over_two_processes_is_refused():
    x, y = data()
    model = make_model()
    with pytest.raises(ValueError, match="IterableDataset, which cannot be split exactly"):
        model.fit(
            DataLoader(TensorDataset(x, y), batch_size=16),
            DataLoader(Stream(x, y), batch_size=16),
            epochs=1,
            accelerator="cpu",
            devices=2,
            verbose=0,
        )


def test_mode_auto_follows_the_monitored_name_and_fit_says_so(capsys):
    x, y = data(n=192)
    train = DataLoader(TensorDataset(x[:128], y[:128]), batch_size=16, shuffle=True)
    val = DataLoader(TensorDataset(x[128:], y[128:]), batch_size=32)
    model = make_model({"acc": accuracy})
    history = model.fit(train, val, epochs=4, patience=None, monitor="val_acc", verbose=2)
    assert "best weights by val_acc (max, from its name)" in capsys.readouterr().out
    best = history.loc[history["val_acc"].idxmax()]
    assert model.evaluate(val, quiet=True)["val_acc"] == pytest.approx(best["val_acc"])
    mse = torchmetrics.MeanSquaredError()  # torchmetrics says lower is better, whatever the name
    assert kt.callbacks.monitor.auto_mode("val_score", {"score": mse}) == "min"


class NaNFromStart(nn.Module):
    def forward(self, preds, labels):
        return nn.functional.cross_entropy(preds, labels) * float("nan")


def test_nan_in_the_first_epoch_restores_the_weights_from_before_training(capsys):
    x, y = data()
    model = make_model(loss_fn=NaNFromStart())
    before = snapshot(model)
    history = model.fit(DataLoader(TensorDataset(x, y), batch_size=16), epochs=3, verbose=2)
    assert len(history) == 1
    out = capsys.readouterr().out
    assert "The best finite weights are restored" not in out
    assert "No epoch had a finite loss, so the weights from before training are restored" in out
    assert unchanged(model, before)


class CtrlCAtBatch(kt.Callback):
    def __init__(self, batch):
        self.batch = batch

    def on_train_batch_end(self, batch, logs=None):
        if batch == self.batch:
            raise KeyboardInterrupt


def test_ctrl_c_in_the_first_epoch_gives_back_the_starting_weights(capsys):
    x, y = data()
    model = make_model()
    before = snapshot(model)
    history = model.fit(
        DataLoader(TensorDataset(x, y), batch_size=16), epochs=3, verbose=2, callbacks=[CtrlCAtBatch(2)]
    )
    assert len(history) == 0
    assert "0 finished epoch(s) with the weights from before training restored" in capsys.readouterr().out
    assert unchanged(model, before) and model.net.training
