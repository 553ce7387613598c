"""Keras 3's ``fit`` / ``evaluate`` / ``predict`` meaning: ``validation_split``'s floor, the data
forms Keras reads (``predict([X1, X2])``, a dict of inputs with ``y``, ``(x, y, sample_weight)``
validation data, ``predict(generator)``), ``class_weight`` for a class absent from training and
for one-hot labels, ``initial_epoch``, ``validation_steps`` / ``validation_batch_size``,
``evaluate``'s and ``predict``'s keywords and hooks, a net sized by its first batch (PyTorch's
lazy modules, as a Keras ``Dense`` takes its input size), and the Keras example page of the docs.

Every run is real. Where a value is compared with one computed by hand, the learning rate is 0
(the weights stay put, so the loss of every epoch is the loss of the initial net) and the hand
computation uses the net itself on the rows Keras's rule names.
"""

from __future__ import annotations

import math
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import kerastorch as kt
from helpers import accuracy
from kerastorch.data.sample_weights import class_weight_table

DOCS = Path(__file__).resolve().parents[2] / "docs"


def data(n=50, features=3, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, features)).astype("float32")
    return X, (X[:, 0] + 0.5 * X[:, 1] > 0).astype("int64")


def frozen(net, metrics=None, loss_fn=None):
    """A model whose optimizer does not move the weights (lr=0): every epoch's values are the net's own."""
    return kt.KerasModel(net, loss_fn or nn.CrossEntropyLoss(), metrics, torch.optim.SGD(net.parameters(), lr=0.0))


def losses_of(net, X, y):
    """Each sample's cross-entropy under the net as it is."""
    with torch.no_grad():
        return nn.functional.cross_entropy(net(torch.as_tensor(X)), torch.as_tensor(y), reduction="none")


