"""Keras's callbacks with Keras 3's meaning: EarlyStopping (baseline, start_from_epoch,
restore_best_weights), ModelCheckpoint (save_freq in batches, save_weights_only,
initial_value_threshold), ReduceLROnPlateau, TerminateOnNaN(raise_error), mode="auto", and
fit's own early stopping saying that it stopped.

Most runs watch a metric whose value at each epoch (or training batch) the test chooses
(:class:`Scripted`), so the epoch a callback acts at is known by hand, Keras's rule applied
to a written-down sequence; the net trains for real underneath, and the weights the run ends
with are compared with the weights recorded at the epoch the rule names.
"""

from __future__ import annotations

import os

import pytest
import torch
import torchmetrics
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import kerastorch as kt
from kerastorch.callbacks import EarlyStopping, ModelCheckpoint, ReduceLROnPlateau, TerminateOnNaN
from kerastorch.files.state import load_state_file, training_state_path
from kerastorch.files.weights import load_weights
from kerastorch.training.meters import EpochMeters

BATCHES_PER_EPOCH = 5


def loaders(n_train=32 * BATCHES_PER_EPOCH, n_val=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n_train + n_val, 8, generator=g)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).long()
    train = DataLoader(TensorDataset(x[:n_train], y[:n_train]), batch_size=32)
    val = DataLoader(TensorDataset(x[n_train:], y[n_train:]), batch_size=32)
    return train, val


class Scripted(kt.Callback):
    """Metrics whose values the test chooses: ``values[name][epoch - 1]`` for the epoch, or with
    ``batch_values[name][epoch - 1][batch]`` a value per training batch (whose running mean is
    what per-step logs show). Pass it among the callbacks and its :meth:`metrics` as metrics_dict
    (or, for values per batch, as ``fit(weighted_metrics=...)``, which are computed batch by batch;
    metrics_dict's are computed on several batches at once)."""

    order = -100  # knows the epoch before anything else runs

    def __init__(self, values=None, batch_values=None):
        self.values, self.batch_values = values or {}, batch_values or {}
        self.epoch, self.batch, self.stage = 1, 0, "val"

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch, self.batch, self.stage = epoch, 0, "train"

    def on_train_batch_begin(self, batch, logs=None):
        self.batch = batch

    def on_test_begin(self, logs=None):
        self.stage = "val"

    def value(self, name):
        if self.stage == "train" and name in self.batch_values:
            return self.batch_values[name][self.epoch - 1][self.batch]
        return self.values[name][self.epoch - 1]

    def metrics(self):
        def metric_for(name):
            return lambda preds, labels: torch.tensor(self.value(name))  # a function: copied as itself

        return {name: metric_for(name) for name in {*self.values, *self.batch_values}}


class RecordWeights(kt.Callback):
    """The net's weights after each epoch, and after chosen (epoch, batch) pairs (1-based batch)."""

    def __init__(self):
        self.by_epoch, self.by_batch, self.epoch = {}, {}, 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        self.by_batch[(self.epoch, batch + 1)] = weights_of(self.model)

    def on_epoch_end(self, epoch, logs=None):
        self.by_epoch[epoch] = weights_of(self.model)


def weights_of(model):
    return {k: v.detach().clone() for k, v in model.net.state_dict().items()}


