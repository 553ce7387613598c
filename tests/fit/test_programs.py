"""Programs practitioners write, run the obvious way: a Hugging Face model with its own loss, a GAN
through ``train_step`` alone, timm's schedulers, PyTorch's text tutorial (labels first), a regression
with a 1-D ``y`` and multi-label 0/1 integer labels; and what each of them relies on."""

from __future__ import annotations

import doctest
import math
import os
import runpy
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Optional

import numpy as np
import pytest
import torch
import torchmetrics
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import kerastorch as kt
from kerastorch.helpers.modes import eval_mode

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def run_example(name: str) -> dict:
    """Run ``examples/<name>.py`` as a script, in this process; return its globals."""
    torch.manual_seed(0)
    return runpy.run_path(str(EXAMPLES / f"{name}.py"), run_name="__main__")


def weights_of(net: nn.Module) -> dict:
    return {k: v.detach().clone() for k, v in net.state_dict().items()}


def same_weights(net: nn.Module, before: dict) -> bool:
    return all(torch.equal(before[k], v) for k, v in net.state_dict().items())


# -- Hugging Face: the model's own loss, its logits for the metrics and predict ----------------------


@pytest.mark.slow
def test_a_hugging_face_model_fine_tunes_with_its_own_loss_metrics_early_stopping_and_predict(capsys):
    pytest.importorskip("transformers")
    found = run_example("huggingface_text")
    history, model, labels = found["history"], found["model"], found["labels"]
    out = capsys.readouterr().out
    assert "No loss_fn: the net computes its own loss" in out and "'labels', included" in out
    assert history["val_acc"].max() == 1.0 and len(history) < 10  # learned, then stopped early
    logits = found["logits"]
    assert isinstance(logits, torch.Tensor) and logits.shape == (128, 2)
    assert (logits.argmax(1) == labels[384:]).float().mean() == 1.0
    # The loss in the history is the model's own: evaluate gives the best epoch's val_loss back.
    best = history.loc[history["val_acc"].idxmax()]
    assert model.evaluate(found["dl_val"], quiet=True)["val_loss"] == pytest.approx(best["val_loss"], rel=1e-5)


@pytest.mark.slow
def test_a_hugging_face_model_with_a_loss_fn_is_called_without_labels_and_its_logits_meet_the_loss():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=8, num_labels=3,
    )  # fmt: skip
    net = transformers.BertForSequenceClassification(config)
    seen = []
    net.register_forward_pre_hook(lambda module, args, kwargs: seen.append(sorted(kwargs)), with_kwargs=True)
    ids = torch.randint(0, 32, (64, 8))
    rows = [{"input_ids": ids[i], "labels": i % 3} for i in range(64)]
    model = kt.KerasModel(net, nn.CrossEntropyLoss(), {"acc": torchmetrics.Accuracy(task="multiclass", num_classes=3)})
    before = model.evaluate(DataLoader(rows, batch_size=64), quiet=True)["val_loss"]
    with torch.no_grad(), eval_mode(net):  # evaluate's mode: no dropout
        expected = nn.functional.cross_entropy(net(input_ids=ids).logits, torch.arange(64) % 3).item()
    assert before == pytest.approx(expected, rel=1e-5)
    assert seen[0] == ["input_ids"]  # the labels went to the loss, not to the net
    history = model.fit(DataLoader(rows, batch_size=16), epochs=2, verbose=0)
    assert list(history.columns) == ["epoch", "train_loss", "train_acc", "lr"]


