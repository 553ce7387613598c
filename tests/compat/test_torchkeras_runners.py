"""torchkeras's ``KerasModel.StepRunner = MyStepRunner``: fit and evaluate run the program's own step."""

from __future__ import annotations

import pytest
import torch
import torchmetrics
from torch import nn
from torch.utils.data import DataLoader

import kerastorch as kt
from kerastorch import KerasModel
from tests.conftest import make_mlp


class StepRunner:
    """torchkeras's own StepRunner, as the book's DIN chapter copies it into the notebook."""

    built: list[str] = []  # the stage of every runner built, in order

    def __init__(
        self, net, loss_fn, accelerator=None, stage="train", metrics_dict=None, optimizer=None, lr_scheduler=None
    ):
        self.net, self.loss_fn, self.metrics_dict, self.stage = net, loss_fn, metrics_dict, stage
        self.optimizer, self.lr_scheduler = optimizer, lr_scheduler
        self.accelerator = accelerator
        StepRunner.built.append(stage)
        if self.stage == "train":
            self.net.train()
        else:
            self.net.eval()

    def __call__(self, batch):
        features, labels = batch
        with self.accelerator.autocast():
            preds = self.net(features)
            loss = self.loss_fn(preds, labels)
        if self.stage == "train" and self.optimizer is not None:
            self.accelerator.backward(loss)
            if self.accelerator.sync_gradients:
                self.accelerator.clip_grad_norm_(self.net.parameters(), 1.0)
            self.optimizer.step()
            if self.lr_scheduler is not None:
                self.lr_scheduler.step()
            self.optimizer.zero_grad()
        all_loss = self.accelerator.gather(loss).sum()
        all_preds = self.accelerator.gather(preds)
        all_labels = self.accelerator.gather(labels)
        step_losses = {self.stage + "_loss": all_loss.item()}
        step_metrics = {
            self.stage + "_" + name: metric_fn(all_preds, all_labels).item()
            for name, metric_fn in self.metrics_dict.items()
        }
        if self.stage == "train":
            step_metrics["lr"] = self.optimizer.state_dict()["param_groups"][0]["lr"] if self.optimizer else 0.0
        return step_losses, step_metrics


@pytest.fixture
def step_runner(monkeypatch):
    """``KerasModel.StepRunner = StepRunner``, as the programs write it, undone after the test."""
    StepRunner.built = []
    monkeypatch.setattr(KerasModel, "StepRunner", StepRunner)
    return StepRunner


def accuracy():
    return torchmetrics.Accuracy(task="multiclass", num_classes=10)


def digits_model(**kwargs):
    net = make_mlp()
    return KerasModel(
        net, nn.CrossEntropyLoss(), {"acc": accuracy()}, torch.optim.Adam(net.parameters(), lr=0.01), **kwargs
    )


def weights_of(model):
    return {k: v.clone() for k, v in model.net.state_dict().items()}


def same_weights(model, before):
    return all(torch.equal(before[k], v) for k, v in model.net.state_dict().items())


def test_fit_runs_the_programs_step_runner_and_keeps_its_own_loop(step_runner, loaders, tmp_path):
    dl_train, dl_val = loaders
    model = digits_model()
    model.lr_scheduler = torch.optim.lr_scheduler.StepLR(model.optimizer, step_size=len(dl_train), gamma=0.5)
    ckpt = tmp_path / "checkpoint.pt"
    history = model.fit(dl_train, dl_val, epochs=4, ckpt_path=ckpt, monitor="val_acc", mode="max", verbose=0)

    assert list(history.columns) == ["epoch", "train_loss", "train_acc", "lr", "val_loss", "val_acc"]
    assert history["val_acc"].iloc[-1] > 0.9  # it learned, through the program's step
    # A new runner per stage and epoch, after one 'val' runner that read the names before training.
    assert step_runner.built == ["val"] + ["train", "val"] * 4
    # The runner stepped the scheduler after every batch (one halving per epoch here); fit did not step it too.
    assert list(history["lr"]) == pytest.approx([0.01, 0.005, 0.0025, 0.00125])
    # The best epoch's weights are back and in the checkpoint; evaluate runs the runner too.
    best = history["val_acc"].max()
    assert model.evaluate(dl_val, quiet=True)["val_acc"] == pytest.approx(best)
    assert torch.load(ckpt, weights_only=True).keys() == model.net.state_dict().keys()