class IdsSeen(nn.Module):
    """A net that records which samples it sees, in training and in eval mode (column 0 is the id);
    what it sees in eval mode before training (the first-batch checks' look) apart."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(1, 2)
        self.seen = {"train": set(), "eval": set(), "checked": set()}

    def forward(self, x):
        mode = "train" if self.training else "eval" if self.seen["train"] else "checked"
        self.seen[mode].update(int(i) for i in x[:, 0])
        return self.linear(x[:, 1:])


def with_ids(n):
    X = np.stack([np.arange(n), np.random.default_rng(0).normal(size=n)], axis=1).astype("float32")
    return X, (np.arange(n) % 2).astype("int64")


# -- validation_split ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "n, fraction, trained",
    [(34, 0.2, 27), (10, 0.3, 7), (100, 0.7, 30)],
    ids=["34 samples, 0.2", "10 samples, 0.3", "100 samples, 0.7"],
)
def test_validation_split_trains_on_keras_floor_and_validates_the_last_samples(n, fraction, trained):
    # Keras's train_validation_split: floor(n * (1 - fraction)) samples train. 10 * 0.7 is 7.000000000000001
    # and 100 * 0.3 is 30.000000000000004 in floating point: a ceil would train on 8 and 31.
    assert trained == math.floor(n * (1.0 - fraction))
    X, y = with_ids(n)
    net = IdsSeen()
    frozen(net).fit(X, y, validation_split=fraction, epochs=1, batch_size=4, verbose=0)
    assert net.seen["train"] == set(range(trained))
    assert net.seen["eval"] == set(range(trained, n))
    checked = net.seen["checked"]  # the first batch of each (the training batches are shuffled)
    assert len(checked & set(range(trained))) == min(4, trained)
    assert checked - set(range(trained)) == set(range(trained, min(trained + 4, n)))


def test_validation_split_on_a_dataset_takes_the_same_floor():
    X, y = with_ids(34)
    net = IdsSeen()
    frozen(net).fit(TensorDataset(torch.tensor(X), torch.tensor(y)), validation_split=0.2, epochs=1, verbose=0)
    assert net.seen["train"] == set(range(27)) and net.seen["eval"] == set(range(27, 34))
    assert net.seen["checked"] == set(range(34))  # the first batch of each, one batch of 32 for training


# -- data forms -----------------------------------------------------------------------------------


class TwoInputs(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Linear(2, 2), nn.Linear(1, 2)

    def forward(self, a, b):
        return self.a(a) + self.b(b)


def test_predict_takes_every_array_of_a_list_or_tuple_as_an_input():
    X, _ = data()
    net = TwoInputs()
    model = kt.KerasModel(net, nn.CrossEntropyLoss())
    with torch.no_grad():
        expected = net(torch.tensor(X[:, :2]), torch.tensor(X[:, 2:]))
    torch.testing.assert_close(model.predict([X[:, :2], X[:, 2:]], batch_size=16, verbose=0), expected)
    torch.testing.assert_close(model.predict((X[:, :2], X[:, 2:]), verbose=0), expected)
    torch.testing.assert_close(model.predict(x={"a": X[:, :2], "b": X[:, 2:]}, verbose=0), expected)


def test_predict_with_labels_beside_the_inputs_says_that_every_array_is_an_input():
    X, y = data()
    model = kt.KerasModel(nn.Linear(3, 2), nn.CrossEntropyLoss())
    with pytest.raises(
        TypeError, match=r"predict passed the 2 arrays of the tuple to the net as 2 inputs.*predict\(X\)"
    ):
        model.predict((X, y), verbose=0)


def test_fit_takes_a_dict_of_inputs_with_a_positional_y_as_keras_does():
    X, y = data()
    inputs = {"a": X[:, :2], "b": X[:, 2:]}
    histories = []
    for call in (
        lambda m: m.fit(inputs, y, epochs=2, shuffle=False, verbose=0),
        lambda m: m.fit({**inputs, "labels": y}, epochs=2, shuffle=False, verbose=0),
        lambda m: m.fit(x=inputs, y=y, epochs=2, shuffle=False, verbose=0),
    ):
        net = TwoInputs()
        histories.append(
            call(kt.KerasModel(net, nn.CrossEntropyLoss(), optimizer=torch.optim.SGD(net.parameters(), 0.1)))
        )
    assert (
        histories[0]["train_loss"].tolist()
        == histories[1]["train_loss"].tolist()
        == histories[2]["train_loss"].tolist()
    )
    assert histories[0]["train_loss"].iloc[1] < histories[0]["train_loss"].iloc[0]  # it trained
    with pytest.raises(ValueError, match="the dict of arrays has a labels key .* and a bare array follows it as y"):
        kt.KerasModel(TwoInputs(), nn.CrossEntropyLoss()).fit({**inputs, "labels": y}, y, verbose=0)


def test_validation_data_with_sample_weights_is_read_as_keras_x_y_sample_weight():
    X, y = data(80)
    w = np.random.default_rng(1).random(30).astype("float32")
    net = nn.Linear(3, 2)
    model = frozen(net)
    per_sample = losses_of(net, X[50:], y[50:])
    weighted = float((per_sample * torch.tensor(w)).mean())  # Keras's sum over batch size: (1/N) sum w_i l_i
    history = model.fit(X[:50], y[:50], validation_data=(X[50:], y[50:], w), batch_size=8, epochs=1, verbose=0)
    assert history["val_loss"].iloc[0] == pytest.approx(weighted, rel=1e-5)
    plain = model.fit(X[:50], y[:50], validation_data=(X[50:], y[50:]), batch_size=8, epochs=1, verbose=0)
    assert plain["val_loss"].iloc[0] == pytest.approx(float(per_sample.mean()), rel=1e-5)
    # evaluate takes the same weights by keyword, and the same tuple
    assert model.evaluate(X[50:], y[50:], sample_weight=w, verbose=0)["val_loss"] == pytest.approx(weighted, rel=1e-5)
    assert model.evaluate((X[50:], y[50:], w), verbose=0)["val_loss"] == pytest.approx(weighted, rel=1e-5)
    # Keras's (x, y, None), as code that weights only sometimes writes it: no weights
    unweighted = float(per_sample.mean())
    none = model.fit(X[:50], y[:50], validation_data=(X[50:], y[50:], None), batch_size=8, epochs=1, verbose=0)
    assert none["val_loss"].iloc[0] == pytest.approx(unweighted, rel=1e-5)
    assert model.evaluate((X[50:], y[50:], None), verbose=0)["val_loss"] == pytest.approx(unweighted, rel=1e-5)
    trained = model.fit((X[50:], y[50:], None), batch_size=30, epochs=1, verbose=0)
    assert trained["train_loss"].iloc[0] == pytest.approx(unweighted, rel=1e-5)


def test_a_tuple_data_set_takes_grouped_inputs_and_refuses_labels_in_the_weights_place():
    X, y = data(60)
    w = np.linspace(0.5, 1.5, 60).astype("float32")
    net = TwoInputs()
    model = frozen(net)
    with torch.no_grad():
        per_sample = nn.functional.cross_entropy(
            net(torch.tensor(X[:, :2]), torch.tensor(X[:, 2:])), torch.tensor(y), reduction="none"
        )
    history = model.fit(((X[:, :2], X[:, 2:]), y, w), epochs=1, verbose=0, batch_size=7)
    assert history["train_loss"].iloc[0] == pytest.approx(float((per_sample * torch.tensor(w)).mean()), rel=1e-5)
    with pytest.raises(ValueError, match=r"its third array holds integers, which look like labels.*\(\(X1, X2\), y\)"):
        model.fit(X[:50], y[:50], validation_data=(X[50:, :2], X[50:, 2:], y[50:]), verbose=0)
    with pytest.raises(ValueError, match=r"a tuple of 4 arrays.*\(\(X1, X2, X3\), y\)"):
        model.fit((X[:, :1], X[:, 1:2], X[:, 2:], y), verbose=0)
    # Float labels in the third place look like weights: the first batch fails, saying how it was read.
    regression = kt.KerasModel(TwoInputs(), nn.MSELoss())
    before = [p.clone() for p in regression.net.parameters()]
    with pytest.raises(TypeError, match=r"read as Keras reads it: \(x, y, sample_weight\).*fit\(\(\(X1, X2\), y\)\)"):
        regression.fit((X[:, :2], X[:, 2:], w), verbose=0)
    assert all(torch.equal(a, b) for a, b in zip(before, regression.net.parameters()))


class TwoOutputs(nn.Module):
    """A class and a value from the same features: Keras's multi-output net."""

    def __init__(self):
        super().__init__()
        self.classes, self.value = nn.Linear(3, 2), nn.Linear(3, 1)

    def forward(self, x):
        return self.classes(x), self.value(x)


