"""What the tests share: the same accuracy as a plain function and as the module that torchkeras
users write (state in Parameters, updated in forward); a way to run a test where file modes bind;
what a method of KerasModel hands the door for a call.

Imported as ``from helpers import ...``: pytest puts tests/ on the path, and so does
running a script in tests/ as ``python tests/xxx_script.py``.
"""

from __future__ import annotations

import inspect
import os
import shutil
import subprocess
import sys

import pytest
import torch
from torch import nn


def called(method, model, *args, **kwargs) -> dict:
    """What ``model.method(*args, **kwargs)`` hands the door (``kerastorch.arguments``): the method's
    signature bound to the call, every default filled in."""
    bound = inspect.signature(method).bind(model, *args, **kwargs)
    bound.apply_defaults()
    return {name: value for name, value in bound.arguments.items() if name != "self"}


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


# Set in the child process that ran_where_file_modes_bind starts: the test then runs itself.
WITHOUT_ROOTS_OVERRIDE = "KERASTORCH_TEST_WITHOUT_ROOTS_OVERRIDE"


def ran_where_file_modes_bind(request) -> bool:
    """For a test about read-only files and folders: root (as CI runs) writes into them anyway, so
    as root the test runs again in a child process started without that power (``setpriv`` drops
    CAP_DAC_OVERRIDE), and this returns True once the child passed: the test is done. False where
    file modes bind already (not root, or in that child): the test goes on here."""
    if os.geteuid() != 0 or os.environ.get(WITHOUT_ROOTS_OVERRIDE):
        return False
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("root writes into read-only files, and setpriv (util-linux), which drops that, is not here")
    child = subprocess.run(
        [setpriv, "--bounding-set=-dac_override,-dac_read_search", sys.executable, "-m", "pytest", "-q"]
        + ["-p", "no:cacheprovider", request.node.nodeid],
        cwd=request.config.rootpath,
        env={**os.environ, WITHOUT_ROOTS_OVERRIDE: "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert child.returncode == 0 and " passed" in child.stdout, child.stdout + child.stderr
    return True
