"""torchkeras's script ``kerasmodel_example.py`` (lyhue1991/torchkeras, at the repository's top),
with only the import changed: a CNN on MNIST with a hand-written ``Accuracy`` module,
``summary(model, input_data=features)``, ``fit`` with the default-style ``ckpt_path='checkpoint'``,
``plot=True`` and ``wandb=False``, ``model.evaluate(dl_val, quiet=False)`` and a clone reloaded with
``model_clone.load_ckpt(ckpt_path)``. MNIST (a download through torchvision) is replaced by the
digits that ship with scikit-learn at MNIST's shape (1x28x28 float images, int64 labels, 10
classes), all of it where upstream keeps every 20th image (the digits are 1348 and 449 images);
fewer epochs (100 there, 6 here). The script runs outside a notebook, headless: matplotlib
on its Agg backend, as ``MPLBACKEND=Agg`` gives it."""

from __future__ import annotations

import os

import numpy as np  # noqa: F401 (as upstream)
import pandas as pd
import pytest
import torch
import torch.nn.functional as F  # noqa: F401 (as upstream)
from torch import nn
from torch.utils.data import DataLoader, Dataset  # noqa: F401 (as upstream)

import kerastorch as torchkeras  # the one changed line: "import torchkeras"

pytestmark = pytest.mark.slow