def same_weights(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def make_model(metrics_dict, lr=0.1, seed=0, optimizer=None):
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    optimizer = optimizer(net) if optimizer else torch.optim.SGD(net.parameters(), lr=lr)
    return kt.KerasModel(net, nn.CrossEntropyLoss(), metrics_dict, optimizer)


def run(script, callbacks=(), epochs=10, **fit_kwargs):
    """Fit a small net whose metrics follow ``script``; returns (model, history, recorded weights)."""
    train, val = loaders()
    model = make_model(script.metrics())
    recorder = RecordWeights()
    history = model.fit(
        train, val, epochs=epochs, callbacks=[script, *callbacks, recorder], **{"verbose": 0, **fit_kwargs}
    )
    return model, history, recorder


# -- EarlyStopping -------------------------------------------------------------------------------


@pytest.mark.parametrize("patience", [0, 1, 2, 3])
def test_early_stopping_stops_where_keras_does(patience):
    # Keras's own test: on these losses it stops at 0-based epoch max(patience, 1) + 2.
    losses = [10.0, 9.0, 8.0, 9.0, 8.9, 8.8, 8.7, 8.6, 8.5]
    stopper = EarlyStopping("val_err", patience=patience)  # mode="auto": an error is lower-better
    _, history, _ = run(Scripted({"err": losses}), [stopper], epochs=9)
    stop = max(patience, 1) + 3  # 1-based
    assert stopper.mode == "min"
    assert stopper.stopped_epoch == stop and list(history["epoch"]) == list(range(1, stop + 1))
    assert stopper.best == 8.0 and stopper.best_epoch == 3


def test_baseline_not_beaten_stops_patience_epochs_after_the_first_watched_one():
    # Keras's test: nothing beats baseline=0.5, so wait is never reset: 1, 2, 3 (improving: no stop
    # check), 4 (not improving, 4 < 5), 5 -> stop at epoch 5, and the best (0.7, epoch 3) comes back.
    stopper = EarlyStopping("val_err", patience=5, baseline=0.5, restore_best_weights=True)
    model, history, recorder = run(Scripted({"err": [0.9, 0.8, 0.7, 0.71, 0.72, 0.73, 0.74]}), [stopper], epochs=7)
    assert len(history) == 5 and stopper.stopped_epoch == 5
    assert same_weights(weights_of(model), recorder.by_epoch[3])


def test_baseline_changes_when_an_improving_run_stops():
    errors = [0.9, 0.8, 0.85, 0.4, 0.3, 0.2, 0.1]
    # baseline=0.5: wait goes 1, 2 (both improve on the best but not on the baseline), 3 at epoch 3 -> stop.
    with_baseline = EarlyStopping("val_err", patience=2, baseline=0.5)
    _, history, _ = run(Scripted({"err": errors}), [with_baseline], epochs=7)
    assert list(history["epoch"]) == [1, 2, 3]
    # Without it, epochs 1 and 2 reset wait; epoch 3 makes it 1; then every epoch improves: all 7 run.
    without = EarlyStopping("val_err", patience=2)
    _, history, _ = run(Scripted({"err": errors}), [without], epochs=7)
    assert len(history) == 7 and without.stopped_epoch is None
    # An epoch that beats the baseline resets wait as usual.
    beaten = EarlyStopping("val_err", patience=2, baseline=0.5)
    _, history, _ = run(Scripted({"err": [0.9, 0.4, 0.45, 0.45, 0.45]}), [beaten], epochs=5)
    assert beaten.stopped_epoch == 4  # wait: 1, 0 (0.4 beats 0.5), 1, 2


def test_start_from_epoch_ignores_the_warm_up_epochs_entirely():
    errors = [0.1, 0.2, 0.3, 0.4, 0.35, 0.5, 0.5, 0.5, 0.5]
    # Without a warm-up, epoch 1 is the best and patience 2 stops at epoch 3.
    plain = EarlyStopping("val_err", patience=2)
    _, history, _ = run(Scripted({"err": errors}), [plain], epochs=9)
    assert len(history) == 3
    # start_from_epoch=3: epochs 1-3 are not watched (0.1 is never the best); 4 then 5 are the best, 6 and 7
    # do not improve -> stop at 7, and restore_best_weights gives back epoch 5.
    warm = EarlyStopping("val_err", patience=2, start_from_epoch=3, restore_best_weights=True)
    model, history, recorder = run(Scripted({"err": errors}), [warm], epochs=9)
    assert len(history) == 7 and warm.best_epoch == 5 and warm.best == pytest.approx(0.35)
    assert same_weights(weights_of(model), recorder.by_epoch[5])


@pytest.mark.parametrize("restore, expected_epoch", [(None, 1), (True, 2), (False, 4)])
def test_restore_best_weights_none_true_false(restore, expected_epoch):
    # fit's monitor (val_err) is best at epoch 1; the EarlyStopping's (val_score, max) at epoch 2,
    # and it stops at epoch 4 (patience 2). None: fit restores its best (1). True: the stopper's best (2).
    # False: the last epoch's weights (4).
    script = Scripted({"score": [0.25, 0.75, 0.5, 0.5, 0.5, 0.5], "err": [0.25, 0.5, 0.5, 0.5, 0.5, 0.5]})
    stopper = EarlyStopping("val_score", patience=2, restore_best_weights=restore)
    model, history, recorder = run(script, [stopper], epochs=6, monitor="val_err")
    assert len(history) == 4 and stopper.best_epoch == 2
    assert same_weights(weights_of(model), recorder.by_epoch[expected_epoch])
    others = {1, 2, 4} - {expected_epoch}
    assert not any(same_weights(weights_of(model), recorder.by_epoch[e]) for e in others)


def test_restore_best_weights_true_and_false_say_which_weights_the_net_holds(capsys):
    script = Scripted({"score": [0.25, 0.75, 0.5, 0.5], "err": [0.25, 0.5, 0.5, 0.5]})
    keep_best = EarlyStopping("val_score", patience=2, restore_best_weights=True, verbose=1)
    run(script, [keep_best], epochs=4, monitor="val_err")  # fit's verbose=0: the callback's own verbose speaks
    assert "Restored the weights of epoch 2 (val_score 0.75, EarlyStopping's best)" in capsys.readouterr().out
    run(script, [EarlyStopping("val_score", patience=2, restore_best_weights=False)], epochs=4, monitor="val_err")
    assert capsys.readouterr().out == ""  # verbose=None follows fit's verbose=0
    keep_last = EarlyStopping("val_score", patience=2, restore_best_weights=False, verbose=1)
    run(script, [keep_last], epochs=4, monitor="val_err")
    assert "Kept the last epoch's weights (restore_best_weights=False); the best val_score was at epoch 2" in (
        capsys.readouterr().out
    )


def test_a_users_early_stopping_replaces_fits_own():
    # fit's default patience=5 would stop this run at epoch 6; the user's patience=8 stops it at 9.
    scores = [0.75] + [0.5] * 11
    stopper = EarlyStopping("val_score", patience=8)
    _, history, _ = run(Scripted({"score": scores}), [stopper], epochs=12, monitor="val_score")
    assert len(history) == 9 and stopper.stopped_epoch == 9
    # Without one, fit's own stops it at 6.
    _, history, _ = run(Scripted({"score": scores}), epochs=12, monitor="val_score")
    assert len(history) == 6


@pytest.mark.parametrize("verbose", [0, 1, 2])
def test_fits_own_early_stopping_says_that_it_stopped_and_how_to_turn_it_off(verbose, capsys):
    _, history, _ = run(
        Scripted({"score": [0.75] + [0.5] * 9}), epochs=10, monitor="val_score", patience=2, verbose=verbose
    )
    assert len(history) == 3
    printed = capsys.readouterr()
    said = printed.out + printed.err
    line = (
        "Stopped early at epoch 3: val_score has not improved for 2 epoch(s) (best 0.75 at epoch 1). "
        "fit stops a run after patience=2 epochs without improvement; pass patience=None to train all 10 epochs, "
        "or a larger patience."
    )
    if verbose:
        assert line in said
        assert said.index(line) > said.index("Epoch 3/10")  # said after the last epoch's line
        # and the last line names the weights the net ends with
        assert said.strip().splitlines()[-1] == "Restored the weights of epoch 1 (val_score 0.7500, the best)."
    else:
        assert said == ""


class ScoreInLogs(kt.Callback):
    """Keras's pattern: a callback computes a score of its own and writes it into the epoch's logs."""

    adds_logs = ("val_score",)

    def __init__(self, scores):
        self.scores = scores

    def on_epoch_end(self, epoch, logs=None):
        logs["val_score"] = self.scores[epoch - 1]


def test_a_value_a_callback_adds_to_the_logs_can_be_monitored(tmp_path):
    scores = [0.5, 0.75, 0.25, 0.5, 0.25, 0.5]
    # fit's own monitor: the best weights are epoch 2's, and early stopping counts from there
    train, val = loaders()
    model = make_model({})
    recorder = RecordWeights()
    history = model.fit(
        train, val, epochs=6, monitor="val_score", patience=2, callbacks=[recorder, ScoreInLogs(scores)], verbose=0
    )
    assert history["val_score"].tolist() == scores[:4]  # stopped at epoch 4: no better score for 2 epochs
    assert same_weights(weights_of(model), recorder.by_epoch[2])
    # Keras's callbacks that watch it, given after it as in Keras (and before it: it runs first either way)
    stopper = EarlyStopping("val_score", patience=1)
    checkpoint = ModelCheckpoint(tmp_path / "best-{epoch}.safetensors", monitor="val_score", save_best_only=True)
    history = make_model({}).fit(train, val, epochs=6, callbacks=[stopper, checkpoint, ScoreInLogs(scores)], verbose=0)
    assert stopper.stopped_epoch == 3 and stopper.mode == "max"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best-1.safetensors", "best-2.safetensors"]

    # torch's ReduceLROnPlateau is stepped before the epoch's callbacks: refused, the callback offered
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="max")
    stepped = kt.KerasModel(net, nn.CrossEntropyLoss(), {}, optimizer, lr_scheduler=plateau)
    with pytest.raises(ValueError, match=r"is not there yet.*kt.callbacks.ReduceLROnPlateau\('val_score'"):
        stepped.fit(train, val, epochs=2, monitor="val_score", callbacks=[ScoreInLogs(scores)], verbose=0)

    class Unsaid(ScoreInLogs):
        adds_logs = ()

    before = weights_of(model)
    with pytest.raises(ValueError, match=r"monitors 'val_score', which this run does not log.*adds_logs = \('name',\)"):
        model.fit(train, val, epochs=2, callbacks=[Unsaid(scores), EarlyStopping("val_score")], verbose=0)
    with pytest.raises(ValueError, match=r"monitor='val_score' is not a value this run produces.*adds_logs"):
        model.fit(train, val, epochs=2, monitor="val_score", callbacks=[Unsaid(scores)], verbose=0)
    assert same_weights(weights_of(model), before)


