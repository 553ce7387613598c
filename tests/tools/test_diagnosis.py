"""What the curves say: each kind of finding on a real run built to show it, none on a healthy run,
the rules' edges on hand-built histories, validation samples found in the training data, and the
report fit prints at its end and keeps for model.diagnose(): the epochs' timing, a divergence traced
to its batch and module."""

from __future__ import annotations

import contextlib
import io
import math
import re
import time
from collections import OrderedDict
from pathlib import Path

import pandas as pd
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Subset, SubsetRandomSampler, TensorDataset

import kerastorch as kt
from helpers import accuracy
from kerastorch.data.forms import FitData, prepare_data
from kerastorch.data.overlap import count_overlap, row_hashes
from kerastorch.tools import diagnosis, fit_report
from kerastorch.tools.diagnosis import Divergence


def fitted(net, optimizer, train, val=None, **fit_args):
    """The history of a silent fit, whose own report finds what kt.diagnose finds in that history (a
    divergence's finding says more in the run's report: where the run traced it), and what the
    loss before the first step shows (a loss that rose inside the first epoch)."""
    model = kt.KerasModel(net, nn.CrossEntropyLoss(), {"acc": accuracy}, optimizer)
    history = model.fit(*train, validation_data=val, verbose=0, **fit_args)
    said = [(f.kind, f.epochs) for f in model.diagnose().findings if "start_loss" not in f.evidence]
    assert said == [(f.kind, f.epochs) for f in kt.diagnose(history).findings]
    return history


def digits_net(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))


@pytest.fixture(scope="module")
def digits(digits8):
    (x, y), (x_val, y_val) = (ds.tensors for ds in digits8)
    return (x, y), (x_val, y_val)


# -- real runs, one per kind -------------------------------------------------------------------------


def test_a_healthy_run_that_converges_with_early_stopping_gets_no_finding(digits):
    net = digits_net()
    history = fitted(net, torch.optim.Adam(net.parameters(), lr=1e-2), *digits, epochs=60, patience=5, batch_size=128)
    assert len(history) < 60 and history["val_acc"].max() > 0.95  # it stopped early, and learned
    report = kt.diagnose(history)
    assert report.findings == [] and str(report) == "" and report._repr_html_() == ""


def test_a_big_net_on_a_few_noisy_samples_overfits_and_the_turn_is_named():
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(300, 20, generator=g), torch.randn(20, generator=g)
    y = ((x @ w + 1.5 * torch.randn(300, generator=g)) > 0).long()  # labels a linear rule gets 80% right
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(20, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 2))
    history = fitted(
        net, torch.optim.Adam(net.parameters(), lr=1e-3), (x[:40], y[:40]), (x[40:], y[40:]), epochs=40, batch_size=8
    )
    report = kt.diagnose(history)
    assert report.kinds == ["overfitting"], str(report)
    turned = int(history.loc[history["val_loss"].idxmin(), "epoch"])
    overfit = report.findings[0]
    assert overfit.epochs == tuple(range(turned, int(history["epoch"].iloc[-1]) + 1))
    assert overfit.evidence["turned_at"] == turned and overfit.evidence["best_val_loss"] == history["val_loss"].min()
    assert f"lowest at epoch {turned}" in overfit.message
    assert f"The weights of epoch {turned} (its best val_loss) were put back" in overfit.message
    assert "weight_decay=" in overfit.message
    assert str(report).startswith("What the curves say:\n[warning] overfitting: ")


def test_sgd_at_a_learning_rate_of_10_is_too_high(digits):
    net = digits_net()
    history = fitted(net, torch.optim.SGD(net.parameters(), lr=10), *digits, epochs=12, patience=None)
    report = kt.diagnose(history)
    assert "lr_too_high" in report.kinds, str(report)
    assert "model.lr_find(train_data)" in str(report) and "underfitting" not in report.kinds


def test_a_loss_that_rises_inside_the_first_epoch_is_a_learning_rate_too_high_in_the_runs_report(digits):
    (x, y), val = digits
    net = digits_net()
    model = kt.KerasModel(net, nn.CrossEntropyLoss(), optimizer=torch.optim.Adam(net.parameters(), lr=1.0))
    history = model.fit(x, y, validation_data=val, epochs=4, verbose=0)
    report = model.diagnose()
    assert report.kinds[0] == "lr_too_high", str(report)
    finding = report.findings[0]
    assert finding.epochs == (1,) and "rose inside epoch 1" in finding.message
    assert finding.evidence["first_train_loss"] >= 2 * finding.evidence["start_loss"]
    assert finding.evidence["start_loss"] == pytest.approx(math.log(10), abs=0.2)  # chance level at the start
    assert "lr_too_high" not in kt.diagnose(history).kinds  # the history alone cannot see it


