"""The book's chapter 5-3, "loss functions" (lyhue1991/eat_pytorch_in_20_days), with only the
import changed: a focal loss plus L1 and L2 penalties on the net's weights — a loss function
that closes over the net — with ``torchkeras.metrics.AUC`` on imbalanced rings (1,000
positives, 6,000 negatives), then the optimizer with per-group weight decay built from
``model.named_parameters()``. Its data is generated, so it runs as written but for the
epochs (20 there, 8 here); the plots are left out."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import kerastorch as torchkeras  # noqa: F401 (the one changed line: "import torchkeras")

pytestmark = pytest.mark.slow


class FocalLoss(nn.Module):
    def __init__(self, gamma=2.0, alpha=0.75):
        super().__init__()
        self.gamma = gamma
        self.alpha = alpha

    def forward(self, y_pred, y_true):
        bce = torch.nn.BCELoss(reduction="none")(y_pred, y_true)
        p_t = (y_true * y_pred) + ((1 - y_true) * (1 - y_pred))
        alpha_factor = y_true * self.alpha + (1 - y_true) * (1 - self.alpha)
        modulating_factor = torch.pow(1.0 - p_t, self.gamma)
        loss = torch.mean(alpha_factor * modulating_factor * bce)
        return loss


# L2正则化
def L2Loss(model, alpha):
    l2_loss = torch.tensor(0.0, requires_grad=True)
    for name, param in model.named_parameters():
        if "bias" not in name:  # 一般不对偏置项使用正则
            l2_loss = l2_loss + (0.5 * alpha * torch.sum(torch.pow(param, 2)))
    return l2_loss


# L1正则化
def L1Loss(model, beta):
    l1_loss = torch.tensor(0.0, requires_grad=True)
    for name, param in model.named_parameters():
        if "bias" not in name:
            l1_loss = l1_loss + beta * torch.sum(torch.abs(param))
    return l1_loss


def test_focal_loss_with_regularization(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    # 正负样本数量
    n_positive, n_negative = 1000, 6000

    # 生成正样本, 小圆环分布
    r_p = 5.0 + torch.normal(0.0, 1.0, size=[n_positive, 1])
    theta_p = 2 * np.pi * torch.rand([n_positive, 1])
    Xp = torch.cat([r_p * torch.cos(theta_p), r_p * torch.sin(theta_p)], axis=1)
    Yp = torch.ones_like(r_p)

    # 生成负样本, 大圆环分布
    r_n = 8.0 + torch.normal(0.0, 1.0, size=[n_negative, 1])
    theta_n = 2 * np.pi * torch.rand([n_negative, 1])
    Xn = torch.cat([r_n * torch.cos(theta_n), r_n * torch.sin(theta_n)], axis=1)
    Yn = torch.zeros_like(r_n)

    # 汇总样本
    X = torch.cat([Xp, Xn], axis=0)
    Y = torch.cat([Yp, Yn], axis=0)

    ds = TensorDataset(X, Y)

    ds_train, ds_val = torch.utils.data.random_split(ds, [int(len(ds) * 0.7), len(ds) - int(len(ds) * 0.7)])
    dl_train = DataLoader(ds_train, batch_size=100, shuffle=True, num_workers=2)
    dl_val = DataLoader(ds_val, batch_size=100, num_workers=2)

    features, labels = next(iter(dl_train))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(2, 4)
            self.fc2 = nn.Linear(4, 8)
            self.fc3 = nn.Linear(8, 1)

        def forward(self, x):
            x = F.relu(self.fc1(x))
            x = F.relu(self.fc2(x))
            y = self.fc3(x)
            return y

    net = Net()

    from kerastorch import summary

    summary(net, features)

    from kerastorch import KerasModel
    from kerastorch.metrics import AUC

    net = Net()

    # 将L2正则和L1正则添加到FocalLoss损失，一起作为目标函数
    def focal_loss_with_regularization(y_pred, y_true):
        y_probs = torch.sigmoid(y_pred)
        focal = FocalLoss()(y_probs, y_true)
        l2_loss = L2Loss(net, 0.001)  # 注意设置正则化项系数
        l1_loss = L1Loss(net, 0.001)
        total_loss = focal + l2_loss + l1_loss
        return total_loss

    optimizer = torch.optim.Adam(net.parameters(), lr=0.002)
    model = KerasModel(
        net=net, loss_fn=focal_loss_with_regularization, metrics_dict={"auc": AUC()}, optimizer=optimizer
    )

    dfhistory = model.fit(
        train_data=dl_train,
        val_data=dl_val,
        epochs=8,  # the book: 20
        ckpt_path="checkpoint",
        patience=3,
        monitor="val_auc",
        mode="max",
        plot=True,
        cpu=True,
    )

    Xp_pred = X[torch.squeeze(torch.sigmoid(net.forward(X)) >= 0.5)]
    Xn_pred = X[torch.squeeze(torch.sigmoid(net.forward(X)) < 0.5)]

    weight_params = [param for name, param in model.named_parameters() if "bias" not in name]
    bias_params = [param for name, param in model.named_parameters() if "bias" in name]

    optimizer = torch.optim.SGD(
        [{"params": weight_params, "weight_decay": 1e-5}, {"params": bias_params, "weight_decay": 0}],
        lr=1e-2,
        momentum=0.9,
    )

    # What the chapter relies on: the regularised loss trains through the closure over the
    # net, val_auc is the monitored column, and the model's named_parameters are the net's.
    assert {"train_loss", "train_auc", "val_loss", "val_auc"} <= set(dfhistory.columns)
    assert dfhistory["train_loss"].iloc[-1] < dfhistory["train_loss"].iloc[0]
    assert dfhistory["val_auc"].max() > 0.9
    assert model.evaluate(dl_val)["val_auc"] == pytest.approx(dfhistory["val_auc"].max(), abs=1e-6)
    # The closure's net is the trained one: the validation loss recomputed through it (with
    # the best weights restored) is evaluate's, penalty included.
    with torch.no_grad():
        batch_losses = [focal_loss_with_regularization(net(x), y) for x, y in dl_val]
    assert torch.stack(batch_losses).mean().item() == pytest.approx(model.evaluate(dl_val)["val_loss"], rel=1e-5)
    assert len(Xp_pred) + len(Xn_pred) == len(X)
    assert len(weight_params) == 3 and len(bias_params) == 3
    assert all(p is q for p, q in zip(weight_params, [net.fc1.weight, net.fc2.weight, net.fc3.weight]))
    assert [g["weight_decay"] for g in optimizer.param_groups] == [1e-5, 0]