def test_a_monitored_value_never_finite_says_the_net_keeps_the_last_weights(capsys):
    nan = float("nan")
    model, history, recorder = run(Scripted({"score": [nan] * 6}), epochs=6, monitor="val_score", patience=2, verbose=2)
    assert len(history) == 2
    said = capsys.readouterr().out.strip().splitlines()
    assert said[-2].startswith("Stopped early at epoch 2: val_score has had no finite value for 2 epoch(s)")
    assert said[-1] == "No epoch had a finite val_score: the net keeps the last epoch's weights."
    assert same_weights(weights_of(model), recorder.by_epoch[2])


def test_mode_auto_keeps_the_best_accuracy_not_the_worst(tmp_path):
    # In "min" mode (the old default) the best would be epoch 3 (0.125); "auto" reads val_acc as max: epoch 4.
    accuracies = [0.25, 0.5, 0.125, 0.75, 0.625]
    stopper = EarlyStopping(monitor="val_acc", patience=2, restore_best_weights=True)
    checkpoint = ModelCheckpoint(tmp_path / "best.safetensors", monitor="val_acc", save_best_only=True)
    model, history, recorder = run(Scripted({"acc": accuracies}), [stopper, checkpoint], epochs=5)
    assert (stopper.mode, checkpoint.mode) == ("max", "max")
    assert len(history) == 5 and stopper.best_epoch == checkpoint.best_epoch == 4
    assert same_weights(load_weights(tmp_path / "best.safetensors"), recorder.by_epoch[4])
    assert same_weights(weights_of(model), recorder.by_epoch[4])


