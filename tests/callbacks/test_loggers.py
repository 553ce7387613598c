"""Loggers: CSVLogger, TensorBoard (read back with TensorBoard's own reader) and WandbLogger
(offline mode, only where wandb is installed)."""

from __future__ import annotations

import glob
import json
import sys

import pandas as pd
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import kerastorch as kt
from helpers import accuracy
from kerastorch.callbacks import CSVLogger, TensorBoard


def loaders(n=160, batch_size=32):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 8, generator=g)
    y = (x[:, 0] - x[:, 2] > 0).long()
    return (
        DataLoader(TensorDataset(x[:128], y[:128]), batch_size=batch_size),
        DataLoader(TensorDataset(x[128:], y[128:]), batch_size=batch_size),
    )


def make_model(seed=0):
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    return kt.KerasModel(net, nn.CrossEntropyLoss(), {"acc": accuracy}, torch.optim.SGD(net.parameters(), lr=0.2))


# -- CSVLogger --------------------------------------------------------------------------------


def test_csv_rows_are_readable_during_the_run_and_match_the_history(tmp_path):
    path = tmp_path / "logs" / "history.csv"
    read_mid_run = []
    peek = kt.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: read_mid_run.append(pd.read_csv(path)))
    train, val = loaders()
    history = make_model().fit(train, val, epochs=3, callbacks=[CSVLogger(path), peek], verbose=0)

    assert [len(frame) for frame in read_mid_run] == [1, 2, 3]
    assert list(read_mid_run[0].columns) == list(history.columns)
    pd.testing.assert_frame_equal(read_mid_run[1], history.iloc[:2], check_exact=False, rtol=1e-12)
    pd.testing.assert_frame_equal(pd.read_csv(path), history, check_exact=False, rtol=1e-12)


def test_csv_append_continues_a_file_and_refuses_other_columns(tmp_path):
    path = tmp_path / "history.csv"
    train, val = loaders()
    model = make_model()
    first = model.fit(train, val, epochs=2, callbacks=[CSVLogger(path)], verbose=0)
    second = model.fit(train, val, epochs=2, callbacks=[CSVLogger(path, append=True)], verbose=0)
    written = pd.read_csv(path)
    assert len(written) == 4 and list(written.columns) == list(first.columns)  # one header
    pd.testing.assert_frame_equal(written, pd.concat([first, second], ignore_index=True), check_exact=False, rtol=1e-12)

    content = path.read_text()
    other = kt.KerasModel(model.net, nn.CrossEntropyLoss(), {}, torch.optim.SGD(model.net.parameters(), lr=0.1))
    with pytest.raises(ValueError, match="append=True.*has the columns.*Write to another file"):
        other.fit(train, val, epochs=1, callbacks=[CSVLogger(path, append=True)], verbose=0)
    assert path.read_text() == content


def test_csv_append_with_initial_epoch_keeps_the_earlier_runs_rows(tmp_path):
    # Keras's habit: go on from a finished run with initial_epoch. Its rows are history, not a kill's leftovers.
    path = tmp_path / "history.csv"
    train, val = loaders()
    model = make_model()
    first = model.fit(train, val, epochs=3, callbacks=[CSVLogger(path, append=True)], verbose=0)
    second = model.fit(train, val, initial_epoch=2, epochs=5, callbacks=[CSVLogger(path, append=True)], verbose=0)
    written = pd.read_csv(path)
    assert written["epoch"].tolist() == [1, 2, 3, 3, 4, 5]
    pd.testing.assert_frame_equal(written, pd.concat([first, second], ignore_index=True), check_exact=False, rtol=1e-12)


def test_csv_logger_leaves_no_file_when_training_never_starts(tmp_path):
    path = tmp_path / "history.csv"
    train, val = loaders()
    with pytest.raises(ValueError, match="val_f1"):
        make_model().fit(
            train, val, epochs=2, verbose=0, callbacks=[CSVLogger(path), kt.callbacks.EarlyStopping("val_f1")]
        )
    assert not path.exists()


# -- TensorBoard -----------------------------------------------------------------------------


def read_scalars(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_tensorboard_scalars_read_back_with_tensorboards_reader(tmp_path):
    pytest.importorskip("tensorboard")
    train, val = loaders()
    read_mid_run = []
    peek = kt.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: read_mid_run.append(read_scalars(tmp_path / "val"))
    )
    history = make_model().fit(
        train, val, epochs=3, callbacks=[TensorBoard(tmp_path, histogram_freq=3), peek], verbose=0
    )

    train_run, val_run = read_scalars(tmp_path / "train"), read_scalars(tmp_path / "val")
    # One tag per quantity in each run: TensorBoard draws train and val of "loss" on one chart.
    assert sorted(train_run) == ["acc", "loss", "lr"] and sorted(val_run) == ["acc", "loss"]
    for run, stage in ((train_run, "train"), (val_run, "val")):
        for quantity in ("loss", "acc"):
            steps, values = zip(*run[quantity])
            assert steps == (1, 2, 3)
            assert values == pytest.approx(list(history[f"{stage}_{quantity}"]), rel=1e-6)
    assert [len(scalars["loss"]) for scalars in read_mid_run] == [1, 2, 3]  # flushed each epoch

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    histograms = EventAccumulator(str(tmp_path / "train"))
    histograms.Reload()
    assert sorted(histograms.Tags()["histograms"]) == ["0.bias", "0.weight", "2.bias", "2.weight"]


def test_tensorboard_without_the_package_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # as if tensorboard were not installed
    with pytest.raises(ImportError, match=r"pip install 'kerastorch\[tensorboard\]'"):
        TensorBoard("runs/never")


# -- WandbLogger -----------------------------------------------------------------------------


def test_wandb_without_the_package_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if wandb were not installed
    from kerastorch.callbacks import WandbLogger

    with pytest.raises(ImportError, match=r"pip install 'kerastorch\[wandb\]'"):
        WandbLogger()
    train, val = loaders()
    model = make_model()
    with pytest.raises(ImportError, match=r"kerastorch\[wandb\]"):
        model.fit(train, val, epochs=1, wandb=True, verbose=0)


def test_wandb_logger_writes_an_offline_run(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    train, val = loaders()
    model = make_model()
    # Offline mode through fit's own argument: wandb reads its environment only once per process.
    history = model.fit(
        train,
        val,
        epochs=2,
        verbose=0,
        wandb={"project": "kerastorch-test", "mode": "offline", "dir": str(tmp_path), "log_weights": True},
    )

    assert wandb.run is None  # the run fit started is finished
    wandb.teardown()  # wandb's service writes the run file in the background; wait for it
    run_files = glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "run-*.wandb"))
    assert len(run_files) == 1
    assert model.run_id and run_files[0].endswith(f"run-{model.run_id}.wandb")  # torchkeras's model.run_id
    data = open(run_files[0], "rb").read()
    # The run file holds each logged value as JSON text.
    for column in history.columns:
        assert column.encode() in data
    for value in history["val_loss"]:
        assert json.dumps(value).encode() in data
    assert b"best_val_loss" in data
    weights = glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "files" / "weights.safetensors"))
    assert len(weights) == 1
    from kerastorch.files.weights import load_weights

    saved = load_weights(weights[0])
    assert all(torch.equal(saved[k], v) for k, v in model.net.state_dict().items())