def class_and_value_loss(outputs, labels):
    return nn.functional.cross_entropy(outputs[0], labels[0]) + nn.functional.mse_loss(outputs[1], labels[1])


def test_a_net_with_two_outputs_takes_its_labels_as_keras_does():
    X, y = data(60)
    value = (X[:, 2:3] * 2).astype("float32")
    torch.manual_seed(0)
    net = TwoOutputs()
    model = frozen(net, loss_fn=class_and_value_loss)
    with torch.no_grad():
        by_hand = class_and_value_loss(net(torch.tensor(X[40:])), (torch.tensor(y[40:]), torch.tensor(value[40:])))
    # fit(X, [y1, y2]), y=(y1, y2), ((X, (y1, y2))) and validation_data=(X_val, [y1, y2]): one reading
    for history in (
        model.fit(X[:40], [y[:40], value[:40]], validation_data=(X[40:], [y[40:], value[40:]]), epochs=1, verbose=0),
        model.fit(X[:40], y=(y[:40], value[:40]), validation_data=(X[40:], (y[40:], value[40:])), epochs=1, verbose=0),
        model.fit((X, (y, value)), validation_split=1 / 3, epochs=1, verbose=0),
    ):
        assert history["val_loss"].iloc[0] == pytest.approx(float(by_hand), rel=1e-5)
    assert model.evaluate(X[40:], [y[40:], value[40:]], verbose=0)["val_loss"] == pytest.approx(
        float(by_hand), rel=1e-5
    )
    # a dict of labels reaches the loss as a dict
    named = frozen(net, loss_fn=lambda out, labels: class_and_value_loss(out, (labels["kind"], labels["size"])))
    scores = named.evaluate(X[40:], {"kind": y[40:], "size": value[40:]}, verbose=0)
    assert scores["val_loss"] == pytest.approx(float(by_hand), rel=1e-5)

    # labels of several lengths are named one by one; a list of 0-d values is one array of labels
    for given in ([y, value[:30]], {"kind": y, "size": value[:30]}):
        with pytest.raises(ValueError, match=r"differ in length \(.* has 60, y\[.*\] has 30 samples\)"):
            model.fit(X, given, epochs=1, verbose=0)
        with pytest.raises(ValueError, match=r"differ in length \(.* has 60, y\[.*\] has 30 samples\)"):
            model.fit(X, y=given, epochs=1, verbose=0)
    single = frozen(nn.Linear(3, 2))
    ids = [torch.tensor(int(label)) for label in y]
    assert len(single.fit(X, y=ids, epochs=1, verbose=0)) == 1
    assert len(single.fit(X, y=[np.array(label) for label in y], epochs=1, verbose=0)) == 1

    # class weights are for one array of labels, as in Keras
    class ClassAndValueLoss(nn.Module):
        reduction = "mean"

        def forward(self, outputs, labels):
            return class_and_value_loss(outputs, labels)

    weighted = frozen(net, loss_fn=ClassAndValueLoss())
    with pytest.raises(ValueError, match=r"class_weight weighs the classes of one array of labels.*one output"):
        weighted.fit(X, [y, value], class_weight={0: 1.0, 1: 2.0}, epochs=1, verbose=0)


