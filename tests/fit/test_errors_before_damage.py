"""Holes an adversarial user found in "errors before damage": each fails before any weight
changes, with a message that says what to do."""

from __future__ import annotations

import pytest
import torch
import torchmetrics
from torch import nn
from torch.utils.data import DataLoader, TensorDataset, WeightedRandomSampler

import kerastorch as kt
from helpers import accuracy


def data(n=96, classes=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 4, generator=g), torch.randint(0, classes, (n,), generator=g)


def make_model(metrics=None, loss_fn=None, outputs=3):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, outputs))
    return kt.KerasModel(net, loss_fn or nn.CrossEntropyLoss(), metrics, torch.optim.SGD(net.parameters(), lr=0.1))


def unchanged(model, before):
    return all(torch.equal(before[k], v) for k, v in model.net.state_dict().items())


def snapshot(model):
    return {k: v.clone() for k, v in model.net.state_dict().items()}


def test_a_validation_loader_without_labels_fails_before_training():
    x, y = data()
    model = make_model()
    before = snapshot(model)
    test_loader = DataLoader(TensorDataset(x), batch_size=16)  # a test set: inputs only
    with pytest.raises(ValueError, match="has no labels"):
        model.fit(DataLoader(TensorDataset(x, y), batch_size=16), test_loader, epochs=2, verbose=0)
    assert unchanged(model, before)


def test_a_metric_that_does_not_fit_the_outputs_fails_before_training():
    x, y = data()
    model = make_model({"acc": torchmetrics.Accuracy(task="multiclass", num_classes=2)})
    before = snapshot(model)
    with pytest.raises(ValueError, match="Metric 'acc' failed on the first batch of train_data, before training"):
        model.fit(DataLoader(TensorDataset(x, y), batch_size=16), epochs=2, verbose=0)
    assert unchanged(model, before)


def test_a_loss_of_shape_one_is_refused_up_front():
    x, y = data()
    model = make_model(loss_fn=lambda preds, labels: nn.functional.cross_entropy(preds, labels).reshape(1))
    before = snapshot(model)
    with pytest.raises(ValueError, match=r"got \(1,\).*loss\.squeeze\(\)"):
        model.fit(DataLoader(TensorDataset(x, y), batch_size=16), epochs=2, verbose=0)
    assert unchanged(model, before)


def test_a_generator_as_data_is_refused_with_what_to_pass():
    x, y = data()
    model = make_model()
    batches = ((x[i : i + 16], y[i : i + 16]) for i in range(0, 96, 16))
    with pytest.raises(TypeError, match="one-shot iterator.*steps_per_epoch"):
        model.fit(batches, epochs=2, verbose=0)


def test_metric_collections_and_reserved_names_are_refused_when_the_model_is_built():
    collection = torchmetrics.MetricCollection({"acc": torchmetrics.Accuracy(task="multiclass", num_classes=3)})
    with pytest.raises(TypeError, match="MetricCollection.*one by one"):
        make_model({"all": collection})
    for name in ("loss", "lr", "epoch", "val_acc", "train_f1"):
        with pytest.raises(ValueError, match=f"metrics_dict\\['{name}'\\]: the history already has columns"):
            make_model({name: accuracy})
    with pytest.raises(TypeError, match="is the class Accuracy, not a metric"):
        make_model({"acc": torchmetrics.Accuracy})


def test_the_first_batch_check_leaves_a_samplers_own_generator_alone():
    x, y = data()
    dataset = TensorDataset(x, y)

    def order_of_first_epoch(with_fit):
        generator = torch.Generator().manual_seed(5)
        sampler = WeightedRandomSampler(torch.ones(len(x)), num_samples=len(x), generator=generator)
        loader = DataLoader(dataset, batch_size=16, sampler=sampler)
        seen = []

        class Record(kt.Callback):
            def on_train_batch_begin(self, batch, logs=None):
                pass

        model = make_model()
        original = model.net.forward

        def forward(inputs):
            if model.net.training:
                seen.append(inputs[:, 0].clone())
            return original(inputs)

        model.net.forward = forward
        if with_fit:
            model.fit(loader, epochs=1, verbose=0)
            return torch.cat(seen)
        return torch.cat([xb[:, 0] for xb, _ in loader])

    torch.testing.assert_close(order_of_first_epoch(with_fit=True), order_of_first_epoch(with_fit=False))


