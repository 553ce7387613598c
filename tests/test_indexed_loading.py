"""A DataLoader over tensors in memory reads each batch with one index per tensor
(``kerastorch/data/indexed.py``): the batches, the data order, the random numbers drawn and so the
whole run are those of the loader as given, and a loader where that could differ is left alone."""

from __future__ import annotations

import os
import signal

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    Subset,
    TensorDataset,
    WeightedRandomSampler,
    default_collate,
    random_split,
)

import kerastorch as kt
import kerastorch.data.forms as forms
from kerastorch.data.arrays import array_dataset
from kerastorch.data.indexed import IndexedLoader, read_by_index


def by_sample(batch):
    """torch's default collate, as a function of the user's own: a loader with it is not read by index."""
    return default_collate(batch)


def points(n=200, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 5, generator=g)
    return x, (x[:, 0] > x[:, 1]).long(), g


def assert_same_batch(ours, torchs):
    """The same structure, types, dtypes, shapes, memory layout and values."""
    assert type(ours) is type(torchs)
    if isinstance(torchs, torch.Tensor):
        assert ours.dtype == torchs.dtype and ours.shape == torchs.shape and ours.stride() == torchs.stride()
        assert torch.equal(ours, torchs)
    elif isinstance(torchs, dict):
        assert list(ours) == list(torchs)
        for key in torchs:
            assert_same_batch(ours[key], torchs[key])
    else:
        assert len(ours) == len(torchs)
        for a, b in zip(ours, torchs):
            assert_same_batch(a, b)


def two_passes(loader):
    """Each batch of two passes, with torch's random state and the loader's generator's after each batch."""
    seen = []
    for _ in range(2):
        for batch in loader:
            generator = loader.generator.get_state() if loader.generator is not None else None
            seen.append((batch, torch.random.get_rng_state(), generator))
    return seen


def assert_read_as_torch_reads(make_loader):
    """``make_loader()`` read by index gives what the loader itself gives, random states included."""
    torch.manual_seed(3)
    expected = two_passes(make_loader())
    torch.manual_seed(3)
    loader = make_loader()
    indexed = read_by_index(loader)
    assert type(indexed) is IndexedLoader and type(loader) is DataLoader
    got = two_passes(indexed)
    assert len(got) == len(expected) > 0
    for (batch, state, generator), (want, want_state, want_generator) in zip(got, expected):
        assert_same_batch(batch, want)
        assert torch.equal(state, want_state)
        assert (generator is None) == (want_generator is None)
        assert generator is None or torch.equal(generator, want_generator)


def keras_arrays(form):
    """The dataset kerastorch makes of arrays given in one of Keras's forms."""
    x, y, _ = points()
    w = torch.rand(len(x))
    x2 = np.random.default_rng(0).normal(size=(len(x), 3))  # float64 NumPy: made float32
    given = {
        "X, y": dict(data=x, y=y),
        "(X1, X2), y": dict(data=(x, x2), y=y),
        "dict of arrays with labels": dict(data={"a": x, "b": x2, "labels": y}, y=None),
        "sample weights": dict(data=x, y=y, sample_weight=w),
        "labels of two outputs": dict(data=x, y=[y, y.float()]),
        "labels of named outputs": dict(data=x, y={"first": y, "second": y.float()}),
        "inputs only (predict)": dict(data=[x, x2], y=None, needs_labels=False),
    }[form]
    return array_dataset(
        given["data"],
        given["y"],
        given.get("sample_weight"),
        "x",
        keep_float64=False,
        needs_labels=given.get("needs_labels", True),
    )


@pytest.mark.parametrize(
    "form",
    [
        "X, y",
        "(X1, X2), y",
        "dict of arrays with labels",
        "sample weights",
        "labels of two outputs",
        "labels of named outputs",
        "inputs only (predict)",
    ],
)
def test_the_arrays_kerastorch_batches_are_read_as_torch_reads_them(form):
    dataset = keras_arrays(form)
    assert_read_as_torch_reads(lambda: DataLoader(dataset, batch_size=32, shuffle=True))


@pytest.mark.parametrize(
    "loader_of",
    [
        lambda x, y, g: DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True),
        lambda x, y, g: DataLoader(TensorDataset(x, y), batch_size=7, drop_last=True),
        lambda x, y, g: DataLoader(TensorDataset(x), batch_size=64, shuffle=True, generator=g),
        lambda x, y, g: DataLoader(random_split(TensorDataset(x, y), [0.7, 0.3])[0], batch_size=16, shuffle=True),
        lambda x, y, g: DataLoader(Subset(TensorDataset(x, y), np.arange(150, 10, -3, dtype=np.int32)), batch_size=9),
        lambda x, y, g: DataLoader(Subset(TensorDataset(x, y), range(20, 180)), batch_size=16, shuffle=True),
        lambda x, y, g: DataLoader(
            TensorDataset(x, y), batch_size=10, sampler=WeightedRandomSampler(torch.rand(len(x)), 80, generator=g)
        ),
        lambda x, y, g: DataLoader(
            TensorDataset(x.double(), y.int()), batch_sampler=BatchSampler(range(5, 60), 8, False)
        ),
    ],
    ids=[
        "shuffled",
        "drop_last",
        "a generator of its own",
        "random_split",
        "Subset with NumPy indices",
        "Subset of a range",
        "WeightedRandomSampler",
        "batch_sampler",
    ],
)
def test_a_loader_over_tensors_is_read_as_torch_reads_it(loader_of):
    x, y, _ = points()
    g = torch.Generator()

    def make():
        g.manual_seed(5)  # the loader's own generator, where it has one, starts alike for both
        return loader_of(x, y, g)

    assert_read_as_torch_reads(make)


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


