"""kerastorch.kerascallbacks: torchkeras's callbacks by name and arguments, writing torchkeras's files."""

from __future__ import annotations

import glob
import os

import pandas as pd
import pytest
import torch
from torch import nn

import kerastorch as kt
from kerastorch.examples import digits_loaders
from kerastorch.kerascallbacks import EpochCheckpoint, TensorBoardCallback, VisDisplay, VisMetric, VisProgress


@pytest.fixture(scope="module")
def loaders():
    return digits_loaders(batch_size=64, size=8)[:2]  # train and validation


def make_model():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    return kt.KerasModel(net, nn.CrossEntropyLoss(), optimizer=torch.optim.Adam(net.parameters(), lr=1e-2))


def test_torchkeras_callbacks_run_and_write_torchkeras_files(loaders, tmp_path, monkeypatch):
    pytest.importorskip("tensorboard", reason="the tensorboard extra is in the test extra")
    monkeypatch.chdir(tmp_path)
    shown = []

    def display_fn(model):  # torchkeras display functions read model.history as a dict of lists
        shown.append(list(model.history.get("epoch", [])) if hasattr(model, "history") else None)

    tensorboard = TensorBoardCallback(save_dir="runs", model_name="digits", log_weight=True, log_weight_freq=2)
    model = make_model()
    history = model.fit(
        *loaders,
        epochs=4,
        patience=None,
        verbose=0,
        callbacks=[
            tensorboard,
            EpochCheckpoint(ckpt_dir="weights", save_freq=1, max_ckpt=2),
            VisMetric(save_path="history.png"),
            VisProgress(),
            VisDisplay(display_fn, dis_period=2),
        ],
    )
    # TensorBoard: events and the history under save_dir/model_name/<time>/
    assert tensorboard.log_path.startswith(os.path.join("runs", "digits"))
    assert glob.glob(os.path.join(tensorboard.log_path, "**", "events.out.tfevents.*"), recursive=True)
    saved_history = pd.read_csv(os.path.join(tensorboard.log_path, "dfhistory.csv"))
    assert saved_history["val_loss"].tolist() == pytest.approx(history["val_loss"].tolist())
    # EpochCheckpoint: the last two epochs' checkpoint_epoch<N>.pt, which torch.load reads
    assert sorted(os.listdir("weights")) == ["checkpoint_epoch3.pt", "checkpoint_epoch4.pt"]
    state = torch.load(os.path.join("weights", "checkpoint_epoch4.pt"), weights_only=True)
    assert set(state) == set(model.net.state_dict())
    # VisMetric: the plot saved where torchkeras saves it
    assert os.path.getsize("history.png") > 1000
    # VisDisplay: before training, then every 2 epochs, with the history so far
    assert shown == [[], [1, 2], [1, 2, 3, 4]]


def test_wandb_callback_is_an_offline_wandb_run_with_the_best_weights(loaders, tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    from kerastorch.kerascallbacks import WandbCallback

    monkeypatch.setenv("WANDB_SILENT", "true")
    callback = WandbCallback(project="kerastorch-test", config={"lr": 1e-2}, name="digits", save_ckpt=True,
                             save_code=False, mode="offline", dir=str(tmp_path))  # fmt: skip
    model = make_model()
    model.fit(*loaders, epochs=2, verbose=0, callbacks=[callback])
    assert wandb.run is None  # finished with fit
    wandb.teardown()
    assert len(glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "run-*.wandb"))) == 1
    assert len(glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "files" / "weights.safetensors"))) == 1