def test_the_first_batch_checks_cost_one_pass_in_eval_mode_on_one_batch_of_each_data():
    # The net runs once per training batch and once per validation batch, plus the first training
    # and the first validation batch, checked in eval mode before training.
    x, y = data()
    model = make_model({"acc": torchmetrics.Accuracy(task="multiclass", num_classes=3)})
    calls = {"train": 0, "eval": 0}
    original = model.net.forward

    def forward(inputs):
        calls["train" if model.net.training else "eval"] += 1
        return original(inputs)

    model.net.forward = forward
    train, val = (
        DataLoader(TensorDataset(x, y), batch_size=16),
        DataLoader(TensorDataset(x[:40], y[:40]), batch_size=20),
    )
    history = model.fit(train, val, epochs=2, verbose=0)
    assert calls == {"train": 2 * len(train), "eval": 2 * len(val) + 2}
    assert history["train_acc"].notna().all()


def test_a_first_step_that_fails_its_checks_changes_no_weight_and_no_running_statistic():
    x, y = data()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
    optimizer = torch.optim.Adam(net.parameters(), lr=0.1)
    model = kt.KerasModel(net, nn.CrossEntropyLoss(), {"acc": torchmetrics.Accuracy(task="multiclass", num_classes=2)})
    model.optimizer = optimizer
    before = snapshot(model)
    with pytest.raises(ValueError, match="Metric 'acc' failed on the first batch of train_data, before training"):
        model.fit(DataLoader(TensorDataset(x, y), batch_size=16), epochs=1, verbose=0)
    assert unchanged(model, before)  # BatchNorm's running mean, variance and batch count included
    assert not optimizer.state
    assert model.net.training  # the mode it was in


def test_an_overridden_train_step_is_tried_once_inside_a_snapshot_before_it_trains():
    x, y = data()
    ran = []

    class OwnStep(kt.KerasModel):
        def train_step(self, batch):
            ran.append(len(batch[0]))
            return super().train_step(batch)

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 3))
    model = OwnStep(net, nn.CrossEntropyLoss(), {"acc": torchmetrics.Accuracy(task="multiclass", num_classes=2)})
    before = snapshot(model)
    with pytest.raises(ValueError, match="Metric 'acc' failed on the first batch of train_data"):
        model.fit(DataLoader(TensorDataset(x, y), batch_size=16), epochs=1, verbose=0)
    assert ran == [16] and unchanged(model, before)  # tried once on the first batch; nothing changed
    assert not model.optimizer.state


def test_mode_auto_follows_the_monitored_name_and_fit_says_so(capsys):
    x, y = data(n=192)
    train = DataLoader(TensorDataset(x[:128], y[:128]), batch_size=16, shuffle=True)
    val = DataLoader(TensorDataset(x[128:], y[128:]), batch_size=32)
    model = make_model({"acc": accuracy})
    history = model.fit(train, val, epochs=4, patience=None, monitor="val_acc", verbose=2)
    assert "best weights by val_acc (max, from its name)" in capsys.readouterr().out
    best = history.loc[history["val_acc"].idxmax()]
    assert model.evaluate(val, quiet=True)["val_acc"] == pytest.approx(best["val_acc"])
    mse = torchmetrics.MeanSquaredError()  # torchmetrics says lower is better, whatever the name
    assert kt.callbacks.monitor.auto_mode("val_score", {"score": mse}) == "min"


def test_fits_first_line_says_a_mode_came_from_the_metric_when_it_did(capsys):
    x, y = data()
    top2 = torchmetrics.Accuracy(task="multiclass", num_classes=3, top_k=2)  # the name alone reads as "min"
    model = make_model({"top2": top2})
    model.fit(x, y, validation_split=0.25, epochs=1, monitor="val_top2", verbose=2)
    assert "best weights by val_top2 (max, from the metric's higher_is_better)" in capsys.readouterr().out
    assert kt.callbacks.monitor.auto_mode("val_top2") == "min"


