"""torchkeras's notebook 05, ``05，kerasmodel_ddp_tpu_examples.ipynb`` (lyhue1991/torchkeras), with only
the import changed: the same CNN trained with a torchmetrics ``Accuracy``, ``AdamW`` and
``CosineAnnealingWarmRestarts``, first in one process (``model.fit(..., mixed_precision='no')``), then
in two DDP processes started by accelerate's ``notebook_launcher(model.fit, args, num_processes=2)``;
after each, the notebook reloads ``checkpoint.pt`` with ``torch.load`` and prints ``model.evaluate(dl_val)``.

Replaced: MNIST (a download) by the digits that ship with scikit-learn at MNIST's shape (1x28x28
float images, int64 labels, 10 classes); the DDP processes run on the CPU (gloo) where the notebook
had two GPUs. So that the small data trains in seconds: batches of 64 (1024 there: the digits' 449
validation images would make no batch with ``drop_last=True``), 32 and 64 channels (512 and 256
there, 40 times the compute) with a learning rate of 1e-3 (1e-4 there), and ``num_workers=0`` (2 there).

Left out: the ``!pip install`` cells; the copy of torchkeras's source in its second cell (it does not
use torchkeras); the cells that write accelerate's config file and restart the kernel (the restart is
done here by forgetting accelerate's process-wide state: see ``restarted_kernel``); and the TPU
section (``torch_xla`` on 8 TPU cores), which cannot run here.
"""

from __future__ import annotations

import os
import re

import pandas as pd
import pytest
import torch
import torchmetrics
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

from kerastorch import KerasModel  # the one changed line: "from torchkeras import KerasModel"
from kerastorch.examples import digits_datasets

pytestmark = pytest.mark.slow


@pytest.fixture
def restarted_kernel(tmp_path, monkeypatch):
    """The notebook restarts its kernel (``os._exit(0)``) before the DDP cell: accelerate's
    ``notebook_launcher`` needs a process whose accelerate state is still empty. In this test
    process that is the state forgotten, as a fresh kernel has it."""
    from accelerate.state import AcceleratorState, GradientState

    monkeypatch.chdir(tmp_path)
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


### 1，准备数据


def create_dataloaders(batch_size=1024):
    ds_train, ds_val, _ = digits_datasets(size=28)  # upstream: torchvision.datasets.MNIST(root="./minist/", ...) twice

    dl_train = torch.utils.data.DataLoader(
        ds_train,
        batch_size=batch_size,
        shuffle=True,
        num_workers=0,  # upstream: 2
        drop_last=True,
    )
    dl_val = torch.utils.data.DataLoader(
        ds_val,
        batch_size=batch_size,
        shuffle=False,
        num_workers=0,  # upstream: 2
        drop_last=True,
    )
    return dl_train, dl_val


### 2，定义模型


def create_net():
    net = nn.Sequential()
    net.add_module("conv1", nn.Conv2d(in_channels=1, out_channels=32, kernel_size=3))  # upstream: 512 channels
    net.add_module("pool1", nn.MaxPool2d(kernel_size=2, stride=2))
    net.add_module("conv2", nn.Conv2d(in_channels=32, out_channels=64, kernel_size=5))  # upstream: 512 -> 256
    net.add_module("pool2", nn.MaxPool2d(kernel_size=2, stride=2))
    net.add_module("dropout", nn.Dropout2d(p=0.1))
    net.add_module("adaptive_pool", nn.AdaptiveMaxPool2d((1, 1)))
    net.add_module("flatten", nn.Flatten())
    net.add_module("linear1", nn.Linear(64, 128))  # upstream: nn.Linear(256, 128)
    net.add_module("relu", nn.ReLU())
    net.add_module("linear2", nn.Linear(128, 10))
    return net


def build_model():
    """The notebook's section 3 up to the model (the same in both cells)."""
    torch.manual_seed(0)
    net = create_net()

    loss_fn = nn.CrossEntropyLoss()
    metrics_dict = {"acc": torchmetrics.Accuracy(task="multiclass", num_classes=10)}

    optimizer = torch.optim.AdamW(params=net.parameters(), lr=1e-3)  # upstream: lr=1e-4
    lr_scheduler = torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(optimizer=optimizer, T_0=5)

    model = KerasModel(net, loss_fn, metrics_dict, optimizer, lr_scheduler)
    return net, model


def printed_dict(text: str) -> dict:
    """The dict ``print(model.evaluate(dl_val))`` printed: the last line that looks like one."""
    line = [line for line in text.splitlines() if line.startswith("{")][-1]
    return {key: float(value) for key, value in re.findall(r"'(\w+)': ([0-9.e-]+)", line)}