def test_a_net_that_returns_its_own_loss_in_a_dict_trains_without_loss_fn():
    # Any net may compute its loss: a dict batch goes to it whole, and its output's "loss" is used.
    class Regressor(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(3, 1)

        def forward(self, x, labels=None):  # as Hugging Face models: a loss when given the labels
            logits = self.linear(x).squeeze(1)
            return {"loss": None if labels is None else nn.functional.mse_loss(logits, labels), "logits": logits}

    torch.manual_seed(0)
    x = torch.randn(64, 3)
    y = x @ torch.tensor([1.0, -2.0, 0.5])
    rows = [{"x": x[i], "labels": y[i]} for i in range(64)]
    net = Regressor()
    model = kt.KerasModel(net, optimizer=torch.optim.SGD(net.parameters(), lr=0.3))
    history = model.fit(DataLoader(rows, batch_size=16), epochs=8, verbose=0)
    assert history["train_loss"].iloc[-1] < 1e-3 * y.var().item()
    assert model.predict(DataLoader(rows, batch_size=16)).shape == (64,)  # its "logits", labels left out


class SpanFinder(nn.Module):
    """A question-answering net as Hugging Face's: a loss when given both ends of the answer."""

    def __init__(self, length=6):
        super().__init__()
        self.ends = nn.Linear(4, 2)
        self.length = length

    def forward(self, tokens, start_positions=None, end_positions=None):
        start_logits, end_logits = self.ends(tokens).unbind(-1)
        loss = None
        if start_positions is not None and end_positions is not None:
            loss = (
                nn.functional.cross_entropy(start_logits, start_positions)
                + nn.functional.cross_entropy(end_logits, end_positions)
            ) / 2
        return {"loss": loss, "start_logits": start_logits, "end_logits": end_logits}


def answer_spans(n=32, length=6):
    g = torch.Generator().manual_seed(0)
    tokens = torch.randn(n, length, 4, generator=g)
    start = tokens[:, :, 0].argmax(1)
    return [{"tokens": tokens[i], "start_positions": start[i], "end_positions": start[i]} for i in range(n)]


def test_a_question_answering_batch_refused_for_its_labels_offers_the_labels_at_that_trains_it():
    torch.manual_seed(0)
    net = SpanFinder()
    before = weights_of(net)
    data = DataLoader(answer_spans(), batch_size=8)
    with pytest.raises(ValueError) as refused:
        kt.KerasModel(net, loss_fn=None).fit(data, epochs=1, verbose=0)
    message = str(refused.value)
    assert "which has no labels" in message
    assert "Its keys 'start_positions' and 'end_positions' are the labels of a question-answering model" in message
    assert "pass labels_at='start_positions'" in message and "'end_positions' included" in message
    assert same_weights(net, before)

    # What it offers trains: the net gets both keys and its own loss is the history's train_loss.
    model = kt.KerasModel(
        net, loss_fn=None, optimizer=torch.optim.Adam(net.parameters(), lr=0.05), labels_at="start_positions"
    )
    history = model.fit(data, epochs=5, verbose=0)
    assert history["train_loss"].iloc[-1] < 0.8 * history["train_loss"].iloc[0]


def test_a_dict_batch_with_a_key_named_like_labels_is_told_about_it():
    rows = [{"x": torch.randn(3), "class_label": 1} for _ in range(8)]
    with pytest.raises(ValueError, match=r"Its key 'class_label' looks like labels: pass labels_at='class_label'"):
        kt.KerasModel(nn.Linear(3, 2), nn.CrossEntropyLoss()).fit(DataLoader(rows, batch_size=4), verbose=0)


@pytest.mark.slow
def test_a_hugging_face_question_answering_model_trains_with_the_labels_at_its_refusal_offers():
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=16,
    )  # fmt: skip
    torch.manual_seed(0)
    net = transformers.BertForQuestionAnswering(config)  # built from its config: nothing downloaded
    ids = torch.randint(0, 50, (32, 12))
    rows = [
        {"input_ids": ids[i], "attention_mask": torch.ones(12, dtype=torch.long),
         "start_positions": torch.tensor(i % 12), "end_positions": torch.tensor((i + 2) % 12)}
        for i in range(32)
    ]  # fmt: skip
    data = DataLoader(rows, batch_size=8)
    with pytest.raises(ValueError, match=r"pass labels_at='start_positions'") as refused:
        kt.KerasModel(net, loss_fn=None).fit(data, epochs=1, verbose=0)
    assert "'end_positions' included" in str(refused.value)
    model = kt.KerasModel(net, loss_fn=None, labels_at="start_positions")
    history = model.fit(data, epochs=2, verbose=0)
    assert list(history.columns) == ["epoch", "train_loss", "lr"] and history["train_loss"].notna().all()
    net.eval()
    with torch.no_grad():  # the model's own loss of both ends, as Hugging Face computes it, batch by batch
        own = torch.stack([net(**batch).loss for batch in data]).mean().item()
    assert model.evaluate(data, quiet=True)["val_loss"] == pytest.approx(own, rel=1e-5)


def test_without_loss_fn_a_net_that_returns_no_loss_fails_before_training_saying_what_it_called():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(4, 2)

        def forward(self, x, labels=None):
            return self.linear(x)

    torch.manual_seed(0)
    net = Net()
    model = kt.KerasModel(net)
    before = weights_of(net)
    rows = [{"x": torch.randn(4), "labels": 1} for _ in range(8)]
    with pytest.raises(ValueError) as caught:
        model.fit(DataLoader(rows, batch_size=4), epochs=1, verbose=0)
    message = str(caught.value)
    assert message.startswith(
        "KerasModel has no loss_fn. Pass one, e.g. KerasModel(net, loss_fn=nn.CrossEntropyLoss())"
    )
    assert "net(x=..., labels=...) with x: float32 (4, 4), labels: int64 (4,)" in message
    assert "returned a tensor of shape (4, 2), which has no loss" in message
    assert same_weights(net, before)


# -- a custom train_step that stands alone: a GAN ----------------------------------------------------


@pytest.mark.slow
def test_a_gan_trains_with_train_step_alone_and_logs_its_two_losses(capsys):
    found = run_example("gan")
    history, samples = found["history"], found["samples"]
    assert list(history.columns) == ["epoch", "train_d_loss", "train_g_loss", "lr"]
    assert len(history) == 25  # nothing monitored: no early stopping
    assert "nothing monitored (monitor=None): the last epoch's weights stay" in capsys.readouterr().out
    assert abs(samples.mean().item() - 4.0) < 0.5 and 0.5 < samples.std().item() < 2.0


