"""What torchkeras programs do that means something else here: each is said, never silently ignored."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import kerastorch as kt


def data(n=96):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=g)
    return DataLoader(TensorDataset(x, (x[:, 0] > 0).long()), batch_size=16)


def make_model(model_class=kt.KerasModel, **kwargs):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    return model_class(net, nn.CrossEntropyLoss(), optimizer=torch.optim.SGD(net.parameters(), lr=0.1), **kwargs)


def unchanged(model, before):
    return all(torch.equal(before[k], v) for k, v in model.net.state_dict().items())


@pytest.mark.parametrize("path", ["checkpoint.pt", Path("ckpt")])
def test_a_checkpoint_path_in_patiences_place_is_refused_naming_ckpt_path(path):
    model = make_model()
    before = {k: v.clone() for k, v in model.net.state_dict().items()}
    with pytest.raises(TypeError, match=r"fourth argument is patience .* Pass it by name: .*ckpt_path="):
        model.fit(data(), data(), 3, path, verbose=0)  # torchkeras's fit(train, val, epochs, ckpt_path)
    assert unchanged(model, before)


@pytest.mark.parametrize("name", ["StepRunner", "EpochRunner"])
def test_a_torchkeras_step_runner_assignment_is_refused_with_the_subclassing_recipe(name):
    class MyStepRunner:
        def __init__(
            self, net, loss_fn, accelerator=None, stage="train", metrics_dict=None, optimizer=None, lr_scheduler=None
        ):
            self.net = net

    class Model(kt.KerasModel):
        pass

    setattr(Model, name, MyStepRunner)  # torchkeras: KerasModel.StepRunner = MyStepRunner
    model = make_model(Model)
    before = {k: v.clone() for k, v in model.net.state_dict().items()}
    with pytest.raises(TypeError, match=rf"Model.{name} = 'MyStepRunner' is torchkeras's way .* override train_step"):
        model.fit(data(), epochs=1, verbose=0)
    assert unchanged(model, before)


def test_a_one_cycle_sized_in_batches_but_stepped_per_epoch_is_pointed_out():
    loader = data()
    model = make_model()
    scheduler = torch.optim.lr_scheduler.OneCycleLR(model.optimizer, max_lr=0.1, total_steps=3 * len(loader))
    model.lr_scheduler = scheduler
    with pytest.warns(UserWarning, match=r"total_steps=18 .* lr_scheduler_interval='step'"):
        model.fit(loader, epochs=3, verbose=0)
    per_step = make_model(lr_scheduler_interval="step")
    per_step.lr_scheduler = torch.optim.lr_scheduler.OneCycleLR(
        per_step.optimizer, max_lr=0.1, total_steps=3 * len(loader)
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # stepped per batch, as sized: nothing to say
        history = per_step.fit(loader, epochs=3, verbose=0)
    assert history["lr"].iloc[1] > history["lr"].iloc[0]  # the cycle climbs within the run


@pytest.mark.slow
def test_fit_ddp_is_fit_on_that_many_processes():
    model = make_model()
    history = model.fit_ddp(2, data(), data(), epochs=2, accelerator="cpu", verbose=0)
    assert list(history["epoch"]) == [1, 2] and history["val_loss"].iloc[-1] < history["val_loss"].iloc[0] + 1
    with pytest.raises(ValueError, match="pass only one of them"):
        model.fit_ddp(2, data(), epochs=1, devices=2)
