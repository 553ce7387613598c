"""The net's train/eval mode for the length of a block, and back to what it was afterwards.

Evaluating, predicting and looking at a first batch run the net in eval mode (dropout off,
BatchNorm's running statistics used), and leave it in the mode it had, also after an
error or Ctrl-C. Training runs every module in train mode except those the user put in eval
mode (:class:`TrainingModes`: a frozen backbone's BatchNorm keeps its statistics), and ``fit``
leaves every module in the mode it found it in (:func:`modes_kept`).

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
def eval_mode(net: nn.Module, *others: object) -> Iterator[nn.Module]:
    """``net`` in eval mode inside the block, and each of ``others`` that is a module (a loss with
    parameters or buffers of its own); their own modes back afterwards."""
    with contextlib.ExitStack() as stack:
        for module in (net, *others):
            if isinstance(module, nn.Module):
                stack.enter_context(_mode(module, training=False))
        yield net


@contextlib.contextmanager
def train_mode(net: nn.Module) -> Iterator[nn.Module]:
    """``net`` in train mode inside the block; its own mode back afterwards."""
    with _mode(net, training=True):
        yield net


@contextlib.contextmanager
def modes_kept(net: nn.Module) -> Iterator[None]:
    """Every module of ``net`` back in the mode it had before the block, whatever the block did."""
    modes = {module: module.training for module in net.modules()}
    try:
        yield
    finally:
        for module, was_training in modes.items():
            module.training = was_training


class TrainingModes:
    """The modes a net trains in: train mode, except the modules that are in eval mode when training
    begins (put there by the user before ``fit`` or in ``on_train_begin``: a frozen BatchNorm), as
    Lightning does. A net wholly in eval mode (left so by code that ran it for inference) trains
    wholly in train mode.

    >>> import torch
    >>> net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
    >>> _ = net[1].eval()
    >>> modes = TrainingModes(net)
    >>> _ = net.eval()
    >>> modes.for_training()
    >>> net.training, net[0].training, net[1].training
    (True, True, False)
    """

    def __init__(self, net: nn.Module):
        self.net = net
        modules = list(net.modules())
        in_eval = [module for module in modules if not module.training]
        self.kept_in_eval = [] if len(in_eval) == len(modules) else in_eval

    def for_training(self) -> None:
        """The net in train mode, but for the modules kept in eval mode (each alone, not its children)."""
        self.net.train()
        for module in self.kept_in_eval:
            module.training = False


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


__all__ = ["TrainingModes", "eval_mode", "modes_kept", "train_mode"]