def test_sgd_at_a_learning_rate_of_1e_7_is_too_low(digits):
    net = digits_net()
    history = fitted(net, torch.optim.SGD(net.parameters(), lr=1e-7), *digits, epochs=3)
    report = kt.diagnose(history)
    assert report.kinds == ["lr_too_low"], str(report)
    assert report.findings[0].epochs == (1, 3) and "barely moved in 3 epochs" in str(report)


def test_two_epochs_of_a_learnable_task_have_not_converged(digits):
    net = digits_net()
    history = fitted(net, torch.optim.Adam(net.parameters(), lr=1e-3), *digits, epochs=2)
    report = kt.diagnose(history)
    assert report.kinds == ["not_converged"], str(report)
    assert report.findings[0].severity == "info" and "epochs=4" in str(report)


def test_a_linear_model_on_a_non_linear_task_underfits():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(600, 2, generator=g)
    y = (x[:, 0] * x[:, 1] > 0).long()  # XOR of the signs: no straight line separates it
    torch.manual_seed(0)
    net = nn.Linear(2, 2)
    history = fitted(
        net, torch.optim.Adam(net.parameters(), lr=1e-2), (x[:400], y[:400]), (x[400:], y[400:]), epochs=20
    )
    report = kt.diagnose(history)
    assert report.kinds == ["underfitting"], str(report)
    assert "bigger net" in str(report) and report.findings[0].evidence["last_train_loss"] > 0.6


def test_a_loss_that_turns_nan_is_a_divergence_at_its_epoch():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(200, 4, generator=g)
    y = (x[:, 0] > 0).long()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
    history = fitted(net, torch.optim.SGD(net.parameters(), lr=1e4), (x, y), epochs=5, validation_split=0.2)
    nan_epoch = int(history.loc[history["train_loss"].isna(), "epoch"].iloc[0])
    report = kt.diagnose(history)
    assert report.kinds[0] == "diverged" and report.findings[0].epochs == (nan_epoch,), str(report)
    assert not report.ok and f"at epoch {nan_epoch}" in str(report) and "gradient_clip_val" in str(report)


# -- the rules on hand-built histories ---------------------------------------------------------------


def history(train, val=None, **columns):
    frame = {"epoch": list(range(1, len(train) + 1)), "train_loss": train, "lr": [1e-3] * len(train)}
    if val is not None:
        frame["val_loss"] = val
    return pd.DataFrame({**frame, **columns})


TRAIN = [1.0, 0.6, 0.4, 0.3, 0.25, 0.2, 0.16, 0.13]  # falls at every epoch
TURNING = [0.9, 0.6, 0.5, 0.45]  # lowest at epoch 4


def test_overfitting_needs_a_rise_of_10_percent_over_3_epochs_with_the_training_loss_falling():
    def rising_to(last):
        return TURNING + [0.46, 0.47, 0.48, last]

    assert kt.diagnose(history(TRAIN, rising_to(0.45 * 1.11))).kinds == ["overfitting"]
    assert kt.diagnose(history(TRAIN, rising_to(0.45 * 1.09))).kinds == []
    assert kt.diagnose(history(TRAIN[:6], TURNING + [0.6, 0.7])).kinds == []  # 2 epochs of rising: not yet
    bouncing = TRAIN[:5] + [0.22, 0.25, 0.2]  # the training loss goes up too: noise, not overfitting
    assert "overfitting" not in kt.diagnose(history(bouncing, rising_to(0.6))).kinds


def test_which_weights_the_overfitting_finding_says_were_kept():
    frame = history(TRAIN, TURNING + [0.5, 0.55, 0.6, 0.65], val_acc=[0.5, 0.6, 0.7, 0.8, 0.85, 0.8, 0.8, 0.8])
    assert "weights of epoch 4 (its best val_loss) were put back" in str(kt.diagnose(frame))
    assert "weights of epoch 5 (its best val_acc) were put back" in str(
        kt.diagnose(frame, monitor="val_acc", mode="max")
    )
    said = str(kt.diagnose(frame, monitor=None))
    assert "put back" not in said and "monitor='val_loss', patience=3" in said
    assert "put back" not in str(kt.diagnose(frame, restore_best_weights=False))