@pytest.mark.parametrize(
    "loader_of",
    [
        lambda x, y: DataLoader(TensorDataset(x, y), batch_size=8, num_workers=1),
        lambda x, y: DataLoader(TensorDataset(x, y), batch_size=8, collate_fn=by_sample),
        lambda x, y: OwnLoader(TensorDataset(x, y), batch_size=8),
        lambda x, y: DataLoader(Rows(x, y), batch_size=8),
        lambda x, y: DataLoader(TensorDataset(x.as_subclass(TaggedTensor), y), batch_size=8),
        lambda x, y: DataLoader(TensorDataset(x.T.contiguous().T, y), batch_size=8),
        lambda x, y: DataLoader(TensorDataset(x, y), batch_size=None),
        lambda x, y: DataLoader(TensorDataset(torch.randn(1, 40, 2).permute(1, 2, 0), y), batch_size=8),
        lambda x, y: DataLoader(TensorDataset(torch.empty(40, 0, 5).transpose(1, 2), y), batch_size=8),
        lambda x, y: DataLoader(Subset(TensorDataset(x, y), torch.tensor([3, 1], dtype=torch.uint8)), batch_size=2),
        lambda x, y: DataLoader(Subset(TensorDataset(x, y), [1, True]), batch_size=2),
        lambda x, y: DataLoader(Subset(TensorDataset(x, y), [torch.tensor([1]), torch.tensor([2])]), batch_size=2),
    ],
    ids=[
        "worker processes",
        "a collate_fn of its own",
        "a DataLoader subclass",
        "a Dataset of its own",
        "a tensor subclass",
        "a tensor of another memory layout",
        "batch_size=None",
        "strides of a size-1 dimension that a stack sets otherwise",
        "no elements, strides a stack sets otherwise",
        "Subset of uint8 indices (masks to torch)",
        "Subset with a bool among its indices",
        "Subset of one-element tensors",
    ],
)
def test_a_loader_whose_batches_reading_by_index_could_change_is_left_as_it_is(loader_of):
    x, y, _ = points(40)
    loader = loader_of(x, y)
    assert read_by_index(loader) is loader


@pytest.mark.skipif(torch.cuda.is_available(), reason="pinned on CUDA, a batch read by index is pinned too")
def test_a_loader_pinned_without_cuda_is_left_to_torch_which_warns_of_it():
    x, y, _ = points(40)
    loader = DataLoader(TensorDataset(x, y), batch_size=8, pin_memory=True)
    assert read_by_index(loader) is loader


@pytest.mark.parametrize(
    "indices",
    [[0, 1.5], [1, True], [np.int64(2), 3], [torch.tensor([1]), torch.tensor([2])], [torch.tensor(4), 2], [2**63, 1]],
    ids=["a float", "a bool", "a NumPy integer", "one-element tensors", "a 0-d tensor", "beyond int64"],
)
def test_indices_other_than_python_ints_are_fetched_as_torch_fetches_them(indices):
    x, y, _ = points(40)
    loader = DataLoader(TensorDataset(x, y), batch_sampler=[indices, [5, 6]])

    def first_batch_or_error(loader):
        try:
            return next(iter(loader))
        except Exception as error:
            return type(error), str(error)

    ours, torchs = first_batch_or_error(read_by_index(loader)), first_batch_or_error(loader)
    if isinstance(torchs, tuple):
        assert ours == torchs
    else:
        assert_same_batch(ours, torchs)


def test_a_sampler_without_a_length_trains_as_with_torchs_fetch():
    x, y, _ = points(96)

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


def test_a_pass_after_the_dataset_changed_is_torchs_own():
    x, _, _ = points(40)
    dataset = TensorDataset(x)
    indexed = read_by_index(DataLoader(dataset, batch_size=8))
    assert type(next(iter(indexed))[0]) is torch.Tensor
    dataset.tensors = (x.T.contiguous().T,)  # a callback replacing the data between epochs: no longer row by row
    batches = list(indexed)
    assert all(torch.equal(batch[0], x[8 * i : 8 * i + 8]) for i, batch in enumerate(batches)) and len(batches) == 5


