"""The door: each method's signature is written once (in model.py), and every keyword it takes
reaches the data or a setting. Each table below holds, per keyword, a call that changes it and
the call it is compared with; a keyword the method gains needs a row (the first test of each
method says so)."""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch
from torch import nn

import kerastorch as kt
from helpers import accuracy, called
from kerastorch import arguments, settings


def keywords_of(method) -> set[str]:
    return set(inspect.signature(method).parameters) - {"self"}


X, Y = torch.randn(32, 4), torch.arange(32) % 3
X2, Y2 = X + 1, (torch.arange(32) + 1) % 3
VAL = (X[:8], Y[:8])


def hits(preds, labels):  # one value per sample, as weighted metrics return
    return (preds.argmax(1) == labels).float()


def model_for_keywords():
    return kt.KerasModel(nn.Linear(4, 3), nn.CrossEntropyLoss(), metrics_dict={"acc": accuracy})


def fit_rows(tmp_path):
    ckpt = str(tmp_path / "best.pt")
    return {  # keyword: (the call that changes it, the call it is compared with); both on top of BASE_FIT
        "train_data": ({"train_data": X2}, {}),
        "val_data": ({"val_data": VAL}, {}),
        "epochs": ({"epochs": 3}, {}),
        "patience": ({"patience": 2}, {}),
        "monitor": ({"monitor": "train_acc"}, {}),
        "mode": ({"mode": "max"}, {}),
        "min_delta": ({"min_delta": 0.1}, {}),
        "ckpt_path": ({"ckpt_path": ckpt}, {}),
        "resume": ({"resume": True, "ckpt_path": ckpt}, {"ckpt_path": ckpt}),
        "callbacks": ({"callbacks": [kt.callbacks.TerminateOnNaN()]}, {}),
        "verbose": ({"verbose": 2}, {}),
        "plot": ({"plot": True}, {}),
        "quiet": ({"quiet": True}, {}),
        "wandb": ({"wandb": {"mode": "offline"}}, {}),
        "accelerator": ({"accelerator": "cpu"}, {}),
        "devices": ({"devices": 1}, {}),
        "precision": ({"precision": "64-true"}, {}),
        "strategy": ({"strategy": "ddp"}, {}),
        "mixed_precision": ({"mixed_precision": "bf16"}, {}),
        "cpu": ({"cpu": True}, {}),
        "gradient_accumulation_steps": ({"gradient_accumulation_steps": 2}, {}),
        "gradient_clip_val": ({"gradient_clip_val": 1.0}, {}),
        "gradient_clip_algorithm": ({"gradient_clip_algorithm": "value"}, {}),
        "restore_best_weights": ({"restore_best_weights": False}, {}),
        "x": ({"train_data": None, "x": X}, {}),
        "y": ({"y": Y2}, {}),
        "validation_data": ({"validation_data": VAL}, {"val_data": VAL}),
        "batch_size": ({"batch_size": 8}, {}),
        "shuffle": ({"shuffle": False}, {}),
        "validation_split": ({"validation_split": 0.25}, {}),
        "class_weight": ({"class_weight": "balanced"}, {}),
        "sample_weight": ({"sample_weight": torch.full((32,), 2.0)}, {}),
        "steps_per_epoch": ({"steps_per_epoch": 2}, {}),
        "validation_freq": ({"validation_freq": 2, "val_data": VAL}, {"val_data": VAL}),
        "initial_epoch": ({"initial_epoch": 1}, {}),
        "validation_steps": ({"validation_steps": 1, "val_data": VAL}, {"val_data": VAL}),
        "validation_batch_size": ({"validation_batch_size": 4, "val_data": VAL}, {"val_data": VAL}),
        "weighted_metrics": ({"weighted_metrics": {"wacc": hits}}, {}),
        "doctor": ({"doctor": True}, {}),
        "compile": ({"compile": True}, {}),
        "fsdp_wrap": ({"strategy": "fsdp", "fsdp_wrap": [nn.Linear]}, {"strategy": "fsdp"}),
        "on_oom": ({"on_oom": "raise"}, {}),
    }


BASE_FIT = {"train_data": X, "y": Y}


def test_every_keyword_of_fit_has_a_row(tmp_path):
    assert set(fit_rows(tmp_path)) == keywords_of(kt.KerasModel.fit)


def test_every_keyword_of_fit_reaches_the_data_or_a_setting(tmp_path):
    model = model_for_keywords()

    def door(keywords):
        call = called(kt.KerasModel.fit, model, **{**BASE_FIT, **keywords})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # fsdp_wrap= is the older spelling
            return repr(arguments.fit_arguments(model, call))

    unreached = [name for name, (changed, compared) in fit_rows(tmp_path).items() if door(changed) == door(compared)]
    assert not unreached, f"these keywords change nothing that leaves the door: {unreached}"