def test_validation_freq_gaps_are_epochs_without_validation_not_a_divergence():
    val = [math.nan, 0.6, math.nan, 0.45, math.nan, 0.5, math.nan, 0.55, math.nan, 0.6]
    train = [1.0, 0.7, 0.5, 0.4, 0.33, 0.28, 0.24, 0.2, 0.17, 0.15]
    report = kt.diagnose(history(train, val))
    assert report.kinds == ["overfitting"], str(report)
    assert report.findings[0].epochs == (4, 6, 8, 10) and "rose over the 6 epochs after it" in str(report)


def test_a_nan_epoch_is_a_divergence_and_the_rules_read_the_epochs_before_it():
    report = kt.diagnose(history([1.0, 0.99995, 0.9999, math.nan], [1.0, 1.0, 1.0, math.nan]))
    assert report.kinds == ["diverged", "lr_too_low"], str(report)
    assert report.findings[0].epochs == (4,) and report.findings[0].evidence == {"epoch": 4}
    infinite_val = kt.diagnose(history([1.0, 0.5, 0.3], [0.9, math.inf, 0.4]))
    assert infinite_val.kinds[0] == "diverged" and infinite_val.findings[0].epochs == (2,)


def test_a_slow_but_steady_run_has_not_converged_either(digits):
    net = digits_net()
    history = fitted(net, torch.optim.Adam(net.parameters(), lr=1e-4), *digits, epochs=6)
    drops = -history["train_loss"].diff().dropna()
    assert (drops < 0.02 * history["train_loss"].iloc[0]).all()  # each epoch under 2% of the first: slow
    report = kt.diagnose(history)
    assert report.kinds == ["not_converged"], str(report)
    assert "epochs=12" in str(report)


def test_not_converged_is_a_last_drop_of_2_percent_or_half_the_runs_pace():
    assert kt.diagnose(history([2.0, 1.98, 1.96, 1.94])).kinds == ["not_converged"]  # 1% an epoch, steadily
    assert kt.diagnose(history([2.0, 1.2, 1.0, 0.99])).kinds == []  # 0.01: under 2% of 2.0, under 0.34 / 2
    assert kt.diagnose(history([2.0, 1.2, 1.0, 0.95])).kinds == ["not_converged"]  # 0.05: 2.5% of 2.0


def test_the_loss_before_the_first_step_shows_a_rise_inside_the_first_epoch_even_of_one_epoch():
    assert kt.diagnose(history([2.0])).kinds == []
    assert kt.diagnose(history([2.0]), start_loss=1.0).kinds == ["lr_too_high"]  # twice: a rise inside epoch 1
    assert kt.diagnose(history([1.9, 1.5, 1.2]), start_loss=1.0).kinds == ["not_converged"]  # under twice
    finding = kt.diagnose(history([4.0, 2.5, 2.4]), start_loss=1.0).findings[0]
    assert finding.kind == "lr_too_high" and finding.epochs == (1,) and finding.evidence["start_loss"] == 1.0


def test_without_validation_the_rules_read_the_training_loss():
    assert kt.diagnose(history([2.0, 1.2, 0.8])).kinds == ["not_converged"]
    assert kt.diagnose(history([0.7, 0.66, 0.65, 0.65, 0.65, 0.649])).kinds == ["underfitting"]
    assert kt.diagnose(history([2.0, 0.5, 0.2, 0.1, 0.09, 0.089])).kinds == []
    assert kt.diagnose(history([1.0, 0.5, 0.9, 0.4])).kinds == ["lr_too_high"]
    assert kt.diagnose(history([1.0, 1.05, 1.08, 1.1])).kinds == ["lr_too_high"]  # ended above where it began


def test_not_converged_needs_the_validation_loss_at_its_lowest_too():
    assert kt.diagnose(history([2.0, 1.2, 0.8], [1.5, 1.0, 0.9])).kinds == ["not_converged"]
    assert kt.diagnose(history([2.0, 1.2, 0.8], [1.5, 1.0, 1.1])).kinds == []  # validation has stopped improving
    # fit monitored an accuracy that was best at epoch 1 (early stopping ends such a run): not said either
    stopped = history([2.0, 1.2, 0.8], [1.5, 1.0, 0.9], val_acc=[0.9, 0.8, 0.8])
    assert kt.diagnose(stopped, monitor="val_acc", mode="max").kinds == []
    assert kt.diagnose(stopped).kinds == ["not_converged"]  # by the validation loss, fit's default monitor