def test_mode_auto_follows_a_torchmetrics_higher_is_better_over_the_name(tmp_path):
    # "score" reads as higher-is-better, but the metric is a mean squared error: lower is better.
    torch.manual_seed(0)
    x = torch.randn(96, 4)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [0.0]])
    net = nn.Linear(4, 1)
    model = kt.KerasModel(
        net, nn.MSELoss(), {"score": torchmetrics.MeanSquaredError()}, torch.optim.SGD(net.parameters(), lr=0.05)
    )
    checkpoint = ModelCheckpoint(tmp_path / "best.safetensors", monitor="val_score", save_best_only=True)
    stopper = EarlyStopping("val_score", patience=10)
    recorder = RecordWeights()
    history = model.fit(
        x[:64], y[:64], validation_data=(x[64:], y[64:]), epochs=4, verbose=0, callbacks=[checkpoint, stopper, recorder]
    )
    assert (checkpoint.mode, stopper.mode) == ("min", "min")
    best = int(history["epoch"][history["val_score"].idxmin()])
    assert checkpoint.best_epoch == best
    assert same_weights(load_weights(tmp_path / "best.safetensors"), recorder.by_epoch[best])


# -- ModelCheckpoint -----------------------------------------------------------------------------


def test_save_freq_counts_batches_across_epochs_as_keras_does(tmp_path):
    # Keras's test: 5 batches an epoch and save_freq=15 write at the ends of epochs 3, 6 and 9 only.
    every15 = ModelCheckpoint(tmp_path / "a" / "e{epoch:02d}.safetensors", save_freq=15)
    # save_freq=7: after overall batches 7, 14, 21, 28, 35 = (epoch, batch) (2, 2), (3, 4), (5, 1), (6, 3), (7, 5).
    every7 = ModelCheckpoint(tmp_path / "b" / "e{epoch}-b{batch}.safetensors", save_freq=7)
    _, _, recorder = run(Scripted({"err": [0.5] * 10}), [every15, every7], epochs=10, patience=None)
    assert sorted(os.listdir(tmp_path / "a")) == ["e03.safetensors", "e06.safetensors", "e09.safetensors"]
    for epoch in (3, 6, 9):
        assert same_weights(load_weights(tmp_path / "a" / f"e{epoch:02d}.safetensors"), recorder.by_epoch[epoch])
    written = [(2, 2), (3, 4), (5, 1), (6, 3), (7, 5), (9, 2), (10, 4)]
    assert sorted(os.listdir(tmp_path / "b")) == sorted(f"e{e}-b{b}.safetensors" for e, b in written)
    for epoch, batch in written:
        saved = load_weights(tmp_path / "b" / f"e{epoch}-b{batch}.safetensors")
        assert same_weights(saved, recorder.by_batch[(epoch, batch)])


