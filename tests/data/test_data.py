"""Data the Keras way: fit / evaluate / predict on arrays, tensors, DataFrames and Datasets,
validation_split, class and sample weights, steps_per_epoch and validation_freq."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset

import kerastorch as kt
from helpers import accuracy


def blobs(n=600, seed=0, overlap=1.0):
    """Two-feature, three-class data as NumPy float64 and int arrays."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    centers = np.array([[0.0, 0.0], [3.0, 0.0], [0.0, 3.0]])
    X = centers[y] + overlap * rng.normal(size=(n, 2))
    return X, y


def make_model(lr=0.05, seed=0, loss_fn=None, metrics=True):
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 3))
    return kt.KerasModel(
        net,
        loss_fn or nn.CrossEntropyLoss(),
        {"acc": accuracy} if metrics else None,
        torch.optim.Adam(net.parameters(), lr=lr),
    )


def weights_of(model):
    return {k: v.clone() for k, v in model.net.state_dict().items()}


def test_fit_x_y_on_numpy_float64_learns_and_evaluate_and_predict_take_arrays():
    X, y = blobs()
    model = make_model()
    history = model.fit(X, y, epochs=8, batch_size=32, validation_split=0.25, verbose=0, patience=None)
    assert list(history.columns) == ["epoch", "train_loss", "train_acc", "lr", "val_loss", "val_acc"]
    assert history["val_acc"].iloc[-1] > 0.85
    scores = model.evaluate(X[450:], y[450:], quiet=True)
    preds = model.predict(X, batch_size=100)
    assert preds.dtype == torch.float32 and preds.shape == (600, 3)
    # rows in input order: the same as the net on the whole array at once
    with torch.no_grad():
        torch.testing.assert_close(preds, model.net(torch.as_tensor(X, dtype=torch.float32)))
    # the arrays path gives what the loader path gives
    loader = DataLoader(TensorDataset(torch.tensor(X[450:], dtype=torch.float32), torch.tensor(y[450:])), batch_size=7)
    assert model.evaluate(loader, quiet=True) == pytest.approx(scores)


def test_validation_split_takes_the_last_fraction_before_shuffling():
    X, y = blobs(n=200)
    model = make_model()
    history = model.fit(X, y, epochs=2, validation_split=0.3, verbose=0, patience=None)
    # the restored best weights score on the last 60 samples as the history's best row says
    best = history.loc[history["val_loss"].idxmin()]
    last = model.evaluate(X[140:], y[140:], quiet=True)
    assert last["val_loss"] == pytest.approx(best["val_loss"], rel=1e-6)
    assert last["val_acc"] == pytest.approx(best["val_acc"], rel=1e-6)


def test_keras_spellings_and_the_data_forms_all_train_the_same_net():
    X, y = blobs(n=256)
    Xf, yt = torch.tensor(X, dtype=torch.float32), torch.tensor(y)
    forms = {
        "positional": lambda m: m.fit(X, y, shuffle=False, epochs=2, verbose=0),
        "y keyword": lambda m: m.fit(X, y=y, shuffle=False, epochs=2, verbose=0),
        "x and y keywords": lambda m: m.fit(x=X, y=y, shuffle=False, epochs=2, verbose=0),
        "tuple": lambda m: m.fit((X, y), shuffle=False, epochs=2, verbose=0),
        "tensors": lambda m: m.fit(Xf, yt, shuffle=False, epochs=2, verbose=0),
        "dataframe": lambda m: m.fit(
            pd.DataFrame(X, columns=["a", "b"]), pd.Series(y), shuffle=False, epochs=2, verbose=0
        ),
        "dict": lambda m: m.fit({"x": X, "labels": y}, shuffle=False, epochs=2, verbose=0),
        "dataset": lambda m: m.fit(TensorDataset(Xf, yt), shuffle=False, epochs=2, verbose=0),
        "loader": lambda m: m.fit(DataLoader(TensorDataset(Xf, yt), batch_size=32), epochs=2, verbose=0),
        # A list of NumPy batches (float64 among them), made tensors as predict makes a generator's.
        "list of NumPy batches": lambda m: m.fit(
            [(X[i : i + 32], y[i : i + 32]) for i in range(0, 256, 32)], epochs=2, verbose=0
        ),
    }
    results = {}
    for name, run in forms.items():
        model = make_model()
        if name == "dict":  # net(x=...) for dict batches
            model.net.forward = lambda x, _f=model.net.forward: _f(x)
        results[name] = run(model)["train_loss"].tolist()
    for name, losses in results.items():
        assert losses == pytest.approx(results["loader"], rel=1e-5), name