class TwoNets(kt.KerasModel):
    """A GAN-shaped step: the second net's loss reaches the first net's parameters too."""

    def __init__(self, first, second, record_grads: bool = False):
        super().__init__(nn.ModuleDict({"first": first, "second": second}))
        self.optimizer = torch.optim.SGD(second.parameters(), lr=0.1)
        self.first_optimizer = torch.optim.SGD(first.parameters(), lr=0.1)
        self.expected: Optional[list] = [] if record_grads else None

    def train_step(self, batch):
        (x,) = batch
        first, second = self.net["first"], self.net["second"]
        hidden = second(x)
        first_loss = first(hidden.detach()).pow(2).mean()
        if self.expected is not None:  # what the first net's gradients must be: its own loss's alone
            self.expected.append(torch.autograd.grad(first_loss, list(first.parameters()), retain_graph=True))
        self.backward(first_loss)
        self.optimizer_step(self.first_optimizer)
        second_loss = (first(hidden) - 1).pow(2).mean()  # reaches first's parameters as well
        self.backward(second_loss)
        self.optimizer_step(self.optimizer)
        return {"first_loss": first_loss.detach(), "second_loss": second_loss.detach()}


class GradsAtStep(kt.Callback):
    def __init__(self, optimizer_of):
        self.optimizer_of, self.seen = optimizer_of, []

    def on_before_optimizer_step(self, optimizer):
        if optimizer is self.optimizer_of(self.model):
            self.seen.append([p.grad.clone() for group in optimizer.param_groups for p in group["params"]])


@pytest.mark.parametrize("accumulate", [1, 2])
def test_no_gradient_leaks_from_one_nets_loss_into_the_other_nets_next_update(accumulate):
    torch.manual_seed(0)
    model = TwoNets(nn.Linear(4, 1), nn.Linear(4, 4), record_grads=True)
    watch = GradsAtStep(lambda model: model.first_optimizer)
    x = torch.randn(64, 4)
    model.fit(
        DataLoader(TensorDataset(x), batch_size=8),
        epochs=2,
        monitor=None,
        callbacks=[watch],
        gradient_accumulation_steps=accumulate,
        verbose=0,
    )
    expected = model.expected[1:]  # [0]: the trial before training
    assert len(watch.seen) == 16 // accumulate
    for step, seen in enumerate(watch.seen):  # each update: the mean of its group's own gradients, no more
        group = expected[step * accumulate : (step + 1) * accumulate]
        for i, grad in enumerate(seen):
            assert torch.allclose(grad, sum(g[i] for g in group) / accumulate, atol=1e-6), (step, i)


def test_train_step_values_are_exact_epoch_means_become_columns_and_can_be_monitored(tmp_path):
    class Halves(kt.KerasModel):
        def train_step(self, batch):
            x, y = batch
            loss = nn.functional.mse_loss(self.net(x).squeeze(1), y)
            self.backward(loss)
            self.optimizer_step()
            return {"loss": loss, "batch_size": torch.tensor(float(len(x)))}

    torch.manual_seed(0)
    x, y = torch.randn(20, 2), torch.randn(20)
    net = nn.Linear(2, 1)
    model = Halves(net, optimizer=torch.optim.SGD(net.parameters(), lr=0.0))  # lr 0: the loss is fixed
    with torch.no_grad():
        per_sample = (net(x).squeeze(1) - y).pow(2)
    history = model.fit(
        DataLoader(TensorDataset(x, y), batch_size=8),
        epochs=2,
        monitor="train_batch_size",
        mode="max",
        ckpt_path=tmp_path / "best.pt",
        verbose=0,
    )
    assert list(history.columns) == ["epoch", "train_loss", "train_batch_size", "lr"]
    assert history["train_loss"].iloc[0] == pytest.approx(per_sample.mean().item(), rel=1e-6)  # not a mean of means
    assert history["train_batch_size"].iloc[0] == pytest.approx((8 * 8 + 8 * 8 + 4 * 4) / 20)
    assert (tmp_path / "best.pt").exists()
    with pytest.raises(ValueError, match=r"monitor='train_g_loss' is not a value this run produces\. Your "
                       r"train_step returns loss, batch_size.*Did you mean 'train_loss'"):  # fmt: skip
        model.fit(DataLoader(TensorDataset(x, y), batch_size=8), epochs=1, monitor="train_g_loss", verbose=0)