def test_underfitting_needs_the_validation_loss_alike():
    flat = [0.7, 0.66, 0.65, 0.65, 0.65, 0.649]
    assert kt.diagnose(history(flat, [0.7, 0.68, 0.67, 0.66, 0.66, 0.66])).kinds == ["underfitting"]
    assert "underfitting" not in kt.diagnose(history(flat, [0.9, 0.9, 0.9, 0.9, 0.9, 0.9])).kinds


def test_the_validation_loss_jumping_and_falling_back_is_a_learning_rate_too_high():
    train = [1.0, 0.5, 0.4, 0.35, 0.3]
    assert kt.diagnose(history(train, [0.6, 0.4, 0.7, 0.35, 0.3])).kinds == ["lr_too_high"]
    assert kt.diagnose(history(train, [0.6, 0.4, 0.6, 0.35, 0.3])).kinds == ["not_converged"]  # 0.2: under 1.0 / 4


def test_histories_without_a_training_loss_or_epochs_and_wrong_arguments():
    assert kt.diagnose(pd.DataFrame()).findings == []
    assert kt.diagnose(pd.DataFrame({"epoch": [1, 2], "train_g_loss": [1.0, 0.5]})).findings == []
    with pytest.raises(TypeError, match="takes the DataFrame that fit returns"):
        kt.diagnose([1.0, 0.5])
    with pytest.raises(ValueError, match=r"timing must be a DataFrame with the columns \['epoch', 'seconds'"):
        kt.diagnose(history([1.0]), timing=pd.DataFrame({"epoch": [1]}))
    with pytest.raises(ValueError, match="mode='best'"):
        kt.diagnose(history([1.0]), mode="best")


def test_a_divergence_the_run_replayed_is_said_with_its_batch_and_module():
    frame = history([1.0, 0.5, math.nan])
    replayed = Divergence(epoch=3, batch=17, inputs_finite=True, module="encoder.2", labels_finite=True, replayed=17)
    finding = kt.diagnose(frame, divergence=replayed).findings[0]
    assert finding.kind == "diverged" and finding.epochs == (3,)
    assert "at epoch 3" in finding.message and "batch 17 of the training data" in finding.message
    assert "was the module 'encoder.2'. Look in its forward" in finding.message
    assert finding.evidence == {
        "epoch": 3,
        "batch": 17,
        "inputs_finite": True,
        "module": "encoder.2",
        "labels_finite": True,
        "replayed": 17,
        "data": "training",
    }
    dirty = kt.diagnose(frame, divergence=Divergence(3, 2, inputs_finite=False, module="0")).findings[0]
    assert "its inputs hold some" in dirty.message and "model.doctor" in dirty.message
    blown = kt.diagnose(frame, divergence=Divergence(3, module="head", weights_finite=False, replayed=40)).findings[0]
    assert "all 40 batches of the training data gave finite values" in blown.message
    assert (
        "holding NaN or infinite weights was the module 'head'" in blown.message
        and "gradient_clip_val" in blown.message
    )


# -- the input-bound rule, from a timing frame -----------------------------------------------------------


def timing(fractions, seconds=None):
    seconds = seconds or [2.0] * len(fractions)
    return pd.DataFrame({"epoch": range(1, len(fractions) + 1), "seconds": seconds, "data_wait_fraction": fractions})


def test_an_input_bound_run_says_the_fraction_and_what_to_try():
    report = kt.diagnose(history([1.0, 0.5, 0.3, 0.25, 0.24, 0.24]), timing=timing([0.9, 0.7, 0.7, 0.8, 0.7, 0.7]))
    bound = next(f for f in report.findings if f.kind == "input_bound")
    assert bound.evidence["data_wait_fraction"] == pytest.approx(0.72)  # the first epoch left out
    assert "72%" in bound.message and "num_workers" in bound.message and bound.epochs == (2, 3, 4, 5, 6)
    assert report.timing is not None and list(report.timing.columns) == ["epoch", "seconds", "data_wait_fraction"]
    compute_bound = kt.diagnose(
        history([2.0, 0.5, 0.2, 0.1, 0.09, 0.089]), timing=timing([0.6, 0.1, 0.05, 0.1, 0.1, 0.1])
    )
    assert compute_bound.findings == [] and len(compute_bound.timing) == 6
    assert kt.diagnose(history([1.0])).timing.empty