def test_validation_data_is_keras_spelling_and_val_data_too():
    X, y = blobs(n=200)
    model = make_model()
    history = model.fit(X[:150], y[:150], validation_data=(X[150:], y[150:]), epochs=1, verbose=0)
    assert "val_acc" in history
    with pytest.raises(ValueError, match="Both val_data and validation_data were given"):
        model.fit((X, y), val_data=(X, y), validation_data=(X, y), verbose=0)


def test_multi_input_arrays_call_the_net_with_each():
    class TwoInputs(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(1, 3), nn.Linear(1, 3)

        def forward(self, first, second):
            return self.a(first) + self.b(second)

    X, y = blobs(n=300)
    torch.manual_seed(0)
    net = TwoInputs()
    model = kt.KerasModel(net, nn.CrossEntropyLoss(), {"acc": accuracy}, torch.optim.Adam(net.parameters(), lr=0.05))
    history = model.fit((X[:, :1], X[:, 1:]), y, epochs=10, verbose=0)
    assert history["train_acc"].iloc[-1] > 0.8
    assert model.predict((X[:, :1], X[:, 1:])).shape == (300, 3)  # predict has no labels: every array is an input


def overlapping_two_classes(n=2000, seed=0):
    rng = np.random.default_rng(seed)
    y = (rng.random(n) < 0.5).astype(np.int64)
    X = (y[:, None] * 1.0 + rng.normal(size=(n, 1))).astype(np.float32)  # the classes overlap a lot
    return X, y


def two_class_model(seed=0):
    torch.manual_seed(seed)
    net = nn.Linear(1, 2)
    return kt.KerasModel(net, nn.CrossEntropyLoss(), optimizer=torch.optim.Adam(net.parameters(), lr=0.05))


def test_class_weight_moves_the_decision_towards_the_weighted_class_for_loaders_too():
    X, y = overlapping_two_classes()
    plain, weighted, from_loader = two_class_model(), two_class_model(), two_class_model()
    plain.fit(X, y, epochs=8, verbose=0, patience=None)
    weighted.fit(X, y, epochs=8, verbose=0, patience=None, class_weight={1: 5.0})
    loader = DataLoader(TensorDataset(torch.tensor(X), torch.tensor(y)), batch_size=32, shuffle=True)
    from_loader.fit(loader, epochs=8, verbose=0, patience=None, class_weight={1: 5.0})
    positive = {
        name: float((m.predict(X).argmax(1) == 1).float().mean())
        for name, m in (("plain", plain), ("weighted", weighted), ("loader", from_loader))
    }
    assert 0.35 < positive["plain"] < 0.65
    assert positive["weighted"] > positive["plain"] + 0.2 and positive["loader"] > positive["plain"] + 0.2


def test_the_weighted_train_loss_is_the_exact_epoch_value_of_the_minimised_loss():
    X, y = overlapping_two_classes(n=300)
    w = np.random.default_rng(1).random(300).astype(np.float32)
    model = two_class_model()
    model.optimizer.param_groups[0]["lr"] = 0.0  # the weights stay put, so the epoch value is checkable
    history = model.fit(X, y, sample_weight=w, class_weight={0: 2.0}, batch_size=64, epochs=1, verbose=0)
    with torch.no_grad():
        per_sample = nn.functional.cross_entropy(model.net(torch.tensor(X)), torch.tensor(y), reduction="none")
    total_weight = torch.tensor(w) * torch.where(torch.tensor(y) == 0, 2.0, 1.0)
    assert history["train_loss"].iloc[0] == pytest.approx(float((per_sample * total_weight).mean()), rel=1e-5)
    # the user's loss object is not changed
    assert model.loss_fn.reduction == "mean"


def test_balanced_class_weights_and_weights_in_dict_batches():
    X, y = overlapping_two_classes(n=400)
    X, y = X[(y == 0) | (np.arange(400) % 8 == 0)], y[(y == 0) | (np.arange(400) % 8 == 0)]  # 1 in 8 positives kept
    balanced = two_class_model()
    balanced.fit(X, y, class_weight="balanced", epochs=10, verbose=0, patience=None)
    recall = float((balanced.predict(X[y == 1]).argmax(1) == 1).float().mean())
    assert recall > 0.5  # without weights the rare class is mostly predicted as the common one

    class DictSamples(Dataset):
        def __len__(self):
            return len(y)

        def __getitem__(self, i):
            return {"input": torch.tensor(X[i]), "labels": torch.tensor(y[i]), "sample_weight": torch.tensor(0.0)}

    zero = two_class_model()
    zero.net.forward = lambda input, _f=zero.net.forward: _f(input)
    before = weights_of(zero)
    history = zero.fit(DictSamples(), epochs=1, verbose=0)
    assert history["train_loss"].iloc[0] == 0.0  # every sample weighs nothing: the loss and its gradient vanish
    assert all(torch.equal(before[k], v) for k, v in weights_of(zero).items())


class Counting(IterableDataset):
    """An endless stream of (x, y) with a running sample number in x."""

    def __iter__(self):
        for i in itertools.count():
            yield torch.tensor([float(i), 1.0]), torch.tensor(i % 3)


def test_steps_per_epoch_on_an_endless_stream_continues_the_same_iterator():
    seen = []

    class Watch(kt.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            pass

    model = make_model(lr=0.0)
    original = model.net.forward

    def forward(x):
        seen.append(x[:, 0].tolist())
        return original(x)

    model.net.forward = forward
    history = model.fit(Counting(), epochs=3, steps_per_epoch=4, batch_size=5, verbose=0, patience=None)
    assert len(history) == 3
    # The first-batch checks look at the first batch a fresh pass gives, and leave the stream where it
    # was: then 3 epochs x 4 batches that never repeat a sample.
    checked, trained = seen[0], seen[1:]
    assert checked == trained[0]
    assert len(trained) == 12
    assert [row[0] for row in trained] == [5.0 * i for i in range(12)]


def test_validation_freq_leaves_nan_on_other_epochs_and_watches_only_validated_ones():
    X, y = blobs(n=200)
    model = make_model()
    history = model.fit(
        X,
        y,
        epochs=5,
        validation_split=0.2,
        validation_freq=2,
        verbose=0,
        patience=1,
        callbacks=[kt.callbacks.CSVLogger("/dev/null")],
    )
    assert history["val_loss"].isna().tolist()[:5] == [True, False, True, False, True][: len(history)]
    assert history["train_loss"].notna().all()
    best = history.loc[history["val_loss"].idxmin()]
    assert int(best["epoch"]) % 2 == 0


def test_validation_freq_rows_reach_a_csv_with_every_column(tmp_path):
    X, y = blobs(n=100)
    path = tmp_path / "history.csv"
    make_model().fit(
        X, y, epochs=2, validation_split=0.2, validation_freq=2, verbose=0, callbacks=[kt.callbacks.CSVLogger(path)]
    )
    rows = pd.read_csv(path)
    assert list(rows.columns) == ["epoch", "train_loss", "train_acc", "lr", "val_loss", "val_acc"]
    assert rows["val_loss"].isna().tolist() == [True, False]


BAD = [
    (dict(train_data=np.zeros((10, 2)), val_data=np.zeros(9)), ValueError, r"X has 10 samples but y has 9"),
    (
        dict(train_data=(np.zeros((10, 2)), np.zeros(9, dtype=int)), val_data=None),
        ValueError,
        r"The arrays of train_data differ in length \(train_data\[0\] has 10, train_data\[1\] has 9 samples\)",
    ),
    (dict(validation_split=1.5), ValueError, r"validation_split=1\.5; use a fraction in \[0, 1\)"),
    (dict(train_data="loader", validation_split=0.2), ValueError, r"already makes its batches, so validation_split="),
    (dict(train_data="loader", batch_size=16), ValueError, r"already makes its batches, so batch_size="),
    (dict(class_weight={-1: 2.0}), ValueError, r"class_weight names class -1; classes are numbered 0, 1, 2"),
    (
        dict(train_data=np.array([["a", "b"]] * 10), val_data=np.zeros(10, dtype=int)),
        TypeError,
        r"train_data holds <U1 values, not numbers; encode text or categories",
    ),
    (dict(steps_per_epoch=0), ValueError, r"steps_per_epoch=0 must be a whole number >= 1"),
]


@pytest.mark.parametrize("arguments, error, message", BAD)
def test_bad_data_is_refused_before_any_weight_changes(arguments, error, message):
    X, y = blobs(n=40)
    model = make_model()
    before = weights_of(model)
    arguments = {"train_data": X, "val_data": y, "verbose": 0, **arguments}
    if isinstance(arguments["train_data"], str):
        arguments["train_data"] = DataLoader(TensorDataset(torch.tensor(X, dtype=torch.float32), torch.tensor(y)))
        arguments.pop("val_data")
    with pytest.raises(error, match=message):
        model.fit(**arguments)
    assert all(torch.equal(before[k], v) for k, v in weights_of(model).items())


def test_class_weight_with_a_regression_loss_is_refused():
    X = np.random.default_rng(0).normal(size=(32, 2))
    torch.manual_seed(0)
    net = nn.Linear(2, 1)
    model = kt.KerasModel(net, nn.MSELoss())
    with pytest.raises(ValueError, match="class_weight needs integer class labels, but the labels are float32"):
        model.fit(X, X[:, :1], class_weight={0: 2.0}, verbose=0)


def test_weights_with_a_loss_that_has_no_per_sample_form_say_the_fix():
    X, y = blobs(n=40)
    model = make_model(loss_fn=lambda preds, labels: nn.functional.cross_entropy(preds, labels))
    with pytest.raises(ValueError, match="sample_weight= needs the loss of each sample"):
        model.fit(X, y, sample_weight=np.ones(40), verbose=0)


@pytest.mark.slow
def test_arrays_with_validation_split_shard_over_two_processes_with_exact_values():
    X, y = blobs(n=301)
    model = make_model()
    history = model.fit(X, y, epochs=2, validation_split=0.2, accelerator="cpu", devices=2, verbose=0, patience=None)
    best = history.loc[history["val_loss"].idxmin()]
    # the caller's net holds the best weights: evaluating them on the last 20 % gives the history's values
    split_at = math.floor(301 * (1.0 - 0.2))  # Keras's rule: 240 for training, the last 61 for validation
    scores = model.evaluate(X[split_at:], y[split_at:], quiet=True)
    assert scores["val_loss"] == pytest.approx(best["val_loss"], rel=1e-5)
    assert scores["val_acc"] == pytest.approx(best["val_acc"], rel=1e-6)


def test_weighted_metrics_average_with_the_sample_weights_and_plain_metrics_do_not():
    X, y = overlapping_two_classes(n=300)
    w = np.random.default_rng(2).random(300).astype(np.float32)
    model = two_class_model()
    model.metrics_dict = {"acc": accuracy}
    model.optimizer.param_groups[0]["lr"] = 0.0  # fixed weights: the epoch values are checkable by hand
    per_sample_correct = lambda preds, labels: (preds.argmax(1) == labels).float()
    history = model.fit(
        X,
        y,
        sample_weight=w,
        batch_size=64,
        epochs=1,
        verbose=0,
        weighted_metrics={"wacc": per_sample_correct},
        monitor="train_wacc",
        mode="max",
    )
    with torch.no_grad():
        correct = (model.net(torch.tensor(X)).argmax(1) == torch.tensor(y)).float()
    assert history["train_wacc"].iloc[0] == pytest.approx(float((correct * torch.tensor(w)).sum() / w.sum()), rel=1e-5)
    assert history["train_acc"].iloc[0] == pytest.approx(float(correct.mean()), rel=1e-6)
    with pytest.raises(ValueError, match=r"weighted_metrics\['acc'\] has the name of a metric in metrics_dict"):
        model.fit(X, y, weighted_metrics={"acc": per_sample_correct}, verbose=0)
