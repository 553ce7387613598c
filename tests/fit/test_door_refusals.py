"""Refused at the door, naming what the user did: sample weights that cannot train, validation_freq, labels as lists, rows as inputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from small_runs import blobs, loaders, make_model, same, weights_of

# -- 13. sample weights that would train nothing, or the wrong way ------------------------------


@pytest.mark.parametrize(
    "weights, message",
    [
        (np.zeros(300), r"sample_weight is 0 for every sample.*nothing"),
        (np.r_[np.ones(299), -1.0], r"sample_weight holds 1 negative value.*>= 0"),
        (np.r_[np.ones(299), np.nan], r"sample_weight holds 1 NaN"),
    ],
)
def test_sample_weights_that_cannot_train_are_refused_at_the_door(weights, message):
    x, y = blobs(n=300)
    model = make_model()
    before = weights_of(model.net)
    with pytest.raises(ValueError, match=message):
        model.fit(x, y, sample_weight=weights, epochs=1, verbose=0)
    assert same(weights_of(model.net), before)


def test_class_weights_that_are_all_zero_are_refused():
    x, y = blobs(n=300)
    with pytest.raises(ValueError, match="every class weight is 0"):
        make_model().fit(x, y, class_weight={0: 0.0, 1: 0.0, 2: 0.0}, epochs=1, verbose=0)


# -- 14. validation_freq beyond the last epoch -------------------------------------------------


def test_validation_freq_larger_than_epochs_is_refused_at_the_door():
    model = make_model()
    with pytest.raises(ValueError, match=r"validation_freq=5 with epochs=3.*no epoch is validated"):
        model.fit(*loaders(), epochs=3, validation_freq=5, verbose=0)
    assert len(model.fit(*loaders(), epochs=3, validation_freq=3, verbose=0).dropna()) == 1
    # Going on from epoch 4: epochs 5 to 7 hold no multiple of 4 either.
    before = [p.clone() for p in model.net.parameters()]
    with pytest.raises(ValueError, match=r"validation_freq=4 with epochs 5 to 7.*no epoch is validated"):
        model.fit(*loaders(), initial_epoch=4, epochs=7, validation_freq=4, verbose=0)
    assert all(torch.equal(a, b) for a, b in zip(before, model.net.parameters()))
    assert model.fit(*loaders(), initial_epoch=4, epochs=8, validation_freq=4, verbose=0)[
        "val_loss"
    ].notna().tolist() == [
        False,
        False,
        False,
        True,
    ]


def test_validation_freq_takes_keras_list_of_epochs():
    model = make_model()
    history = model.fit(*loaders(), epochs=5, validation_freq=[1, 3, 4], patience=None, verbose=0)
    assert history["val_loss"].notna().tolist() == [True, False, True, True, False]
    # the best weights are a validated epoch's
    assert model.evaluate(loaders()[1], verbose=0)["val_loss"] == pytest.approx(history["val_loss"].min(), rel=1e-5)
    before = [p.clone() for p in model.net.parameters()]
    with pytest.raises(ValueError, match=r"validation_freq=\[0\]: a list names the epochs to validate, 1-based"):
        model.fit(*loaders(), epochs=2, validation_freq=[0], verbose=0)
    with pytest.raises(ValueError, match=r"validation_freq=\[6\] with epochs=5: no epoch is validated"):
        model.fit(*loaders(), epochs=5, validation_freq=[6], verbose=0)
    assert all(torch.equal(a, b) for a, b in zip(before, model.net.parameters()))


# -- 15. messages that name what the user did ---------------------------------------------------


def test_labels_given_as_a_python_list_are_labels():
    x, y = blobs(n=200)
    history = make_model().fit(x.numpy(), y.tolist(), epochs=2, verbose=0)
    assert len(history) == 2


def test_a_list_of_rows_as_inputs_is_named_as_such():
    x, y = blobs(n=200)
    rows = x.tolist()
    with pytest.raises(TypeError, match=r"train_data is a list of 200 rows.*np\.asarray") as caught:
        make_model().fit(rows, y.numpy(), epochs=1, verbose=0)
    assert "val_data" not in str(caught.value)
    assert len(make_model().fit(np.asarray(rows), y.numpy(), epochs=1, verbose=0)) == 1
