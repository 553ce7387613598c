"""Metrics the tests share: the same accuracy as a plain function and as the module that
torchkeras users write (state in Parameters, updated in forward).

Imported as ``from helpers import ...``: pytest puts tests/ on the path, and so does
running a script in tests/ as ``python tests/xxx_script.py``.
"""

from __future__ import annotations

import torch
from torch import nn


def accuracy(preds: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The fraction of argmax predictions equal to the labels (a plain-function metric)."""
    return (preds.argmax(dim=-1) == labels).float().mean()


class TorchkerasAccuracy(nn.Module):
    """The accuracy of torchkeras's README: ``forward`` updates correct/total Parameters and
    returns the batch's accuracy, ``compute`` divides, ``reset`` zeroes them in place."""

    def __init__(self):
        super().__init__()
        self.correct = nn.Parameter(torch.tensor(0.0), requires_grad=False)
        self.total = nn.Parameter(torch.tensor(0.0), requires_grad=False)

    def forward(self, preds: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        preds = preds.argmax(dim=-1)
        targets = targets.reshape(-1)
        correct = (preds == targets).sum()
        self.correct += correct
        self.total += targets.shape[0]
        return correct / targets.shape[0]

    def compute(self) -> torch.Tensor:
        return self.correct.float() / self.total

    def reset(self) -> None:
        self.correct -= self.correct
        self.total -= self.total
