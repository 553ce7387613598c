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


def test_a_warm_restart_period_shorter_than_the_run_is_pointed_out_and_is_what_happens():
    model = make_model()
    model.lr_scheduler = torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(model.optimizer, T_0=2)
    with pytest.warns(UserWarning, match=r"T_0=2; .* restarts 1 time in 3 epochs .* lr_scheduler_interval='step'"):
        history = model.fit(data(), epochs=3, patience=None, verbose=0)
    lr = list(history["lr"])
    assert lr[1] < lr[0] and lr[2] == pytest.approx(lr[0])  # what the warning said: a restart after epoch 2


def test_a_cosine_sized_in_batches_is_pointed_out_and_one_sized_in_epochs_is_not():
    loader = data()
    model = make_model()
    model.lr_scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(model.optimizer, T_max=3 * len(loader))
    with pytest.warns(UserWarning, match=r"T_max=18 .* \(3 epochs\), so the rate would stop partway"):
        history = model.fit(loader, epochs=3, patience=None, verbose=0)
    assert history["lr"].iloc[-1] > 0.05  # barely down from 0.1: the cosine was a sixth done
    for sizes_in_epochs in (
        lambda optimizer: torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=3),
        lambda optimizer: torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(optimizer, T_0=3),
    ):
        fitting = make_model()
        fitting.lr_scheduler = sizes_in_epochs(fitting.optimizer)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # sized in epochs: nothing to say
            fitting.fit(loader, epochs=3, patience=None, verbose=0)


@pytest.mark.slow
def test_fit_ddp_is_fit_on_that_many_processes():
    model = make_model()
    history = model.fit_ddp(2, data(), data(), epochs=2, accelerator="cpu", verbose=0)
    assert list(history["epoch"]) == [1, 2] and history["val_loss"].iloc[-1] < history["val_loss"].iloc[0] + 1
    with pytest.raises(ValueError, match="pass only one of them"):
        model.fit_ddp(2, data(), epochs=1, devices=2)


@pytest.mark.slow
def test_model_fit_under_accelerates_notebook_launcher_trains_in_processes_that_write_the_checkpoint(tmp_path):
    from accelerate import notebook_launcher

    ckpt_path = tmp_path / "checkpoint.pt"
    # As the notebook's first cell: a fit in this process, and an evaluate that prints. The
    # finished run must not leave accelerate's state behind for the launcher's forks to inherit.
    first = make_model()
    first.fit(data(), data(), epochs=1, accelerator="cpu", verbose=0)
    first.evaluate(data())
    model = make_model()
    before = {k: v.clone() for k, v in model.net.state_dict().items()}

    def train(train_data, val_data, epochs):  # the launcher passes positional arguments only
        model.fit(train_data, val_data, epochs, ckpt_path=ckpt_path, accelerator="cpu", verbose=0)

    notebook_launcher(train, (data(), data(), 2), num_processes=2)  # as torchkeras's notebook 05 does
    # The processes were forks of this one: their weights come back through the checkpoint only.
    assert unchanged(model, before)
    model.net.load_state_dict(torch.load(ckpt_path, weights_only=True))
    same_run = make_model().fit_ddp(2, data(), data(), epochs=2, accelerator="cpu", verbose=0)
    assert model.evaluate(data(), quiet=True)["val_loss"] == pytest.approx(same_run["val_loss"].min())


def test_the_model_answers_the_net_calls_torchkeras_programs_make():
    model = make_model()
    net = model.net
    x = torch.randn(5, 4)
    assert torch.equal(model(x), net(x)) and torch.equal(model.forward(x), net(x))
    assert list(model.parameters()) == list(net.parameters())
    assert [name for name, _ in model.named_parameters()] == [name for name, _ in net.named_parameters()]
    assert model.eval() is model and not net.training
    assert model.train() is model and net.training
    assert model.to("cpu") is model
    state = model.state_dict()
    assert list(state) == list(net.state_dict())  # the net's own keys, as checkpoints hold them
    model.load_state_dict({k: torch.zeros_like(v) for k, v in state.items()})
    assert all(not p.any() for p in net.parameters())