def test_predict_goes_once_over_a_generator_and_steps_cut_an_endless_one():
    X, y = data()
    net = nn.Linear(3, 2)
    model = kt.KerasModel(net, nn.CrossEntropyLoss())

    def batches():  # what a Keras user's generator yields: NumPy arrays, (x,) or (x, y)
        for start in range(0, 50, 16):
            yield (X[start : start + 16],) if start % 32 else (X[start : start + 16], y[start : start + 16])

    with torch.no_grad():
        expected = net(torch.tensor(X))
    torch.testing.assert_close(model.predict(batches(), verbose=0), expected)

    def endless():
        while True:
            yield torch.tensor(X[:5])

    assert model.predict(endless(), steps=3, verbose=0).shape == (15, 2)
    with pytest.raises(TypeError, match=r"one-shot iterator.*predict goes over its data once and takes a generator"):
        model.fit(batches(), verbose=0)


# -- class_weight ------------------------------------------------------------------------------------


def test_class_weight_may_name_a_class_only_in_the_validation_split():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 3)).astype("float32")
    y = np.r_[np.arange(32) % 2, [2] * 8].astype("int64")  # class 2 only in the last 20 %: the validation split
    net = nn.Linear(3, 3)
    model = frozen(net)
    with pytest.warns(UserWarning, match=r"class_weight names class 2, which the training labels never have"):
        history = model.fit(X, y, validation_split=0.2, class_weight={0: 1.0, 1: 3.0, 2: 10.0}, epochs=1, verbose=0)
    table = torch.tensor([1.0, 3.0, 10.0])
    train = losses_of(net, X[:32], y[:32])
    assert history["train_loss"].iloc[0] == pytest.approx(float((train * table[y[:32]]).mean()), rel=1e-5)
    # as in Keras, class weights weight the training loss only
    assert history["val_loss"].iloc[0] == pytest.approx(float(losses_of(net, X[32:], y[32:]).mean()), rel=1e-5)