def test_a_custom_step_that_fails_says_which_batch_it_got_and_changes_nothing_in_either_optimizer():
    class Broken(TwoNets):
        def train_step(self, batch):
            super().train_step(batch)
            raise RuntimeError("the generator's shapes are wrong")

    torch.manual_seed(0)
    model = Broken(nn.Linear(4, 1), nn.Linear(4, 4))
    before = weights_of(model.net)
    with pytest.raises(RuntimeError) as caught:
        model.fit(DataLoader(TensorDataset(torch.randn(16, 4)), batch_size=8), epochs=1, verbose=0)
    assert str(caught.value).startswith(
        "On the first batch of train_data, your train_step failed, before training started (nothing has changed): "
        "the generator's shapes are wrong. kerastorch gave your train_step the first batch: a list of 1: "
        "batch[0]: float32 (8, 4)."
    )
    assert same_weights(model.net, before) and not model.optimizer.state and not model.first_optimizer.state
    assert all(p.grad is None for p in model.net.parameters())


def test_a_train_step_that_returns_something_else_is_told_what_to_return():
    class Odd(kt.KerasModel):
        def train_step(self, batch):
            return 3

    with pytest.raises(ValueError, match=r"train_step returned int; return \(loss, preds, labels\).*train_d_loss"):
        Odd(nn.Linear(2, 1)).fit(DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=4), epochs=1, verbose=0)


# -- what fit keeps: monitor=None, restore_best_weights=False ---------------------------------------


def regression_loaders(n: int = 64):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 3, generator=g)
    y = (x @ torch.tensor([[1.0], [-1.0], [2.0]])) + 0.1 * torch.randn(n, 1, generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=16), DataLoader(TensorDataset(x[:32], y[:32]), batch_size=16)


def test_monitor_none_trains_every_epoch_and_keeps_the_last_weights(tmp_path, capsys):
    train, val = regression_loaders()
    torch.manual_seed(0)
    net = nn.Linear(3, 1)
    model = kt.KerasModel(net, nn.MSELoss(), optimizer=torch.optim.SGD(net.parameters(), lr=1.1))  # diverges
    history = model.fit(train, val, epochs=4, monitor=None, ckpt_path=tmp_path / "last.pt", verbose=2)
    assert len(history) == 4 and "★" not in capsys.readouterr().out  # no best epoch, no early stopping
    last = history["val_loss"].iloc[-1]
    assert model.evaluate(val, quiet=True)["val_loss"] == pytest.approx(last, rel=1e-5)  # the last epoch's
    assert last > history["val_loss"].min()  # which was not the best one
    saved = torch.load(tmp_path / "last.pt", weights_only=True)
    assert all(torch.equal(saved[k], v) for k, v in net.state_dict().items())
    with pytest.raises(ValueError, match=r"patience=3 stops a run when the monitored value stops improving, but "
                       r"monitor=None monitors nothing"):  # fmt: skip
        model.fit(train, val, epochs=1, monitor=None, patience=3, verbose=0)


def test_monitor_none_after_a_nan_loss_puts_back_the_last_finite_epochs_weights_and_resumes(tmp_path, capsys):
    train, _ = regression_loaders()
    torch.manual_seed(0)
    net = nn.Linear(3, 1)
    kept = {}

    def on_epoch_begin(epoch, logs):
        if epoch == 3:
            with torch.no_grad():
                net.weight.fill_(float("nan"))

    watch = kt.callbacks.LambdaCallback(
        on_epoch_begin=on_epoch_begin, on_epoch_end=lambda epoch, logs: kept.update({epoch: weights_of(net)})
    )
    model = kt.KerasModel(net, nn.MSELoss(), optimizer=torch.optim.SGD(net.parameters(), lr=0.05))
    history = model.fit(train, epochs=5, monitor=None, callbacks=[watch], verbose=1)
    assert len(history) == 3 and "Restored the weights of epoch 2, the last one with a finite loss." in (
        capsys.readouterr().out
    )
    assert same_weights(net, kept[2])
    # resume=True keeps the last weights in the training state, and a second call trains on from it.
    path = tmp_path / "last.safetensors"
    first = kt.KerasModel(nn.Linear(3, 1), nn.MSELoss()).fit(train, epochs=2, monitor=None, ckpt_path=path,
                                                            resume=True, verbose=0)  # fmt: skip
    again = kt.KerasModel(nn.Linear(3, 1), nn.MSELoss())
    resumed = again.fit(train, epochs=3, monitor=None, ckpt_path=path, resume=True, verbose=0)
    assert list(resumed["epoch"]) == [1, 2, 3] and list(resumed["train_loss"][:2]) == list(first["train_loss"])