def test_save_best_only_between_batches_compares_the_running_training_value(tmp_path):
    # train_score per batch; with save_freq=2 the checks fall after batches (1, 2), (1, 4), (2, 1), (2, 3),
    # (2, 5), where the running means over the epoch so far are 0.375, 0.5, 0.25, 0.25, 0.4: only the
    # first two improve (mode max, from the name).
    per_batch = [[0.5, 0.25, 0.75, 0.5, 0.5], [0.25, 0.25, 0.25, 0.25, 1.0]]
    script = Scripted({"score": [0.5, 0.5]}, batch_values={"score": per_batch})
    checkpoint = ModelCheckpoint(
        tmp_path / "e{epoch}-b{batch}-{train_score:.3f}.safetensors", "train_score", save_best_only=True, save_freq=2
    )
    train, val = loaders()
    model = make_model({})
    recorder = RecordWeights()
    history = model.fit(
        train, val, epochs=2, verbose=0, weighted_metrics=script.metrics(), callbacks=[script, checkpoint, recorder]
    )
    assert history["train_score"].tolist() == pytest.approx([0.5, 0.4])
    assert sorted(os.listdir(tmp_path)) == ["e1-b2-0.375.safetensors", "e1-b4-0.500.safetensors"]
    assert same_weights(load_weights(tmp_path / "e1-b4-0.500.safetensors"), recorder.by_batch[(1, 4)])
    assert checkpoint.best == 0.5


def test_save_freq_reads_the_device_once_per_n_batches_and_only_when_needed(tmp_path, monkeypatch):
    reads = []
    real_read = EpochMeters.read

    def counting_read(self, synced=True):
        reads.append((self.prefix, synced))
        return real_read(self, synced)

    monkeypatch.setattr(EpochMeters, "read", counting_read)
    epoch_reads = [("train", True), ("val", True)]
    # A file name without logged values: nothing read between batches.
    run(Scripted({"err": [0.5] * 2}), [ModelCheckpoint(tmp_path / "b{batch}.safetensors", save_freq=5)], epochs=2)
    assert reads == epoch_reads * 2
    reads.clear()
    # Naming train_loss: one read at the 5th batch of each epoch, none at the other four.
    named = ModelCheckpoint(tmp_path / "e{epoch}-{train_loss:.3f}.safetensors", save_freq=5)
    run(Scripted({"err": [0.5] * 2}), [named], epochs=2)
    assert reads == ([("train", False)] + epoch_reads) * 2


def test_save_weights_only_false_writes_the_same_weights_file_load_ckpt_reads(tmp_path):
    only_weights = ModelCheckpoint(tmp_path / "w.safetensors", save_weights_only=True)
    whole = ModelCheckpoint(tmp_path / "m.pt", save_weights_only=False)
    model, _, recorder = run(Scripted({"err": [0.5] * 2}), [only_weights, whole], epochs=2, patience=None)
    for name in ("w.safetensors", "m.pt"):
        assert same_weights(load_weights(tmp_path / name), recorder.by_epoch[2])
    fresh = make_model({})
    fresh.load_ckpt(tmp_path / "m.pt")
    assert same_weights(weights_of(fresh), recorder.by_epoch[2])


def test_initial_value_threshold_must_be_beaten_before_the_first_file(tmp_path):
    checkpoint = ModelCheckpoint(
        tmp_path / "e{epoch}.safetensors", "val_score", save_best_only=True, initial_value_threshold=0.6
    )
    run(Scripted({"score": [0.25, 0.5, 0.75, 0.625]}), [checkpoint], epochs=4)
    assert os.listdir(tmp_path) == ["e3.safetensors"]