def test_an_epochs_loss_is_the_mean_over_its_samples_and_a_metric_its_compute(step_runner, digits8):
    _, ds_val = digits8
    dl_val = DataLoader(ds_val, batch_size=100)  # 449 samples: the last batch has 49
    model = digits_model()
    logs = model.evaluate(dl_val, quiet=True)

    x, y = ds_val.tensors
    model.net.eval()
    with torch.no_grad():
        preds = model.net(x)
    assert logs["val_loss"] == pytest.approx(nn.functional.cross_entropy(preds, y).item(), rel=1e-5)
    assert logs["val_acc"] == pytest.approx((preds.argmax(1) == y).float().mean().item())


def test_a_runner_without_a_loss_fn_that_logs_its_metric_as_a_loss(monkeypatch, loaders):
    # torchkeras's CRNN_CTC example: loss_fn=None, the loss computed in the runner, and the
    # accuracy put in step_losses so that it is averaged like the loss; monitor names it.
    class CTCStyleRunner:
        def __init__(
            self, net, loss_fn, accelerator, stage="train", metrics_dict=None, optimizer=None, lr_scheduler=None
        ):
            self.net, self.stage, self.optimizer, self.accelerator = net, stage, optimizer, accelerator

        def __call__(self, batch):
            images, targets = batch
            preds = self.net(images)
            loss = nn.functional.cross_entropy(preds, targets)
            acc = (preds.argmax(1) == targets).float().mean().item()
            if self.optimizer is not None and self.stage == "train":
                self.accelerator.backward(loss)
                self.optimizer.step()
                self.optimizer.zero_grad()
            return {self.stage + "_loss": self.accelerator.gather(loss).sum().item(), self.stage + "_acc": acc}, {}

    monkeypatch.setattr(KerasModel, "StepRunner", CTCStyleRunner)
    dl_train, dl_val = loaders
    net = make_mlp()
    model = KerasModel(net, loss_fn=None, optimizer=torch.optim.AdamW(net.parameters(), lr=0.01))
    history = model.fit(dl_train, dl_val, epochs=3, patience=10, monitor="val_acc", mode="max", verbose=0)
    assert list(history.columns) == ["epoch", "train_loss", "train_acc", "lr", "val_loss", "val_acc"]
    assert history["val_acc"].max() > 0.85


def test_a_monitor_the_runner_does_not_return_fails_before_training_naming_what_it_returns(step_runner, loaders):
    dl_train, dl_val = loaders
    model = digits_model()
    before = weights_of(model)
    with pytest.raises(ValueError, match=r"monitor='val_accuracy' is not a value .* returned: .*val_acc.* 'val_acc'\?"):
        model.fit(dl_train, dl_val, epochs=2, monitor="val_accuracy", verbose=0)
    assert same_weights(model, before)
    assert step_runner.built == ["val"]  # only the look at the names: no training runner was built


@pytest.mark.parametrize(
    "fit_kwargs, named, instead",
    [
        ({"gradient_accumulation_steps": 2}, "gradient_accumulation_steps", "do it in the runner"),
        ({"gradient_clip_val": 1.0}, "gradient_clip_val", r"clip_grad_norm_\(self.net.parameters\(\), 1.0\)"),
        ({"class_weight": "balanced"}, "class_weight", "weight the loss in the runner"),
        ({"mixed_precision": "fp16"}, "precision='16-mixed'", "precision='bf16-mixed'"),
    ],
)
def test_what_fits_own_step_would_add_is_refused_with_what_to_do(step_runner, loaders, fit_kwargs, named, instead):
    dl_train, dl_val = loaders
    model = digits_model()
    before = weights_of(model)
    with pytest.raises(
        ValueError,
        match=rf"{named}: a torchkeras StepRunner \(StepRunner\) runs the whole step .*{instead}.* train_step",
    ):
        model.fit(dl_train, dl_val, epochs=1, verbose=0, **fit_kwargs)
    assert same_weights(model, before) and step_runner.built == []


def test_a_callback_acting_inside_the_step_is_refused(step_runner, loaders):
    dl_train, dl_val = loaders
    model = digits_model()
    with pytest.raises(ValueError, match=r"EMA acts inside the training step"):
        model.fit(dl_train, dl_val, epochs=1, verbose=0, callbacks=[kt.callbacks.EMA(0.9)])
    watch = kt.Callback()
    watch.on_after_backward = lambda: None  # a hook set on the instance counts too
    with pytest.raises(ValueError, match=r"Callback acts inside the training step \(on_after_backward\)"):
        model.fit(dl_train, dl_val, epochs=1, verbose=0, callbacks=[watch])


