"""doctor: each planted beginner's mistake is found by its check, a healthy setup has no
error, and nothing the doctor does stays behind; fit(doctor=True) stops before training."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, SubsetRandomSampler, TensorDataset

import kerastorch as kt
from helpers import accuracy


def blobs(n=400, seed=0):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 3, (n,), generator=g)
    centers = torch.tensor([[0.0, 0.0], [3.0, 0.0], [0.0, 3.0]])
    x = centers[y] + 0.7 * torch.randn(n, 2, generator=g)
    return x, y


def loaders(x=None, y=None, shuffle=True):
    if x is None:
        x, y = blobs()
    torch.manual_seed(0)
    return (
        DataLoader(TensorDataset(x[:300], y[:300]), batch_size=32, shuffle=shuffle),
        DataLoader(TensorDataset(x[300:], y[300:]), batch_size=50),
    )


def make_model(net=None, loss_fn=None, lr=0.05):
    torch.manual_seed(0)
    net = net if net is not None else nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 3))
    return kt.KerasModel(
        net, loss_fn or nn.CrossEntropyLoss(), {"acc": accuracy}, torch.optim.Adam(net.parameters(), lr=lr)
    )


def checks_fired(report, severity=None):
    return {f.check for f in report.findings if severity is None or f.severity == severity}


def test_a_healthy_setup_has_no_error_and_says_so():
    report = make_model().doctor(*loaders())
    assert report.ok and not report.errors, str(report)
    assert checks_fired(report, "warning") == set(), str(report)
    assert "no sample is in both sets" in str(report).lower() or "0 error(s)" in str(report)
    assert "<table>" in report._repr_html_()


def test_doctor_changes_nothing_and_fit_after_it_equals_fit_alone():
    model = make_model(net=nn.Sequential(nn.Linear(2, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3)))
    model.fit(*loaders(), epochs=1, verbose=0)  # optimizer state to keep
    train, val = loaders()  # (seeds torch: before the RNG is captured)
    weights = {k: v.clone() for k, v in model.net.state_dict().items()}
    optimizer = {k: v.clone() for k, v in model.optimizer.state_dict()["state"][0].items()}
    rng = (random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state().clone())
    model.doctor(train, val)
    assert all(torch.equal(weights[k], v) for k, v in model.net.state_dict().items())
    assert all(torch.equal(optimizer[k], v) for k, v in model.optimizer.state_dict()["state"][0].items())
    assert random.getstate() == rng[0] and np.array_equal(np.random.get_state()[1], rng[1])
    assert torch.equal(torch.get_rng_state(), rng[2])

    alone = make_model()
    alone_history = alone.fit(*loaders(), epochs=2, verbose=0)
    checked = make_model()
    train, val = loaders()
    checked.doctor(train, val)
    assert checked.fit(train, val, epochs=2, verbose=0).equals(alone_history)


def test_labels_outside_the_outputs_are_an_error():
    x, y = blobs()
    report = make_model().doctor(*loaders(x, y + 1))  # classes 1..3 for 3 outputs
    assert "labels_in_range" in checks_fired(report, "error")
    assert "outside [0, 3)" in str(report) and "nn.Linear(..., 4)" in str(report)


def test_a_softmax_before_cross_entropy_is_an_error():
    net = nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 3), nn.Softmax(dim=1))
    report = make_model(net=net).doctor(*loaders())
    assert "logits_not_probabilities" in checks_fired(report, "error")
    assert "Remove the final nn.Softmax" in str(report)


def test_bce_loss_on_raw_scores_is_an_error():
    x, y = blobs()
    yb = (y == 1).float().unsqueeze(1)
    net = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 1))
    report = make_model(net=net, loss_fn=nn.BCELoss()).doctor(*loaders(x * 10, yb))
    assert "logits_not_probabilities" in checks_fired(report, "error") and "BCEWithLogitsLoss" in str(report)


def test_validation_samples_in_the_training_data_are_counted():
    x, y = blobs()
    train = DataLoader(TensorDataset(x, y), batch_size=32)
    val = DataLoader(TensorDataset(x[350:], y[350:]), batch_size=50)  # the last 50 are also training samples
    report = make_model().doctor(train, val)
    overlap = next(f for f in report.findings if f.check == "train_val_overlap")
    assert overlap.severity == "warning" and "50 of the 50 validation samples compared" in overlap.message


def test_one_dataset_split_by_two_samplers_is_compared_by_their_indices_and_every_sample_is_counted():
    x, y = blobs(n=3000)
    data = TensorDataset(x, y)
    train = DataLoader(data, batch_size=32, sampler=SubsetRandomSampler(range(2500)))
    clean = make_model().doctor(train, DataLoader(data, batch_size=50, sampler=SubsetRandomSampler(range(2500, 3000))))
    assert "No sample is in both sets (2500 training and 500 validation" in str(clean)  # more than 2,000: in memory
    leak = make_model().doctor(train, DataLoader(data, batch_size=50, sampler=SubsetRandomSampler(range(2400, 3000))))
    overlap = next(f for f in leak.findings if f.check == "train_val_overlap")
    assert overlap.severity == "warning" and "100 of the 600 validation samples compared" in overlap.message
    assert overlap.evidence == {"count": 100, "fraction": pytest.approx(1 / 6)}


def test_unnormalized_inputs_and_sorted_unshuffled_labels_are_warned_about():
    x, y = blobs()
    report = make_model().doctor(*loaders(x * 1000 + 500, y))
    assert "inputs_normalized" in checks_fired(report, "warning")
    order = torch.argsort(y)
    report = make_model().doctor(*loaders(x[order], y[order], shuffle=False))
    assert "shuffled" in checks_fired(report, "warning") and "shuffle=True" in str(report)


def test_a_rare_class_is_found_and_class_weight_is_suggested():
    x, y = blobs(n=600)
    keep = (y != 2) | (torch.arange(600) % 30 == 0)
    report = make_model().doctor(*loaders(x[keep], y[keep]))
    assert "class_balance" in checks_fired(report, "warning") and "class_weight='balanced'" in str(report)


def test_a_layer_that_never_learns_is_named_and_a_frozen_one_is_info():
    class Spare(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 3))
            self.spare = nn.Linear(2, 3)  # defined, never called
            self.frozen = nn.Linear(2, 3)
            self.frozen.requires_grad_(False)

        def forward(self, x):
            return self.body(x) + 0 * self.frozen(x)

    report = make_model(net=Spare()).doctor(*loaders())
    found = {f.severity: f.message for f in report.findings if f.check == "all_parameters_learn"}
    assert "spare.weight" in found["warning"] and "frozen.weight" in found["info"]


def test_nan_inputs_are_an_error():
    x, y = blobs()
    x[5, 0] = float("nan")
    report = make_model().doctor(*loaders(x, y, shuffle=False))
    assert "finite_inputs" in checks_fired(report, "error") and "fillna" in str(report)


def test_a_net_that_cannot_learn_one_batch_and_a_learning_rate_that_blows_up():
    frozen_lr = make_model(lr=0.0)
    assert "overfits_one_batch" in checks_fired(frozen_lr.doctor(*loaders()), "warning")
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 3))
    wild = kt.KerasModel(net, nn.CrossEntropyLoss(), optimizer=torch.optim.SGD(net.parameters(), lr=50.0))
    report = wild.doctor(*loaders())
    assert "learning_rate" in checks_fired(report, "error") and "lr_find" in str(report)


@pytest.mark.filterwarnings("ignore:Using a target size")  # torch says it too, in the checks that train on the net
def test_mse_with_labels_of_shape_n_for_outputs_n_by_1_is_said_as_what_fit_does():
    x, _ = blobs()
    target = x.sum(dim=1)  # shape (N,), the net outputs (N, 1): fit reshapes them, as Keras does
    net = nn.Linear(2, 1)
    report = make_model(net=net, loss_fn=nn.MSELoss()).doctor(*loaders(x, target))
    assert "labels_in_range" in checks_fired(report, "info") and "as Keras does" in str(report)
    assert "labels_in_range" not in checks_fired(report, "error")


def test_fit_with_doctor_stops_before_training_on_an_error_and_trains_when_healthy():
    x, y = blobs()
    model = make_model()
    before = {k: v.clone() for k, v in model.net.state_dict().items()}
    with pytest.raises(kt.DoctorError, match="(?s)labels_in_range.*Training did not start"):
        model.fit(*loaders(x, y + 1), epochs=2, verbose=0, doctor=True)
    assert all(torch.equal(before[k], v) for k, v in model.net.state_dict().items())
    history = make_model().fit(*loaders(), epochs=2, verbose=0, doctor=True)
    assert len(history) == 2
