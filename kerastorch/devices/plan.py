"""Where a ``fit`` run happens, decided once and kept as a value.

A run happens in one of three places:

- ``"here"``: this process, on one device;
- ``"workers"``: ``fit(devices=k)`` from a notebook or a plain ``python`` process starts
  k processes (:mod:`kerastorch.devices.launch`), each of which runs the plan ``for_worker()``;
- ``"rank"``: this process is one rank of a job that a launcher started (``torchrun``,
  ``accelerate launch``, SLURM's ``srun``, an MPI, a Kubeflow ``PyTorchJob``, Ray Train), as
  :func:`~kerastorch.devices.environment.cluster_environment` reads it; the launcher chose its device.

:func:`make_plan` matches the parsed words (:mod:`kerastorch.devices.words`) against the
machine: which accelerators exist and how many devices each has. CUDA is counted
without being initialised (:mod:`kerastorch.devices.cuda`), so a plan made in a
notebook still lets the notebook fork workers that use the GPUs.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import warnings
from typing import Optional

import torch

from ..settings import DeviceSettings
from ..strategies import Strategy, resolve, strategy_for_net
from .cgroups import usable_cpu_count
from .cuda import cuda_device_count, mps_available, why_no_cuda
from .environment import ONE_PROCESS, ClusterEnvironment, cluster_environment
from .words import DevicesArg, count_asked, is_auto, parse_accelerator_word, parse_devices

WHERE = ("here", "workers", "rank")


@dataclasses.dataclass(frozen=True)
class Plan:
    """Where and how a run trains: ``where`` (see the module docstring), the torch device
    type, the chosen device indices (empty for ``"rank"``: the launcher chose), the
    precision that will really run, the strategy, the job's number of processes, and the
    cluster environment that started this process (``"local"`` for a run here and for the
    workers ``fit(devices=k)`` starts)."""

    where: str
    device_type: str
    devices: tuple[int, ...]
    precision: str
    strategy: Strategy
    world_size: int = 1  # the processes of the job this process is a rank of
    cluster: ClusterEnvironment = ONE_PROCESS

    @property
    def num_processes(self) -> int:
        """How many processes train together: k workers, the job's ranks, or this one."""
        if self.where == "workers":
            return len(self.devices)
        return self.world_size if self.where == "rank" else 1

    def for_worker(self) -> Plan:
        """The plan each started worker runs: one rank of the job fit started (no launcher's)."""
        return dataclasses.replace(self, where="rank", devices=(), world_size=len(self.devices), cluster=ONE_PROCESS)

    def single_device(self) -> Optional[str]:
        """The exact device of a one-process run (``"cuda:1"``, ``"cpu"``); None for MPS or a rank."""
        if self.where != "here":
            return None
        return {"cuda": f"cuda:{self.devices[0]}", "cpu": "cpu"}.get(self.device_type)


def make_plan(settings: DeviceSettings, net: torch.nn.Module) -> Plan:
    """Decide where the run happens. Errors (absent hardware, too many devices, a launcher's missing or
    contradicting variables) come before anything starts."""
    cluster = cluster_environment()
    if cluster.warning:  # e.g. a SLURM batch script of several tasks, not started by srun
        warnings.warn(cluster.warning, UserWarning, stacklevel=4)
    device_type = device_type_for(settings.accelerator)
    precision = settings.precision
    if device_type in ("cpu", "mps") and precision == "16-mixed":
        warnings.warn(
            f"precision='16-mixed' is not supported on {device_type.upper()} (see the precision table); "
            "running 'bf16-mixed' instead. Pass precision='bf16-mixed' to silence this warning.",
            UserWarning,
            stacklevel=4,
        )
        precision = "bf16-mixed"
    if cluster.is_job:
        strategy = resolve(settings.strategy, net, cluster.world_size)
        return Plan("rank", device_type, (), precision, strategy, cluster.world_size, cluster)
    devices = settings.devices
    alone = strategy_for_net(net)  # what one process would run (it looks at every parameter's device)
    if is_auto(devices) and not alone.moves_net:
        devices = 1  # the user placed the net's pieces; it trains in this one process
    chosen = tuple(choose_devices(devices, device_type))
    strategy = resolve(settings.strategy, net, len(chosen), alone)
    return Plan("workers" if len(chosen) > 1 else "here", device_type, chosen, precision, strategy, cluster=cluster)


def parse_accelerator(accelerator: str = "auto") -> str:
    """Return the torch device type to run on: ``"cuda"``, ``"mps"`` or ``"cpu"``.

    ``"auto"`` prefers CUDA, then MPS, then the CPU; ``"gpu"`` means CUDA, else MPS.
    Asking for hardware that is absent is an error, never a silent fall back to the CPU.
    """
    return device_type_for(parse_accelerator_word(accelerator))


def device_type_for(word: str) -> str:
    """The torch device type for an accelerator word already parsed (one of ``ACCELERATORS``)."""
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
        return cpu_count()
    return 1


@functools.lru_cache(maxsize=1)
def cpu_count() -> int:
    """The cores this process may run on (its affinity and its cgroups' CPU quota: a SLURM job's
    cores, a container's, :func:`~kerastorch.devices.cgroups.usable_cpu_count`), not the machine's
    alone: ``devices=-1`` on the CPU starts one process per core. Read once: the files it reads would
    cost a fit of one batch for a count only ``devices=-1`` and device lists use."""
    return usable_cpu_count()


def choose_devices(devices: DevicesArg, device_type: str, interactive: Optional[bool] = None) -> list[int]:
    """The device indices a run uses: :func:`~kerastorch.devices.words.parse_devices` with what this machine has.

    On the CPU and on MPS, ``"auto"`` is one device (as in Lightning). A CPU "device" is
    one process, so a count larger than the number of cores is allowed (it runs, slowly);
    ``-1`` on the CPU is one process per CPU this process may use (:func:`cpu_count`). CUDA
    indices are relative to ``CUDA_VISIBLE_DEVICES``; :func:`~kerastorch.devices.cuda.cuda_visible_devices`
    turns them into the value a child process needs to see exactly these devices.
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


__all__ = ["Plan", "choose_devices", "make_plan", "parse_accelerator"]
