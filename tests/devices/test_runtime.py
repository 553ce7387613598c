"""Devices and accelerators: seed 001's table through parse_devices, every error it gives,
CUDA_VISIBLE_DEVICES composition, and find_usable_cuda_devices (probing in a child process).

The GPU tests at the end skip on a machine without CUDA.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import kerastorch as kt
from kerastorch.compat.arguments import accelerator_from_cpu
from kerastorch.devices.cuda import _probe_in_child_process, cuda_visible_devices, visible_device_entries
from kerastorch.devices.plan import choose_devices, cpu_count, parse_accelerator
from kerastorch.devices.runtime import reset_accelerate_state
from kerastorch.devices.words import parse_devices

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HAS_CUDA = torch.cuda.device_count() > 0  # counted through NVML: does not initialise CUDA in this process


def needs_cuda(test):
    """A GPU test: marked `gpu`, skipped without CUDA."""
    return pytest.mark.gpu(pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")(test))


without_cuda = pytest.mark.skipif(HAS_CUDA, reason="checks the answer on a machine without CUDA")


# -- seed 001's table ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "devices, parsed",
    [
        (3, [0, 1, 2]),  # first 3 GPUs
        (-1, [0, 1, 2, 3]),  # all available GPUs
        ([0], [0]),  # GPU 0
        ([1, 3], [1, 3]),  # GPU index 1 and 3 (0-based)
        ("3", [0, 1, 2]),  # first 3 GPUs
        ("1, 3", [1, 3]),  # GPU index 1 and 3 (0-based)
        ("-1", [0, 1, 2, 3]),  # all available GPUs
        ("0, 1", [0, 1]),  # the seed's Trainer(devices="0, 1")
        ("3,", [3]),  # a comma makes the number an index
        ("0", [0]),  # zero devices is never meant: device 0
        ((2, 0), [2, 0]),
        (range(2), [0, 1]),
        (" 2 ", [0, 1]),
        ("auto", [0, 1, 2, 3]),  # all from a script
    ],
)
def test_parse_devices_follows_the_table(devices, parsed):
    assert kt.devices.parse_devices(devices, 4) == parsed


def test_auto_is_one_device_in_an_interactive_session():
    assert parse_devices("auto", 4, interactive=True) == [0]
    assert parse_devices("auto", 4, interactive=False) == [0, 1, 2, 3]


def test_three_and_three_comma_differ():
    assert parse_devices("3", 8) == [0, 1, 2]
    assert parse_devices("3,", 8) == [3]


@pytest.mark.parametrize(
    "devices, error, words",
    [
        (5, ValueError, "asks for 5 devices, but this machine has 4"),
        ("5", ValueError, "but this machine has 4"),
        ([4], ValueError, "has 4 devices: valid indices are 0 to 3"),
        ("1, 7", ValueError, "names index 7, but this machine has 4"),
        ([-1], ValueError, "names index -1"),
        ([1, 1], ValueError, "more than once"),
        ("2, 2", ValueError, "more than once"),
        (0, ValueError, "no device at all"),
        (-2, ValueError, "use a positive count, or -1 for all"),
        ([], ValueError, "is empty"),
        (1.0, TypeError, "is a float; devices takes an int k"),
        (True, TypeError, "is a bool"),
        (None, TypeError, "is a NoneType"),
        ({0, 1}, TypeError, "is a set"),
        ("gpu", ValueError, "is not understood; devices takes"),
        ("", ValueError, "is not understood"),
        ("1.5", ValueError, "is not understood"),
        ("0, x", ValueError, "is not a list of device indices"),
        (",", ValueError, "is not a list of device indices"),
        ([0, "1"], TypeError, "holds '1', a str, where a device index"),
        ([0, 1.0], TypeError, "holds 1.0, a float"),
    ],
)
def test_parse_devices_errors_say_what_is_accepted(devices, error, words):
    with pytest.raises(error, match=words.replace("(", r"\(").replace(")", r"\)")) as caught:
        parse_devices(devices, 4)
    if "accepted" in words or "devices takes" in words:
        assert "a list of indices like [0, 2]" in str(caught.value)


def test_no_device_to_choose_from():
    with pytest.raises(ValueError, match="this machine has none"):
        parse_devices(-1, 0, kind="CUDA device")
    with pytest.raises(ValueError, match="has 0 CUDA devices"):
        parse_devices([0], 0, kind="CUDA device")


def test_numpy_integers_are_indices():
    import numpy as np

    assert parse_devices([np.int64(1)], 2) == [1]
    assert parse_devices(np.int64(2), 2) == [0, 1]


# -- what the machine has -------------------------------------------------------------------


def test_cpu_devices_are_processes():
    assert choose_devices("auto", "cpu") == [0]  # Lightning: one process on the CPU
    assert choose_devices(3, "cpu") == [0, 1, 2]  # more processes than cores runs (slowly)
    assert choose_devices(-1, "cpu") == list(range(cpu_count()))  # the CPUs this process may use
    with pytest.raises(ValueError, match="CPU process"):
        choose_devices([0, 0], "cpu")


def test_unknown_accelerator_lists_the_valid_ones():
    with pytest.raises(ValueError, match="'auto', 'cpu', 'gpu', 'cuda', 'mps'"):
        parse_accelerator("tpu")
    with pytest.raises(ValueError, match="accelerator=3"):
        parse_accelerator(3)
    assert parse_accelerator(" CPU ") == "cpu"
    # torchkeras's cpu=True is translated at the door, before the accelerator is parsed
    assert parse_accelerator(accelerator_from_cpu("auto", cpu=True)) == "cpu"
    assert accelerator_from_cpu(" CPU ", cpu=True) == "cpu" and accelerator_from_cpu("cuda", cpu=False) == "cuda"
    with pytest.raises(ValueError, match="cpu=True and accelerator='cuda' disagree"):
        accelerator_from_cpu("cuda", cpu=True)
    with pytest.raises(ValueError, match="'auto', 'cpu', 'gpu', 'cuda', 'mps'"):
        accelerator_from_cpu("tpu", cpu=True)


@without_cuda
@pytest.mark.parametrize("accelerator", ["gpu", "cuda"])
def test_absent_gpu_is_an_error_not_a_cpu_run(accelerator):
    with pytest.raises(RuntimeError, match=f"accelerator='{accelerator}' was asked for.*accelerator='cpu'"):
        parse_accelerator(accelerator)


# -- CUDA_VISIBLE_DEVICES for a process that should see chosen devices ------------------------


@pytest.mark.parametrize(
    "indices, visible, value",
    [
        ([1, 3], None, "1,3"),
        ([0], None, "0"),
        ([0, 2], "4,5,6,7", "4,6"),  # indices count within the mask already set
        ([1], "7, 3", "3"),
        ([1], "GPU-aaaa,GPU-bbbb", "GPU-bbbb"),  # UUIDs are kept as written
        ([0, 1], "2,5,-1,6", "2,5"),  # CUDA stops reading at a negative entry
    ],
)
def test_cuda_visible_devices(indices, visible, value):
    assert cuda_visible_devices(indices, visible=visible) == value


def test_cuda_visible_devices_refuses_an_index_the_mask_hides():
    with pytest.raises(ValueError, match="makes 2 device.s. visible, numbered 0 to 1"):
        cuda_visible_devices([2], visible="4,5")
    with pytest.raises(ValueError, match="makes 0 device"):
        cuda_visible_devices([0], visible="")
    assert visible_device_entries(None) is None


def test_cuda_visible_devices_reads_this_process_mask(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    assert cuda_visible_devices([1]) == "1"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert cuda_visible_devices([1]) == "1"


# -- find_usable_cuda_devices -------------------------------------------------------------


def test_find_usable_zero_is_empty():
    assert kt.devices.find_usable_cuda_devices(0) == []


@pytest.mark.parametrize("bad, error", [(1.5, TypeError), ("2", TypeError), (True, TypeError), (-2, ValueError)])
def test_find_usable_refuses_bad_counts(bad, error):
    with pytest.raises(error, match="-1 for all usable"):
        kt.devices.find_usable_cuda_devices(bad)


@without_cuda
@pytest.mark.parametrize("num_devices", [1, -1])
def test_find_usable_without_cuda_says_why(num_devices):
    with pytest.raises(ValueError, match="accelerator='cpu'") as caught:
        kt.devices.find_usable_cuda_devices(num_devices)
    assert (
        "without CUDA" in str(caught.value)
        or "no CUDA device is visible" in str(caught.value)
        or "no NVIDIA GPU" in str(caught.value)
    )


@pytest.mark.slow
def test_probe_runs_in_a_child_process_and_numbers_as_torch_does():
    initialised_before = torch.cuda.is_initialized()
    usable, occupied = _probe_in_child_process(-1)
    assert sorted(usable + occupied) == list(range(torch.cuda.device_count()))
    assert torch.cuda.is_initialized() == initialised_before


# -- on a GPU ---------------------------------------------------------------------------------


def _run_python(code: str, **env: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": REPO_ROOT, **env},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


@needs_cuda
def test_find_usable_one_leaves_cuda_uninitialised_in_the_caller():
    out = _run_python(
        "import torch, kerastorch as kt; found = kt.devices.find_usable_cuda_devices(1); "
        "print(found, torch.cuda.is_initialized())"
    )
    assert out == "[0] False"


FORK_AFTER_CHOOSING = """
import os, torch, kerastorch as kt
from kerastorch.devices.plan import choose_devices, parse_accelerator
device_type = parse_accelerator("gpu")
chosen = choose_devices(-1, device_type)
usable = kt.devices.find_usable_cuda_devices(1)
pid = os.fork()  # what a multi-process launch from a notebook does next
if pid == 0:
    try:
        torch.zeros(1, device="cuda").sum().item()
        os._exit(0)
    except Exception as error:
        print(error, flush=True)
        os._exit(1)
