"""Trackers: MLflow's status from how fit ended, a store lost mid-run, Optuna over several processes."""

from __future__ import annotations

import os

import pytest
from small_runs import digits_model, same, weights_of

import kerastorch as kt

# -- 8, 17, 18. trackers: MLflow's status and a lost store, Optuna over several processes ---------


@pytest.mark.slow
def test_mlflow_status_comes_from_how_fit_ended_not_from_an_error_the_caller_is_handling(digits, tmp_path):
    mlflow = pytest.importorskip("mlflow")
    from kerastorch.callbacks import MLflowLogger

    uri = f"sqlite:///{tmp_path / 'store.db'}"
    logger = MLflowLogger(experiment="digits", tracking_uri=uri)
    try:
        raise KeyError("the caller's own error, handled")
    except KeyError:  # a notebook's retry loop, a fallback: fit inside an except block
        history = digits_model().fit(*digits, epochs=2, verbose=0, callbacks=[logger])
    assert len(history) == 2
    assert mlflow.tracking.MlflowClient(tracking_uri=uri).get_run(logger.run_id).info.status == "FINISHED"


class BreakTheStore(kt.Callback):
    """The tracking store becomes unreadable after the given epoch (a lost server, a full disk)."""

    def __init__(self, path, epoch):
        self.path, self.epoch = path, epoch

    def on_epoch_end(self, epoch, logs=None):
        if epoch == self.epoch:
            with open(self.path, "r+b") as f:
                f.write(b"not a database" * 1000)


@pytest.mark.slow
def test_a_tracking_store_lost_mid_run_loses_no_training(digits, tmp_path):
    pytest.importorskip("mlflow")
    from kerastorch.callbacks import MLflowLogger
    from kerastorch.files.state import load_state_file, training_state_path

    store = tmp_path / "store.db"
    ckpt = tmp_path / "best.safetensors"
    logger = MLflowLogger(experiment="digits", tracking_uri=f"sqlite:///{store}")
    with pytest.warns(UserWarning, match="(?s)MLflow store failed after epoch 2.*the training goes on") as caught:
        history = digits_model().fit(
            *digits, epochs=4, verbose=0, ckpt_path=ckpt, resume=True, callbacks=[BreakTheStore(store, 2), logger]
        )
    assert len(history) == 4 and os.path.exists(ckpt)
    assert load_state_file(training_state_path(ckpt))["epoch"] == 4
    said = [str(w.message) for w in caught if "MLflowLogger" in str(w.message)]
    assert "not a database" in said[0] and "not ended as FINISHED" in said[1]


@pytest.mark.slow
def test_optuna_pruning_over_several_processes_is_refused_before_training(digits):
    optuna = pytest.importorskip("optuna")
    from kerastorch.callbacks import OptunaPruning

    trial = optuna.create_study().ask()
    model = digits_model()
    before = weights_of(model.net)
    with pytest.raises(ValueError, match=r"OptunaPruning.*devices=2.*devices=1"):
        model.fit(*digits, epochs=2, verbose=0, accelerator="cpu", devices=2, callbacks=[OptunaPruning(trial)])
    assert same(weights_of(model.net), before)