LR_FIND_ROWS = {
    "train_data": ({"train_data": X2}, {}),
    "y": ({"y": Y2}, {}),
    "start_lr": ({"start_lr": 1e-5}, {}),
    "end_lr": ({"end_lr": 1.0}, {}),
    "num_steps": ({"num_steps": 10}, {}),
    "smoothing": ({"smoothing": 0.5}, {}),
    "diverge": ({"diverge": 2.0}, {}),
    "x": ({"train_data": None, "x": X}, {}),
    "batch_size": ({"batch_size": 8}, {}),
    "shuffle": ({"shuffle": False}, {}),
    "validation_split": ({"validation_split": 0.25}, {}),
    "sample_weight": ({"sample_weight": torch.full((32,), 2.0)}, {}),
    "accelerator": ({"accelerator": "cpu"}, {}),
    "devices": ({"devices": 1}, {}),
    "precision": ({"precision": "64-true"}, {}),
    "mixed_precision": ({"mixed_precision": "bf16"}, {}),
    "cpu": ({"cpu": True}, {}),
}

EVALUATE_ROWS = {
    "data": ({"data": X2}, {}),
    "y": ({"y": Y2}, {}),
    "batch_size": ({"batch_size": 8}, {}),
    "verbose": ({"verbose": 0}, {}),
    "sample_weight": ({"sample_weight": torch.full((32,), 2.0)}, {}),
    "steps": ({"steps": 2}, {}),
    "callbacks": ({"callbacks": [kt.callbacks.TerminateOnNaN()]}, {}),
    "return_dict": ({"return_dict": False}, {}),
    "x": ({"data": None, "x": X2}, {}),
    "val_data": ({"data": None, "val_data": X2}, {}),
    "quiet": ({"quiet": True}, {}),
}

PREDICT_ROWS = {
    "data": ({"data": X2}, {}),
    "batch_size": ({"batch_size": 8}, {}),
    "verbose": ({"verbose": 0}, {}),
    "steps": ({"steps": 2}, {}),
    "callbacks": ({"callbacks": [kt.callbacks.TerminateOnNaN()]}, {}),
    "x": ({"data": None, "x": X2}, {}),
    "concatenate": ({"concatenate": False}, {}),
}

OTHER_DOORS = {
    "lr_find": (kt.KerasModel.lr_find, arguments.finder_arguments, LR_FIND_ROWS, {"train_data": X, "y": Y}),
    "evaluate": (kt.KerasModel.evaluate, arguments.evaluate_arguments, EVALUATE_ROWS, {"data": X, "y": Y}),
    "predict": (kt.KerasModel.predict, arguments.predict_arguments, PREDICT_ROWS, {"data": X}),
}


@pytest.mark.parametrize("name", sorted(OTHER_DOORS))
def test_every_keyword_of_lr_find_evaluate_and_predict_reaches_the_data_or_a_setting(name):
    method, door, rows, base = OTHER_DOORS[name]
    assert set(rows) == keywords_of(method)
    model = model_for_keywords()

    def through_the_door(keywords):
        # repr shows tensors' values: a tensor given is not compared by ==
        return repr(door(called(method, model, **{**base, **keywords})))

    unreached = [
        key for key, (changed, compared) in rows.items() if through_the_door(changed) == through_the_door(compared)
    ]
    assert not unreached, f"these keywords of {name} change nothing that leaves the door: {unreached}"


def test_fit_one_cycle_takes_fit_s_keywords_from_fit_s_signature():
    torch.manual_seed(0)
    model = model_for_keywords()
    history = model.fit_one_cycle(X, Y, 2, max_lr=0.1, batch_size=8, verbose=0, patience=None)
    assert history["epoch"].tolist() == [1, 2] and history["lr"].iloc[-1] < 0.1
    with pytest.raises(TypeError, match="unexpected keyword argument 'batchsize'"):
        model.fit_one_cycle(X, Y, 2, max_lr=0.1, batchsize=8)
    with pytest.raises(ValueError, match=r"batch_size=0; use a whole number of samples >= 1"):
        model.fit_one_cycle(X, Y, 2, max_lr=0.1, batch_size=0)


GROUPS = {  # each group's from_keywords, and the method whose keywords it reads
    settings.MonitorSettings: kt.KerasModel.fit,
    settings.OutputSettings: kt.KerasModel.fit,
    settings.DeviceSettings: kt.KerasModel.fit,
    settings.StepSettings: kt.KerasModel.fit,
    settings.DataSettings: kt.KerasModel.fit,
    settings.FinderSettings: kt.KerasModel.lr_find,
    settings.EvaluateSettings: kt.KerasModel.evaluate,
    settings.PredictSettings: kt.KerasModel.predict,
}


@pytest.mark.parametrize("group", list(GROUPS), ids=lambda group: group.__name__)
def test_a_settings_group_is_built_by_name_from_its_method_s_keywords(group):
    """A keyword a group reads that its method does not take would never be given: a misspelt name."""
    added_by_the_door = {"lr_scheduler", "lr_scheduler_interval", "monitoring"}  # the model's, the resolved monitor
    parameters = inspect.signature(group.from_keywords).parameters.values()
    read = {p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert read and not read - keywords_of(GROUPS[group]) - added_by_the_door
    # built by name only: a group's keywords cannot be given in the wrong order
    assert all(p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.VAR_KEYWORD) for p in parameters)
