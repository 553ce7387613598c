"""torchkeras's own example notebooks, with only the import changed.

Each test is the code of one upstream notebook (lyhue1991/torchkeras) as it is, except:
the import line, MNIST (a download) replaced by the digits that ship with scikit-learn at
the same shape (1x28x28 images, 10 classes), fewer epochs, and the cells that only draw or
start TensorBoard's web page left out. The assertions are what the notebook relies on.
"""

from __future__ import annotations

import glob
import os
import re

import pandas as pd
import pytest
import torch
from torch import nn

import kerastorch as torchkeras  # the one changed line: "import torchkeras"
from kerastorch.examples import digits_datasets

pytestmark = pytest.mark.slow


@pytest.fixture
def mnist_like(tmp_path, monkeypatch):
    """The notebooks' dl_train / dl_val, on local digits of MNIST's shape."""
    monkeypatch.chdir(tmp_path)
    ds_train, ds_val, _ = digits_datasets(size=28)
    dl_train = torch.utils.data.DataLoader(ds_train, batch_size=128, shuffle=True, num_workers=2)
    dl_val = torch.utils.data.DataLoader(ds_val, batch_size=128, shuffle=False, num_workers=2)
    return ds_train, dl_train, dl_val


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


def test_01_kerasmodel_example(mnist_like):
    ds_train, dl_train, dl_val = mnist_like
    for features, labels in dl_train:  # noqa: B007 (as upstream: the first batch)
        break

    net = create_net()

    model = torchkeras.KerasModel(
        net,
        loss_fn=nn.CrossEntropyLoss(),
        optimizer=torch.optim.Adam(net.parameters(), lr=5e-3),
        metrics_dict={"acc": Accuracy()},
    )

    from kerastorch import summary

    summary(model, input_data=features)

    ckpt_path = "checkpoint"
    dfhistory = model.fit(
        train_data=dl_train,
        val_data=dl_val,
        epochs=4,
        patience=3,
        monitor="val_acc",
        mode="max",
        ckpt_path=ckpt_path,
        plot=True,
    )
    model.evaluate(dl_val)
    model.evaluate(dl_val, quiet=False)

    net = model.net
    net.eval()
    img, label = ds_train[1]
    y_pred = torch.argmax(net(img[None, ...]))
    y_prob = torch.softmax(net(img[None, ...]), dim=-1).max()

    #  used the saved model parameters
    net_clone = create_net()
    model_clone = torchkeras.KerasModel(
        net_clone,
        loss_fn=nn.CrossEntropyLoss(),
        optimizer=torch.optim.Adam(net_clone.parameters(), lr=0.001),
        metrics_dict={"acc": Accuracy()},
    )
    model_clone.load_ckpt("checkpoint")

    # What the notebook relies on:
    for column in ("train_loss", "train_acc", "val_loss", "val_acc"):
        assert column in dfhistory.columns  # plot_metric(dfhistory, "loss"), plot_metric(dfhistory, "acc")
    assert dfhistory["val_acc"].max() > 0.5
    assert 0 <= y_pred.item() <= 9 and 0 < y_prob.item() <= 1
    best = dfhistory["val_acc"].max()
    assert model_clone.evaluate(dl_val)["val_acc"] == pytest.approx(best)  # the checkpoint is the best epoch's
    net_clone.load_state_dict(torch.load("checkpoint", weights_only=True))  # a plain torch file, as in torchkeras
    assert os.path.isfile("kerastorch_history.png")  # plot=True outside a notebook saves the plot


def last_summary_value(log_path: str, key: str) -> float:
    """The last value an offline wandb run's log gives a summary key. The log is protobuf
    records: the key, then its value as JSON in field 16 (tag bytes 0x82 0x01, a length)."""
    log = open(log_path, "rb").read()
    matches = list(re.finditer(re.escape(key.encode()) + rb"\x82\x01([\x00-\x7f])", log))
    assert matches, f"{key} not in the run's summary"
    last = matches[-1]
    return float(log[last.end() : last.end() + last.group(1)[0]])