def test_model_checkpoint_values_unknown_between_batches_fail_before_training(tmp_path):
    train, val = loaders()
    model = make_model({})
    before = weights_of(model)
    cases = [
        (
            ModelCheckpoint(tmp_path / "e{epoch}-{val_loss:.3f}.safetensors", save_freq=3),
            "'val_loss', which is not known between batches.*use 'epoch', 'batch' or any of: train_loss",
        ),
        (
            ModelCheckpoint(tmp_path / "b.safetensors", save_best_only=True, save_freq=3),
            r"save_best_only=True, save_freq=3\) compares 'val_loss'.*monitor one of train_loss, or pass save_freq='epoch'",
        ),
        (ModelCheckpoint(tmp_path / "e{epoch}-b{batch}.safetensors"), r"names \{batch\}.*pass save_freq=N"),
    ]
    for checkpoint, message in cases:
        with pytest.raises(ValueError, match=message):
            model.fit(train, val, epochs=1, verbose=0, callbacks=[checkpoint])
    assert same_weights(weights_of(model), before) and os.listdir(tmp_path) == []


def test_model_checkpoint_with_save_freq_survives_being_sent_to_another_process(tmp_path):
    # fit(devices=k) pickles the callbacks for its workers; the per-batch hook set on the instance goes too.
    import pickle

    checkpoint = pickle.loads(pickle.dumps(ModelCheckpoint(tmp_path / "b{batch}.safetensors", save_freq=5)))
    run(Scripted({"err": [0.5]}), [checkpoint], epochs=1)
    assert os.listdir(tmp_path) == ["b5.safetensors"]


# -- ReduceLROnPlateau ---------------------------------------------------------------------------


class RecordRates(kt.Callback):
    """Every param group's learning rate each epoch trained with."""

    def __init__(self):
        self.rates = []

    def on_epoch_begin(self, epoch, logs=None):
        self.rates.append([group["lr"] for group in self.model.optimizer.param_groups])


def flat(rows):
    return [value for row in rows for value in row]


def two_groups(net):
    return torch.optim.SGD([{"params": net[0].parameters(), "lr": 0.1}, {"params": net[2].parameters(), "lr": 0.2}])


def test_reduce_lr_on_plateau_follows_keras_rule_in_every_param_group():
    # min mode, min_delta 0.01, patience 2, cooldown 2, factor 0.5, min_lr 0.03; the errors below give:
    # e1 best 1.0 | e2 0.995 is not < 0.99: wait 1 | e3 0.9 best | e4 wait 1 | e5 wait 2: reduce to
    # [0.05, 0.1], cooldown 2 | e6 cooldown 1 | e7 cooldown 0, wait 1 | e8 wait 2: reduce to
    # [max(0.025, 0.03), 0.05] = [0.03, 0.05] | e9 cooldown 1 | e10 wait 1 | e11 wait 2: the first group is
    # at min_lr, the second goes to 0.03 | e12 cooldown 1 | e13 wait 1 | e14 wait 2: nothing above min_lr,
    # so no cooldown starts and wait stays 2.
    errors = [1.0, 0.995] + [0.9] * 12
    reducer = ReduceLROnPlateau("val_err", factor=0.5, patience=2, min_delta=0.01, cooldown=2, min_lr=0.03)
    rates = RecordRates()
    train, val = loaders()
    script = Scripted({"err": errors})
    model = make_model(script.metrics(), optimizer=two_groups)
    history = model.fit(train, val, epochs=14, patience=None, verbose=0, callbacks=[script, reducer, rates])
    expected = [[0.1, 0.2]] * 5 + [[0.05, 0.1]] * 3 + [[0.03, 0.05]] * 3 + [[0.03, 0.03]] * 3
    assert flat(rates.rates) == pytest.approx(flat(expected), rel=1e-12)
    assert history["lr"].tolist() == pytest.approx([r[0] for r in expected], rel=1e-12)
    assert (reducer.mode, reducer.wait, reducer.cooldown_counter) == ("min", 2, 0)


def test_reduce_lr_on_plateau_skips_epochs_that_were_not_validated():
    # validation_freq=2: val_err exists at epochs 2, 4, 6 only. Patience 1: epoch 2 is the best, 4 and 6
    # do not improve -> the rate halves after epochs 4 and 6, and the odd epochs count for nothing.
    reducer = ReduceLROnPlateau("val_err", factor=0.5, patience=1)
    rates = RecordRates()
    _, history, _ = run(Scripted({"err": [0.5] * 7}), [reducer, rates], epochs=7, patience=None, validation_freq=2)
    assert history["lr"].tolist() == pytest.approx([0.1] * 4 + [0.05] * 2 + [0.025])


