"""fit(devices=k) from a notebook: again after a failure, and Ctrl-C afterwards."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from small_runs import digits_model

import kerastorch as kt

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


# -- 1, 2. fit(devices=k) from a notebook: again after a failure, and Ctrl-C afterwards ----------


AGAIN_AFTER_A_FAILURE = """
import gc, os, torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
import kerastorch as kt

class FailsOnRankOne(kt.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if os.environ.get("RANK") == "1":
            raise ValueError("rank one cannot go on")

def model():
    net = nn.Linear(4, 3)
    return kt.KerasModel(net, nn.CrossEntropyLoss(), {}, torch.optim.SGD(net.parameters(), lr=0.1))

data = DataLoader(TensorDataset(torch.randn(64, 4), torch.randint(0, 3, (64,))), batch_size=16)
# No collection in this process between the two fits (there may be none in a notebook either): what the
# failed launch left is still there when the next one forks its workers, which collect (accelerate does).
gc.disable()
try:
    model().fit(data, epochs=1, verbose=0, accelerator="cpu", devices=2, callbacks=[FailsOnRankOne()])
except ValueError as error:
    print("first fit:", error)
history = model().fit(data, epochs=2, verbose=0, accelerator="cpu", devices=2)
print("second fit:", len(history), "epochs")
"""


@pytest.mark.slow
def test_fit_on_two_processes_again_after_a_failed_one_trains(tmp_path):
    env = {**os.environ, "PYTHONPATH": REPO_ROOT, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(
        [sys.executable, "-c", AGAIN_AFTER_A_FAILURE],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # the workers too, to end them all if they hang
    )
    try:
        output, _ = process.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"the second fit(devices=2) hung:\n{output[-3000:]}")
    assert process.returncode == 0, output[-3000:]
    assert "first fit: rank one cannot go on" in output and "second fit: 2 epochs" in output


class InterruptAtEpoch(kt.Callback):
    def __init__(self, epoch):
        self.epoch = epoch

    def on_epoch_end(self, epoch, logs=None):
        if epoch == self.epoch:
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C


@pytest.mark.slow
def test_ctrl_c_after_a_fit_on_two_processes_still_returns_the_history_so_far(digits):
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    digits_model().fit(*digits, epochs=1, verbose=0, accelerator="cpu", devices=2)
    assert {sig: signal.getsignal(sig) for sig in handlers} == handlers  # the caller's handlers are back
    history = digits_model().fit(*digits, epochs=4, verbose=0, callbacks=[InterruptAtEpoch(2)])
    assert len(history) == 2
