"""The tutorials' data and net: handwritten digits that ship offline, and seed 003's CNN.

The digits are scikit-learn's bundled 8x8 images (1,797 of them), scaled up to the
28x28 MNIST size the CNN was written for. They come in three parts: one to train on,
one to pick the best epoch (validation) and one to report the final score (test), which
training never sees. Needs the ``examples`` extra: ``pip install ".[examples]"``.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def digits_datasets(
    size: int = 28, seed: int = 0, val_fraction: float = 0.125, test_fraction: float = 0.125
) -> tuple[TensorDataset, TensorDataset, TensorDataset]:
    """Train, validation and test sets of ``(image[1, size, size], label)``.

    The split is fixed by ``seed``: 1,348 digits to train, 225 to validate and 224 to test
    with the default fractions. The three never share a digit.

    Example:
        >>> ds_train, ds_val, ds_test = digits_datasets(size=8)
        >>> len(ds_train), len(ds_val), len(ds_test)
        (1348, 225, 224)
    """
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise ImportError(
            "The digits data comes with scikit-learn, which is not installed. Install it with "
            'pip install scikit-learn, or in a copy of the kerastorch repository: pip install ".[examples]"'
        ) from None
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    if size != 8:
        images = nn.functional.interpolate(images, size=(size, size), mode="bilinear", align_corners=False)
    labels = torch.tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    n_held_out = int(len(labels) * (val_fraction + test_fraction))
    n_val = n_held_out - int(len(labels) * test_fraction)
    parts = order[:n_val], order[n_val:n_held_out], order[n_held_out:]
    val, test, train = (TensorDataset(images[part], labels[part]) for part in parts)
    return train, val, test


def digits_loaders(
    batch_size: int = 64, size: int = 28, seed: int = 0, val_fraction: float = 0.125, test_fraction: float = 0.125
) -> tuple[DataLoader, DataLoader, DataLoader]:
    """Loaders over :func:`digits_datasets`: training shuffled, validation and test in order."""
    ds_train, ds_val, ds_test = digits_datasets(size, seed, val_fraction, test_fraction)
    return (
        DataLoader(ds_train, batch_size=batch_size, shuffle=True),
        DataLoader(ds_val, batch_size=batch_size, shuffle=False),
        DataLoader(ds_test, batch_size=batch_size, shuffle=False),
    )


def create_cnn(num_classes: int = 10) -> nn.Sequential:
    """Seed 003's CNN for 1x28x28 images."""
    net = nn.Sequential()
    net.add_module("conv1", nn.Conv2d(in_channels=1, out_channels=32, kernel_size=3))
    net.add_module("pool1", nn.MaxPool2d(kernel_size=2, stride=2))
    net.add_module("conv2", nn.Conv2d(in_channels=32, out_channels=64, kernel_size=5))
    net.add_module("pool2", nn.MaxPool2d(kernel_size=2, stride=2))
    net.add_module("dropout", nn.Dropout2d(p=0.1))
    net.add_module("adaptive_pool", nn.AdaptiveMaxPool2d((1, 1)))
    net.add_module("flatten", nn.Flatten())
    net.add_module("linear1", nn.Linear(64, 32))
    net.add_module("relu", nn.ReLU())
    net.add_module("linear2", nn.Linear(32, num_classes))
    return net