@pytest.mark.parametrize("name, torch_format", [("checkpoint.pt", True), ("ckpt", True), ("best.safetensors", False)])
def test_checkpoints_are_in_the_format_their_name_says(tmp_path, name, torch_format):
    from safetensors.torch import load_file

    model = make_model()
    history = model.fit(data(), data(), epochs=3, ckpt_path=tmp_path / name, monitor="val_loss", verbose=0)
    path = tmp_path / name
    if torch_format:  # what torchkeras programs do: net.load_state_dict(torch.load(ckpt_path))
        state = torch.load(path, weights_only=True)
    else:
        state = load_file(path)
    fresh = make_model()
    fresh.net.load_state_dict(state)
    assert fresh.evaluate(data(), quiet=True)["val_loss"] == pytest.approx(history["val_loss"].min())
    other = make_model()
    other.load_ckpt(path)  # load_ckpt reads both, without unpickling code
    assert all(torch.equal(a, b) for a, b in zip(other.net.parameters(), fresh.net.parameters()))


def test_a_loss_that_closes_over_the_net_and_a_net_taking_one_tuple_train():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))

    def regularised(preds, labels):  # torchkeras programs add an L2 term through the net
        return nn.functional.cross_entropy(preds, labels) + 1e-3 * sum((p**2).sum() for p in net.parameters())

    model = kt.KerasModel(net, regularised, optimizer=torch.optim.Adam(net.parameters(), lr=1e-2))
    history = model.fit(data(), data(), epochs=5, patience=None, verbose=0)
    assert history["val_loss"].iloc[-1] < history["val_loss"].iloc[0]

    class NumAndCat(nn.Module):  # one input: a tuple (x_num, x_cat)
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(3, 2)
            self.head = nn.Linear(4 + 2, 2)

        def forward(self, inputs):
            x_num, x_cat = inputs
            return self.head(torch.cat([x_num, self.embed(x_cat)], dim=1))

    g = torch.Generator().manual_seed(0)
    x_num, x_cat = torch.randn(96, 4, generator=g), torch.randint(0, 3, (96,), generator=g)
    y = ((x_num[:, 0] > 0) ^ (x_cat == 1)).long()
    batches = [((x_num[i : i + 16], x_cat[i : i + 16]), y[i : i + 16]) for i in range(0, 96, 16)]
    torch.manual_seed(0)
    tuple_model = kt.KerasModel(NumAndCat(), nn.CrossEntropyLoss(), optimizer=None)
    tuple_history = tuple_model.fit(batches, batches, epochs=8, patience=None, verbose=0)
    assert tuple_history["val_loss"].iloc[-1] < tuple_history["val_loss"].iloc[0]


def test_model_accelerator_during_fit_is_accelerates_and_after_it_answers_for_this_process(tmp_path):
    seen = {}

    class Look(kt.Callback):
        def on_epoch_end(self, epoch, logs=None):
            accelerator = self.model.accelerator
            seen["type"] = type(accelerator).__name__
            seen["device"] = accelerator.device
            seen["main"] = accelerator.is_main_process

    model = make_model()
    model.fit(data(), epochs=1, verbose=0, callbacks=[Look()])
    assert seen == {"type": "Accelerator", "device": torch.device("cpu"), "main": True}
    # After fit, what torchkeras programs do with it still works, for this one process.
    accelerator = model.accelerator
    assert accelerator.device == next(model.net.parameters()).device and accelerator.is_main_process
    net = accelerator.unwrap_model(model.net)
    accelerator.save(accelerator.get_state_dict(net), tmp_path / "net.pt")
    assert set(torch.load(tmp_path / "net.pt", weights_only=True)) == set(model.net.state_dict())
    loader = data()
    assert accelerator.prepare(loader) is loader