def test_the_wait_is_weighted_by_each_epochs_seconds():
    frame = timing([0.0, 0.9, 0.1], seconds=[1.0, 1.0, 9.0])  # 0.9 * 1 + 0.1 * 9 over 10 seconds: 18%
    assert kt.diagnose(pd.DataFrame(), timing=frame).findings == []
    frame = timing([0.0, 0.9, 0.1], seconds=[1.0, 9.0, 1.0])  # 82%
    assert kt.diagnose(pd.DataFrame(), timing=frame).kinds == ["input_bound"]


# -- validation samples in the training data ---------------------------------------------------------------


def blobs(n=400, seed=0):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 3, (n,), generator=g)
    return torch.tensor([[0.0, 0.0], [3.0, 0.0], [0.0, 3.0]])[y] + 0.7 * torch.randn(n, 2, generator=g), y


def test_overlap_is_counted_in_every_form_of_data_held_in_memory():
    x, y = blobs()
    data = TensorDataset(x, y)
    val_rows = torch.cat([x[350:], x[10:20]])  # 50 samples only the validation set has, 10 the training set has
    val = TensorDataset(val_rows, torch.zeros(60, dtype=torch.long))
    expected = (10, 60)
    for train in (
        x[:350],
        x[:350].numpy(),
        pd.DataFrame(x[:350].numpy()),
        Subset(data, range(350)),
        Subset(data, torch.randperm(350)),
        Subset(data, range(-400, -50)),
        DataLoader(Subset(data, range(350)), batch_size=32, shuffle=True),
        DataLoader(TensorDataset(x[:350], y[:350]), batch_size=32),
    ):
        overlap = count_overlap(train, val)
        assert (overlap.count, overlap.compared) == expected, type(train).__name__
        assert overlap.fraction == pytest.approx(1 / 6) and overlap.every_sample and overlap.leak
    # fit's own loaders: arrays, and Keras's validation_split (the last 20%: no overlap)
    loaders = prepare_data(FitData(x, y=y), 32, True, 0.2, keep_float64=False, pin_memory=False)
    assert count_overlap(*loaders).count == 0 and count_overlap(*loaders).compared == 80


def test_one_dataset_split_by_two_samplers_is_compared_by_their_indices():
    x, y = blobs()
    data = TensorDataset(x, y)
    train = DataLoader(data, batch_size=32, sampler=SubsetRandomSampler(range(300)))
    assert count_overlap(train, DataLoader(data, sampler=SubsetRandomSampler(range(300, 400)))).count == 0
    assert count_overlap(train, DataLoader(data, sampler=SubsetRandomSampler(range(250, 400)))).count == 50


def test_data_not_in_memory_is_compared_by_its_first_batches_only_when_asked():
    x, y = blobs()
    train = [(x[i : i + 50], y[i : i + 50]) for i in range(0, 300, 50)]  # batches the user made
    val = [(x[250:300], y[250:300]), (x[300:350], y[300:350])]
    assert count_overlap(train, val) is None
    overlap = count_overlap(train, val, limit=1000)
    assert (overlap.count, overlap.compared, overlap.train_compared, overlap.every_sample) == (50, 100, 300, False)
    assert count_overlap(train, val, limit=120).train_compared == 120


def test_rows_repeated_as_often_as_the_training_rows_repeat_are_duplicates_not_a_leak():
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 3, (400, 3), generator=g).float()  # 27 distinct rows
    overlap = count_overlap(x[:300], x[300:])
    assert overlap.count > 90 and overlap.train_repeated > 0.9 and not overlap.leak
    assert kt.diagnose(pd.DataFrame(), overlap=overlap).findings == []


def test_an_overlap_in_the_runs_report_says_the_count_and_the_fraction():
    x, _ = blobs()
    overlap = count_overlap(x, x[300:])
    finding = kt.diagnose(history([1.0, 0.4, 0.2, 0.1, 0.09, 0.089]), overlap=overlap).findings[0]
    assert finding.kind == "train_val_overlap" and finding.evidence["count"] == 100
    assert "100 of the 100 validation samples (100%)" in finding.message and "validation_split=0.2" in finding.message


