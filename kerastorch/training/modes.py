"""The net's train/eval mode for the length of a block, and back to what it was afterwards.

Evaluating, predicting and looking at a first batch run the net in eval mode (dropout off,
BatchNorm's running statistics used), and leave it in the mode it had, also after an
error or Ctrl-C.

>>> import torch
>>> net = torch.nn.Dropout()
>>> with eval_mode(net):
...     net.training
False
>>> net.training
True
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from torch import nn


@contextlib.contextmanager
def eval_mode(net: nn.Module) -> Iterator[nn.Module]:
    """``net`` in eval mode inside the block; its own mode back afterwards."""
    with _mode(net, training=False):
        yield net


@contextlib.contextmanager
def train_mode(net: nn.Module) -> Iterator[nn.Module]:
    """``net`` in train mode inside the block; its own mode back afterwards."""
    with _mode(net, training=True):
        yield net


@contextlib.contextmanager
def _mode(net: nn.Module, training: bool) -> Iterator[None]:
    # Each submodule's own flag is kept, not only the root's: a frozen BatchNorm the user put in
    # eval mode inside a training net stays so.
    modes = {module: module.training for module in net.modules()}
    net.train(training)
    try:
        yield
    finally:
        for module, was_training in modes.items():
            module.training = was_training


__all__ = ["eval_mode", "train_mode"]