def test_02_kerasmodel_wandb_demo(mnist_like, monkeypatch):
    """Offline (no account here): the cells that resume the run on the server and query its
    API (``wandb.init(id=model.run_id, resume="must")``, ``wandb.Api()``) are left out; what
    they read (``best_score``, the ``checkpoint`` artifact, ``model.mode``) is checked in the
    run's own files."""
    wandb = pytest.importorskip("wandb", reason="the wandb extra is not installed")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", os.getcwd())
    # wandb keeps the settings of this process's first run (its folder among them) until torn down: a
    # test that ran wandb earlier would have this run's files written in that test's folder.
    wandb.teardown()
    from argparse import Namespace

    config = Namespace(
        batch_size=256,
        lr=1e-3,
        dropout_p=0.1,
    )
    ds_train, dl_train, dl_val = mnist_like
    for features, labels in dl_train:  # noqa: B007 (as upstream: the first batch)
        break

    net = create_net()  # upstream: create_net(config), the same layers with config.dropout_p

    model = torchkeras.KerasModel(
        net,
        loss_fn=nn.CrossEntropyLoss(),
        optimizer=torch.optim.Adam(net.parameters(), lr=0.001),
        metrics_dict={"acc": Accuracy()},
    )

    from kerastorch import summary

    summary(model, input_data=features)

    from kerastorch.kerascallbacks import WandbCallback

    wandb_cb = WandbCallback(project="mnist_torchkeras", config=config, name=None, save_code=True, save_ckpt=True)

    dfhistory = model.fit(
        train_data=dl_train,
        val_data=dl_val,
        epochs=3,  # upstream: 15
        patience=5,
        monitor="val_acc",
        mode="max",
        ckpt_path="checkpoint.pt",
        callbacks=[wandb_cb],
    )

    # visual the  prediction
    device = None
    for p in model.parameters():
        device = p.device
        break
    for i in range(9):
        img, label = ds_train[i]
        tensor = img.to(device)
        y_pred = torch.argmax(net(tensor[None, ...]))
        assert 0 <= y_pred.item() <= 9

    # What the notebook relies on: the run's id on the model, the run finished with fit, and in
    # the run's folder the history, the best score and the checkpoint (an artifact named
    # "checkpoint", the file at model.ckpt_path) that get_best_run_id / get_model_versions read.
    assert model.run_id and wandb.run is None
    wandb.teardown()
    (run_dir,) = glob.glob(os.path.join("wandb", f"offline-run-*-{model.run_id}"))
    files = os.path.join(run_dir, "files")
    assert pd.read_csv(os.path.join(files, "dfhistory.csv"))["val_acc"].tolist() == pytest.approx(
        dfhistory["val_acc"].tolist()
    )
    (log,) = glob.glob(os.path.join(run_dir, "run-*.wandb"))
    best = dfhistory["val_acc"].max() if model.mode == "max" else dfhistory["val_acc"].min()
    assert last_summary_value(log, "best_score") == pytest.approx(best)
    assert model.ckpt_path == "checkpoint.pt"
    copied = torch.load(os.path.join(files, "checkpoint.pt"), weights_only=True)
    assert all(torch.equal(copied[k], v) for k, v in torch.load(model.ckpt_path, weights_only=True).items())
    assert not glob.glob(os.path.join(files, "weights.safetensors"))  # the checkpoint is the weights
    assert wandb_cb.config == vars(config)


def test_04_kerasmodel_tensorboard_demo(mnist_like):
    pytest.importorskip("tensorboard", reason="the tensorboard extra is in the test extra")
    ds_train, dl_train, dl_val = mnist_like
    for features, labels in dl_train:  # noqa: B007 (as upstream: the first batch)
        break

    net = create_net()
    model = torchkeras.KerasModel(
        net,
        loss_fn=nn.CrossEntropyLoss(),
        optimizer=torch.optim.Adam(net.parameters(), lr=0.001),
        metrics_dict={"acc": Accuracy()},
    )

    from kerastorch import summary

    summary(model, input_data=features)

    # you can also try: from torchkeras.kerascallbacks import WandbCallback
    from kerastorch.kerascallbacks import TensorBoardCallback

    dfhistory = model.fit(
        train_data=dl_train,
        val_data=dl_val,
        epochs=3,
        patience=5,
        monitor="val_acc",
        mode="max",
        ckpt_path="checkpoint.pt",
        callbacks=[TensorBoardCallback(save_dir="runs", model_name="mnist_cnn", log_weight=True, log_weight_freq=5)],
    )

    # visual the  prediction
    device = None
    for p in model.parameters():
        device = p.device
        break
    for i in range(9):
        img, label = ds_train[i]
        tensor = img.to(device)
        y_pred = torch.argmax(net(tensor[None, ...]))
        assert 0 <= y_pred.item() <= 9

    # What the notebook relies on: the events and the history under runs/mnist_cnn/<time>/, a checkpoint.
    (log_path,) = glob.glob(os.path.join("runs", "mnist_cnn", "*"))
    assert glob.glob(os.path.join(log_path, "**", "events.out.tfevents.*"), recursive=True)
    assert pd.read_csv(os.path.join(log_path, "dfhistory.csv"))["val_acc"].tolist() == pytest.approx(
        dfhistory["val_acc"].tolist()
    )
    assert set(torch.load("checkpoint.pt", weights_only=True)) == set(net.state_dict())