def test_kerasmodel_example_py(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MPLBACKEND", "Agg")  # a headless run: no window may open, nothing may block
    torch.manual_seed(0)

    from matplotlib import pyplot as plt  # noqa: F401 (as upstream, once the backend is set)

    # ### 1, prepare data
    from kerastorch.examples import digits_datasets  # upstream: import torchvision; from torchvision import transforms

    ds_train, ds_val, _ = digits_datasets(size=28)  # upstream: torchvision.datasets.MNIST(root="mnist/", ...) twice
    ds_train = torch.utils.data.Subset(ds_train, range(0, len(ds_train), 1))  # upstream: step 20 (60000 -> 3000)
    ds_val = torch.utils.data.Subset(ds_val, range(0, len(ds_val), 1))  # upstream: step 20 (10000 -> 500)
    dl_train = torch.utils.data.DataLoader(ds_train, batch_size=128, shuffle=True, num_workers=0)
    dl_val = torch.utils.data.DataLoader(ds_val, batch_size=128, shuffle=False, num_workers=0)

    for features, labels in dl_train:  # noqa: B007 (as upstream: the first batch)
        break
    print(features.shape)
    print(labels.shape)

    # ### 2, create the  model

    def create_net():
        net = nn.Sequential()
        net.add_module("conv1", nn.Conv2d(in_channels=1, out_channels=32, kernel_size=3))
        net.add_module("pool1", nn.MaxPool2d(kernel_size=2, stride=2))
        net.add_module("conv2", nn.Conv2d(in_channels=32, out_channels=64, kernel_size=5))
        net.add_module("pool2", nn.MaxPool2d(kernel_size=2, stride=2))
        net.add_module("dropout", nn.Dropout2d(p=0.1))
        net.add_module("adaptive_pool", nn.AdaptiveMaxPool2d((1, 1)))
        net.add_module("flatten", nn.Flatten())
        net.add_module("linear1", nn.Linear(64, 32))
        net.add_module("relu", nn.ReLU())
        net.add_module("linear2", nn.Linear(32, 10))
        return net

    class Accuracy(nn.Module):
        def __init__(self):
            super().__init__()

            self.correct = nn.Parameter(torch.tensor(0.0), requires_grad=False)
            self.total = nn.Parameter(torch.tensor(0.0), requires_grad=False)

        def forward(self, preds: torch.Tensor, targets: torch.Tensor):
            preds = preds.argmax(dim=-1)
            m = (preds == targets).sum()
            n = targets.shape[0]
            self.correct += m
            self.total += n

            return m / n

        def compute(self):
            return self.correct.float() / self.total

        def reset(self):
            self.correct -= self.correct
            self.total -= self.total

    net = create_net()

    model = torchkeras.KerasModel(
        net,
        loss_fn=nn.CrossEntropyLoss(),
        optimizer=torch.optim.Adam(net.parameters(), lr=0.002),
        metrics_dict={"acc": Accuracy()},
    )

    from kerastorch import summary  # upstream: from torchkeras import summary

    summary(model, input_data=features)

    # ### 3, train the model

    ckpt_path = "checkpoint"
    # model.load_ckpt(ckpt_path) #load trained ckpt and continue training
    dfhistory = model.fit(
        train_data=dl_train,
        val_data=dl_val,
        epochs=6,  # upstream: 100
        patience=5,
        monitor="val_acc",
        mode="max",
        ckpt_path=ckpt_path,
        plot=True,
        wandb=False,
    )

    model.evaluate(dl_val, quiet=False)

    # ### 5, save the model
    net_clone = create_net()

    model_clone = torchkeras.KerasModel(
        net_clone,
        loss_fn=nn.CrossEntropyLoss(),
        optimizer=torch.optim.Adam(net_clone.parameters(), lr=0.001),
        metrics_dict={"acc": Accuracy()},
    )

    model_clone.load_ckpt(ckpt_path)

    # What the script relies on. The first batch's shapes, printed:
    printed = capsys.readouterr().out
    assert "torch.Size([128, 1, 28, 28])\ntorch.Size([128])\n" in printed
    # summary(model, input_data=features) printed the net's table, with its parameter count.
    assert "conv1 (Conv2d)" in printed and f"Total params: {sum(p.numel() for p in net.parameters()):,}" in printed
    # The history: a DataFrame, one row per epoch (patience=5 cannot stop 6 epochs early), with
    # the columns torchkeras gives.
    assert isinstance(dfhistory, pd.DataFrame)
    assert {"epoch", "train_loss", "train_acc", "val_loss", "val_acc"} <= set(dfhistory.columns)
    assert dfhistory["epoch"].tolist() == list(range(1, len(dfhistory) + 1)) and len(dfhistory) == 6
    assert dfhistory["val_acc"].max() > 0.6  # it learned: chance is 0.1
    assert dfhistory["train_loss"].iloc[-1] < dfhistory["train_loss"].iloc[0]
    # plot=True outside a notebook: the figure is written to a file, whose path is printed; no window.
    assert os.path.isfile("kerastorch_history.png") and os.path.getsize("kerastorch_history.png") > 0
    assert os.path.abspath("kerastorch_history.png") in printed
    # evaluate(dl_val, quiet=False) shows the values; it gives the best epoch's, as fit restored them.
    evaluated = model.evaluate(dl_val, quiet=True)
    assert set(evaluated) == {"val_loss", "val_acc"}
    assert evaluated["val_acc"] == pytest.approx(dfhistory["val_acc"].max())
    last_line = printed.strip().splitlines()[-1]  # what evaluate(dl_val, quiet=False) printed
    shown = dict(part.split("=") for part in last_line.split(", "))
    assert list(shown) == ["val_loss", "val_acc"]
    assert float(shown["val_acc"]) == pytest.approx(evaluated["val_acc"], abs=1e-3)
    # The checkpoint at ckpt_path (no extension, as torchkeras's default) is the best epoch's
    # weights: load_ckpt puts them in the clone, which scores the same and predicts the same.
    assert os.path.isfile(ckpt_path)
    assert model_clone.evaluate(dl_val, quiet=True) == pytest.approx(evaluated)
    plain = create_net()
    plain.load_state_dict(torch.load(ckpt_path, weights_only=True))  # a plain state dict, as torchkeras writes
    for each in (plain, net_clone, model.net):
        each.eval()
    with torch.no_grad():
        assert torch.equal(net_clone(features), model.net(features))
        assert torch.equal(plain(features), model.net(features))