def test_a_change_to_the_users_loader_during_fit_is_followed_as_without_reading_by_index(monkeypatch):
    x, y, _ = points(96)

    def halved(samples):
        features, labels = default_collate(samples)
        return [features * 0.5, labels]

    def fit_with_curriculum():
        loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)

        class Curriculum(kt.Callback):
            def on_epoch_begin(self, epoch, logs=None):
                if epoch == 2:
                    loader.collate_fn = halved  # DataLoader lets this be set at any time

        kt.seed_everything(0)
        model = dropout_model()
        history = model.fit(loader, epochs=3, verbose=0, patience=None, callbacks=[Curriculum()])
        return history, {k: v.clone() for k, v in model.net.state_dict().items()}, torch.random.get_rng_state()

    followed = fit_with_curriculum()
    monkeypatch.setattr(forms, "read_by_index", lambda loader: loader)
    assert_same_run(followed, fit_with_curriculum())


def test_torchs_profiler_sees_each_batch_of_a_pass_read_by_index_as_data():
    x, y, _ = points(32)

    def data_events(loader):
        with torch.profiler.profile() as profiler:
            batches = list(loader)
        assert len(batches) == 4
        return [event.name for event in profiler.events() if event.name.startswith("enumerate(DataLoader)#")]

    loader = DataLoader(TensorDataset(x, y), batch_size=8)
    assert len(data_events(read_by_index(loader))) == len(data_events(loader)) >= 4  # the end of the pass, too


def dropout_model(seed=0):
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 2))
    return kt.KerasModel(net, nn.CrossEntropyLoss(), optimizer=torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9))


def run(collate_fn=None, callbacks=(), **fit_options):
    """Three epochs on shuffled TensorDataset loaders, with dropout; the history, the weights and
    torch's random state afterwards."""
    x, y, _ = points(240)
    collate = {} if collate_fn is None else {"collate_fn": collate_fn}
    kt.seed_everything(0)
    model = dropout_model()
    history = model.fit(
        DataLoader(TensorDataset(x[:192], y[:192]), batch_size=16, shuffle=True, **collate),
        DataLoader(TensorDataset(x[192:], y[192:]), batch_size=16, **collate),
        epochs=3,
        patience=None,
        verbose=0,
        callbacks=list(callbacks),
        **fit_options,
    )
    return history, {k: v.clone() for k, v in model.net.state_dict().items()}, torch.random.get_rng_state()


def assert_same_run(run, other):
    pd.testing.assert_frame_equal(run[0], other[0], check_exact=True)
    assert all(torch.equal(run[1][k], other[1][k]) for k in run[1])
    assert torch.equal(run[2], other[2])


def test_fit_over_a_loader_read_by_index_is_the_run_over_the_loader_itself():
    fast, slow = run(), run(collate_fn=by_sample)
    assert fast[0]["val_loss"].iloc[-1] < fast[0]["val_loss"].iloc[0]  # it learned
    assert_same_run(fast, slow)


def test_the_users_loader_is_left_as_it_was():
    x, y, _ = points()
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    before = dict(vars(loader))
    dropout_model().fit(loader, epochs=1, verbose=0)
    assert type(loader) is DataLoader and vars(loader) == before


def test_a_run_preempted_mid_epoch_resumes_to_the_run_over_the_loader_itself(tmp_path):
    class SignalAt(kt.Callback):
        epoch = 0

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_begin(self, batch, logs=None):
            if (self.epoch, batch) == (2, 5):
                os.kill(os.getpid(), signal.SIGTERM)

    ckpt = tmp_path / "best.pt"
    with pytest.raises(kt.Preempted):
        run(callbacks=[SignalAt()], ckpt_path=ckpt, resume=True)
    resumed = run(ckpt_path=ckpt, resume=True)
    assert_same_run(resumed, run(collate_fn=by_sample))


def test_fit_on_arrays_with_validation_split_is_the_run_read_sample_by_sample(monkeypatch):
    x, y, _ = points(300)

    def fit_arrays():
        kt.seed_everything(0)
        model = dropout_model()
        history = model.fit(x.numpy(), y.numpy(), validation_split=0.25, batch_size=20, epochs=2, verbose=0)
        return history, {k: v.clone() for k, v in model.net.state_dict().items()}, torch.random.get_rng_state()

    fast = fit_arrays()
    monkeypatch.setattr(forms, "read_by_index", lambda loader: loader)  # the loaders as torch reads them
    assert_same_run(fast, fit_arrays())


def test_evaluate_and_predict_over_a_loader_read_by_index_give_the_loaders_values():
    x, y, _ = points()
    model = dropout_model()
    plain = DataLoader(TensorDataset(x, y), batch_size=32)
    by_sample_loader = DataLoader(TensorDataset(x, y), batch_size=32, collate_fn=by_sample)
    assert model.evaluate(plain, verbose=0) == model.evaluate(by_sample_loader, verbose=0)
    assert torch.equal(model.predict(plain), model.predict(by_sample_loader))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_pinned_loader_on_cuda_is_read_by_index_and_pinned_as_torch_pins_it():
    x, y, _ = points()
    assert_read_as_torch_reads(lambda: DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True, pin_memory=True))
    batch = next(iter(read_by_index(DataLoader(TensorDataset(x, y), batch_size=16, pin_memory=True))))
    assert all(tensor.is_pinned() for tensor in batch)
