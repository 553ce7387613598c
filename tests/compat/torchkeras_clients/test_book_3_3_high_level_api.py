"""The book's chapter 3-3, "high-level API" (lyhue1991/eat_pytorch_in_20_days), with only the
import changed: a linear regression with a torchmetrics metric, and a binary classifier with
``torchkeras.metrics.Accuracy``. Its data is generated, so it runs as written (its 100 epochs
too), but with its loaders' ``num_workers=2`` by 0: two worker processes started for each of 100
epochs took most of a minute a test, and test nothing of kerastorch. The plotting cells are left
out, and the book's ``model.accelerator`` (a name it never defined) reads ``keras_model.accelerator``."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import kerastorch as torchkeras  # the one changed line: "import torchkeras"

pytestmark = pytest.mark.slow


def test_linear_regression(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    print("torchkeras.__version__=" + torchkeras.__version__)
    # 样本数量
    n = 400

    # 生成测试用数据集
    X = 10 * torch.rand([n, 2]) - 5.0  # torch.rand是均匀分布
    w0 = torch.tensor([[2.0], [-3.0]])
    b0 = torch.tensor([[10.0]])
    Y = X @ w0 + b0 + torch.normal(0.0, 2.0, size=[n, 1])  # @表示矩阵乘法,增加正态扰动

    # 构建输入数据管道
    ds = TensorDataset(X, Y)
    ds_train, ds_val = torch.utils.data.random_split(ds, [int(400 * 0.7), 400 - int(400 * 0.7)])
    dl_train = DataLoader(ds_train, batch_size=16, shuffle=True, num_workers=0)  # the book: 2
    dl_val = DataLoader(ds_val, batch_size=16, num_workers=0)  # the book: 2

    features, labels = next(iter(dl_train))

    class LinearRegression(nn.Module):
        def __init__(self):
            super(LinearRegression, self).__init__()  # noqa: UP008 (as in the book)
            self.fc = nn.Linear(2, 1)

        def forward(self, x):
            return self.fc(x)

    net = LinearRegression()

    from kerastorch import summary

    summary(net, input_data=features)

    import torchmetrics

    from kerastorch import KerasModel

    net = LinearRegression()
    keras_model = KerasModel(
        net=net,
        loss_fn=nn.MSELoss(),
        metrics_dict={"mae": torchmetrics.MeanAbsoluteError()},
        optimizer=torch.optim.Adam(net.parameters(), lr=0.01),
    )

    dfhistory = keras_model.fit(
        train_data=dl_train,
        val_data=dl_val,
        epochs=100,
        ckpt_path="checkpoint",
        patience=10,
        monitor="val_loss",
        mode="min",
    )

    w, b = net.state_dict()["fc.weight"], net.state_dict()["fc.bias"]
    dfhistory.tail()
    evaluated = keras_model.evaluate(dl_val)

    # 预测
    dl = DataLoader(TensorDataset(X))

    result = []
    with torch.no_grad():
        for batch in dl:
            features = batch[0].to(keras_model.accelerator.device)
            res = net(features)
            result.extend(res.tolist())
    result = np.array(result).flatten()
    print(result[:10])

    # What the chapter shows: the fitted line is the true one, the history and evaluate's keys.
    assert set(evaluated) == {"val_loss", "val_mae"}
    assert evaluated["val_loss"] == pytest.approx(dfhistory["val_loss"].min())
    torch.testing.assert_close(w, w0.T, atol=0.3, rtol=0)
    assert abs(b.item() - 10.0) < 1.0
    assert result.shape == (400,)


def test_binary_classification(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    # 正负样本数量
    n_positive, n_negative = 2000, 2000

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
    dl_train = DataLoader(ds_train, batch_size=100, shuffle=True, num_workers=0)  # the book: 2
    dl_val = DataLoader(ds_val, batch_size=100, num_workers=0)  # the book: 2

    for features, labels in dl_train:  # noqa: B007 (as in the book: the first batch)
        break

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

    from kerastorch import KerasModel
    from kerastorch.metrics import Accuracy

    net = Net()
    loss_fn = nn.BCEWithLogitsLoss()
    metric_dict = {"acc": Accuracy()}

    optimizer = torch.optim.Adam(net.parameters(), lr=0.001)

    keras_model = KerasModel(net, loss_fn=loss_fn, metrics_dict=metric_dict, optimizer=optimizer)

    from kerastorch import summary

    summary(net, input_data=features)

    dfhistory = keras_model.fit(
        train_data=dl_train,
        val_data=dl_val,
        epochs=100,
        ckpt_path="checkpoint",
        patience=10,
        monitor="val_acc",
        mode="max",
    )

    Xp_pred = X[torch.squeeze(net.forward(X) >= 0.5)]
    Xn_pred = X[torch.squeeze(net.forward(X) < 0.5)]

    evaluated = keras_model.evaluate(dl_val)

    device = keras_model.accelerator.device

    @torch.no_grad()
    def predict(net, dl):
        net.eval()
        result = torch.cat([net.forward(t[0].to(device)) for t in dl])
        return result.data

    predictions = F.sigmoid(predict(net, dl_val)[:10])

    # What the chapter shows: the rings separated, evaluate's keys, probabilities.
    assert set(evaluated) == {"val_loss", "val_acc"}
    assert evaluated["val_acc"] == pytest.approx(dfhistory["val_acc"].max())
    assert dfhistory["val_acc"].max() > 0.85
    assert len(Xp_pred) + len(Xn_pred) == len(X)
    assert predictions.shape == (10, 1) and ((predictions >= 0) & (predictions <= 1)).all()
