"""lr_find at its edges: a curve that never descends, twenty steps, NaN data, persistent workers."""

from __future__ import annotations

import warnings

import pandas as pd
import pytest
import torch
from small_runs import blobs, digits_model, loaders, make_model
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import kerastorch as kt
from kerastorch.tools.tuning import descends

# -- 11. lr_find: a suggestion outside the range, NaN data -------------------------------------


def test_lr_find_says_when_the_curve_never_descends_and_suggests_a_rate_it_tried():
    # SGD from lr=3 diverges at once: the loss is lowest at the first step.
    model = make_model(optimizer=None, lr=0.1)
    model.optimizer = torch.optim.SGD(model.net.parameters(), lr=0.1)
    with pytest.warns(UserWarning, match="never went down over the .* rates it tried") as caught:
        found = model.lr_find(loaders()[0], start_lr=3.0, end_lr=300.0, num_steps=20)
    assert found.suggestion in found.history["lr"].tolist() and found.suggestion >= 3.0
    said = str(caught[0].message)
    assert "start_lr=3" in said and "start_lr 100x smaller" in said and "num_steps" in said


@pytest.mark.parametrize("seed", range(8))
def test_lr_find_on_twenty_steps_suggests_one_of_its_rates_and_says_when_it_saw_no_descent(seed):
    # num_steps=20 over 8 decades: a few noisy points, where one seed in eight found its lowest loss at the
    # second step and suggested a tenth of that rate, below every rate tried, without a word.
    x, y = blobs(seed=seed)
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(x.shape[1], 32), nn.ReLU(), nn.Linear(32, int(y.max()) + 1))
    model = kt.KerasModel(net, nn.CrossEntropyLoss(), optimizer=torch.optim.Adam(net.parameters(), 1e-3))
    data = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found = model.lr_find(data, num_steps=20)
    assert found.suggestion in found.history["lr"].tolist()
    said = [str(w.message) for w in caught if "lr_find" in str(w.message)]
    assert bool(said) == (not descends(found.history["loss"].to_numpy())), said
    assert all("never went down" in text for text in said)


def test_lr_find_on_nan_data_names_the_data_not_the_learning_rate():
    x, y = blobs()
    x[5, 1] = float("nan")
    model = make_model()
    with pytest.raises(ValueError, match="train_data.*NaN") as caught:
        model.lr_find(DataLoader(TensorDataset(x, y), batch_size=32))
    assert "start_lr" not in str(caught.value)


# -- 10. lr_find before fit, with persistent DataLoader workers ---------------------------------------


class Jittered(torch.utils.data.Dataset):
    """Samples with random noise drawn in the loader's worker (an augmentation)."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, index):
        x, y = self.dataset[index]
        return x + 0.1 * torch.randn_like(x), y


@pytest.mark.slow
def test_lr_find_and_doctor_before_fit_with_persistent_workers_change_nothing(digits8):
    def run(find_first):
        torch.manual_seed(0)
        train = DataLoader(Jittered(digits8[0]), batch_size=128, shuffle=True, num_workers=1, persistent_workers=True)
        model = digits_model()
        if find_first:
            model.lr_find(train, num_steps=20)
            model.doctor(train)
        return model.fit(train, epochs=2, verbose=0)

    pd.testing.assert_frame_equal(run(find_first=True), run(find_first=False), check_exact=True)
