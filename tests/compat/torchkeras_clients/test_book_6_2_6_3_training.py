"""The book's chapters 6-2, "three ways to train" and 6-3, "training on the GPU"
(lyhue1991/eat_pytorch_in_20_days), their ``KerasModel`` cells with only the import changed: a
CNN in an ``nn.ModuleList`` trained with torchmetrics' multiclass ``Accuracy`` (``cpu=True``
in 6-2; on whatever accelerate finds in 6-3). MNIST (a download) is replaced by the digits
that ship with scikit-learn at MNIST's shape; 3 epochs instead of 10; the hand-written loops
before these cells use no torchkeras."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import kerastorch as torchkeras  # noqa: F401 (the one changed line: "import torchkeras")
from kerastorch.examples import digits_datasets

pytestmark = pytest.mark.slow


@pytest.fixture
def mnist_like(tmp_path, monkeypatch):
    """The chapters' dl_train / dl_val, on local digits of MNIST's shape."""
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    ds_train, ds_val, _ = digits_datasets(size=28)
    dl_train = torch.utils.data.DataLoader(ds_train, batch_size=128, shuffle=True, num_workers=2)
    dl_val = torch.utils.data.DataLoader(ds_val, batch_size=128, shuffle=False, num_workers=2)
    return dl_train, dl_val


def test_6_2_keras_model_on_a_module_list(mnist_like):
    dl_train, dl_val = mnist_like
    from kerastorch import KerasModel

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(
                [
                    nn.Conv2d(in_channels=1, out_channels=32, kernel_size=3),
                    nn.MaxPool2d(kernel_size=2, stride=2),
                    nn.Conv2d(in_channels=32, out_channels=64, kernel_size=5),
                    nn.MaxPool2d(kernel_size=2, stride=2),
                    nn.Dropout2d(p=0.1),
                    nn.AdaptiveMaxPool2d((1, 1)),
                    nn.Flatten(),
                    nn.Linear(64, 32),
                    nn.ReLU(),
                    nn.Linear(32, 10),
                ]
            )

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x

    net = Net()

    from torchmetrics import Accuracy

    keras_model = KerasModel(
        net,
        loss_fn=nn.CrossEntropyLoss(),
        metrics_dict={"acc": Accuracy(task="multiclass", num_classes=10)},
        optimizer=torch.optim.Adam(net.parameters(), lr=0.01),
    )

    dfhistory = keras_model.fit(
        train_data=dl_train,
        val_data=dl_val,
        epochs=3,  # the book: 10
        patience=3,
        monitor="val_acc",
        mode="max",
        plot=True,
        cpu=True,
    )

    # What the chapter shows: the history's columns and a net that learns the digits.
    assert list(dfhistory.columns[:1]) == ["epoch"] and len(dfhistory) == 3
    assert {"train_loss", "train_acc", "val_loss", "val_acc", "lr"} <= set(dfhistory.columns)
    assert dfhistory["val_acc"].max() > 0.5
    assert keras_model.evaluate(dl_val)["val_acc"] == pytest.approx(dfhistory["val_acc"].max())


def test_6_3_keras_model_on_the_accelerator_accelerate_finds(mnist_like):
    dl_train, dl_val = mnist_like
    import accelerate

    accelerator = accelerate.Accelerator()
    print(accelerator.device)

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

    from torchmetrics import Accuracy

    from kerastorch import KerasModel

    net = create_net()
    model = KerasModel(
        net,
        loss_fn=nn.CrossEntropyLoss(),
        metrics_dict={"acc": Accuracy(task="multiclass", num_classes=10)},
        optimizer=torch.optim.Adam(net.parameters(), lr=0.01),
    )

    dfhistory = model.fit(
        train_data=dl_train,
        val_data=dl_val,
        epochs=3,  # the book: 10
        patience=3,
        monitor="val_acc",
        mode="max",
    )

    # What the chapter shows: training on the device accelerate picked, the net left there.
    assert next(net.parameters()).device.type == accelerator.device.type
    assert model.accelerator.device.type == accelerator.device.type
    assert dfhistory["val_acc"].max() > 0.5