def test_row_hashes_tell_rows_apart_by_every_byte_and_60000_rows_take_about_a_second():
    rows = torch.zeros(4, 3)
    rows[1, 2], rows[2, 0], rows[3, 0] = -0.0, 1e-30, 1e-30
    hashes = row_hashes(rows)
    assert hashes[0] != hashes[1] and hashes[0] != hashes[2] and hashes[2] == hashes[3]  # -0.0 has other bytes
    images = torch.rand(60_000, 784, generator=torch.Generator().manual_seed(0))
    start = time.perf_counter()
    overlap = count_overlap(images[:50_000], images[45_000:])
    seconds = time.perf_counter() - start
    assert (overlap.count, overlap.compared, overlap.train_repeated) == (5_000, 15_000, 0.0)
    assert seconds < 10, seconds  # about 0.5 s on one core of a laptop


# -- the one pair of report types ------------------------------------------------------------------------


def test_the_doctor_and_the_run_report_with_the_same_types_and_look_alike():
    run = kt.diagnose(history(TRAIN, TURNING + [0.5, 0.55, 0.6, 0.65]))
    assert isinstance(run, kt.Diagnosis) and isinstance(run.findings[0], kt.Finding)
    line = str(run).splitlines()[1]
    assert line.startswith("[warning] overfitting: The validation loss")
    finding = run.findings[0]
    assert finding.kind == finding.check == "overfitting" and finding.fix == ""
    assert len({finding, finding}) == 1  # hashable, as the doctor's findings were
    table = run._repr_html_()
    assert "<table>" in table and "What the curves say:" in table and "<code>overfitting</code>" in table
    doctor_like = kt.Diagnosis([kt.Finding("shuffled", "warning", "The loader is not shuffled.", "shuffle=True")])
    assert str(doctor_like).splitlines()[1:] == [
        "[warning] shuffled: The loader is not shuffled.",
        "    fix: shuffle=True",
    ]
    assert doctor_like.findings[0].kind == "shuffled" and doctor_like.findings[0].epochs is None


def test_every_kind_is_a_documented_constant():
    assert set(diagnosis.KINDS) == {
        "overfitting",
        "underfitting",
        "lr_too_high",
        "lr_too_low",
        "not_converged",
        "diverged",
        "input_bound",
        "train_val_overlap",
    }
    assert "diagnose" in kt.__all__ and kt.diagnose is diagnosis.diagnose
    for kind in diagnosis.KINDS:
        assert f'"{kind}"' in diagnosis.__doc__


