"""Small data, nets and models shared by tests in several folders."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, Subset, TensorDataset

import kerastorch as kt
from helpers import accuracy


def blobs(n=400, classes=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, classes, (n,), generator=g)
    centers = torch.tensor([[0.0, 0.0], [3.0, 0.0], [0.0, 3.0]])[:classes]
    return centers[y] + 0.7 * torch.randn(n, 2, generator=g), y


def loaders(x=None, y=None, batch_size=32, sampler=None, split=300):
    if x is None:
        x, y = blobs()
    torch.manual_seed(0)
    train = DataLoader(
        TensorDataset(x[:split], y[:split]), batch_size=batch_size, shuffle=sampler is None, sampler=sampler
    )
    return train, DataLoader(TensorDataset(x[split:], y[split:]), batch_size=50)


def mlp(inputs=2, outputs=3, seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(inputs, 16), nn.ReLU(), nn.Linear(16, outputs))


def make_model(net=None, loss_fn=None, lr=0.05, metrics=None, optimizer=None, lr_scheduler=None):
    net = net if net is not None else mlp()
    optimizer = optimizer or torch.optim.Adam(net.parameters(), lr=lr)
    return kt.KerasModel(net, loss_fn or nn.CrossEntropyLoss(), metrics or {}, optimizer, lr_scheduler=lr_scheduler)


def weights_of(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def digits_model():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    return kt.KerasModel(net, nn.CrossEntropyLoss(), {"acc": accuracy}, torch.optim.Adam(net.parameters(), lr=1e-2))


def batch_norm_model():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 10))
    return kt.KerasModel(net, nn.CrossEntropyLoss(), {"acc": accuracy}, torch.optim.Adam(net.parameters(), lr=1e-2))


def digits_for_processes(digits8, val_samples=101):
    ds_train, ds_val = digits8
    torch.manual_seed(1)  # the same shuffling for every run
    # 101 validation samples in batches of 16: 4 batches for one process, 3 for the other.
    return DataLoader(ds_train, batch_size=64, shuffle=True), DataLoader(Subset(ds_val, range(val_samples)), 16)