def test_restore_best_weights_false_keeps_the_last_epoch_but_still_marks_and_writes_the_best(tmp_path, capsys):
    train, val = regression_loaders()
    torch.manual_seed(0)
    net = nn.Linear(3, 1)
    model = kt.KerasModel(net, nn.MSELoss(), optimizer=torch.optim.SGD(net.parameters(), lr=1.1))
    history = model.fit(
        train, val, epochs=4, patience=None, restore_best_weights=False, ckpt_path=tmp_path / "b.pt", verbose=2
    )
    out = capsys.readouterr().out
    assert "best epoch by val_loss (min, from its name); the last epoch's weights stay" in out
    best = int(history["val_loss"].idxmin()) + 1
    assert f"Epoch {best}/4" in out.split("★")[0].splitlines()[-1]  # the best epoch is marked
    assert model.evaluate(val, quiet=True)["val_loss"] == pytest.approx(history["val_loss"].iloc[-1], rel=1e-5)
    best_weights = torch.load(tmp_path / "b.pt", weights_only=True)
    net.load_state_dict(best_weights)
    assert model.evaluate(val, quiet=True)["val_loss"] == pytest.approx(history["val_loss"].min(), rel=1e-5)


def test_reduce_lr_on_plateau_as_scheduler_needs_a_monitored_value():
    net = nn.Linear(3, 1)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    model = kt.KerasModel(net, nn.MSELoss(), optimizer=optimizer,
                          lr_scheduler=torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer))  # fmt: skip
    with pytest.raises(ValueError, match="ReduceLROnPlateau, which fit steps with the monitored value, but "):
        model.fit(regression_loaders()[0], epochs=1, monitor=None, verbose=0)


# -- schedulers of other libraries: timm's ----------------------------------------------------------


class TimmCosine:
    """A cosine schedule with warm-up behind the interface of timm's schedulers (timm is not installed
    here): ``timm.scheduler.scheduler.Scheduler``'s ``__init__(optimizer, param_group_field,
    t_in_epochs=True, ..., initialize=True)``, ``state_dict()``, ``load_state_dict(state_dict)``,
    ``step(epoch, metric=None)``, ``step_update(num_updates, metric=None)`` and ``update_groups(values)``,
    with ``CosineLRScheduler``'s ``t_initial``, ``lr_min``, ``warmup_t``, ``warmup_lr_init`` and
    ``t_in_epochs``. Like timm's, ``step`` moves the rate only when ``t_in_epochs``, and ``step_update``
    only when not; its ``step`` needs the epoch, which torch's ``scheduler.step()`` would not give."""

    def __init__(self, optimizer, t_initial, lr_min=0.0, warmup_t=0, warmup_lr_init=0.0, t_in_epochs=True):
        self.optimizer, self.param_group_field = optimizer, "lr"
        for group in optimizer.param_groups:
            group.setdefault("initial_lr", group["lr"])
        self.base_values = [group["initial_lr"] for group in optimizer.param_groups]
        self.t_initial, self.lr_min, self.t_in_epochs = t_initial, lr_min, t_in_epochs
        self.warmup_t, self.warmup_lr_init, self.metric = warmup_t, warmup_lr_init, None
        self.calls: list = []
        self.update_groups(self.lr_at(0))

    def lr_at(self, t: int) -> list:
        if t < self.warmup_t:
            return [self.warmup_lr_init + t * (base - self.warmup_lr_init) / self.warmup_t for base in self.base_values]
        return [
            self.lr_min + 0.5 * (base - self.lr_min) * (1 + math.cos(math.pi * min(t, self.t_initial) / self.t_initial))
            for base in self.base_values
        ]

    def state_dict(self) -> dict:
        return {key: value for key, value in self.__dict__.items() if key != "optimizer"}

    def load_state_dict(self, state_dict: dict) -> None:
        self.__dict__.update(state_dict)

    def step(self, epoch: int, metric: Optional[float] = None) -> None:
        self.metric = metric
        self.calls.append(("step", epoch, metric))
        if self.t_in_epochs:
            self.update_groups(self.lr_at(epoch))

    def step_update(self, num_updates: int, metric: Optional[float] = None) -> None:
        self.metric = metric
        self.calls.append(("step_update", num_updates))
        if not self.t_in_epochs:
            self.update_groups(self.lr_at(num_updates))

    def update_groups(self, values) -> None:
        for group, value in zip(self.optimizer.param_groups, values):
            group[self.param_group_field] = value


class LearningRates(kt.Callback):
    def __init__(self):
        self.lrs: list = []

    def on_train_batch_begin(self, batch, logs=None):
        self.lrs.append(self.model.optimizer.param_groups[0]["lr"])


def test_a_timm_scheduler_counted_in_epochs_sets_each_epochs_rate_as_timm_does():
    train, val = regression_loaders()  # 4 batches per epoch
    net = nn.Linear(3, 1)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    scheduler = TimmCosine(optimizer, t_initial=5, warmup_t=2, warmup_lr_init=0.01)
    model = kt.KerasModel(net, nn.MSELoss(), optimizer=optimizer, lr_scheduler=scheduler)
    history = model.fit(train, val, epochs=5, patience=None, verbose=0)
    assert list(history["lr"]) == pytest.approx([scheduler.lr_at(t)[0] for t in range(5)])  # epoch e trains at t=e-1
    # Called as timm's train.py calls it: step_update after every update, step(epoch + 1, metric) after each epoch.
    expected = []
    for epoch in range(5):
        expected += [("step_update", epoch * 4 + k) for k in range(1, 5)]
        expected.append(("step", epoch + 1, history["val_loss"].iloc[epoch]))
    assert scheduler.calls == expected  # (its trial call before training was undone with its state)