# -- the docs page -----------------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_pages_examples_run_in_order_and_print_the_findings_the_page_shows():
    """Each Python block of docs/reading-your-run.md runs after the ones above it; the findings it
    prints are the ones the text block below it shows (their numbers may differ on other machines)."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "reading-your-run.md").read_text()
    blocks = re.findall(r"```(python|text)\n(.*?)```", page, re.S)
    assert [kind for kind, _ in blocks].count("python") >= 10
    namespace: dict = {"__name__": "reading_your_run"}
    printed = ""
    for kind, code in blocks:
        if kind == "python":
            output = io.StringIO()
            with contextlib.redirect_stdout(output):
                exec(compile(code, "docs/reading-your-run.md", "exec"), namespace)
            printed = output.getvalue()
        else:

            def said(text):
                return [line.split(":")[0] for line in text.splitlines() if line.startswith(("[", "What"))]

            assert said(printed) == said(code), (printed, code)


# -- the report at the end of fit ---------------------------------------------------------------------------


def test_a_healthy_fit_prints_nothing_more_and_keeps_an_empty_report_with_its_timing(digits, capsys):
    net = digits_net()
    model = kt.KerasModel(net, nn.CrossEntropyLoss(), optimizer=torch.optim.Adam(net.parameters(), lr=1e-2))
    (x, y), val = digits
    with pytest.raises(RuntimeError, match=r"has not been fit yet.*kt.diagnose\(history\)"):
        model.diagnose()
    history = model.fit(x, y, validation_data=val, epochs=40, patience=3, batch_size=128, verbose=2)
    assert len(history) < 40  # stopped early, healthy
    printed = capsys.readouterr().out
    assert "What the curves say" not in printed and printed.rstrip().endswith("the best).")
    report = model.diagnose()
    assert report.findings == [] and str(report) == "" and report.source == "run"
    timing = report.timing
    assert list(timing.columns) == ["epoch", "seconds", "data_wait_fraction"]
    assert timing["epoch"].tolist() == history["epoch"].tolist() and (timing["seconds"] > 0).all()
    assert (
        timing["data_wait_fraction"].between(0, 0.5).all()
    )  # tensors in memory: the step, not the data, sets the pace


def test_fit_prints_its_report_at_its_end_also_after_early_stopping_and_only_when_verbose(capsys):
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(300, 20, generator=g), torch.randn(20, generator=g)
    y = ((x @ w + 1.5 * torch.randn(300, generator=g)) > 0).long()

    def overfit(verbose):
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(20, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 2))
        model = kt.KerasModel(net, nn.CrossEntropyLoss(), optimizer=torch.optim.Adam(net.parameters(), lr=1e-3))
        model.fit(x[:40], y[:40], validation_data=(x[40:], y[40:]), epochs=40, batch_size=8, verbose=verbose)
        return model

    model = overfit(verbose=2)
    printed = capsys.readouterr().out
    report = model.diagnose()
    assert report.kinds == ["overfitting"] and len(model.history) < 40  # early stopping ended it
    assert printed.rstrip().endswith(str(report)) and "\nWhat the curves say:\n[warning] overfitting: " in printed
    assert overfit(verbose=0).diagnose().kinds == ["overfitting"] and capsys.readouterr().out == ""


def test_after_ctrl_c_the_report_is_kept_but_not_printed(digits, capsys):
    class CtrlC(kt.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 2:
                raise KeyboardInterrupt

    net = digits_net()
    model = kt.KerasModel(net, nn.CrossEntropyLoss(), optimizer=torch.optim.Adam(net.parameters(), lr=1e-3))
    history = model.fit(*digits[0], validation_data=digits[1], epochs=10, verbose=2, callbacks=[CtrlC()])
    printed = capsys.readouterr().out
    assert len(history) == 2 and "Interrupted during epoch 3" in printed
    report = model.diagnose()
    assert report.kinds == ["not_converged"] and len(report.timing) == 2  # still improving when stopped
    assert "What the curves say" not in printed  # the user stopped it on purpose


class SlowToRead(torch.utils.data.Dataset):
    """Samples that take 10 ms each to read: a loader that sets the pace, as a slow disk or heavy
    transforms do."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        time.sleep(0.01)
        return self.x[i], self.y[i]


def test_a_loader_that_sleeps_makes_an_input_bound_run():
    x, y = blobs(48)
    torch.manual_seed(0)
    net = nn.Linear(2, 3)
    model = kt.KerasModel(net, nn.CrossEntropyLoss(), optimizer=torch.optim.Adam(net.parameters(), lr=1e-2))
    model.fit(DataLoader(SlowToRead(x, y), batch_size=16, shuffle=True), epochs=3, verbose=0)
    report = model.diagnose()
    bound = next(f for f in report.findings if f.kind == "input_bound")
    assert bound.epochs == (2, 3), str(report)  # the first epoch, which starts the loader, left out
    assert bound.evidence["data_wait_fraction"] >= diagnosis.INPUT_BOUND_FRACTION
    assert (report.timing["seconds"] > 48 * 0.01).all()
    assert "num_workers" in bound.message


def nan_report(net, loss_fn, x, y, lr, **fit_args):
    model = kt.KerasModel(
        net, loss_fn, optimizer=torch.optim.SGD([p for p in net.parameters() if p.requires_grad], lr=lr)
    )
    model.fit(x, y, epochs=5, verbose=0, **fit_args)
    report = model.diagnose()
    assert report.kinds[0] == "diverged" and not report.ok, str(report)
    return report.findings[0], model


def test_a_batch_with_a_nan_input_is_named_with_the_first_module_it_reaches():
    x, y = blobs(200)
    x[70, 1] = math.nan  # in the third batch of 32
    torch.manual_seed(0)
    finding, model = nan_report(
        nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 3)), nn.CrossEntropyLoss(), x, y, 0.1, shuffle=False
    )
    assert finding.epochs == (1,)
    assert {k: finding.evidence[k] for k in ("batch", "inputs_finite", "labels_finite", "module")} == {
        "batch": 3,
        "inputs_finite": False,
        "labels_finite": True,
        "module": "0",
    }
    assert "batch 3 of the training data" in finding.message and "its inputs hold some" in finding.message
    assert "model.doctor" in finding.message
    assert all(torch.isfinite(p).all() for p in model.net.parameters())  # the weights from before training came back
    assert model.net.training  # the replay ran in eval mode, and left the net's mode as it was