def test_class_weight_with_one_hot_labels_weights_each_sample_by_its_argmax():
    X, y = data(48)
    one_hot = np.eye(2, dtype="float32")[y]
    net = nn.Linear(3, 2)
    model = frozen(net)
    history = model.fit(X, one_hot, class_weight={1: 4.0}, batch_size=10, epochs=1, verbose=0)
    with torch.no_grad():
        per_sample = nn.functional.cross_entropy(net(torch.tensor(X)), torch.tensor(one_hot), reduction="none")
    weights = torch.where(torch.tensor(y) == 1, 4.0, 1.0)
    assert history["train_loss"].iloc[0] == pytest.approx(float((per_sample * weights).mean()), rel=1e-5)
    # a DataLoader of one-hot labels is weighted the same way, batch by batch
    loader = DataLoader(TensorDataset(torch.tensor(X), torch.tensor(one_hot)), batch_size=10)
    from_loader = model.fit(loader, class_weight={1: 4.0}, epochs=1, verbose=0)
    assert from_loader["train_loss"].iloc[0] == pytest.approx(history["train_loss"].iloc[0], rel=1e-6)


def test_the_class_weight_table_by_hand():
    one_hot = torch.tensor([[1.0, 0, 0], [0, 1.0, 0], [0, 1.0, 0], [0, 1.0, 0]])
    # "balanced": N / (classes present * count): 4 / (2 * 1) and 4 / (2 * 3); class 2 never appears
    assert class_weight_table("balanced", one_hot).tolist() == pytest.approx([2.0, 2 / 3])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert class_weight_table({4: 2.0}, torch.tensor([0, 1])).tolist() == [1.0, 1.0, 1.0, 1.0, 2.0]
    assert class_weight_table({1: 5.0}, torch.tensor([[0.0], [1.0]])).tolist() == [1.0, 5.0]  # a (N, 1) column
    with pytest.raises(ValueError, match="not whole \\(a regression target\\?\\)"):
        class_weight_table({0: 2.0}, torch.tensor([0.5, 1.0]))


# -- initial_epoch, validation_steps, validation_batch_size, steps_per_epoch ------------------------------


class Epochs(kt.Callback):
    """The epochs begun, and how many training and validation batches each ran."""

    def __init__(self):
        self.begun, self.train_batches, self.validation_batches = [], [], []

    def on_epoch_begin(self, epoch, logs=None):
        self.begun.append(epoch)
        self.train_batches.append(0)
        self.validation_batches.append(0)

    def on_train_batch_end(self, batch, logs=None):
        self.train_batches[-1] += 1

    def on_test_batch_end(self, batch, logs=None):
        self.validation_batches[-1] += 1


def test_initial_epoch_starts_at_keras_next_epoch_with_one_based_numbers():
    X, y = data()
    seen = Epochs()
    history = kt.KerasModel(nn.Linear(3, 2), nn.CrossEntropyLoss()).fit(
        X, y, epochs=5, initial_epoch=2, callbacks=[seen], verbose=0
    )
    # Keras's initial_epoch=2: two epochs are done, its third (index 2) is the first to train
    assert history["epoch"].tolist() == [3, 4, 5] and seen.begun == [3, 4, 5]
    model = kt.KerasModel(nn.Linear(3, 2), nn.CrossEntropyLoss())
    with pytest.raises(ValueError, match=r"initial_epoch=5 and epochs=5: epochs is the epoch to end at.*epochs=10"):
        model.fit(X, y, epochs=5, initial_epoch=5, verbose=0)
    with pytest.raises(ValueError, match=r"initial_epoch=2 and resume=True.*Pass one of them"):
        model.fit(X, y, epochs=5, initial_epoch=2, resume=True, ckpt_path="unused.pt", verbose=0)


