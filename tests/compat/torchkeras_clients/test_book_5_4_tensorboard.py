"""The book's chapter 5-4, "TensorBoard" (lyhue1991/eat_pytorch_in_20_days), with only the
import changed: ``summary(net, input_shape=(3, 32, 32))`` on a small CNN, then a binary
classifier on generated rings trained with ``TensorBoardCallback(save_dir, model_name,
log_weight, log_weight_freq)``. Its data is generated, so it runs as written but for the
epochs (100 there, 3 here); the cells that draw or start TensorBoard's web page, and those
that use torch's ``SummaryWriter`` alone, are left out."""

from __future__ import annotations

import glob
import os

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import kerastorch as torchkeras  # the one changed line: "import torchkeras"

pytestmark = pytest.mark.slow


def test_summary_of_a_cnn_by_input_shape(capsys):
    class Net(nn.Module):
        def __init__(self):
            super(Net, self).__init__()  # noqa: UP008 (as in the book)
            self.conv1 = nn.Conv2d(in_channels=3, out_channels=32, kernel_size=3)
            self.pool = nn.MaxPool2d(kernel_size=2, stride=2)
            self.conv2 = nn.Conv2d(in_channels=32, out_channels=64, kernel_size=5)
            self.dropout = nn.Dropout2d(p=0.1)
            self.adaptive_pool = nn.AdaptiveMaxPool2d((1, 1))
            self.flatten = nn.Flatten()
            self.linear1 = nn.Linear(64, 32)
            self.relu = nn.ReLU()
            self.linear2 = nn.Linear(32, 1)

        def forward(self, x):
            x = self.conv1(x)
            x = self.pool(x)
            x = self.conv2(x)
            x = self.pool(x)
            x = self.dropout(x)
            x = self.adaptive_pool(x)
            x = self.flatten(x)
            x = self.linear1(x)
            x = self.relu(x)
            y = self.linear2(x)
            return y

    net = Net()

    from kerastorch import summary

    info = summary(net, input_shape=(3, 32, 32))

    # What the chapter shows: every layer with its output shape for a batch of 3x32x32 images
    # (the batch as -1), and the total number of parameters.
    printed = capsys.readouterr().out
    assert info.total_params == sum(p.numel() for p in net.parameters())
    assert f"{info.total_params:,}" in printed
    shapes = dict(zip(info.table["layer"], info.table["output_shape"]))
    assert any("Conv2d" in layer and shape == "[-1, 32, 30, 30]" for layer, shape in shapes.items())
    assert info.table["output_shape"].iloc[-1] == "[-1, 1]"


def test_tensorboard_callback(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard", reason="the tensorboard extra is in the test extra")
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    print("torchkeras.__version__=" + torchkeras.__version__)

    # number of samples
    n_positive, n_negative = 4000, 4000

    # positive samples
    r_p = 5.0 + torch.normal(0.0, 1.0, size=[n_positive, 1])
    theta_p = 2 * np.pi * torch.rand([n_positive, 1])
    Xp = torch.cat([r_p * torch.cos(theta_p), r_p * torch.sin(theta_p)], axis=1)
    Yp = torch.ones_like(r_p)

    # negative samples
    r_n = 8.0 + torch.normal(0.0, 1.0, size=[n_negative, 1])
    theta_n = 2 * np.pi * torch.rand([n_negative, 1])
    Xn = torch.cat([r_n * torch.cos(theta_n), r_n * torch.sin(theta_n)], axis=1)
    Yn = torch.zeros_like(r_n)

    # concat positive and negative samples
    X = torch.cat([Xp, Xn], axis=0)
    Y = torch.cat([Yp, Yn], axis=0)

    ds = TensorDataset(X, Y)
    ds_train, ds_val = torch.utils.data.random_split(ds, [int(len(ds) * 0.7), len(ds) - int(len(ds) * 0.7)])
    dl_train = DataLoader(ds_train, batch_size=16, shuffle=True)
    dl_val = DataLoader(ds_val, batch_size=16)

    for features, labels in dl_train:  # noqa: B007 (as in the book: the first batch)
        break

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(2, 16)
            self.fc2 = nn.Linear(16, 8)
            self.fc3 = nn.Linear(8, 1)

        def forward(self, x):
            x = F.relu(self.fc1(x))
            x = F.relu(self.fc2(x))
            y = self.fc3(x)  # don't need nn.Sigmoid()
            return y

    from kerastorch import KerasModel
    from kerastorch.metrics import Accuracy

    net = Net()
    loss_fn = nn.BCEWithLogitsLoss()
    metric_dict = {"acc": Accuracy()}

    lr = 0.0001
    optimizer = torch.optim.Adam(net.parameters(), lr=lr)

    model = KerasModel(net, loss_fn=loss_fn, metrics_dict=metric_dict, optimizer=optimizer)

    from kerastorch import summary

    summary(model, input_data=features)

    from kerastorch.kerascallbacks import TensorBoardCallback

    tb = TensorBoardCallback(
        save_dir="./data/tensorboard",
        model_name="model",
        log_weight=False,
        log_weight_freq=5,
    )

    model.fit(
        train_data=dl_train,
        val_data=dl_val,
        epochs=3,  # the book: 100
        ckpt_path="checkpoint",
        patience=10,
        monitor="val_acc",
        mode="max",
        callbacks=[tb],
        plot=True,
        cpu=True,
    )

    # What the chapter relies on: TensorBoard's event files under ./data/tensorboard/model/<time>
    # with the epochs' values, the history next to them, and the checkpoint.
    from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer

    (log_path,) = glob.glob(os.path.join("data", "tensorboard", "model", "*"))
    runs = EventMultiplexer().AddRunsFromDirectory(log_path)
    runs.Reload()
    history = model.history
    assert len(history) == 3
    assert [e.value for e in runs.Scalars("val", "acc")] == pytest.approx(history["val_acc"].tolist())
    assert [e.value for e in runs.Scalars("train", "loss")] == pytest.approx(history["train_loss"].tolist())
    assert not any(tags["histograms"] for tags in runs.Runs().values())  # log_weight=False
    assert pd.read_csv(os.path.join(log_path, "dfhistory.csv"))["val_loss"].tolist() == pytest.approx(
        history["val_loss"].tolist()
    )
    assert set(torch.load("checkpoint", weights_only=True)) == set(net.state_dict())
