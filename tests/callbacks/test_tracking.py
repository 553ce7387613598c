"""MLflowLogger and OptunaPruning against their real back ends: an MLflow store in a temporary
folder read back with MLflow's own client, and an Optuna study on SQLite."""

from __future__ import annotations

import pytest
import torch
import torchmetrics
from safetensors.torch import load_file
from torch import nn

import kerastorch as kt
from kerastorch.callbacks import MLflowLogger, OptunaPruning
from kerastorch.examples import digits_loaders

mlflow = pytest.importorskip("mlflow", reason="mlflow is in the test extra")
optuna = pytest.importorskip("optuna", reason="optuna is in the test extra")

pytestmark = pytest.mark.slow  # importing mlflow alone takes seconds


@pytest.fixture(scope="module")
def loaders():
    return digits_loaders(batch_size=64, size=8)[:2]  # train and validation


def make_model(lr=1e-2):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    metrics = {"acc": torchmetrics.Accuracy(task="multiclass", num_classes=10)}
    return kt.KerasModel(net, nn.CrossEntropyLoss(), metrics, torch.optim.Adam(net.parameters(), lr=lr))


def test_mlflow_logs_parameters_every_epoch_and_the_best_weights(loaders, tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    logger = MLflowLogger(experiment="digits", tracking_uri=uri, params={"seed": 0})
    model = make_model()
    history = model.fit(*loaders, epochs=4, patience=None, monitor="val_acc", verbose=0, callbacks=[logger])

    client = mlflow.tracking.MlflowClient(tracking_uri=uri)
    run = client.get_run(logger.run_id)
    assert run.info.status == "FINISHED"
    assert client.get_experiment(run.info.experiment_id).name == "digits"
    params = run.data.params
    assert params["epochs"] == "4" and params["monitor"] == "val_acc" and params["optimizer"] == "Adam"
    assert params["optimizer.lr"] == "0.01" and params["seed"] == "0" and params["metrics"] == "acc"
    assert int(params["net_parameters"]) == sum(p.numel() for p in model.net.parameters())
    for name in ("train_loss", "train_acc", "val_loss", "val_acc", "lr"):
        points = client.get_metric_history(logger.run_id, name)
        assert [p.step for p in points] == [1, 2, 3, 4], name
        assert [p.value for p in points] == pytest.approx(history[name].tolist()), name
    # The artifact is the best epoch's weights: the ones the net holds after fit.
    local = client.download_artifacts(logger.run_id, "best.safetensors", str(tmp_path))
    saved = load_file(local)
    assert all(torch.equal(saved[k], v) for k, v in model.net.state_dict().items())


def test_mlflow_ends_the_run_as_killed_on_ctrl_c_and_failed_on_an_error(loaders, tmp_path):
    uri = f"sqlite:///{tmp_path / 'store.db'}"

    class Interrupt(kt.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 2:
                raise KeyboardInterrupt

    class Breaks(kt.Callback):
        def on_epoch_end(self, epoch, logs=None):
            raise RuntimeError("a broken callback")

    killed = MLflowLogger(experiment="digits", tracking_uri=uri)
    history = make_model().fit(*loaders, epochs=5, verbose=0, callbacks=[killed, Interrupt()])
    assert len(history) == 2
    failed = MLflowLogger(experiment="digits", tracking_uri=uri)
    with pytest.raises(RuntimeError, match="a broken callback"):
        make_model().fit(*loaders, epochs=5, verbose=0, callbacks=[failed, Breaks()])

    client = mlflow.tracking.MlflowClient(tracking_uri=uri)
    assert client.get_run(killed.run_id).info.status == "KILLED"
    assert len(client.get_metric_history(killed.run_id, "val_loss")) == 2
    assert client.get_run(failed.run_id).info.status == "FAILED"


def test_optuna_prunes_a_hopeless_trial_cleanly_and_completes_a_good_one(loaders, tmp_path):
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    # A trial whose val_acc is under 0.5 after an epoch is pruned; the first trial learns
    # nothing (lr 1e-7), the second learns.
    study = optuna.create_study(
        study_name="digits", storage=storage, direction="maximize", pruner=optuna.pruners.ThresholdPruner(lower=0.5)
    )
    study.enqueue_trial({"lr": 1e-7})
    study.enqueue_trial({"lr": 1e-2})
    seen = {}

    def objective(trial):
        model = make_model(lr=trial.suggest_float("lr", 1e-7, 1e-1, log=True))
        ckpt = tmp_path / f"trial{trial.number}.safetensors"
        try:
            history = model.fit(*loaders, epochs=4, patience=None, monitor="val_acc", ckpt_path=ckpt, verbose=0,
                                callbacks=[OptunaPruning(trial)])  # fmt: skip
        finally:
            seen[trial.number] = (model, ckpt)
        return history["val_acc"].max()

    study.optimize(objective, n_trials=2)

    trials = optuna.load_study(study_name="digits", storage=storage).trials
    assert [t.state for t in trials] == [optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.COMPLETE]
    assert list(trials[0].intermediate_values) == [1]  # stopped after the first epoch
    assert list(trials[1].intermediate_values) == [1, 2, 3, 4]
    assert trials[1].value == pytest.approx(max(trials[1].intermediate_values.values()))
    # The pruned run stopped like an early stop: its history, its best weights, a whole file.
    pruned, ckpt = seen[0]
    assert len(pruned.history) == 1
    saved = load_file(ckpt)
    assert all(torch.equal(saved[k], v) for k, v in pruned.net.state_dict().items())
    assert not list(tmp_path.glob(".*.tmp"))


def test_optuna_pruning_refuses_a_value_the_run_does_not_log(loaders):
    study = optuna.create_study()
    trial = study.ask()
    with pytest.raises(ValueError, match=r"OptunaPruning\(monitor='val_f1'\): this run logs"):
        make_model().fit(*loaders, epochs=1, verbose=0, callbacks=[OptunaPruning(trial, monitor="val_f1")])


def test_under_two_processes_only_the_main_one_logs_to_mlflow(loaders, tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    history = make_model().fit(
        *loaders,
        epochs=2,
        accelerator="cpu",
        devices=2,
        verbose=0,
        callbacks=[MLflowLogger(experiment="digits", tracking_uri=uri)],
    )
    client = mlflow.tracking.MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("digits").experiment_id])
    assert run.info.status == "FINISHED"
    points = client.get_metric_history(run.info.run_id, "val_loss")
    assert [p.value for p in points] == pytest.approx(history["val_loss"].tolist())