def test_a_runner_that_returns_something_else_fails_on_the_first_batch_before_training(monkeypatch, loaders):
    class OneDictRunner(StepRunner):
        def __call__(self, batch):
            losses, metrics = super().__call__(batch)
            return {**losses, **metrics}

    monkeypatch.setattr(KerasModel, "StepRunner", OneDictRunner)
    dl_train, dl_val = loaders
    model = digits_model()
    before = weights_of(model)
    with pytest.raises(
        TypeError, match=r"OneDictRunner failed on the first batch.* returned a dict; .* returns two dicts"
    ):
        model.fit(dl_train, dl_val, epochs=1, verbose=0)
    assert same_weights(model, before)


def test_the_programs_epoch_runner_makes_each_epochs_values(monkeypatch, step_runner, loaders):
    class EpochRunner:  # as torchkeras's reinforcement-learning examples: it reads and sets loader attributes
        def __init__(self, steprunner, quiet=False):
            self.steprunner, self.stage = steprunner, steprunner.stage

        def __call__(self, dataloader):
            dataloader.agent = self.steprunner.net
            total, batches = 0.0, 0
            for batch in dataloader:
                step_losses, _ = self.steprunner(batch)
                total, batches = total + step_losses[self.stage + "_loss"], batches + 1
            return {self.stage + "_loss": total / batches, self.stage + "_batches": batches}

    monkeypatch.setattr(KerasModel, "EpochRunner", EpochRunner)
    dl_train, dl_val = loaders
    model = digits_model()
    history = model.fit(dl_train, dl_val, epochs=2, patience=None, verbose=0)
    assert list(history["train_batches"]) == [len(dl_train)] * 2 and list(history["val_batches"]) == [len(dl_val)] * 2
    assert history["val_loss"].iloc[1] < history["val_loss"].iloc[0]
    assert dl_train.agent is model.net  # the attribute reached the program's loader


def test_with_an_epoch_runner_a_monitor_it_does_not_return_fails_after_one_epoch_with_the_weights_put_back(
    monkeypatch, step_runner, loaders
):
    class EpochRunner:  # its names are known only once it ran an epoch
        def __init__(self, steprunner, quiet=False):
            self.steprunner, self.stage = steprunner, steprunner.stage

        def __call__(self, dataloader):
            losses = [self.steprunner(batch)[0][self.stage + "_loss"] for batch in dataloader]
            return {self.stage + "_loss": sum(losses) / len(losses)}

    monkeypatch.setattr(KerasModel, "EpochRunner", EpochRunner)
    dl_train, dl_val = loaders
    model = digits_model()
    before = weights_of(model)
    with pytest.raises(
        ValueError,
        match=r"monitor='val_acc' is not a value .* after the first epoch it returned: "
        r"train_loss, lr, val_loss\. Pass monitor= one of those",
    ):
        model.fit(dl_train, dl_val, epochs=3, monitor="val_acc", verbose=0)
    assert step_runner.built == ["train", "val"]  # one epoch, no more
    assert same_weights(model, before)


def test_an_epoch_runner_without_a_step_runner_is_refused(monkeypatch, loaders):
    monkeypatch.setattr(KerasModel, "EpochRunner", type("EpochRunner", (), {}))
    with pytest.raises(TypeError, match=r"EpochRunner is set but StepRunner is not"):
        digits_model().fit(*loaders, epochs=1, verbose=0)


class SampleCount(nn.Module):
    """A metric in torchkeras's pattern (forward / compute / reset) that counts the samples it saw."""

    def __init__(self):
        super().__init__()
        self.register_buffer("seen", torch.tensor(0))

    def forward(self, preds, labels):
        self.seen += labels.shape[0]
        return torch.tensor(labels.shape[0])

    def compute(self):
        return self.seen

    def reset(self):
        self.seen.zero_()


@pytest.mark.slow
def test_the_programs_runner_in_two_processes_gives_one_history_and_the_best_weights(step_runner, loaders):
    dl_train, dl_val = loaders  # 1348 and 449 samples: uneven over 2 processes in batches of 64 and 50
    model = digits_model()
    model.metrics_dict["n"] = SampleCount()
    history = model.fit(dl_train, dl_val, epochs=3, monitor="val_acc", devices=2, accelerator="cpu", verbose=0)
    assert history["val_acc"].max() > 0.85
    # The processes ran as many batches each (the runner gathers at every one), evened out with
    # repeated samples that the runner's gather dropped again: each sample counted once.
    assert list(history["train_n"]) == [1348] * 3 and list(history["val_n"]) == [449] * 3
    # The runner gathered the predictions of both processes: its accuracy is over every sample, as here.
    assert model.evaluate(dl_val, quiet=True)["val_acc"] == pytest.approx(history["val_acc"].max())
