"""kerastorch.metrics: torchkeras's metric names with its meaning (binary, from logits), exact."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import kerastorch as kt
from kerastorch.metrics import AUC, IOU, KS, Accuracy, Precision, Recall

sklearn_metrics = pytest.importorskip("sklearn.metrics", reason="scikit-learn is in the test extra")


def binary_batch(n=200, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, generator=g) * 2
    labels = ((logits + torch.randn(n, generator=g)) > 0).float()  # float labels, as torchkeras programs use
    return logits, labels


def test_binary_metrics_read_logits_and_float_labels_as_torchkeras_does_and_are_exact():
    logits, labels = binary_batch()
    predicted, actual = torch.sigmoid(logits) >= 0.5, labels > 0.5
    true_positives = (predicted & actual).sum().item()
    assert Accuracy()(logits, labels).item() == pytest.approx((predicted == actual).float().mean().item())
    assert Precision()(logits, labels).item() == pytest.approx(true_positives / predicted.sum().item())
    assert Recall()(logits, labels).item() == pytest.approx(true_positives / actual.sum().item())
    scores = torch.sigmoid(logits).numpy()
    assert AUC()(logits, labels).item() == pytest.approx(sklearn_metrics.roc_auc_score(labels.numpy(), scores))
    fpr, tpr, _ = sklearn_metrics.roc_curve(labels.numpy(), scores)
    assert KS()(logits, labels).item() == pytest.approx(float(max(tpr - fpr)))


def test_over_several_batches_the_value_is_the_whole_datas():
    logits, labels = binary_batch(n=300, seed=1)
    for metric_class in (Accuracy, Precision, Recall, AUC, KS):
        metric, whole = metric_class(), metric_class()
        for part in range(3):
            metric(logits[part * 100 : (part + 1) * 100], labels[part * 100 : (part + 1) * 100])
        assert metric.compute().item() == pytest.approx(whole(logits, labels).item()), metric_class.__name__
        metric.reset()
        metric.update(logits[:50], labels[:50])
        assert metric.compute().item() == pytest.approx(metric_class()(logits[:50], labels[:50]).item())


def test_iou_is_the_mean_over_classes_of_intersection_over_union():
    g = torch.Generator().manual_seed(2)
    scores = torch.randn(4, 3, 8, 8, generator=g)  # segmentation: (N, C, H, W)
    masks = torch.randint(0, 3, (4, 8, 8), generator=g)
    predicted = scores.argmax(1)
    expected = torch.stack(
        [((predicted == c) & (masks == c)).sum() / ((predicted == c) | (masks == c)).sum() for c in range(3)]
    ).mean()
    assert IOU(num_classes=3)(scores, masks).item() == pytest.approx(expected.item())
    one_logit = torch.randn(4, 1, 8, 8, generator=g)  # binary: foreground where the logit is > 0
    binary_masks = torch.randint(0, 2, (4, 8, 8), generator=g)
    foreground = (one_logit > 0).reshape(binary_masks.shape).long()
    expected = torch.stack(
        [
            ((foreground == c) & (binary_masks == c)).sum() / ((foreground == c) | (binary_masks == c)).sum()
            for c in (0, 1)
        ]
    ).mean()
    assert IOU(num_classes=1)(one_logit, binary_masks).item() == pytest.approx(expected.item())


def test_a_binary_classifier_trains_with_them_and_val_auc_is_the_exact_auc_of_its_predictions():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(600, 6, generator=g)
    y = ((x[:, 0] - x[:, 1] + 0.5 * torch.randn(600, generator=g)) > 0).float().reshape(-1, 1)
    train, val = (
        DataLoader(TensorDataset(x[:480], y[:480]), batch_size=32, shuffle=True),
        DataLoader(TensorDataset(x[480:], y[480:]), batch_size=50),
    )
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1))
    model = kt.KerasModel(
        net,
        nn.BCEWithLogitsLoss(),
        {"acc": Accuracy(), "auc": AUC(), "ks": KS()},
        torch.optim.Adam(net.parameters(), lr=1e-2),
    )
    history = model.fit(train, val, epochs=5, patience=None, monitor="val_auc", verbose=0)
    assert history["val_auc"].max() > 0.85
    scores = torch.sigmoid(model.predict(val)).reshape(-1).numpy()
    best = history["val_auc"].idxmax()  # mode="auto" chose max for an AUC
    assert history["val_auc"].iloc[best] == pytest.approx(
        sklearn_metrics.roc_auc_score(y[480:].reshape(-1).numpy(), scores)
    )