class NaNFromStart(nn.Module):
    def forward(self, preds, labels):
        return nn.functional.cross_entropy(preds, labels) * float("nan")


def test_nan_in_the_first_epoch_restores_the_weights_from_before_training(capsys):
    x, y = data()
    model = make_model(loss_fn=NaNFromStart())
    before = snapshot(model)
    history = model.fit(DataLoader(TensorDataset(x, y), batch_size=16), epochs=3, verbose=2)
    assert len(history) == 1
    out = capsys.readouterr().out
    assert "The best finite weights are restored" not in out
    assert "No epoch had a finite loss, so the weights from before training are restored" in out
    assert unchanged(model, before)
    silent = make_model(loss_fn=NaNFromStart())  # verbose=0 prints nothing, this line neither
    silent.fit(DataLoader(TensorDataset(x, y), batch_size=16), epochs=3, verbose=0)
    assert capsys.readouterr().out == ""


class CtrlCAtBatch(kt.Callback):
    def __init__(self, batch):
        self.batch = batch

    def on_train_batch_end(self, batch, logs=None):
        if batch == self.batch:
            raise KeyboardInterrupt


def test_ctrl_c_in_the_first_epoch_gives_back_the_starting_weights(capsys):
    x, y = data()
    model = make_model()
    before = snapshot(model)
    history = model.fit(
        DataLoader(TensorDataset(x, y), batch_size=16), epochs=3, verbose=2, callbacks=[CtrlCAtBatch(2)]
    )
    assert len(history) == 0
    assert "0 finished epoch(s) with the weights from before training restored" in capsys.readouterr().out
    assert unchanged(model, before) and model.net.training


def test_a_float64_net_on_float64_data_trains_and_so_does_fit_after_64_true():
    x, y = data()
    x64 = x.double()
    model = make_model()
    model.net.double()
    with pytest.warns(UserWarning, match="converted to float32"):
        history = model.fit(DataLoader(TensorDataset(x64, y), batch_size=16), epochs=1, verbose=0)
    assert len(history) == 1
    model.fit(DataLoader(TensorDataset(x64, y), batch_size=16), epochs=1, verbose=0, precision="64-true")
    with pytest.warns(UserWarning, match="converted to float32"):
        model.fit(DataLoader(TensorDataset(x64, y), batch_size=16), epochs=1, verbose=0)


def test_batchnorm_with_a_last_batch_of_one_is_refused_with_drop_last():
    x, y = data(n=33)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 3))
    model = kt.KerasModel(net, nn.CrossEntropyLoss())
    with pytest.raises(ValueError, match="last batch of every epoch holds a single sample.*drop_last=True"):
        model.fit(DataLoader(TensorDataset(x, y), batch_size=16), epochs=1, verbose=0)
    history = model.fit(DataLoader(TensorDataset(x, y), batch_size=16, drop_last=True), epochs=1, verbose=0)
    assert len(history) == 1


def test_mse_with_labels_of_shape_n_against_outputs_n_by_1_reshapes_them_as_keras_does_and_says_so(capsys):
    # (N, 1) outputs against (N,) labels would broadcast to (N, N): every output compared with every
    # label, and the net would learn their mean. Keras reshapes the labels; so does fit, and says it once.
    x, _ = data()
    target = x.sum(1)
    model = make_model(loss_fn=nn.MSELoss(), outputs=1)
    history = model.fit(DataLoader(TensorDataset(x, target), batch_size=16), epochs=20, verbose=2)
    out = capsys.readouterr().out
    assert out.count("The labels (float32 (16,)) go to MSELoss as float32 (16, 1)") == 1, out
    assert history["train_loss"].iloc[-1] < 0.2 * target.var().item()  # learned the sum, not the mean
    assert model.evaluate(DataLoader(TensorDataset(x, target), batch_size=16), quiet=True)["val_loss"] == (
        pytest.approx(nn.functional.mse_loss(model.predict(x).squeeze(1), target).item(), rel=1e-5)
    )