def test_validation_steps_and_validation_batch_size_cut_each_validation_to_its_first_batches():
    X, y = data(80)
    net = nn.Linear(3, 2)
    seen = Epochs()
    history = frozen(net).fit(
        X[:30],
        y[:30],
        validation_data=(X[30:], y[30:]),
        validation_steps=3,
        validation_batch_size=4,
        epochs=2,
        callbacks=[seen],
        verbose=0,
    )
    assert seen.validation_batches == [3, 3]  # each validation starts again from the first batch
    first_12 = float(losses_of(net, X[30:42], y[30:42]).mean())
    assert history["val_loss"].tolist() == pytest.approx([first_12, first_12], rel=1e-5)
    model = frozen(net)
    with pytest.raises(ValueError, match=r"validation_steps=3 applies to validation data, and there is none"):
        model.fit(X, y, validation_steps=3, verbose=0)
    loader = DataLoader(TensorDataset(torch.tensor(X[30:]), torch.tensor(y[30:])), batch_size=10)
    with pytest.raises(ValueError, match=r"validation_batch_size=4, but val_data is a DataLoader, which already makes"):
        model.fit(X[:30], y[:30], validation_data=loader, validation_batch_size=4, verbose=0)


def test_steps_without_a_batch_size_size_the_batches_to_cover_the_data_as_keras_does():
    X, y = data(50)
    net = nn.Linear(3, 2)
    seen = Epochs()
    history = frozen(net).fit(
        X[:40],
        y[:40],
        validation_data=(X[40:], y[40:]),
        steps_per_epoch=4,
        validation_steps=2,
        epochs=2,
        callbacks=[seen],
        verbose=0,
    )
    # batches of ceil(40 / 4) = 10 and ceil(10 / 2) = 5: every sample once per epoch
    assert seen.train_batches == [4, 4] and seen.validation_batches == [2, 2]
    assert history["train_loss"].iloc[0] == pytest.approx(float(losses_of(net, X[:40], y[:40]).mean()), rel=1e-5)
    assert history["val_loss"].iloc[0] == pytest.approx(float(losses_of(net, X[40:], y[40:]).mean()), rel=1e-5)


# -- evaluate and predict: keywords and hooks --------------------------------------------------------


class Hooks(kt.Callback):
    """Every test and predict hook with what it was called with."""

    def __init__(self):
        self.calls = []

    def on_test_begin(self, logs=None):
        self.calls.append(("on_test_begin", logs))

    def on_test_batch_begin(self, batch, logs=None):
        self.calls.append(("on_test_batch_begin", batch, logs))

    def on_test_batch_end(self, batch, logs=None):
        self.calls.append(("on_test_batch_end", batch, dict(logs)))

    def on_test_end(self, logs=None):
        self.calls.append(("on_test_end", logs))

    def on_predict_begin(self, logs=None):
        self.calls.append(("on_predict_begin", logs))

    def on_predict_batch_begin(self, batch, logs=None):
        self.calls.append(("on_predict_batch_begin", batch, logs))

    def on_predict_batch_end(self, batch, logs=None):
        self.calls.append(("on_predict_batch_end", batch, logs))

    def on_predict_end(self, logs=None):
        self.calls.append(("on_predict_end", logs))


