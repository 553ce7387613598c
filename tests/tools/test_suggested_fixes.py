"""Every fix kerastorch's messages and the doctor suggest is accepted by fit."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from small_runs import blobs, loaders, make_model, mlp
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

import kerastorch as kt

# -- 7. every fix kerastorch suggests is accepted -----------------------------------------------


def test_doctors_class_weight_for_an_imbalanced_binary_bce_net_is_accepted_by_fit():
    x, y = blobs(n=600, classes=2)
    keep = (y == 0) | (torch.arange(600) % 15 == 0)
    x, y = x[keep], y[keep].float().reshape(-1, 1)
    model = make_model(mlp(outputs=1), nn.BCEWithLogitsLoss(), optimizer=None, lr=0.0)
    report = model.doctor(*loaders(x, y, split=250))
    balance = next(f for f in report.findings if f.check == "class_balance")
    assert "class_weight='balanced'" in balance.fix
    # fit takes the suggestion; with lr 0 the first epoch's loss is the weighted mean, by hand.
    model.optimizer = torch.optim.SGD(model.net.parameters(), lr=0.0)
    train, _ = loaders(x, y, split=250)
    history = model.fit(train, epochs=1, verbose=0, class_weight="balanced")
    labels = y[:250].reshape(-1)
    counts = torch.bincount(labels.long(), minlength=2).float()
    table = len(labels) / (2 * counts)
    with torch.no_grad():
        losses = nn.functional.binary_cross_entropy_with_logits(model.net(x[:250]), y[:250], reduction="none")
    expected = (losses.reshape(-1) * table[labels.long()]).mean()
    assert history["train_loss"].iloc[0] == pytest.approx(float(expected), rel=1e-5)


def test_multi_label_targets_get_no_class_weight_advice_fit_would_refuse():
    x, _ = blobs(n=400)
    g = torch.Generator().manual_seed(1)
    y = (torch.rand(400, 6, generator=g) < 0.05).float()  # six rare tags: the usual multi-label data
    model = make_model(mlp(outputs=6), nn.BCEWithLogitsLoss())
    report = model.doctor(*loaders(x, y))
    assert "class_balance" not in {f.check for f in report.warnings}, str(report)
    with pytest.raises(ValueError, match="one label per sample.*pos_weight"):
        model.fit(x, y, epochs=1, verbose=0, class_weight="balanced")


def table_with_text():
    x, y = blobs(n=200)
    return pd.DataFrame({"a": x[:, 0].numpy(), "b": x[:, 1].numpy(), "colour": np.where(y.numpy() == 1, "red", "blue")})


def test_the_get_dummies_that_fits_text_error_suggests_is_accepted():
    frame = table_with_text()
    _, y = blobs(n=200)
    with pytest.raises(TypeError, match=r"pd\.get_dummies\(df\)") as caught:
        make_model(mlp(inputs=3)).fit(frame, y.numpy(), epochs=1, verbose=0)
    assert "colour" in str(caught.value)
    encoded = pd.get_dummies(frame)  # bool columns colour_blue, colour_red beside the floats
    assert sum(dtype.kind == "b" for dtype in encoded.dtypes) == 2
    model = make_model(mlp(inputs=4))
    history = model.fit(encoded, y.numpy(), epochs=2, verbose=0, batch_size=32)
    assert history["train_loss"].iloc[-1] < history["train_loss"].iloc[0]
    assert model.predict(encoded).shape == (200, 3)
    # the other suggestion of the same message: category codes
    coded = frame.assign(colour=frame["colour"].astype("category").cat.codes)
    assert len(make_model(mlp(inputs=3)).fit(coded, y.numpy(), epochs=1, verbose=0)) == 1


def test_nullable_pandas_columns_are_numbers():
    x, y = blobs(n=200)
    frame = pd.DataFrame(
        {
            "a": pd.array(x[:, 0].numpy(), dtype="Float32"),
            "b": pd.array((x[:, 1] * 10).round().numpy().astype(int), dtype="Int64"),
            "flag": pd.array(x[:, 0].numpy() > 0, dtype="boolean"),
        }
    )
    labels = pd.Series(y.numpy(), dtype="Int64")
    model = make_model(mlp(inputs=3))
    history = model.fit(frame, labels, epochs=2, verbose=0)
    assert len(history) == 2 and math.isfinite(history["train_loss"].iloc[-1])
    expected = torch.tensor(np.stack([x[:, 0].numpy(), (x[:, 1] * 10).round().numpy(), x[:, 0].numpy() > 0], 1))
    assert torch.equal(model.predict(frame), model.predict(expected.float()))


def test_a_missing_value_in_a_nullable_column_is_a_nan_like_any_other():
    frame = pd.DataFrame({"a": pd.array([1, None, 3, 4], dtype="Int64"), "b": [0.5, 1.5, 2.5, 3.5]})
    from kerastorch.data.arrays import as_tensor

    tensor = as_tensor(frame, "x")
    assert tensor.dtype == torch.float32 and torch.isnan(tensor[1, 0]) and tensor[2, 0] == 3


# -- 7. the fixes kerastorch's own messages suggest, each accepted ----------------------------------


def small_model(outputs=3, loss_fn=None, batch_norm=False):
    torch.manual_seed(0)
    layers = [nn.Linear(2, 8), *([nn.BatchNorm1d(8)] if batch_norm else []), nn.ReLU(), nn.Linear(8, outputs)]
    net = nn.Sequential(*layers)
    return kt.KerasModel(net, loss_fn or nn.CrossEntropyLoss(), {}, torch.optim.SGD(net.parameters(), lr=0.1))


class Endless(IterableDataset):
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __iter__(self):
        while True:
            yield from zip(self.x, self.y)


def suggestion_cases():
    x, y = blobs(n=21)
    strings = np.array(["cat", "dog", "owl"])[y.numpy()]
    # (what the user did, the message's words, what it suggests)
    return {
        "string labels -> pandas.factorize": (
            lambda: small_model().fit(x.numpy(), strings, epochs=1, verbose=0),
            r"pandas\.factorize\(y\)",
            lambda: small_model().fit(x.numpy(), pd.factorize(strings)[0], epochs=1, verbose=0),
        ),
        # Integer BCE labels and (N,) regression labels are fixed as Keras fixes them (tests/fit/test_programs.py).
        "a one-sample last batch under BatchNorm -> the batch_size it names": (
            lambda: small_model(batch_norm=True).fit(x, y, batch_size=4, epochs=1, verbose=0),
            r"another batch_size \(e\.g\. (\d+)\)",
            "batch_size",
        ),
        "float64 inputs -> X.float() or precision='64-true'": (
            lambda: small_model().fit(DataLoader(TensorDataset(x.double(), y), batch_size=8), epochs=1, verbose=0),
            r"X\.float\(\).*precision='64-true'",
            lambda: (
                small_model().fit(DataLoader(TensorDataset(x.double().float(), y), batch_size=8), epochs=1, verbose=0),
                small_model().fit(
                    DataLoader(TensorDataset(x.double(), y), batch_size=8), epochs=1, verbose=0, precision="64-true"
                ),
            ),
        ),
        "a one-shot iterator -> an IterableDataset with steps_per_epoch": (
            lambda: small_model().fit(iter([(x, y)]), epochs=1, verbose=0),
            r"IterableDataset and pass steps_per_epoch",
            lambda: small_model().fit(DataLoader(Endless(x, y), batch_size=8), steps_per_epoch=3, epochs=2, verbose=0),
        ),
        "sample_weight beside a DataLoader -> a dict batch with 'sample_weight'": (
            lambda: small_model().fit(DataLoader(TensorDataset(x, y), batch_size=8), sample_weight=np.ones(21)),
            r"dict with a 'sample_weight' key",
            lambda: small_model().fit(
                [{"input": x[:8], "labels": y[:8], "sample_weight": torch.ones(8)}], epochs=1, verbose=0
            ),
        ),
        "a bare second array -> validation_data=(X_val, y_val)": (
            lambda: small_model().fit(x[:15], x[15:], epochs=1, verbose=0),  # the second array read as y
            r"validation_data=\(X_val, y_val\)",
            lambda: small_model().fit(x[:15], y[:15], validation_data=(x[15:], y[15:]), epochs=1, verbose=0),
        ),
    }


@pytest.mark.parametrize("case", list(suggestion_cases()))
def test_what_a_message_suggests_is_accepted(case):
    wrong, says, suggested = suggestion_cases()[case]
    with pytest.raises((TypeError, ValueError, RuntimeError), match=says) as caught:
        wrong()
    if suggested == "batch_size":  # the number the message names
        import re

        size = int(re.search(says, str(caught.value)).group(1))
        x, y = blobs(n=21)
        suggested = lambda: small_model(batch_norm=True).fit(x, y, batch_size=size, epochs=1, verbose=0)
    suggested()  # trains without an error


def test_the_doctors_fixes_for_a_rising_loss_and_a_rare_positive_class_are_accepted():
    x, y = blobs(n=300, classes=2)
    y = y.float().reshape(-1, 1)
    model = small_model(1, nn.BCEWithLogitsLoss(pos_weight=torch.tensor([3.0])))
    history = model.fit(x, y, epochs=2, verbose=0, gradient_clip_val=1.0)
    assert len(history) == 2 and math.isfinite(history["train_loss"].iloc[-1])
