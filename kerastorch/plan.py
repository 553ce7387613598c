"""Where a ``fit`` run happens, decided once and kept as a value.

A run happens in one of three places:

- ``"here"``: this process, on one device;
- ``"workers"``: ``fit(devices=k)`` from a notebook or a plain ``python`` process starts
  k processes (:mod:`kerastorch.launch`), each of which runs the plan ``for_worker()``;
- ``"rank"``: this process is one rank of a job that ``torchrun`` or ``accelerate launch``
  started; the launcher chose its device.

:func:`make_plan` matches the parsed words (:mod:`kerastorch.options`) against the
machine: which accelerators exist and how many devices each has. CUDA is counted
without being initialised (:mod:`kerastorch.cuda_devices`), so a plan made in a
notebook still lets the notebook fork workers that use the GPUs.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import warnings
from typing import Optional

import torch

from .cuda_devices import cuda_device_count, mps_available, why_no_cuda
from .model_parallel import is_model_parallel
from .options import DevicesArg, count_asked, is_auto, parse_accelerator_word, parse_devices
from .settings import DeviceSettings

WHERE = ("here", "workers", "rank")


@dataclasses.dataclass(frozen=True)
class Plan:
    """Where and how a run trains: ``where`` (see the module docstring), the torch device
    type, the chosen device indices (empty for ``"rank"``: the launcher chose), the
    precision that will really run, and the multi-process strategy."""

    where: str
    device_type: str
    devices: tuple[int, ...]
    precision: str
    strategy: str = "auto"
    fsdp_wrap: tuple[type, ...] = ()

    @property
    def num_processes(self) -> int:
        return len(self.devices) if self.where == "workers" else 1

    def for_worker(self) -> Plan:
        """The plan each started worker runs: one rank of the job."""
        return dataclasses.replace(self, where="rank", devices=())

    def single_device(self) -> Optional[str]:
        """The exact device of a one-process run (``"cuda:1"``, ``"cpu"``); None for MPS or a rank."""
        if self.where != "here":
            return None
        return {"cuda": f"cuda:{self.devices[0]}", "cpu": "cpu"}.get(self.device_type)


def make_plan(settings: DeviceSettings, net: torch.nn.Module) -> Plan:
    """Decide where the run happens. Errors (absent hardware, too many devices) come before anything starts."""
    device_type = parse_accelerator(settings.accelerator)
    precision = settings.precision
    if device_type in ("cpu", "mps") and precision == "16-mixed":
        warnings.warn(
            f"precision='16-mixed' is not supported on {device_type.upper()} (see the precision table); "
            "running 'bf16-mixed' instead. Pass precision='bf16-mixed' to silence this warning.",
            UserWarning,
            stacklevel=4,
        )
        precision = "bf16-mixed"
    if launched_by_distributed_runner():
        return Plan("rank", device_type, (), precision, settings.strategy, settings.fsdp_wrap)
    devices = settings.devices
    if is_auto(devices) and is_model_parallel(net):
        devices = 1  # the user placed the net's pieces; it trains in this one process
    chosen = tuple(choose_devices(devices, device_type))
    if len(chosen) == 1 and settings.strategy == "fsdp":
        warnings.warn(
            "strategy='fsdp' with one process: there is nothing to shard over, so the net trains as usual. "
            "Pass devices=k (k > 1) to shard it over k processes.",
            UserWarning,
            stacklevel=4,
        )
    where = "workers" if len(chosen) > 1 else "here"
    return Plan(where, device_type, chosen, precision, settings.strategy, settings.fsdp_wrap)


def parse_accelerator(accelerator: str = "auto", cpu: bool = False) -> str:
    """Return the torch device type to run on: ``"cuda"``, ``"mps"`` or ``"cpu"``.

    ``"auto"`` prefers CUDA, then MPS, then the CPU; ``"gpu"`` means CUDA, else MPS.
    Asking for hardware that is absent is an error, never a silent fall back to the CPU.
    ``cpu=True`` is torchkeras's way of saying ``accelerator="cpu"``.
    """
    word = parse_accelerator_word(accelerator, cpu)
    if word == "cpu":
        return "cpu"
    has_cuda, has_mps = cuda_device_count() > 0, mps_available()
    if word == "auto":
        return "cuda" if has_cuda else "mps" if has_mps else "cpu"
    if word == "gpu":
        if has_cuda or has_mps:
            return "cuda" if has_cuda else "mps"
        raise RuntimeError(
            f"accelerator='gpu' was asked for, but this machine has no GPU that torch can use: {why_no_cuda()}, "
            "and there is no Apple MPS device. Use accelerator='cpu' (or 'auto'), or run on a machine with a GPU "
            "and a CUDA build of torch."
        )
    if word == "cuda" and not has_cuda:
        raise RuntimeError(f"accelerator='cuda' was asked for, but {why_no_cuda()}. Use accelerator='cpu' or 'auto'.")
    if word == "mps" and not has_mps:
        raise RuntimeError(
            "accelerator='mps' was asked for, but no Apple MPS device is available; use 'cpu' or 'auto'."
        )
    return word


def is_interactive() -> bool:
    """True in a Jupyter kernel or a Python prompt (where Lightning's devices='auto' means one device)."""
    if hasattr(sys, "ps1") or bool(getattr(sys.flags, "interactive", False)):
        return True
    return "ipykernel" in sys.modules


def num_devices_available(device_type: str) -> int:
    """How many devices of this type there are to choose from (CUDA: counted without initialising it)."""
    if device_type == "cuda":
        return cuda_device_count()
    if device_type == "cpu":
        return os.cpu_count() or 1
    return 1


def choose_devices(devices: DevicesArg, device_type: str, interactive: Optional[bool] = None) -> list[int]:
    """The device indices a run uses: :func:`~kerastorch.options.parse_devices` with what this machine has.

    On the CPU and on MPS, ``"auto"`` is one device (as in Lightning). A CPU "device" is
    one process, so a count larger than the number of cores is allowed (it runs, slowly);
    ``-1`` on the CPU is one process per core. CUDA indices are relative to
    ``CUDA_VISIBLE_DEVICES``; :func:`~kerastorch.cuda_devices.cuda_visible_devices` turns
    them into the value a child process needs to see exactly these devices.
    """
    if interactive is None:
        interactive = is_interactive()
    if is_auto(devices) and device_type != "cuda":
        devices = 1
    num_available = num_devices_available(device_type)
    if device_type == "cpu":
        num_available = max(num_available, count_asked(devices))
    kind = {"cuda": "CUDA device", "mps": "MPS device", "cpu": "CPU process"}.get(device_type, "device")
    return parse_devices(devices, num_available, interactive=interactive, kind=kind)


def launched_by_distributed_runner() -> bool:
    """True when this process is one rank of a job started by torchrun or accelerate launch."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


__all__ = ["Plan", "choose_devices", "make_plan", "parse_accelerator"]