def test_gradients_switched_off_float64_inputs_string_and_integer_labels_say_the_fix():
    x, y = data()
    model = make_model()
    with torch.no_grad(), pytest.raises(RuntimeError, match="Gradients are switched off.*set_grad_enabled"):
        model.fit(DataLoader(TensorDataset(x, y), batch_size=16), epochs=1, verbose=0)
    with pytest.raises(RuntimeError, match="inputs are float64 but the net's weights are float32.*X.float()"):
        model.fit(DataLoader(TensorDataset(x.double(), y), batch_size=16), epochs=1, verbose=0)
    words = [("cat", "dog", "bird")[i] for i in y.tolist()]
    strings = DataLoader(list(zip(x, words)), batch_size=16)
    with pytest.raises(Exception, match="labels are strings \\('"):
        model.fit(strings, epochs=1, verbose=0)
    binary = make_model(loss_fn=nn.BCEWithLogitsLoss(), outputs=1)  # integer 0/1 labels: cast, as Keras does
    assert len(binary.fit(DataLoader(TensorDataset(x, (y > 0).long().unsqueeze(1)), batch_size=16), verbose=0)) == 10


def test_numpy_integers_are_whole_numbers_and_unoptimized_parameters_are_named():
    import numpy as np

    x, y = data()
    model = make_model()
    history = model.fit(
        DataLoader(TensorDataset(x, y), batch_size=16), epochs=np.int64(2), patience=np.int32(3), verbose=0
    )
    assert len(history) == 2
    model.net.add_module("extra", nn.Linear(3, 3))  # added after the optimizer was built
    with pytest.warns(UserWarning, match="does not update 2 of the net's trainable parameters: extra.weight"):
        model.fit(DataLoader(TensorDataset(x, y), batch_size=16), epochs=1, verbose=0)


def test_model_checkpoint_folders_are_checked_before_training(tmp_path):
    x, y = data()
    blocker = tmp_path / "file"
    blocker.write_text("in the way")
    model = make_model()
    before = snapshot(model)
    with pytest.raises(ValueError, match="cannot be written"):
        model.fit(
            DataLoader(TensorDataset(x, y), batch_size=16),
            epochs=1,
            verbose=0,
            callbacks=[kt.callbacks.ModelCheckpoint(str(blocker / "ckpt" / "e{epoch}.safetensors"))],
        )
    assert unchanged(model, before)


class PythonNumbers(nn.Module):
    """torchkeras-style, but the counts are plain Python numbers: not summable over processes."""

    def forward(self, preds, labels):
        self.correct += int((preds.argmax(1) == labels).sum())
        self.total += len(labels)

    def compute(self):
        return torch.tensor(self.correct / max(self.total, 1))

    def reset(self):
        self.correct, self.total = 0, 0


@pytest.mark.slow
def test_a_metric_with_python_number_state_is_refused_under_two_processes():
    x, y = data()
    metric = PythonNumbers()
    metric.reset()
    model = make_model({"acc": metric})
    with pytest.raises(ValueError, match="plain Python numbers \\(correct, total\\).*register_buffer"):
        model.fit(DataLoader(TensorDataset(x, y), batch_size=16), epochs=1, accelerator="cpu", devices=2, verbose=0)
    assert (
        len(make_model({"acc": metric}).fit(DataLoader(TensorDataset(x, y), batch_size=16), epochs=1, verbose=0)) == 1
    )  # one process: exact, allowed


def test_structured_outputs_reach_the_loss_metrics_and_predict_with_their_type():
    from collections import OrderedDict, namedtuple

    Out = namedtuple("Out", ["logits", "aux"])

    class ModelOutput(OrderedDict):  # the shape of Hugging Face outputs: a dict with attributes
        def __getattr__(self, name):
            return self[name]

    class Twin(nn.Module):
        def __init__(self, kind):
            super().__init__()
            self.body, self.kind = nn.Linear(4, 3), kind

        def forward(self, x):
            logits = self.body(x)
            return Out(logits, logits.sum(1)) if self.kind == "tuple" else ModelOutput(logits=logits, aux=logits.sum(1))

    x, y = data()
    for kind, expected in (("tuple", Out), ("dict", ModelOutput)):
        torch.manual_seed(0)
        net = Twin(kind)
        seen = []
        model = kt.KerasModel(
            net,
            lambda out, labels: nn.functional.cross_entropy(out.logits, labels),
            {
                "acc": lambda out, labels, seen=seen: (
                    seen.append(type(out)) or (out.logits.argmax(1) == labels).float().mean()
                )
            },
        )
        history = model.fit(DataLoader(TensorDataset(x, y), batch_size=16), epochs=2, verbose=0)
        assert len(history) == 2 and set(seen) == {expected}
        predicted = model.predict(DataLoader(TensorDataset(x), batch_size=16))
        assert type(predicted) is expected and predicted.logits.shape == (96, 3)


