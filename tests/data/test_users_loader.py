"""A DataLoader the user made is used as given: ``fit``, ``evaluate`` and ``predict`` iterate the very
object, unchanged, so what torch's loader does with it (a dataset or ``collate_fn`` changed by a
callback during ``fit``, a patched ``__getitem__``) is what the run trains on."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    RandomSampler,
    Subset,
    TensorDataset,
    WeightedRandomSampler,
    default_collate,
    random_split,
)

import kerastorch as kt
from kerastorch.data.forms import FitData, eval_loader, prepare_data


def by_sample(batch):
    """torch's default collate, as a function of the user's own."""
    return default_collate(batch)


def points(n=200, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 5, generator=g)
    return x, (x[:, 0] > x[:, 1]).long()


class OwnLoader(DataLoader):
    pass


class TaggedTensor(torch.Tensor):
    pass


class Rows(Dataset):
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


LOADERS = {
    "shuffled": lambda x, y, g: DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True),
    "drop_last": lambda x, y, g: DataLoader(TensorDataset(x, y), batch_size=7, drop_last=True),
    "a generator of its own": lambda x, y, g: DataLoader(TensorDataset(x), batch_size=64, shuffle=True, generator=g),
    "random_split": lambda x, y, g: DataLoader(random_split(TensorDataset(x, y), [0.7, 0.3])[0], batch_size=16),
    "Subset with NumPy indices": lambda x, y, g: DataLoader(
        Subset(TensorDataset(x, y), np.arange(150, 10, -3, dtype=np.int32)), batch_size=9
    ),
    "WeightedRandomSampler": lambda x, y, g: DataLoader(
        TensorDataset(x, y), batch_size=10, sampler=WeightedRandomSampler(torch.rand(len(x)), 80, generator=g)
    ),
    "batch_sampler": lambda x, y, g: DataLoader(
        TensorDataset(x.double(), y.int()), batch_sampler=BatchSampler(range(5, 60), 8, False)
    ),
    "indices other than Python ints": lambda x, y, g: DataLoader(
        TensorDataset(x, y), batch_sampler=[[np.int64(2), 3], [torch.tensor(4), 2]]
    ),
    "worker processes": lambda x, y, g: DataLoader(TensorDataset(x, y), batch_size=8, num_workers=1),
    "a collate_fn of its own": lambda x, y, g: DataLoader(TensorDataset(x, y), batch_size=8, collate_fn=by_sample),
    "a DataLoader subclass": lambda x, y, g: OwnLoader(TensorDataset(x, y), batch_size=8),
    "a Dataset of its own": lambda x, y, g: DataLoader(Rows(x, y), batch_size=8),
    "a tensor subclass": lambda x, y, g: DataLoader(TensorDataset(x.as_subclass(TaggedTensor), y), batch_size=8),
    "a tensor of another memory layout": lambda x, y, g: DataLoader(TensorDataset(x.T.contiguous().T, y), batch_size=8),
    "batch_size=None": lambda x, y, g: DataLoader(TensorDataset(x, y), batch_size=None),
    "pinned": lambda x, y, g: DataLoader(TensorDataset(x, y), batch_size=8, pin_memory=torch.cuda.is_available()),
}


@pytest.mark.parametrize("loader_of", list(LOADERS.values()), ids=list(LOADERS))
def test_fit_evaluate_and_predict_get_the_users_loader_itself(loader_of):
    x, y = points(60)
    loader, val = loader_of(x, y, torch.Generator()), DataLoader(TensorDataset(x, y), batch_size=8)
    before = dict(vars(loader))
    train_loader, val_loader = prepare_data(
        FitData(loader, val), None, shuffle=True, validation_split=0.0, keep_float64=False, pin_memory=True
    )
    assert train_loader is loader and val_loader is val
    assert eval_loader(loader, None, None, needs_labels=True) is loader
    assert eval_loader(loader, None, None, needs_labels=False) is loader
    assert type(loader) in (DataLoader, OwnLoader) and vars(loader) == before


def dropout_model(seed=0):
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 2))
    return kt.KerasModel(net, nn.CrossEntropyLoss(), optimizer=torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9))


def test_the_users_loader_is_left_as_it_was():
    x, y = points()
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    before = dict(vars(loader))
    dropout_model().fit(loader, epochs=1, verbose=0)
    assert type(loader) is DataLoader and vars(loader) == before


class Recorder(nn.Module):
    """A linear net that keeps each batch it trains on (in train mode: not fit's first look at the data)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(5, 2)
        self.trained_on = []

    def forward(self, x):
        if self.training:
            self.trained_on.append(x.detach().clone())
        return self.linear(x)


def fit_and_torchs_loop(make_loader, change, epochs=2):
    """The batches fit trains on and those a plain loop over the same loader gets, with ``change(loader)``
    made after the first batch of the first epoch, by a callback in fit and by the loop itself."""

    class ChangeAfterFirstBatch(kt.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 0 and not self.done:
                change(loader)
                self.done = True

        done = False

    loader = make_loader()
    net = Recorder()
    kt.KerasModel(net, nn.CrossEntropyLoss(), optimizer=torch.optim.SGD(net.parameters(), lr=0.1)).fit(
        loader, epochs=epochs, verbose=0, patience=None, callbacks=[ChangeAfterFirstBatch()]
    )
    loader, seen = make_loader(), []
    for epoch in range(epochs):
        for i, (features, _) in enumerate(loader):
            seen.append(features)
            if (epoch, i) == (0, 0):
                change(loader)
    return net.trained_on, seen


def shuffled_loader():
    x, y = points(64)
    return DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(1))


def test_a_callback_replacing_the_datasets_tensors_mid_epoch_trains_on_the_batches_torch_gives():
    def standardise(loader):
        x, y = loader.dataset.tensors
        loader.dataset.tensors = ((x - x.mean(0)) / x.std(0) + 100.0, y)

    trained_on, torchs = fit_and_torchs_loop(shuffled_loader, standardise)
    assert len(trained_on) == len(torchs) == 16
    assert all(torch.equal(ours, theirs) for ours, theirs in zip(trained_on, torchs))
    assert trained_on[0].mean() < 10 < trained_on[1].mean()  # the new tensors from the second batch on


def test_a_collate_fn_set_by_a_callback_during_fit_counts_as_in_torchs_loop():
    def halved(samples):
        features, labels = default_collate(samples)
        return [features * 0.5, labels]

    def set_collate(loader):
        loader.collate_fn = halved  # DataLoader lets this be set at any time; its next pass uses it

    trained_on, torchs = fit_and_torchs_loop(shuffled_loader, set_collate)
    assert len(trained_on) == len(torchs) == 16
    assert all(torch.equal(ours, theirs) for ours, theirs in zip(trained_on, torchs))
    x, _ = points(64)
    assert torch.equal(torch.sort(torch.cat(trained_on[8:]).flatten())[0], torch.sort((x * 0.5).flatten())[0])


def test_a_class_level_patch_of_the_datasets_getitem_is_read(monkeypatch):
    x, y = points(32)
    loader = DataLoader(TensorDataset(x, y), batch_size=8)
    plain = TensorDataset.__getitem__
    monkeypatch.setattr(TensorDataset, "__getitem__", lambda self, i: (plain(self, i)[0] + 1000.0, plain(self, i)[1]))
    net = Recorder()
    kt.KerasModel(net, nn.CrossEntropyLoss(), optimizer=torch.optim.SGD(net.parameters(), lr=0.1)).fit(
        loader, epochs=1, verbose=0
    )
    assert torch.equal(torch.cat(net.trained_on), x + 1000.0)


def assert_same_run(run, other):
    pd.testing.assert_frame_equal(run[0], other[0], check_exact=True)
    assert all(torch.equal(run[1][k], other[1][k]) for k in run[1])
    assert torch.equal(run[2], other[2])


def test_a_sampler_without_a_length_trains_as_with_torchs_fetch():
    x, y = points(96)

    class Endless(torch.utils.data.Sampler):
        def __iter__(self):
            while True:
                yield from torch.randperm(len(x)).tolist()

    def fit_endless(collate_fn=None):
        kt.seed_everything(0)
        collate = {} if collate_fn is None else {"collate_fn": collate_fn}
        loader = DataLoader(TensorDataset(x, y), batch_size=8, sampler=Endless(), **collate)
        model = dropout_model()
        history = model.fit(loader, epochs=2, steps_per_epoch=5, verbose=0)
        return history, {k: v.clone() for k, v in model.net.state_dict().items()}, torch.random.get_rng_state()

    assert_same_run(fit_endless(), fit_endless(by_sample))


def test_a_batch_sampler_as_sampler_reads_a_tensor_dataset_by_index_and_trains_as_torchs_shuffle():
    """docs/performance.md's way to the speed of arrays for a DataLoader of the user's own."""
    x, y = points(96)
    ds = TensorDataset(x, y)

    def fit(loader):
        kt.seed_everything(0)
        model = dropout_model()
        history = model.fit(loader, epochs=2, verbose=0, patience=None)
        return history, {k: v.clone() for k, v in model.net.state_dict().items()}, torch.random.get_rng_state()

    fast = DataLoader(ds, batch_size=None, sampler=BatchSampler(RandomSampler(ds), batch_size=16, drop_last=False))
    assert_same_run(fit(fast), fit(DataLoader(ds, batch_size=16, shuffle=True)))


class StandardiseAtTrainBegin(kt.Callback):
    """Standardises the training and validation tensors in place when training begins."""

    def __init__(self, *loaders):
        self.loaders = loaders

    def on_train_begin(self, logs=None):
        for loader in self.loaders:
            x = loader.dataset.tensors[0]
            x.sub_(x.mean(0)).div_(x.std(0))


def test_data_a_callback_changes_in_on_train_begin_counts_from_the_first_batch_and_the_first_validation():
    """The first batches fit checks and the first validation are fetched after on_train_begin."""

    def run(standardise_in_callback):
        x, y = points(96, seed=3)
        x_val, y_val = points(48, seed=4)
        x, x_val = x * 7.0 + 3.0, x_val * 7.0 + 3.0
        dl_train = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
        dl_val = DataLoader(TensorDataset(x_val, y_val), batch_size=16)
        callbacks = [StandardiseAtTrainBegin(dl_train, dl_val)] if standardise_in_callback else []
        if not standardise_in_callback:
            StandardiseAtTrainBegin(dl_train, dl_val).on_train_begin()
        kt.seed_everything(0)
        net = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 2))
        model = kt.KerasModel(net, nn.CrossEntropyLoss(), optimizer=torch.optim.SGD(net.parameters(), lr=0.1))
        history = model.fit(dl_train, dl_val, epochs=2, verbose=0, callbacks=callbacks)
        return history, model, dl_val

    history, model, dl_val = run(standardise_in_callback=True)
    before, _, _ = run(standardise_in_callback=False)
    pd.testing.assert_frame_equal(history, before, check_exact=True)  # as if the data came standardised
    assert model.evaluate(dl_val, verbose=0)["val_loss"] == pytest.approx(history["val_loss"].min(), rel=1e-6)