def test_reduce_lr_on_plateau_state_survives_resume(tmp_path):
    errors = [1.0, 0.9] + [0.9] * 10

    def fit(epochs, ckpt_path):
        script, rates = Scripted({"err": errors}), RecordRates()
        reducer = ReduceLROnPlateau("val_err", factor=0.5, patience=2, cooldown=2)
        train, val = loaders()
        model = make_model(script.metrics())
        model.fit(
            train,
            val,
            epochs=epochs,
            patience=None,
            verbose=0,
            callbacks=[script, reducer, rates],
            ckpt_path=ckpt_path,
            resume=ckpt_path is not None,
        )
        return model, rates.rates

    # e1, e2 best | e3 wait 1 | e4 wait 2: halve, cooldown 2 | e5 cooldown 1 | e6 cooldown 0, wait 1 | e7 wait 2:
    # halve | e8 cooldown 1 | e9 wait 1 | e10 halve | e11 cooldown 1 | e12 wait 1.
    _, straight = fit(12, None)
    assert flat(straight) == pytest.approx([0.1] * 4 + [0.05] * 3 + [0.025] * 3 + [0.0125] * 2)
    fit(5, tmp_path / "best.safetensors")  # ends in a cooldown, which a fresh callback would not know
    state = load_state_file(training_state_path(tmp_path / "best.safetensors"))
    assert state["callbacks"]["ReduceLROnPlateau"] == {
        "best": pytest.approx(0.9),
        "best_epoch": 2,
        "wait": 0,
        "cooldown_counter": 1,
    }
    _, resumed = fit(12, tmp_path / "best.safetensors")
    assert resumed == straight[5:]


# -- TerminateOnNaN ------------------------------------------------------------------------------


