"""Small real data and nets shared by the tests: scikit-learn's bundled 8x8 digits."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from kerastorch.examples import digits_datasets

# Weights & Biases runs are written to files here: nothing reaches the network.
os.environ.setdefault("WANDB_MODE", "offline")


@pytest.fixture(scope="session", autouse=True)
def one_thread():
    """Tiny nets train several times faster on one thread of a small shared CPU: more
    threads only wait for each other. Subprocesses set their own."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def digits8():
    """(train, val) TensorDatasets of flattened 8x8 digits: 1348 and 449 samples (no test part)."""
    ds_train, ds_val, _ = digits_datasets(size=8, seed=0, val_fraction=0.25, test_fraction=0.0)
    flat = lambda ds: TensorDataset(ds.tensors[0].flatten(1), ds.tensors[1])
    return flat(ds_train), flat(ds_val)


@pytest.fixture
def digits(digits8):
    """(train, val) loaders of digits8 in batches of 128 and 200, the training one shuffled."""
    ds_train, ds_val = digits8
    torch.manual_seed(0)
    return DataLoader(ds_train, batch_size=128, shuffle=True), DataLoader(ds_val, batch_size=200)


@pytest.fixture
def loaders(digits8):
    ds_train, ds_val = digits8
    torch.manual_seed(0)
    return DataLoader(ds_train, batch_size=64, shuffle=True), DataLoader(ds_val, batch_size=50)


def make_mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))


@pytest.fixture
def mlp():
    return make_mlp()
