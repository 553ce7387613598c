"""A metric per output of a multi-task net (dict outputs, dict labels): Keras's per-output form
``metrics_dict={"cls": {"acc": ...}, "reg": {"mae": ...}}`` and torchmetrics' ``MultitaskWrapper``
give the columns ``train_cls_acc``, ``val_reg_mae``..., exact over the epoch's samples and known
before training (a monitor may name one)."""

from __future__ import annotations

import pytest
import torch
import torchmetrics
from torch import nn
from torch.utils.data import DataLoader
from torchmetrics.wrappers import MultitaskWrapper

import kerastorch as kt


class TwoHeads(nn.Module):
    """A class among 3 and a number, from one body."""

    def __init__(self):
        super().__init__()
        self.body = nn.Linear(4, 16)
        self.cls = nn.Linear(16, 3)
        self.reg = nn.Linear(16, 1)

    def forward(self, x):
        h = torch.relu(self.body(x))
        return {"cls": self.cls(h), "reg": self.reg(h).squeeze(1)}


def rows(n, seed):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 4, generator=g)
    return [(X[i], {"cls": X[i, :3].argmax(), "reg": X[i].sum()}) for i in range(n)]


def loss_fn(preds, labels):
    return nn.functional.cross_entropy(preds["cls"], labels["cls"]) + nn.functional.mse_loss(
        preds["reg"], labels["reg"]
    )


def mae(preds, labels):
    return (preds - labels).abs().mean()


def accuracy():
    return torchmetrics.Accuracy(task="multiclass", num_classes=3)


def fit_with(metrics, **options):
    torch.manual_seed(0)
    net = TwoHeads()
    model = kt.KerasModel(net, loss_fn, metrics_dict=metrics, optimizer=torch.optim.Adam(net.parameters(), lr=1e-2))
    dl_train = DataLoader(rows(100, 0), batch_size=16, shuffle=True)
    dl_val = DataLoader(rows(50, 1), batch_size=16)  # 16, 16, 16, 2: a short last batch
    history = model.fit(dl_train, dl_val, epochs=3, verbose=0, **options)
    return model, history, dl_val


def test_keras_per_output_metrics_are_columns_exact_over_the_samples_and_monitored_by_name():
    per_output = {"cls": {"acc": accuracy()}, "reg": {"mae": mae}}
    model, history, dl_val = fit_with(per_output, monitor="val_cls_acc")
    assert list(history.columns) == [
        "epoch",
        *("train_loss", "train_cls_acc", "train_reg_mae", "lr"),
        *("val_loss", "val_cls_acc", "val_reg_mae"),
    ]
    assert model.mode == "max"  # from Accuracy's higher_is_better
    outputs = model.predict(dl_val, verbose=0)
    labels = {key: torch.stack([y[key] for _, y in rows(50, 1)]) for key in ("cls", "reg")}
    expected_acc = (outputs["cls"].argmax(1) == labels["cls"]).float().mean().item()
    expected_mae = (outputs["reg"] - labels["reg"]).abs().mean().item()
    scores = model.evaluate(dl_val, verbose=0)
    assert scores["val_cls_acc"] == pytest.approx(expected_acc)
    assert scores["val_reg_mae"] == pytest.approx(expected_mae, rel=1e-5)
    best = history.loc[history["val_cls_acc"].idxmax()]  # the best epoch's weights are back
    assert scores["val_cls_acc"] == pytest.approx(best["val_cls_acc"])


def test_a_multitask_wrapper_gives_a_column_per_task_as_the_per_output_form_does():
    wrapped = {
        "acc": MultitaskWrapper({"cls": accuracy()}),
        "mse": MultitaskWrapper({"reg": torchmetrics.MeanSquaredError()}),
    }
    _, history, _ = fit_with(wrapped, monitor="val_reg_mse")
    per_output = {"cls": {"acc": accuracy()}, "reg": {"mse": torchmetrics.MeanSquaredError()}}
    _, same, _ = fit_with(per_output, monitor="val_reg_mse")
    assert list(history.columns) == list(same.columns)
    assert {"train_cls_acc", "val_cls_acc", "train_reg_mse", "val_reg_mse"} <= set(history.columns)
    for column in history.columns:
        assert history[column].tolist() == pytest.approx(same[column].tolist()), column


def test_a_misnamed_monitor_is_refused_before_training_with_the_columns_per_output():
    with pytest.raises(ValueError, match=r"monitor='val_cls_accuracy'.*Did you mean 'val_cls_acc'"):
        fit_with({"cls": {"acc": accuracy()}}, monitor="val_cls_accuracy")


def test_a_metric_for_an_output_the_net_does_not_return_fails_before_training_naming_it():
    torch.manual_seed(0)
    net = TwoHeads()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    model = kt.KerasModel(net, loss_fn, metrics_dict={"box": {"iou": mae}})
    with pytest.raises(ValueError, match=r"Metric 'box_iou' failed.*for the output 'box'.*keys 'cls', 'reg'"):
        model.fit(DataLoader(rows(20, 0), batch_size=8), epochs=1, verbose=0)
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())


@pytest.mark.parametrize(
    "metrics, message",
    [
        ({"cls": {"acc": {"top1": mae}}}, r"metrics_dict\['cls'\]\['acc'\] is a dict again"),
        ({"cls_acc": mae, "cls": {"acc": mae}}, r"makes the column 'cls_acc' twice"),
        ({"cls": {"": mae}}, r"metrics_dict\['cls'\]\[''\]: metrics_dict keys must be non-empty strings"),
        ({"cls": {"acc": torchmetrics.Accuracy}}, r"metrics_dict\['cls'\]\['acc'\] is the class Accuracy"),
    ],
    ids=["two levels", "a column twice", "an empty name", "a class"],
)
def test_bad_per_output_metrics_are_refused_when_the_model_is_built(metrics, message):
    with pytest.raises((TypeError, ValueError), match=message):
        kt.KerasModel(TwoHeads(), loss_fn, metrics_dict=metrics)
