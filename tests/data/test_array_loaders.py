"""The loaders kerastorch builds over arrays (``fit(X, y)``, ``validation_split``, ``evaluate`` and
``predict`` of arrays) read each batch with one index per array, through torch's public
``__getitems__`` (``kerastorch/data/loaders.py``): the batches, the data order, the random numbers
drawn and so the whole run are those of a torch DataLoader reading the same tensors sample by sample."""

from __future__ import annotations

import os
import signal

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, Subset, TensorDataset

import kerastorch as kt
from kerastorch.data.arrays import array_dataset
from kerastorch.data.forms import FitData, eval_loader, prepare_data
from kerastorch.data.loaders import loader_for


class Samples(Dataset):
    """A dataset read sample by sample, as torch reads one without ``__getitems__``: ``dataset[i]`` for
    each index, then ``default_collate``."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, index):
        return self.dataset[index]


def points(n=200, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 5, generator=g)
    return x, (x[:, 0] > x[:, 1]).long()


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
    """Each batch of two passes, with torch's random state after each batch."""
    return [(batch, torch.random.get_rng_state()) for _ in range(2) for batch in loader]


def assert_read_as_torch_reads(ours, torchs):
    """The loader kerastorch built gives what torch's loader of the same samples read one by one gives,
    torch's random state included."""
    assert type(ours) is DataLoader
    torch.manual_seed(3)
    expected = two_passes(torchs)
    torch.manual_seed(3)
    got = two_passes(ours)
    assert len(got) == len(expected) > 0
    for (batch, state), (want, want_state) in zip(got, expected):
        assert_same_batch(batch, want)
        assert torch.equal(state, want_state)


def keras_arrays(form):
    """The dataset kerastorch makes of arrays given in one of Keras's forms."""
    x, y = points()
    w = torch.rand(len(x))
    x2 = np.random.default_rng(0).normal(size=(len(x), 3))  # float64 NumPy: made float32
    images = torch.randn(len(x), 3, 4, 4)
    given = {
        "X, y": dict(data=x, y=y),
        "(X1, X2), y": dict(data=(x, x2), y=y),
        "dict of arrays with labels": dict(data={"a": x, "b": x2, "labels": y}, y=None),
        "sample weights": dict(data=x, y=y, sample_weight=w),
        "labels of two outputs": dict(data=x, y=[y, y.float()]),
        "labels of named outputs": dict(data=x, y={"first": y, "second": y.float()}),
        "inputs only (predict)": dict(data=[x, x2], y=None, needs_labels=False),
        "a tensor of another memory layout": dict(data=x.T.contiguous().T, y=y),
        "channels-last images": dict(data=images.to(memory_format=torch.channels_last), y=y),
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
        "a tensor of another memory layout",
        "channels-last images",
    ],
)
def test_the_arrays_kerastorch_batches_are_read_as_torch_reads_them(form):
    dataset = keras_arrays(form)
    ours = loader_for(dataset, 32, shuffle=True, pin_memory=False)
    assert_read_as_torch_reads(ours, DataLoader(Samples(dataset), batch_size=32, shuffle=True))


def test_the_loaders_of_validation_split_are_read_as_torch_reads_them():
    x, y = points(203)
    data = FitData(x.numpy(), y=y.numpy(), sample_weight=np.linspace(0.5, 1.5, 203))
    train, val = prepare_data(data, 16, shuffle=True, validation_split=0.25, keep_float64=False, pin_memory=False)
    samples = Samples(array_dataset(x, y, torch.linspace(0.5, 1.5, 203, dtype=torch.float64), "x", False))
    assert_read_as_torch_reads(train, DataLoader(Subset(samples, range(152)), batch_size=16, shuffle=True))
    assert_read_as_torch_reads(val, DataLoader(Subset(samples, range(152, 203)), batch_size=16))


def test_evaluate_and_predicts_loaders_of_arrays_are_read_as_torch_reads_them():
    x, y = points(70)
    samples = Samples(array_dataset(x, y, None, "x", False))
    assert_read_as_torch_reads(eval_loader(x, y, 32, needs_labels=True), DataLoader(samples, batch_size=32))
    inputs = Samples(array_dataset(x, None, None, "x", False, needs_labels=False))
    assert_read_as_torch_reads(eval_loader(x, None, None, needs_labels=False), DataLoader(inputs, batch_size=32))