def test_a_loss_that_is_infinite_on_a_label_of_zero_is_named():
    x, _ = blobs(200)
    y = x.sum(1, keepdim=True).abs() + 1
    y[100] = 0.0  # a relative error divides by it: the fourth batch's loss is infinite

    def relative_error(preds, labels):
        return ((preds - labels).abs() / labels.abs()).mean()

    torch.manual_seed(0)
    finding, _ = nan_report(
        nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 1)), relative_error, x, y, 1e-3, shuffle=False
    )
    assert (finding.evidence["batch"], finding.evidence["module"]) == (4, "the loss function"), finding.message
    assert finding.evidence["inputs_finite"] and finding.evidence["labels_finite"]
    assert "was the loss function. Look for a log of 0 or a division by 0" in finding.message


def test_weights_that_overflow_at_a_huge_learning_rate_name_the_module_that_held_them():
    x, _ = blobs(256)
    y = x.sum(1, keepdim=True)
    torch.manual_seed(0)
    # A frozen feature layer (pretrained, say), and layers trained at a rate that makes them blow up.
    net = nn.Sequential(
        OrderedDict(
            features=nn.Linear(2, 32), act=nn.Tanh(), hidden=nn.Linear(32, 32), act2=nn.ReLU(), head=nn.Linear(32, 1)
        )
    )
    net.features.requires_grad_(False)
    finding, model = nan_report(net, nn.MSELoss(), x, y, 0.5, validation_split=0.25)
    assert finding.evidence["module"] == "hidden" and finding.evidence["weights_finite"] is False, finding.message
    assert (
        finding.evidence["replayed"] == 6 and "batch" not in finding.evidence
    )  # every batch finite with the weights put back
    assert "the updates are" in finding.message and "was the module 'hidden'" in finding.message
    assert "Lower the learning rate" in finding.message
    torch.manual_seed(0)
    finding, _ = nan_report(nn.Linear(2, 1), nn.MSELoss(), x, y, 3e38)  # the net is one layer: no name of its own
    assert finding.evidence["module"] == "the net itself", finding.message


def test_validation_samples_in_the_training_data_are_in_the_runs_report_under_a_size_limit(monkeypatch):
    x, y = blobs(400)
    torch.manual_seed(0)
    net = nn.Linear(2, 3)
    model = kt.KerasModel(net, nn.CrossEntropyLoss(), optimizer=torch.optim.Adam(net.parameters(), lr=1e-2))
    leaky = (torch.cat([x[300:], x[:50]]), torch.cat([y[300:], y[:50]]))  # 50 training samples in validation
    model.fit(x[:300], y[:300], validation_data=leaky, epochs=2, verbose=0)
    overlap = next(f for f in model.diagnose().findings if f.kind == "train_val_overlap")
    assert overlap.evidence["count"] == 50 and overlap.evidence["compared"] == 150
    monkeypatch.setattr(fit_report, "OVERLAP_MAX_BYTES", 300 * 2 * 4)  # the training rows alone fill it
    model.fit(x[:300], y[:300], validation_data=leaky, epochs=2, verbose=0)
    assert "train_val_overlap" not in model.diagnose().kinds


@pytest.mark.slow
def test_the_report_of_a_run_in_two_processes_comes_back_to_the_caller(capfd):
    x, y = blobs(256)
    torch.manual_seed(0)
    net = nn.Linear(2, 3)
    model = kt.KerasModel(net, nn.CrossEntropyLoss(), optimizer=torch.optim.Adam(net.parameters(), lr=1e-3))
    model.fit(x, y, validation_data=(x[:64], y[:64]), epochs=2, accelerator="cpu", devices=2, verbose=2)
    report = model.diagnose()  # made by the main worker, sent back with its results
    assert report.kinds[0] == "train_val_overlap", str(report)
    assert report.findings[0].evidence["count"] == 64 and report.timing["epoch"].tolist() == [1, 2]
    assert capfd.readouterr().out.count("What the curves say:") == 1  # printed by one process only