def test_a_timm_scheduler_counted_in_updates_sets_each_steps_rate_and_follows_accumulation():
    train, _ = regression_loaders()  # 4 batches per epoch, 2 updates with accumulation 2
    net = nn.Linear(3, 1)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    scheduler = TimmCosine(optimizer, t_initial=6, warmup_t=2, warmup_lr_init=0.02, t_in_epochs=False)
    model = kt.KerasModel(net, nn.MSELoss(), optimizer=optimizer, lr_scheduler=scheduler)
    rates = LearningRates()
    model.fit(train, epochs=3, gradient_accumulation_steps=2, callbacks=[rates], verbose=0)
    per_update = [scheduler.lr_at(t)[0] for t in range(6)]
    assert rates.lrs == pytest.approx([rate for rate in per_update for _ in range(2)])  # 2 batches per update


def test_a_scheduler_that_does_not_take_fits_calls_fails_before_the_first_batch_and_says_how_to_adapt():
    class NeedsEpoch:  # a scheduler whose step needs an argument fit does not give
        def __init__(self, optimizer):
            self.optimizer = optimizer

        def step(self, epoch):
            self.optimizer.param_groups[0]["lr"] = 0.1 / (1 + epoch)

        def state_dict(self):
            return {}

        def load_state_dict(self, state):
            pass

    train, _ = regression_loaders()
    net = nn.Linear(3, 1)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    model = kt.KerasModel(net, nn.MSELoss(), optimizer=optimizer, lr_scheduler=NeedsEpoch(optimizer))
    before, batches = weights_of(net), []
    with pytest.raises(TypeError) as caught:
        model.fit(
            train, epochs=2, verbose=0, callbacks=[kt.callbacks.LambdaCallback(on_train_batch_begin=batches.append)]
        )
    message = str(caught.value)
    assert "lr_scheduler=NeedsEpoch failed when kerastorch tried it once before training" in message
    assert "scheduler.step() after every epoch (lr_scheduler_interval='epoch')" in message
    assert "missing 1 required positional argument: 'epoch'" in message
    assert "LambdaCallback(on_epoch_end=lambda epoch, logs: scheduler.step(...))" in message
    assert batches == [] and same_weights(net, before) and optimizer.param_groups[0]["lr"] == 0.1


# -- PyTorch's text tutorial: labels first --------------------------------------------------------


@pytest.mark.slow
def test_pytorchs_text_tutorial_trains_with_labels_at_0_and_predicts_from_the_same_batches():
    found = run_example("text_classification")
    assert found["history"]["val_acc"].max() > 0.9
    assert found["scores"].shape == (400, 4)


def test_the_text_tutorials_batches_without_labels_at_fail_saying_what_was_called_and_pointing_to_labels_at():
    text = runpy.run_path(str(EXAMPLES / "text_classification.py"), run_name="tutorial")  # its definitions only
    collate, news = text["collate_batch"], text["news"]
    loader = DataLoader(news(32, torch.Generator().manual_seed(1)), batch_size=8, collate_fn=collate)
    net = text["TextClassificationModel"](200, 16, 4)
    model = kt.KerasModel(net, nn.CrossEntropyLoss())
    with pytest.raises(RuntimeError) as caught:
        model.fit(loader, epochs=1, verbose=0)
    message = str(caught.value)
    assert "kerastorch called net(batch[0], batch[1]) with batch[0]: int64 (8,), batch[1]: int64 (" in message
    assert "labels = batch[2]: int64 (8,)" in message
    assert "KerasModel(..., labels_at=0); predict reads batches the same way" in message


# -- labels the way Keras reads them -----------------------------------------------------------------


def test_a_regression_with_a_1d_y_trains_as_keras_does_and_says_so_once(capsys):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(256, 3)).astype("float32")
    y = X @ np.array([1.0, -2.0, 0.5]) + 1.0  # shape (256,), float64
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 16), nn.ReLU(), nn.Linear(16, 1))
    model = kt.KerasModel(net, nn.MSELoss(), optimizer=torch.optim.Adam(net.parameters(), lr=0.02))
    history = model.fit(X, y, epochs=30, validation_split=0.25, batch_size=32, verbose=2)
    out = capsys.readouterr().out
    assert out.count("go to MSELoss as float32 (32, 1), the shape of the outputs (32, 1), as Keras does") == 1, out
    assert history["val_loss"].min() < 0.05 * y.var()  # the net learned y, not its mean
    assert model.predict(X).shape == (256, 1)