_, status = os.waitpid(pid, 0)
print(device_type, chosen == list(range(torch.cuda.device_count())), usable, "child", os.waitstatus_to_exitcode(status))
"""


@needs_cuda
def test_a_forked_process_can_still_use_cuda_after_choosing_devices():
    assert _run_python(FORK_AFTER_CHOOSING) == "cuda True [0] child 0"


@needs_cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_devices_list_runs_on_that_gpu_even_under_a_mask():
    code = (
        "import torch, kerastorch as kt; from torch import nn; "
        "from torch.utils.data import DataLoader, TensorDataset; "
        "net = nn.Linear(4, 2); dl = DataLoader(TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,))), 16); "
        "kt.KerasModel(net, nn.CrossEntropyLoss()).fit(dl, epochs=1, verbose=0, devices=[1]); "
        "print(next(net.parameters()).device, torch.cuda.current_device())"
    )
    assert _run_python(code) == "cuda:1 1"
    reversed_mask = ",".join(str(i) for i in reversed(range(torch.cuda.device_count())))
    assert _run_python(code, CUDA_VISIBLE_DEVICES=reversed_mask) == "cuda:1 1"


def test_an_accelerator_built_before_fit_still_works_after_it():
    # accelerate's state is shared by every Accelerator; fit builds its own and must give the
    # caller's back rather than leave it reset (as a book chapter prints accelerator.device, fits,
    # and goes on using its accelerator).
    import accelerate

    accelerator = accelerate.Accelerator(cpu=True)
    net = torch.nn.Linear(3, 1)
    model = kt.KerasModel(net, torch.nn.MSELoss(), optimizer=torch.optim.SGD(net.parameters(), lr=0.1))
    history = model.fit((torch.randn(16, 3), torch.randn(16, 1)), epochs=2, batch_size=8, verbose=0)

    try:
        assert len(history) == 2
        assert accelerator.device == torch.device("cpu")
        loader = accelerator.prepare(torch.utils.data.DataLoader(torch.arange(6.0), batch_size=3))
        assert [batch.tolist() for batch in loader] == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    finally:  # the state this test's accelerator made is shared by the process: leave none to the next test
        reset_accelerate_state()