def test_05_one_process_cell(tmp_path, monkeypatch, capsys):
    """Section 一: ``model.fit`` in the notebook's process, then the reload and ``evaluate``."""
    monkeypatch.chdir(tmp_path)
    dl_train, dl_val = create_dataloaders(batch_size=64)  # upstream: 1024
    net, model = build_model()

    dfhistory = model.fit(
        train_data=dl_train,
        val_data=dl_val,
        epochs=5,
        ckpt_path="checkpoint.pt",
        patience=2,
        monitor="val_acc",
        mode="max",
        mixed_precision="no",
    )

    ### 4，评估模型
    model.net.load_state_dict(torch.load("checkpoint.pt"))
    print(model.evaluate(dl_val))

    # What the cell relies on: fit's history (the notebook prints it: a DataFrame, one row per
    # epoch, with the accuracy named after metrics_dict's key); checkpoint.pt, a plain state dict
    # that torch.load reads with its defaults, holding the best epoch's weights; evaluate's dict.
    assert isinstance(dfhistory, pd.DataFrame) and 3 <= len(dfhistory) <= 5  # patience=2 may stop it early
    assert dfhistory["epoch"].tolist() == list(range(1, len(dfhistory) + 1))
    assert {"train_loss", "train_acc", "val_loss", "val_acc"} <= set(dfhistory.columns)
    assert dfhistory["val_acc"].max() > 0.4  # it learned: chance is 0.1
    evaluated = printed_dict(capsys.readouterr().out)
    assert list(evaluated) == ["val_loss", "val_acc"]
    assert evaluated["val_acc"] == pytest.approx(dfhistory["val_acc"].max())  # the best epoch's weights
    best_row = dfhistory["val_acc"].idxmax()
    assert evaluated["val_loss"] == pytest.approx(dfhistory["val_loss"][best_row])


def test_05_ddp_cell_as_written_fails_saying_to_pass_ckpt_path_by_name(restarted_kernel):
    """The notebook passes fit's arguments positionally, in torchkeras 3.3's order (ckpt_path
    fourth, mixed_precision eighth: the version the notebook ran with; torchkeras 4's own fit would
    take 'no' as callbacks). kerastorch's fit has patience fourth: each process refuses the path
    given as patience before training, and says what to write instead."""
    dl_train, dl_val = create_dataloaders(batch_size=64)  # upstream: 1024
    net, model = build_model()

    from accelerate import notebook_launcher

    ckpt_path = "checkpoint.pt"
    args = dict(
        train_data=dl_train,
        val_data=dl_val,
        epochs=5,
        ckpt_path=ckpt_path,
        patience=2,
        monitor="val_acc",
        mode="max",
        mixed_precision="no",
    ).values()

    with pytest.raises(ChildFailedError) as raised:
        notebook_launcher(model.fit, args, num_processes=2)

    shown = str(raised.value)  # the error the notebook shows: it carries the processes' own error
    assert "patience='checkpoint.pt' looks like a file path" in shown and "ckpt_path=" in shown
    assert not os.path.exists("checkpoint.pt")  # refused before any training: nothing written


def test_05_ddp_cell_with_fits_keywords_by_name(restarted_kernel, capfd):
    """Section 二: two processes from ``notebook_launcher``; the notebook's process reloads the
    checkpoint they wrote and evaluates it."""
    dl_train, dl_val = create_dataloaders(batch_size=64)  # upstream: 1024
    net, model = build_model()
    before = {name: tensor.clone() for name, tensor in model.net.state_dict().items()}

    from accelerate import notebook_launcher

    ckpt_path = "checkpoint.pt"
    args = dict(
        train_data=dl_train,
        val_data=dl_val,
        epochs=5,
    ).values()
    # upstream: ckpt_path, patience, monitor, mode and mixed_precision in args too; the launcher
    # passes args positionally and kerastorch's fit has patience fourth (see the test above).
    keywords = dict(ckpt_path=ckpt_path, patience=2, monitor="val_acc", mode="max", mixed_precision="no")

    def fit(*args):  # upstream: notebook_launcher(model.fit, args, num_processes=2)
        return model.fit(*args, **keywords)

    notebook_launcher(fit, args, num_processes=2)
    trained = capfd.readouterr().out  # what the processes printed (the notebook shows it under the cell)

    # The processes were forks: the notebook's model still has its first weights, and only the
    # checkpoint brings the training back, which is why the notebook reloads it.
    assert all(torch.equal(before[name], tensor) for name, tensor in model.net.state_dict().items())

    ### 4，评估模型
    model.net.load_state_dict(torch.load("checkpoint.pt"))
    print(model.evaluate(dl_val))

    # What the cell relies on: checkpoint.pt, a plain state dict that torch.load reads with its
    # defaults, holding the best epoch's weights; evaluate's dict, in the notebook's own process.
    evaluated = printed_dict(capfd.readouterr().out)
    assert list(evaluated) == ["val_loss", "val_acc"]
    assert evaluated["val_acc"] > 0.3  # it learned in the two processes: chance is 0.1
    # The processes printed each epoch's val_acc: with drop_last=True every whole validation batch
    # counts (6 rounds of 2 processes, and the 7th batch on one of them), as in one process, so the
    # reloaded checkpoint scores the best epoch's val_acc on the notebook's own dl_val.
    epochs = [(float(acc), float(loss)) for loss, acc in re.findall(r"val_loss=([0-9.]+), val_acc=([0-9.]+)", trained)]
    assert 3 <= len(epochs) <= 5
    best_acc, its_loss = max(epochs)
    assert evaluated["val_acc"] == pytest.approx(best_acc, abs=1e-3)
    assert evaluated["val_loss"] == pytest.approx(its_loss, rel=1e-3)
