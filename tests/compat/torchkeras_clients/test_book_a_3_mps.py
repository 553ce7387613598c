"""The book's appendix A-3, "speeding up pytorch with the Mac M1 chip" (lyhue1991/eat_pytorch_in_20_days,
``A-3,使用MacM1芯片加速pytorch.ipynb``), its torchkeras part (from ``import torchkeras #Attention
this line`` on) with only the import changed: a CNN on MNIST with a metric of its own (an
``nn.Module`` whose counts are ``nn.Parameter``s), ``summary(model, input_data=features)`` and
``fit`` with no device given ("if gpu/mps is available, will auto use it, otherwise cpu will be
used"). There is no mps (nor a GPU) here, so it runs as on a machine without one: on the CPU.

Left out: the part before it, a hand-written loop that moves the net and the batches to
``mps`` itself and uses no torchkeras. Replaced: MNIST (a torchvision download) by the digits that
ship with scikit-learn at MNIST's shape (1x28x28, 10 classes), ``num_workers=2`` by 0, and 4
epochs instead of 15."""

from __future__ import annotations

import os

import pandas as pd
import pytest
import torch
from torch import nn

import kerastorch as torchkeras  # the one changed line: "import torchkeras #Attention this line"
from kerastorch.examples import digits_datasets

pytestmark = pytest.mark.slow


def test_a_3_keras_model_on_the_device_the_machine_has(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)  # upstream: no seed

    # ================================================================================
    # 一，准备数据
    # ================================================================================

    ds_train, ds_val, _ = digits_datasets(size=28)  # upstream: torchvision.datasets.MNIST(root="mnist/", ...)
    dl_train = torch.utils.data.DataLoader(ds_train, batch_size=128, shuffle=True, num_workers=0)  # upstream: 2
    dl_val = torch.utils.data.DataLoader(ds_val, batch_size=128, shuffle=False, num_workers=0)  # upstream: 2

    for features, labels in dl_train:  # noqa: B007 (as in the book: the first batch)
        break

    # ================================================================================
    # 二，定义模型
    # ================================================================================

    def create_net():
        net = nn.Sequential()
        net.add_module("conv1", nn.Conv2d(in_channels=1, out_channels=64, kernel_size=3))
        net.add_module("pool1", nn.MaxPool2d(kernel_size=2, stride=2))
        net.add_module("conv2", nn.Conv2d(in_channels=64, out_channels=512, kernel_size=3))
        net.add_module("pool2", nn.MaxPool2d(kernel_size=2, stride=2))
        net.add_module("dropout", nn.Dropout2d(p=0.1))
        net.add_module("adaptive_pool", nn.AdaptiveMaxPool2d((1, 1)))
        net.add_module("flatten", nn.Flatten())
        net.add_module("linear1", nn.Linear(512, 1024))
        net.add_module("relu", nn.ReLU())
        net.add_module("linear2", nn.Linear(1024, 10))
        return net

    net = create_net()
    print(net)

    # 评估指标
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

    # ================================================================================
    # 三，训练模型
    # ================================================================================

    model = torchkeras.KerasModel(
        net,
        loss_fn=nn.CrossEntropyLoss(),
        optimizer=torch.optim.Adam(net.parameters(), lr=0.001),
        metrics_dict={"acc": Accuracy()},
    )

    from kerastorch import summary

    summary(model, input_data=features)

    # if gpu/mps is available, will auto use it, otherwise cpu will be used.

    dfhistory = model.fit(
        train_data=dl_train,
        val_data=dl_val,
        epochs=4,  # upstream: 15
        patience=5,
        monitor="val_acc",
        mode="max",
        ckpt_path="checkpoint",
    )

    # ================================================================================
    # 四，评估模型
    # ================================================================================

    evaluated = model.evaluate(dl_val)

    printed = capsys.readouterr().out
    # What the appendix relies on: fit picking the device itself (CUDA, else mps, else the
    # CPU: here the CPU); summary of the model (its net) on a batch; the history; evaluate's
    # keys, giving the best epoch's score; the checkpoint a state dict the net reloads; a net
    # that learned.
    expected = "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    assert f"training on {expected}" in printed
    assert model.accelerator.device.type == expected
    assert f"Total params: {sum(p.numel() for p in net.parameters()):,}" in printed
    assert "[-1, 512, 11, 11]" in printed and "[-1, 10]" in printed
    assert isinstance(dfhistory, pd.DataFrame) and len(dfhistory) == 4
    assert {"epoch", "train_loss", "train_acc", "val_loss", "val_acc"} <= set(dfhistory.columns)
    assert dfhistory["train_loss"].iloc[-1] < dfhistory["train_loss"].iloc[0]
    assert dfhistory["val_acc"].max() > 0.5  # ten classes: chance is 0.1
    assert set(evaluated) == {"val_loss", "val_acc"}
    assert evaluated["val_acc"] == pytest.approx(dfhistory["val_acc"].max())
    assert os.path.isfile("checkpoint")
    net_clone = create_net()
    net_clone.load_state_dict(torch.load("checkpoint", weights_only=True))
    net_clone.eval()
    with torch.no_grad():
        correct = sum((net_clone(x).argmax(dim=-1) == y).sum().item() for x, y in dl_val)
    assert correct / len(ds_val) == pytest.approx(evaluated["val_acc"])