def test_multi_label_with_integer_0_1_labels_trains_and_the_metric_gets_them_as_integers(capsys):
    g = torch.Generator().manual_seed(0)
    X = torch.randn(320, 6, generator=g)
    Y = (X[:, :4] > 0).long()  # 4 labels, 0/1 integers
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 4))
    model = kt.KerasModel(
        net,
        nn.BCEWithLogitsLoss(),
        {"acc": torchmetrics.classification.MultilabelAccuracy(num_labels=4)},  # wants integer targets
        torch.optim.Adam(net.parameters(), lr=0.01),
    )
    history = model.fit(X, Y, validation_split=0.2, epochs=10, verbose=2)
    assert "The labels (int64 (32, 4)) go to BCEWithLogitsLoss as float32 (32, 4), as Keras does; the metrics get " \
        "them as they are." in capsys.readouterr().out  # fmt: skip
    assert history["val_acc"].iloc[-1] > 0.9


def test_messages_name_the_data_the_user_passed_the_validation_split():
    # The training labels fit the metric; the validation labels hold a class it does not know.
    X, y = torch.randn(40, 4), torch.cat([torch.randint(0, 2, (20,)), torch.full((20,), 2)])

    def two_class_accuracy(preds, labels):
        if labels.max() > 1:
            raise ValueError("this accuracy knows the classes 0 and 1")
        return (preds.argmax(1) == labels).float().mean()

    model = kt.KerasModel(nn.Linear(4, 3), nn.CrossEntropyLoss(), {"acc": two_class_accuracy})
    with pytest.raises(ValueError, match="Metric 'acc' failed on the first batch of the validation split"):
        model.fit(X, y, validation_split=0.5, epochs=1, verbose=0)
    with pytest.raises(ValueError, match="Metric 'acc' failed on the first batch of validation_data"):
        model.fit(X[:20], y[:20], validation_data=(X[20:], y[20:]), epochs=1, verbose=0)


# -- the README's example and the package's weight -----------------------------------------------


@pytest.mark.slow
def test_the_readmes_example_runs_and_its_live_plot_picture_exists(tmp_path, monkeypatch):
    readme = (ROOT / "README.md").read_text()
    example = readme.split("```python\n", 1)[1].split("```", 1)[0]
    assert len(example.strip().splitlines()) <= 15
    monkeypatch.chdir(tmp_path)
    found: dict = {}
    exec(compile(example, "README.md", "exec"), found)
    assert found["history"]["val_acc"].max() > 0.9
    assert (tmp_path / "kerastorch_history.png").exists()  # plot=True outside a notebook: the file
    picture = ROOT / "docs" / "images" / "live-plot.png"
    assert picture.exists() and picture.stat().st_size < 100_000 and "docs/images/live-plot.png" in readme


@pytest.mark.slow
def test_importing_kerastorch_never_imports_transformers():
    code = "import sys, kerastorch, kerastorch.training.outputs; print('transformers' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    assert result.stdout.strip() == "False", result.stdout + result.stderr


# -- none of it costs a host sync per step --------------------------------------------------------