def test_evaluate_takes_keras_keywords_and_calls_the_test_hooks_in_keras_order(capsys):
    X, y = data(50)
    net = nn.Linear(3, 2)
    model = frozen(net, {"acc": accuracy})
    hooks = Hooks()
    logs = model.evaluate(x=X, y=y, batch_size=20, verbose=0, callbacks=[hooks])
    assert capsys.readouterr().out == ""  # verbose=0 prints nothing
    assert [call[:2] for call in hooks.calls] == [
        ("on_test_begin", {}),
        ("on_test_batch_begin", 0),
        ("on_test_batch_end", 0),
        ("on_test_batch_begin", 1),
        ("on_test_batch_end", 1),
        ("on_test_batch_begin", 2),
        ("on_test_batch_end", 2),
        ("on_test_end", logs),
    ]
    # a batch's logs are the running values over the batches so far
    assert hooks.calls[2][2]["val_loss"] == pytest.approx(float(losses_of(net, X[:20], y[:20]).mean()), rel=1e-5)
    assert logs["val_loss"] == pytest.approx(float(losses_of(net, X, y).mean()), rel=1e-5)
    # Keras's return_dict=False: the values in the same order, the loss first
    assert model.evaluate(X, y, 20, 0, None, None, None, False) == pytest.approx([logs["val_loss"], logs["val_acc"]])
    assert frozen(net).evaluate(X, y, verbose=0, return_dict=False) == pytest.approx(logs["val_loss"])  # one value
    # steps: the first n batches; without batch_size, n batches that cover the data (ceil(50 / 4) = 13 a batch)
    first_two = model.evaluate(X, y, batch_size=8, steps=2, verbose=0)
    assert first_two["val_loss"] == pytest.approx(float(losses_of(net, X[:16], y[:16]).mean()), rel=1e-5)
    hooks.calls.clear()
    assert model.evaluate(X, y, steps=4, callbacks=[hooks], quiet=True) == pytest.approx(logs)
    assert sum(call[0] == "on_test_batch_end" for call in hooks.calls) == 4
    model.evaluate(val_data=(X, y))  # torchkeras's name; verbose=1 prints the values
    assert re.fullmatch(r"val_loss=[\d.]+, val_acc=[\d.]+\n", capsys.readouterr().out)


def test_predict_calls_the_predict_hooks_in_keras_order_with_each_batch_outputs():
    X, _ = data(50)
    net = nn.Linear(3, 2)
    model = kt.KerasModel(net, nn.CrossEntropyLoss())
    hooks = Hooks()
    predictions = model.predict(X, batch_size=20, verbose=0, callbacks=[hooks])
    assert [call[:2] for call in hooks.calls] == [
        ("on_predict_begin", {}),
        ("on_predict_batch_begin", 0),
        ("on_predict_batch_end", 0),
        ("on_predict_batch_begin", 1),
        ("on_predict_batch_end", 1),
        ("on_predict_batch_begin", 2),
        ("on_predict_batch_end", 2),
        ("on_predict_end", {}),
    ]
    outputs = [call[2]["outputs"] for call in hooks.calls if call[0] == "on_predict_batch_end"]
    assert [len(o) for o in outputs] == [20, 20, 10]
    torch.testing.assert_close(torch.cat(outputs), predictions)
    assert model.predict(X, steps=2, batch_size=8, verbose=0).shape == (16, 2)
    assert model.predict(X, steps=3, verbose=0).shape == (50, 2)  # batches of ceil(50 / 3): all the rows


def test_keras_words_in_evaluate_and_predict_are_checked_at_the_door():
    X, y = data()
    model = kt.KerasModel(nn.Linear(3, 2), nn.CrossEntropyLoss())
    with pytest.raises(ValueError, match=r"steps=0 must be a whole number >= 1"):
        model.evaluate(X, y, steps=0)
    with pytest.raises(TypeError, match=r"return_dict='yes' must be True or False"):
        model.evaluate(X, y, return_dict="yes")
    with pytest.raises(ValueError, match="Both data and x were given"):
        model.predict(X, x=X)
    with pytest.raises(TypeError, match="callbacks is a Hooks, but it must be a list of callbacks"):
        model.predict(X, callbacks=Hooks())
    with pytest.raises(ValueError, match=r"verbose=3; use 0"):
        model.evaluate(X, y, verbose=3)


# -- the docs' Keras example ---------------------------------------------------------------------------


def python_blocks(page: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page, flags=re.S)


def keras_and_kerastorch_scripts(page: str) -> tuple[str, str]:
    """The page's Keras script (one block) and its kerastorch script (the blocks after it, joined)."""
    blocks = python_blocks(page)
    (at,) = [i for i, block in enumerate(blocks) if "import keras\n" in block]
    return blocks[at], "".join(blocks[at + 1 :])


