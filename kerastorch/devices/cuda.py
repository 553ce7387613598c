"""Which CUDA devices there are and which are free, asked without initialising CUDA here.

A notebook that wants to start several training processes later (one per GPU) must
not have initialised CUDA in its own process first: forked children cannot use a
CUDA driver their parent already started. So this module counts devices through
NVML (what ``torch.cuda.device_count()`` does before CUDA is initialised) and probes
them in a short-lived child process.

Device indices are always relative to the devices this process can see: with
``CUDA_VISIBLE_DEVICES="4,6"`` there are two devices, ``0`` (physical 4) and ``1``
(physical 6), exactly as torch numbers them.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from typing import Optional, Sequence

import torch

PROBE_TIMEOUT_S = 120


def cuda_device_count() -> int:
    """Number of CUDA devices this process can see, without initialising CUDA (NVML-based count)."""
    return torch.cuda.device_count()  # 0 for a torch built without CUDA


def mps_available() -> bool:
    """True when torch can use an Apple MPS device (asked without starting anything)."""
    return bool(getattr(torch.backends, "mps", None)) and torch.backends.mps.is_available()


def why_no_cuda() -> str:
    """One sentence on why no CUDA device is visible, for error messages."""
    if not torch.version.cuda:
        return f"this torch ({torch.__version__}) was built without CUDA"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return f"no CUDA device is visible (CUDA_VISIBLE_DEVICES={visible!r} hides the others, or there are none)"
    return "no NVIDIA GPU was found (or its driver is not working: try nvidia-smi)"


def visible_device_entries(visible: Optional[str]) -> Optional[list[str]]:
    """The entries of a ``CUDA_VISIBLE_DEVICES`` value, as CUDA reads them; ``None`` when unset.

    CUDA stops reading at the first entry that is empty or a negative number, so
    ``"0,2,-1,3"`` makes two devices visible. Entries are kept as written: numbers or
    ``GPU-``/``MIG-`` UUIDs.
    """
    if visible is None:
        return None
    entries = []
    for entry in visible.split(","):
        entry = entry.strip()
        if not entry or entry.startswith("-"):
            break
        entries.append(entry)
    return entries


def cuda_visible_devices(indices: Sequence[int], visible: Optional[str] = None) -> str:
    """The ``CUDA_VISIBLE_DEVICES`` value that shows a new process exactly the devices ``indices``.

    ``indices`` are numbered as this process sees its devices (as :func:`~kerastorch.parse_devices`
    returns them). When this process itself runs under a ``CUDA_VISIBLE_DEVICES`` mask,
    the indices are looked up in that mask, so the child gets the same physical devices.
    ``visible`` defaults to this process's ``CUDA_VISIBLE_DEVICES``.

    >>> cuda_visible_devices([1, 3], visible=None)
    '1,3'
    >>> cuda_visible_devices([0, 2], visible="4,5,6,7")
    '4,6'
    """
    if visible is None:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    entries = visible_device_entries(visible)
    indices = list(indices)
    if not indices:
        raise ValueError("No device index was given; pass at least one, e.g. [0].")
    if entries is None:
        return ",".join(str(int(i)) for i in indices)
    wrong = [i for i in indices if not 0 <= i < len(entries)]
    if wrong:
        raise ValueError(
            f"Device index {wrong[0]} is not visible: CUDA_VISIBLE_DEVICES={visible!r} makes {len(entries)} "
            f"device(s) visible, numbered 0 to {len(entries) - 1}. Choose indices in that range, or change "
            "CUDA_VISIBLE_DEVICES before starting Python."
        )
    return ",".join(entries[i] for i in indices)


def find_usable_cuda_devices(num_devices: int = -1) -> list[int]:
    """Indices of CUDA devices that are free to use now, for ``fit(devices=...)``.

    A device is usable when a tensor can be created on it; a device another process holds
    in exclusive compute mode is not. ``num_devices=0`` returns ``[]``, ``-1`` all usable
    devices, ``k`` the first ``k`` usable ones (an error names the occupied ones when there
    are fewer than ``k``). CUDA is probed in a child process, so this process stays free
    to launch several training processes afterwards.

    Example::

        model.fit(dl_train, dl_val, accelerator="cuda", devices=kt.find_usable_cuda_devices(2))

    Two sweeps that call this at the same moment may both pick the same free device.
    """
    if isinstance(num_devices, bool) or not isinstance(num_devices, int):
        raise TypeError(
            f"num_devices={num_devices!r} must be an int: a count like 2, 0 for none, or -1 for all usable."
        )
    if num_devices < -1:
        raise ValueError(f"num_devices={num_devices} must be a count like 2, 0 for none, or -1 for all usable.")
    if num_devices == 0:
        return []
    visible = cuda_device_count()
    asked = "all usable CUDA devices" if num_devices == -1 else f"{num_devices} CUDA device(s)"
    if visible == 0:
        raise ValueError(f"Asked to find {asked}, but {why_no_cuda()}. Train with accelerator='cpu' instead.")
    if num_devices > visible:
        raise ValueError(
            f"Asked to find {num_devices} CUDA devices, but this machine has only {visible} visible. "
            f"Ask for at most {visible}, or -1 for all usable ones."
        )
    if torch.cuda.is_initialized():
        usable, occupied = probe_cuda_devices(num_devices)  # already initialised here: nothing left to protect
    else:
        usable, occupied = _probe_in_child_process(num_devices)
    if not usable or (num_devices != -1 and len(usable) < num_devices):
        raise RuntimeError(
            f"Asked to find {asked}, but only {len(usable)} {'is' if len(usable) == 1 else 'are'} usable now: "
            f"device(s) {occupied} are occupied by other processes. Wait for them to finish, ask for fewer, "
            "or check nvidia-smi."
        )
    return usable


def probe_cuda_devices(num_devices: int) -> tuple[list[int], list[int]]:
    """Try each visible device in turn; stop after ``num_devices`` usable ones (-1: try all).

    Returns ``(usable, occupied)``. This initialises CUDA in the process that runs it, which
    is why :func:`find_usable_cuda_devices` runs it in a child process. It imports nothing
    but torch, so its source can be run on its own.
    """
    import torch

    usable, occupied = [], []
    for index in range(torch.cuda.device_count()):
        try:
            torch.tensor(0, device=torch.device("cuda", index))
        except RuntimeError:  # busy, exclusive to another process, or out of memory
            occupied.append(index)
            continue
        usable.append(index)
        if len(usable) == num_devices:
            break
    return usable, occupied


def _probe_in_child_process(num_devices: int) -> tuple[list[int], list[int]]:
    # The child inherits CUDA_VISIBLE_DEVICES, so it numbers the devices as this process does.
    code = (
        inspect.getsource(probe_cuda_devices)
        + f"\nimport json\nprint(json.dumps(probe_cuda_devices({int(num_devices)})))\n"
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, env=dict(os.environ)
        )
    except subprocess.TimeoutExpired:
        raise RuntimeError(
            f"Probing the CUDA devices took more than {PROBE_TIMEOUT_S} s; is the driver hanging? Check nvidia-smi."
        ) from None
    if done.returncode != 0:
        raise RuntimeError(f"Probing the CUDA devices in a child process failed:\n{done.stderr.strip()[-2000:]}")
    usable, occupied = json.loads(done.stdout.strip().splitlines()[-1])
    return usable, occupied


__all__ = ["cuda_device_count", "cuda_visible_devices", "find_usable_cuda_devices", "probe_cuda_devices"]
