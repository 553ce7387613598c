"""interpret: the confusion matrix, per-class scores and top losses equal a hand computation
over the data; binary classifiers work; regression is refused with what to do instead."""

from __future__ import annotations

import pytest
import torch
import torchmetrics
from matplotlib.figure import Figure
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import kerastorch as kt
from kerastorch.examples import digits_datasets


@pytest.fixture(scope="module")
def trained():
    ds_train, ds_val, _ = digits_datasets(size=8, seed=0)
    x, y = ds_train.tensors[0].flatten(1), ds_train.tensors[1]
    xv, yv = ds_val.tensors[0].flatten(1), ds_val.tensors[1]
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    model = kt.KerasModel(net, nn.CrossEntropyLoss(), optimizer=torch.optim.Adam(net.parameters(), lr=1e-2))
    model.fit(x, y, epochs=3, verbose=0)
    return model, xv, yv


def test_confusion_matrix_per_class_and_top_losses_equal_a_hand_computation(trained):
    model, xv, yv = trained
    interp = model.interpret(DataLoader(TensorDataset(xv, yv), batch_size=37))
    with torch.no_grad():
        logits = model.net(xv)
    preds = logits.argmax(1)
    matrix = interp.confusion_matrix
    for true in range(10):
        for pred in range(10):
            assert matrix.loc[true, pred] == int(((yv == true) & (preds == pred)).sum())
    per_class = interp.per_class
    assert per_class.loc[[str(c) for c in range(10)], "support"].sum() == len(yv)
    assert per_class.loc["macro avg", "support"] == len(yv)
    expected_recall = torchmetrics.functional.classification.multiclass_recall(preds, yv, 10, average=None)
    assert per_class["recall"].iloc[:10].tolist() == pytest.approx(expected_recall.tolist(), abs=1e-6)
    expected_f1 = torchmetrics.functional.classification.multiclass_f1_score(preds, yv, 10, average="macro")
    assert per_class.loc["macro avg", "f1"] == pytest.approx(float(expected_f1), abs=1e-6)

    losses = nn.functional.cross_entropy(logits, yv, reduction="none")
    top = interp.top_losses(5)
    order = torch.argsort(losses, descending=True)[:5]
    assert top.index.tolist() == order.tolist()
    assert top["loss"].tolist() == pytest.approx(losses[order].tolist(), rel=1e-5)
    assert top["label"].tolist() == yv[order].tolist() and top["pred"].tolist() == preds[order].tolist()
    assert isinstance(interp.plot_confusion_matrix(normalize=True), Figure)
    figure = interp.plot_top_losses(6)  # 64 features: drawn as 8x8 images
    assert isinstance(figure, Figure) and len([a for a in figure.axes if a.images]) == 6


def test_arrays_work_and_inputs_that_are_not_images_give_a_table(trained):
    model, xv, yv = trained
    interp = model.interpret(xv, yv, batch_size=100)
    assert int(interp.confusion_matrix.to_numpy().sum()) == len(yv)

    torch.manual_seed(0)
    x = torch.randn(200, 3)
    y = (x[:, 0] > 0).float().unsqueeze(1)
    net = nn.Linear(3, 1)
    binary = kt.KerasModel(net, nn.BCEWithLogitsLoss(), optimizer=torch.optim.Adam(net.parameters(), lr=0.05))
    binary.fit(x, y, epochs=5, verbose=0)
    result = binary.interpret(x, y)
    assert list(result.confusion_matrix.columns) == [0, 1]
    assert result.per_class.loc["weighted avg", "recall"] > 0.8
    assert list(result.plot_top_losses(4).columns) == ["loss", "label", "pred", "prob"]  # 3 features: a table


def test_a_regression_is_refused_with_what_to_do():
    net = nn.Linear(3, 1)
    model = kt.KerasModel(net, nn.MSELoss())
    with pytest.raises(ValueError, match="interpret explains classifiers.*residuals"):
        model.interpret(torch.randn(10, 3), torch.randn(10, 1))