def test_the_keras_example_calls_fit_as_keras_does_but_for_the_checkpoint_file():
    keras_script, kerastorch_script = keras_and_kerastorch_scripts((DOCS / "keras-example.md").read_text())
    assert keras_script.startswith("# not run here") and "import kerastorch as kt" in kerastorch_script

    def fit_call(script: str) -> str:
        start = script.index("history = model.fit(")
        call = script[start : script.index("\n)\n", start) + 2]
        return " ".join(call.replace("keras.callbacks.", "").split())

    # the same data, keywords and callbacks with the same arguments; only the file format differs
    assert "validation_split=0.2" in fit_call(kerastorch_script) and "ReduceLROnPlateau" in fit_call(kerastorch_script)
    assert fit_call(keras_script).replace("best.weights.h5", "best.safetensors") == fit_call(kerastorch_script)
    compile(kerastorch_script, "keras-example.md", "exec")


@pytest.mark.slow  # 50 epochs of the page's script: about 2 s on an idle 2-core CPU, more beside other work
def test_the_keras_example_page_runs_as_pasted(tmp_path, monkeypatch):
    """The page's blocks but the Keras one, in order in one namespace, as a reader pastes them."""
    page = (DOCS / "keras-example.md").read_text()
    runnable = [block for block in python_blocks(page) if not block.startswith("# not run here")]
    assert len(runnable) == len(python_blocks(page)) - 1  # only the Keras script is left out
    namespace: dict = {"__name__": "keras_example"}
    monkeypatch.chdir(tmp_path)
    for number, code in enumerate(runnable, 1):
        exec(compile(code, f"keras-example.md, block {number}", "exec"), namespace)
    history, model = namespace["history"], namespace["model"]
    assert list(history.columns[:6]) == ["epoch", "train_loss", "train_accuracy", "lr", "val_loss", "val_accuracy"]
    assert history["val_accuracy"].max() > 0.7  # it learned (chance is 1/3)
    rates = history["lr"].tolist()
    assert rates[-1] < 1e-3 and rates == sorted(rates, reverse=True)  # ReduceLROnPlateau lowered the rate
    assert isinstance(namespace["loss"], float) and 0.7 < namespace["accuracy"] <= 1.0
    assert namespace["probabilities"].shape == (60, 3)
    # the last 20 % of X validated: restore_best_weights=True left the epoch of the lowest val_loss in the net,
    # and ModelCheckpoint wrote the epoch of the best val_accuracy
    split_at = math.floor(240 * 0.8)
    X_val, y_val = namespace["X"][split_at:], namespace["y"][split_at:]
    assert model.evaluate(X_val, y_val, verbose=0)["val_loss"] == pytest.approx(history["val_loss"].min(), rel=1e-5)
    model.load_ckpt(tmp_path / "best.safetensors")
    assert model.evaluate(X_val, y_val, verbose=0)["val_accuracy"] == pytest.approx(history["val_accuracy"].max())


@pytest.mark.parametrize("with_validation", [False, True])
def test_a_lazy_net_sized_by_its_first_batch_trains_and_keeps_its_best_weights(with_validation):
    """``nn.LazyLinear(16)`` is PyTorch's Keras ``Dense(16)``: no input size until the first batch."""
    torch.manual_seed(0)
    x = torch.randn(256, 4)
    y = (x[:, 0] + x[:, 1] > 0).long()
    net = nn.Sequential(nn.LazyLinear(16), nn.ReLU(), nn.Linear(16, 2))
    optimizer = torch.optim.SGD(net.parameters(), lr=0.5)  # built over the parameters not yet sized
    model = kt.KerasModel(net, nn.CrossEntropyLoss(), {"acc": accuracy}, optimizer)
    history = model.fit((x, y), validation_data=(x, y) if with_validation else None, epochs=8, batch_size=32, verbose=0)
    assert net[0].weight.shape == (16, 4)
    assert history["train_acc"].iloc[-1] > 0.9
    if with_validation:  # the best epoch's weights came back
        best = history["val_loss"].idxmin()
        assert model.evaluate((x, y))["val_loss"] == pytest.approx(history["val_loss"][best], rel=1e-5)