def test_a_crafted_state_cannot_make_model_checkpoint_delete_other_files(tmp_path):
    victim = tmp_path / "precious.txt"
    victim.write_text("keep me")
    checkpoint = kt.callbacks.ModelCheckpoint(str(tmp_path / "ckpt" / "e{epoch}.safetensors"), keep_last=1)
    with pytest.raises(ValueError, match="outside this ModelCheckpoint's folder"):
        checkpoint.load_state_dict({"best": None, "best_epoch": None, "saved_paths": [str(victim)]})
    checkpoint.saved_paths = [str(victim)]
    checkpoint._remember(str(tmp_path / "ckpt" / "e2.safetensors"))
    assert victim.read_text() == "keep me"


def test_resume_refuses_other_metrics_returns_at_most_epochs_rows_and_the_state_goes_when_resume_is_off(tmp_path):
    x, y = data()
    ckpt = tmp_path / "best.safetensors"
    train, val = DataLoader(TensorDataset(x, y), batch_size=16), DataLoader(TensorDataset(x, y), batch_size=32)
    make_model({"acc": accuracy}).fit(train, val, epochs=3, verbose=0, ckpt_path=ckpt, resume=True)
    with pytest.raises(ValueError, match=r"saved with the metrics \['acc'\], but this run has \[\]"):
        make_model().fit(train, val, epochs=4, verbose=0, ckpt_path=ckpt, resume=True)
    shorter = make_model({"acc": accuracy}).fit(train, val, epochs=2, verbose=0, ckpt_path=ckpt, resume=True)
    assert shorter["epoch"].tolist() == [1, 2]
    state = tmp_path / "best.safetensors.state"
    assert state.exists()
    make_model({"acc": accuracy}).fit(train, val, epochs=1, verbose=0, ckpt_path=ckpt, resume=False)
    assert not state.exists()  # the new run's best weights replaced the ones that state belonged to


def test_a_reused_early_stopping_forgets_the_previous_fit_and_a_symlinked_ckpt_is_written_through(tmp_path):
    x, y = data()
    train = DataLoader(TensorDataset(x, y), batch_size=16)
    stopper = kt.callbacks.EarlyStopping("train_loss", patience=2)
    make_model().fit(train, epochs=3, verbose=0, patience=None, callbacks=[stopper])
    stopper.best = -1.0  # as if the previous fit had reached an unbeatable loss
    history = make_model().fit(train, epochs=3, verbose=0, patience=None, callbacks=[stopper])
    assert len(history) == 3 and stopper.best > 0

    target = tmp_path / "real.safetensors"
    link = tmp_path / "link.safetensors"
    link.symlink_to(target)
    make_model().fit(train, epochs=1, verbose=0, ckpt_path=link)
    assert link.is_symlink() and target.is_file()


def test_a_csv_log_of_a_resumed_run_has_each_epoch_once(tmp_path):
    import pandas as pd

    x, y = data()
    train = DataLoader(TensorDataset(x, y), batch_size=16)
    ckpt, log = tmp_path / "best.safetensors", tmp_path / "log.csv"
    make_model().fit(train, epochs=2, verbose=0, ckpt_path=ckpt, resume=True, callbacks=[kt.callbacks.CSVLogger(log)])
    with open(log, "a") as f:  # a kill after the log's write of epoch 3 but before the state's
        f.write("3,0.5,0.1\n")
    make_model().fit(
        train, epochs=4, verbose=0, ckpt_path=ckpt, resume=True, callbacks=[kt.callbacks.CSVLogger(log, append=True)]
    )
    assert pd.read_csv(log)["epoch"].tolist() == [1, 2, 3, 4]