def test_torchs_profiler_sees_each_batch_of_a_loader_over_arrays_as_data():
    x, y = points(32)

    def data_events(loader):
        with torch.profiler.profile() as profiler:
            batches = list(loader)
        assert len(batches) == 4
        return [event.name for event in profiler.events() if event.name.startswith("enumerate(DataLoader)#")]

    dataset = array_dataset(x, y, None, "x", False)
    ours = loader_for(dataset, 8, shuffle=False, pin_memory=False)
    assert len(data_events(ours)) == len(data_events(DataLoader(Samples(dataset), batch_size=8))) >= 4


def dropout_model(seed=0):
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 2))
    return kt.KerasModel(net, nn.CrossEntropyLoss(), optimizer=torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9))


def outcome(model, history):
    """The history, the weights and torch's random state after a run."""
    return history, {k: v.clone() for k, v in model.net.state_dict().items()}, torch.random.get_rng_state()


def run(arrays, callbacks=(), **fit_options):
    """Three epochs with dropout on 192 shuffled training samples and 48 validation ones, given as
    arrays (kerastorch's loaders) or as torch DataLoaders of the same tensors (torch's fetch)."""
    x, y = points(240)
    kt.seed_everything(0)
    model = dropout_model()
    if arrays:
        train, val = (x[:192], y[:192]), (x[192:], y[192:])
        fit_options.update(batch_size=16)
    else:
        train = DataLoader(TensorDataset(x[:192], y[:192]), batch_size=16, shuffle=True)
        val = DataLoader(TensorDataset(x[192:], y[192:]), batch_size=16)
    history = model.fit(train, val, epochs=3, patience=None, verbose=0, callbacks=list(callbacks), **fit_options)
    return outcome(model, history)


def assert_same_run(run, other):
    pd.testing.assert_frame_equal(run[0], other[0], check_exact=True)
    assert all(torch.equal(run[1][k], other[1][k]) for k in run[1])
    assert torch.equal(run[2], other[2])


def test_fit_over_arrays_is_the_run_over_a_torch_loader_of_the_same_tensors():
    fast, torchs = run(arrays=True), run(arrays=False)
    assert fast[0]["val_loss"].iloc[-1] < fast[0]["val_loss"].iloc[0]  # it learned
    assert_same_run(fast, torchs)


def test_fit_on_arrays_with_validation_split_is_the_run_read_sample_by_sample():
    x, y = points(300)

    def fit(*data, **options):
        kt.seed_everything(0)
        model = dropout_model()
        return outcome(model, model.fit(*data, epochs=2, verbose=0, **options))

    fast = fit(x.numpy(), y.numpy(), validation_split=0.25, batch_size=20)
    train = DataLoader(TensorDataset(x[:225], y[:225]), batch_size=20, shuffle=True)
    assert_same_run(fast, fit(train, DataLoader(TensorDataset(x[225:], y[225:]), batch_size=20)))


def test_evaluate_and_predict_over_arrays_give_the_values_of_a_torch_loader():
    x, y = points()
    model = dropout_model()
    loader = DataLoader(TensorDataset(x, y), batch_size=32)
    assert model.evaluate(x, y, batch_size=32, verbose=0) == model.evaluate(loader, verbose=0)
    assert torch.equal(model.predict(x, batch_size=32), model.predict(loader))


@pytest.mark.parametrize("arrays", [True, False], ids=["arrays", "a DataLoader of the user's"])
def test_a_run_preempted_mid_epoch_resumes_to_the_run_never_stopped(tmp_path, arrays):
    class SignalAt(kt.Callback):
        epoch = 0

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_begin(self, batch, logs=None):
            if (self.epoch, batch) == (2, 5):
                os.kill(os.getpid(), signal.SIGTERM)

    ckpt = tmp_path / "best.pt"
    with pytest.raises(kt.Preempted):
        run(arrays, callbacks=[SignalAt()], ckpt_path=ckpt, resume=True)
    resumed = run(arrays, ckpt_path=ckpt, resume=True)
    assert_same_run(resumed, run(arrays=False))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_pinned_loader_over_arrays_on_cuda_is_pinned_as_torch_pins_it():
    x, y = points()
    dataset = array_dataset(x, y, torch.rand(len(x)), "x", False)
    ours = loader_for(dataset, 16, shuffle=True, pin_memory=True)
    assert_read_as_torch_reads(ours, DataLoader(Samples(dataset), batch_size=16, shuffle=True, pin_memory=True))
    batch = next(iter(ours))
    assert all(tensor.is_pinned() for tensor in [*batch.sample, batch.weight])
