"""The torchkeras example flow runs with only the import changed."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from helpers import TorchkerasAccuracy
from kerastorch import KerasModel, summary  # was: from torchkeras import KerasModel, summary
from kerastorch.examples import create_cnn, digits_loaders


def test_torchkeras_example_flow(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    dl_train, dl_val, _ = digits_loaders(batch_size=64)
    net = create_cnn()
    features, _ = next(iter(dl_train))
    table = summary(net, input_data=features)
    assert table.total_params == sum(p.numel() for p in net.parameters())

    model = KerasModel(
        net,
        loss_fn=nn.CrossEntropyLoss(),
        optimizer=torch.optim.Adam(net.parameters(), lr=0.01),
        metrics_dict={"acc": TorchkerasAccuracy()},
    )
    dfhistory = model.fit(
        train_data=dl_train,
        val_data=dl_val,
        epochs=4,
        ckpt_path="checkpoint.pt",
        patience=3,
        monitor="val_acc",
        mode="max",
        plot=True,
        cpu=True,
        mixed_precision="no",
        quiet=True,
        gradient_accumulation_steps=1,
    )
    assert dfhistory["val_acc"].max() > 0.6
    assert (tmp_path / "checkpoint.pt").is_file()
    assert (tmp_path / "kerastorch_history.png").is_file()  # plot=True outside Jupyter

    scores = model.evaluate(dl_val)
    assert scores["val_acc"] == pytest.approx(dfhistory["val_acc"].max())

    net_clone = create_cnn()
    model_clone = KerasModel(net_clone, loss_fn=nn.CrossEntropyLoss(), metrics_dict={"acc": TorchkerasAccuracy()})
    model_clone.load_ckpt("checkpoint.pt")
    assert model_clone.evaluate(dl_val, quiet=True) == pytest.approx(scores)