def test_the_label_fix_the_nets_own_loss_named_values_and_timms_update_calls_add_no_host_sync_per_step():
    from host_syncs import syncs_per_step

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(24 * 16, 3, generator=g), torch.randint(0, 5, (24 * 16,), generator=g)  # integer, (N,)

    def bare(steps: int) -> None:  # what fit does by hand: the labels reshaped and cast, SGD
        net = nn.Linear(3, 1)
        optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
        for xb, yb in DataLoader(TensorDataset(x[: steps * 16], y[: steps * 16]), batch_size=16):
            nn.functional.mse_loss(net(xb), yb.unsqueeze(-1).float()).backward()
            optimizer.step()
            optimizer.zero_grad()

    def fit_labels(steps: int) -> None:
        net = nn.Linear(3, 1)
        optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
        scheduler = TimmCosine(optimizer, t_initial=100, t_in_epochs=False)
        model = kt.KerasModel(net, nn.MSELoss(), optimizer=optimizer, lr_scheduler=scheduler)
        model.fit(DataLoader(TensorDataset(x[: steps * 16], y[: steps * 16]), batch_size=16), epochs=1, verbose=0)

    class OwnLoss(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(3, 1)

        def forward(self, x, labels=None):
            logits = self.linear(x)
            return {"loss": nn.functional.mse_loss(logits, labels.unsqueeze(-1).float()), "logits": logits}

    def fit_own_loss(steps: int) -> None:
        net = OwnLoss()
        rows = [{"x": x[i], "labels": y[i]} for i in range(steps * 16)]
        kt.KerasModel(net, optimizer=torch.optim.SGD(net.parameters(), lr=0.01)).fit(
            DataLoader(rows, batch_size=16), epochs=1, verbose=0
        )

    def fit_named_values(steps: int) -> None:
        model = TwoNets(nn.Linear(4, 1), nn.Linear(4, 4))
        model.fit(DataLoader(TensorDataset(x[: steps * 16].repeat(1, 2)[:, :4]), batch_size=16), epochs=1, verbose=0)

    def bare_two_nets(steps: int) -> None:
        first, second = nn.Linear(4, 1), nn.Linear(4, 4)
        first_optimizer = torch.optim.SGD(first.parameters(), lr=0.1)
        optimizer = torch.optim.SGD(second.parameters(), lr=0.1)
        for (xb,) in DataLoader(TensorDataset(x[: steps * 16].repeat(1, 2)[:, :4]), batch_size=16):
            hidden = second(xb)
            first(hidden.detach()).pow(2).mean().backward()
            first_optimizer.step()
            first_optimizer.zero_grad()
            (first(hidden) - 1).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()

    steps = (8, 24)
    assert syncs_per_step(bare, steps).per_step == 0
    for run in (fit_labels, fit_own_loss):
        assert syncs_per_step(run, steps).per_step == 0, syncs_per_step(run, steps).describe()
    assert syncs_per_step(bare_two_nets, steps).per_step == 0
    assert syncs_per_step(fit_named_values, steps).per_step == 0, syncs_per_step(fit_named_values, steps).describe()


@pytest.mark.slow
def test_lightmodel_fixes_the_labels_as_keras_does_and_says_so(caplog):
    pl = pytest.importorskip("lightning.pytorch")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 3, generator=g)
    y = x.sum(1)  # (N,) for (N, 1) outputs
    torch.manual_seed(0)
    net = nn.Linear(3, 1)
    model = kt.LightModel(net, nn.MSELoss(), optimizer=torch.optim.SGD(net.parameters(), lr=0.1))
    trainer = pl.Trainer(max_epochs=15, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu")  # fmt: skip
    with caplog.at_level("INFO"):
        trainer.fit(model, DataLoader(TensorDataset(x, y), batch_size=16))
    assert sum("go to MSELoss as float32 (16, 1)" in record.getMessage() for record in caplog.records) == 1
    assert nn.functional.mse_loss(net(x).squeeze(1), y).item() < 0.05  # learned the sum, not the mean


PAGES = [
    "fit",
    "data",
    "callbacks",
    "huggingface",
    "custom-steps",
    "tuning",
    "doctor",
    "devices",
    "several-processes",
    "several-machines",
    "resume",
]


@pytest.mark.parametrize("page", PAGES)
def test_every_python_block_of_the_pages_compiles_and_every_included_example_exists(page):
    text = (ROOT / "docs" / f"{page}.md").read_text()
    for block in text.split("```python\n")[1:]:
        code = block.split("```", 1)[0]
        if code.startswith("--8<-- "):  # a whole example, included: it exists and runs in the tests above
            assert (ROOT / code.split('"')[1]).exists()
            continue
        if code.lstrip().startswith(">>> "):  # a session at the prompt: each statement compiles
            for example in doctest.DocTestParser().get_examples(code):
                compile(example.source, f"docs/{page}.md", "single")
            continue
        compile(code, f"docs/{page}.md", "exec")


def test_the_data_pages_examples_run_in_order_as_a_reader_would_paste_them():
    """Each block of the data page's Keras section runs after the ones above it (they build on its first one's data),
    and no warning is left unexplained: what the page says fit accepts, fit accepts."""
    section = (ROOT / "docs" / "data.md").read_text().split("## Data the Keras way", 1)[1].split("\n## ", 1)[0]
    blocks = [block.split("```", 1)[0] for block in section.split("```python\n")[1:]]
    assert len(blocks) >= 8
    namespace: dict = {"__name__": "data_page"}
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        for number, code in enumerate(blocks, 1):
            try:
                exec(compile(code, f"docs/data.md, block {number}", "exec"), namespace)
            except Exception as error:
                raise AssertionError(f"docs/data.md's Python block {number} failed:\n{code}") from error


class NamedValues(kt.KerasModel):
    """A step that calls the net through ``self.net(...)`` (under ``devices=k``, DDP's forward, which is
    how the processes' gradients are averaged) and names its values."""

    def train_step(self, batch):
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.backward(loss)
        self.optimizer_step()
        return {"loss": loss.detach(), "double": 2 * loss.detach()}


@pytest.mark.slow
def test_named_train_step_values_over_two_processes_equal_one_processes():
    def run(devices: int):
        torch.manual_seed(0)
        net = nn.Linear(4, 3)
        model = NamedValues(net, optimizer=torch.optim.SGD(net.parameters(), lr=0.0))  # values of the data alone
        g = torch.Generator().manual_seed(1)
        data = TensorDataset(torch.randn(64, 4, generator=g), torch.randint(0, 3, (64,), generator=g))
        return model.fit(DataLoader(data, batch_size=8), epochs=2, accelerator="cpu", devices=devices, verbose=0)

    one, two = run(1), run(2)
    assert list(two.columns) == ["epoch", "train_loss", "train_double", "lr"]
    for column in ("train_loss", "train_double"):
        assert list(two[column]) == pytest.approx(list(one[column]), rel=1e-5)