def test_terminate_on_nan_raise_error_raises_and_the_best_finite_weights_come_back():
    class PoisonAfterEpoch2(kt.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 2:
                with torch.no_grad():
                    self.model.net[0].weight[0, 0] = float("nan")

    train, val = loaders()
    model = make_model({})
    recorder = RecordWeights()
    with pytest.raises(RuntimeError, match=r"train_loss is nan at epoch 3: TerminateOnNaN\(raise_error=True\)"):
        model.fit(
            train,
            val,
            epochs=6,
            patience=None,
            verbose=0,
            callbacks=[recorder, PoisonAfterEpoch2(), TerminateOnNaN(raise_error=True)],
        )
    history = model.history
    assert list(history["epoch"]) == [1, 2, 3]
    best = 1 + int(history["val_loss"][:2].idxmin())
    assert same_weights(weights_of(model), recorder.by_epoch[best])


def test_terminate_on_nan_raise_error_in_the_first_epoch_gives_back_the_weights_from_before():
    class NaNLoss(nn.Module):
        def forward(self, preds, labels):
            return nn.functional.cross_entropy(preds, labels) * float("nan")

    train, val = loaders()
    model = make_model({})
    model.loss_fn = NaNLoss()
    before = weights_of(model)
    with pytest.raises(RuntimeError, match="at epoch 1"):
        model.fit(train, val, epochs=3, verbose=0, callbacks=[TerminateOnNaN(raise_error=True)])
    assert same_weights(weights_of(model), before)


# -- wrong arguments fail at once, saying what to pass ------------------------------------------


@pytest.mark.parametrize(
    "make, error, message",
    [
        (lambda: EarlyStopping(mode="up"), ValueError, "mode='up' is not supported; use 'min'.*'max'.*'auto'"),
        (lambda: EarlyStopping(patience=-1), ValueError, "patience=-1 must be a whole number >= 0, e.g. patience=3"),
        (lambda: EarlyStopping(start_from_epoch=1.5), ValueError, "start_from_epoch=1.5 must be a whole number"),
        (lambda: EarlyStopping(restore_best_weights="yes"), TypeError, "must be None.*True.*or False"),
        # kerastorch's old positional order: Keras's puts min_delta second.
        (
            lambda: EarlyStopping("val_acc", "max", 3),
            TypeError,
            r"min_delta='max' must be a number; EarlyStopping takes Keras's arguments in Keras's order.*mode='max'",
        ),
        (
            lambda: ModelCheckpoint("b.safetensors", save_freq=0),
            ValueError,
            "save_freq=0 must be 'epoch'.*or a whole number of training batches >= 1",
        ),
        (lambda: ModelCheckpoint("b.safetensors", save_freq="batch"), ValueError, "save_freq='batch' must be 'epoch'"),
        (
            lambda: ModelCheckpoint("b.safetensors", "val_acc", "max", True),
            TypeError,
            r"verbose='max' must be 0.*pass the others by name",
        ),
        (lambda: ModelCheckpoint("b.safetensors", mode="up"), ValueError, "mode='up' is not supported"),
        (
            lambda: ModelCheckpoint("b.safetensors", save_freq=10, every_n_epochs=2),
            ValueError,
            "every_n_epochs=2 counts epochs, but save_freq=10",
        ),
        (lambda: ReduceLROnPlateau(factor=1.0), ValueError, "factor=1.0 must be at least 0 and below 1"),
        (lambda: ReduceLROnPlateau(factor=2), ValueError, "factor=2 must be at least 0 and below 1"),
        (lambda: ReduceLROnPlateau(mode="up"), ValueError, "mode='up' is not supported"),
        (lambda: ReduceLROnPlateau(patience=-2), ValueError, "patience=-2 must be a whole number >= 0"),
        (lambda: ReduceLROnPlateau(cooldown=-1), ValueError, "cooldown=-1 must be a whole number >= 0"),
        (lambda: ReduceLROnPlateau(min_lr=-1e-3), ValueError, "min_lr=-0.001 must be >= 0"),
        (lambda: TerminateOnNaN(raise_error="yes"), TypeError, "raise_error='yes' must be True"),
    ],
)
def test_wrong_arguments_say_what_to_pass(make, error, message):
    with pytest.raises(error, match=message):
        make()


def test_reduce_lr_on_plateau_monitor_is_checked_before_training():
    train, val = loaders()
    model = make_model({})
    before = weights_of(model)
    with pytest.raises(ValueError, match="ReduceLROnPlateau monitors 'val_acc', which this run does not log"):
        model.fit(train, val, epochs=2, verbose=0, callbacks=[ReduceLROnPlateau("val_acc")])
    assert same_weights(weights_of(model), before)


@pytest.mark.parametrize("cls", [ReduceLROnPlateau, TerminateOnNaN, EarlyStopping, ModelCheckpoint])
def test_docstring_example_runs(cls, tmp_path, monkeypatch):
    import inspect
    import textwrap

    monkeypatch.chdir(tmp_path)
    code = textwrap.dedent(inspect.getdoc(cls).split("Example::", 1)[1])
    train, val = loaders()
    model = make_model({"acc": lambda preds, labels: (preds.argmax(-1) == labels).float().mean()})
    model.fit = lambda *args, _fit=model.fit, **kwargs: _fit(*args, **{"verbose": 0, **kwargs})
    exec(code, {"kt": kt, "model": model, "dl_train": train, "dl_val": val})
    assert len(model.history) > 0


# -- several processes ---------------------------------------------------------------------------


@pytest.mark.slow
def test_the_callbacks_on_two_processes_hand_back_their_weights_and_rates(tmp_path):
    # val_score: the stopper's best is epoch 2 and it stops at 4; val_err: the rate halves after epochs 2, 3, 4.
    script = Scripted({"score": [0.25, 0.75, 0.5, 0.5, 0.5, 0.5], "err": [0.25, 0.5, 0.5, 0.5, 0.5, 0.5]})
    callbacks = [
        script,
        EarlyStopping("val_score", patience=2, restore_best_weights=True),
        ReduceLROnPlateau("val_err", factor=0.5, patience=1),
        ModelCheckpoint(tmp_path / "e{epoch}.safetensors"),
        ModelCheckpoint(tmp_path / "steps" / "e{epoch}-b{batch}.safetensors", save_freq=3),
    ]
    train, val = loaders()
    model = make_model(script.metrics())
    history = model.fit(
        train, val, epochs=6, monitor="val_err", accelerator="cpu", devices=2, verbose=0, callbacks=callbacks
    )
    assert len(history) == 4
    assert history["lr"].tolist() == pytest.approx([0.1, 0.1, 0.05, 0.025])
    assert model.optimizer.param_groups[0]["lr"] == pytest.approx(0.0125)  # reduced after epoch 4 too
    assert same_weights(weights_of(model), load_weights(tmp_path / "e2.safetensors"))
    # Each process trains on 3 of the 5 batches an epoch (accelerate evens them out): one file an epoch.
    assert sorted(os.listdir(tmp_path / "steps")) == [f"e{e}-b3.safetensors" for e in (1, 2, 3, 4)]
