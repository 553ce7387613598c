"""Where and in what precision a run happens: Lightning's words, accelerate's engine.

``fit(accelerator=..., devices=..., precision=...)`` is parsed here into a
:class:`Runtime`, which the loop asks for the device, the autocast context, the
grad scaler and the few collective operations it needs. Everything in this file is
checked before the first batch, so a bad value never costs a half-trained net.
"""

from __future__ import annotations

import contextlib
import numbers
import os
import sys
import warnings
from dataclasses import dataclass
from typing import Any, Optional, Sequence, Union

import torch

from .cuda_devices import cuda_device_count, why_no_cuda

ACCELERATORS = ("auto", "cpu", "gpu", "cuda", "mps")

PRECISIONS = ("32-true", "16-mixed", "bf16-mixed", "16-true", "bf16-true", "64-true")
_PRECISION_ALIASES = {
    32: "32-true", "32": "32-true",
    64: "64-true", "64": "64-true",
    16: "16-mixed", "16": "16-mixed",
    "bf16": "bf16-mixed",
}
# torchkeras's spelling, so its users change only the import.
_MIXED_PRECISION_WORDS = {"no": "32-true", "fp16": "16-mixed", "bf16": "bf16-mixed"}

_AUTOCAST_DTYPES = {"16-mixed": torch.float16, "bf16-mixed": torch.bfloat16}
_PARAM_DTYPES = {"16-true": torch.float16, "bf16-true": torch.bfloat16, "64-true": torch.float64}
TRUE_PRECISION_OF = {dtype: name for name, dtype in _PARAM_DTYPES.items()}  # torch.float64 -> "64-true"

DevicesArg = Union[int, str, Sequence[int]]


def parse_precision(precision: Any = "32-true", mixed_precision: Optional[str] = None) -> str:
    """Return the canonical precision name (one of :data:`PRECISIONS`).

    Accepts Lightning's names and aliases (``32``, ``"16"``, ``"bf16"`` ...) and
    torchkeras's ``mixed_precision="no"|"fp16"|"bf16"``.

    >>> parse_precision(64), parse_precision("bf16"), parse_precision(mixed_precision="fp16")
    ('64-true', 'bf16-mixed', '16-mixed')
    """
    allowed = f"{', '.join(repr(p) for p in PRECISIONS)} or the aliases 32, 64, 16, '32', '64', '16', 'bf16'"
    if isinstance(precision, str):
        precision = precision.strip().lower()
    canonical = None
    if isinstance(precision, (str, int)) and not isinstance(precision, bool):
        canonical = precision if precision in PRECISIONS else _PRECISION_ALIASES.get(precision)
    if canonical is None:
        raise ValueError(f"precision={precision!r} is not supported; use {allowed}.")
    if mixed_precision is None:
        return canonical
    if not isinstance(mixed_precision, str) or mixed_precision.strip().lower() not in _MIXED_PRECISION_WORDS:
        raise ValueError(
            f"mixed_precision={mixed_precision!r} is not supported; use 'no', 'fp16' or 'bf16' "
            f"(or Lightning's precision= with {allowed})."
        )
    from_mixed = _MIXED_PRECISION_WORDS[mixed_precision.strip().lower()]
    if canonical != "32-true" and canonical != from_mixed:
        raise ValueError(
            f"precision={precision!r} and mixed_precision={mixed_precision!r} disagree; pass only one of them."
        )
    return from_mixed


def _mps_available() -> bool:
    return bool(getattr(torch.backends, "mps", None)) and torch.backends.mps.is_available()


def parse_accelerator(accelerator: str = "auto", cpu: bool = False) -> str:
    """Return the torch device type to run on: ``"cuda"``, ``"mps"`` or ``"cpu"``.

    ``"auto"`` prefers CUDA, then MPS, then the CPU; ``"gpu"`` means CUDA, else MPS.
    Asking for hardware that is absent is an error, never a silent fall back to the CPU.
    ``cpu=True`` is torchkeras's way of saying ``accelerator="cpu"``. CUDA is looked for
    without being initialised (see :mod:`~kerastorch.cuda_devices`).
    """
    if not isinstance(accelerator, str) or accelerator.strip().lower() not in ACCELERATORS:
        raise ValueError(
            f"accelerator={accelerator!r} is not known; use one of {', '.join(repr(a) for a in ACCELERATORS)}."
        )
    accelerator = accelerator.strip().lower()
    if cpu:
        if accelerator not in ("auto", "cpu"):
            raise ValueError(f"cpu=True and accelerator={accelerator!r} disagree; pass only one of them.")
        return "cpu"
    if accelerator == "cpu":
        return "cpu"
    has_cuda, has_mps = cuda_device_count() > 0, _mps_available()
    if accelerator == "auto":
        return "cuda" if has_cuda else "mps" if has_mps else "cpu"
    if accelerator == "gpu":
        if has_cuda or has_mps:
            return "cuda" if has_cuda else "mps"
        raise RuntimeError(
            f"accelerator='gpu' was asked for, but this machine has no GPU that torch can use: {why_no_cuda()}, "
            "and there is no Apple MPS device. Use accelerator='cpu' (or 'auto'), or run on a machine with a GPU "
            "and a CUDA build of torch."
        )
    if accelerator == "cuda" and not has_cuda:
        raise RuntimeError(
            f"accelerator='cuda' was asked for, but {why_no_cuda()}. Use accelerator='cpu' or 'auto'."
        )
    if accelerator == "mps" and not has_mps:
        raise RuntimeError("accelerator='mps' was asked for, but no Apple MPS device is available; use 'cpu' or 'auto'.")
    return accelerator


def is_interactive() -> bool:
    """True in a Jupyter kernel or a Python prompt (where Lightning's devices='auto' means one device)."""
    if hasattr(sys, "ps1") or bool(getattr(sys.flags, "interactive", False)):
        return True
    return "ipykernel" in sys.modules


_DEVICES_ACCEPTED = ("an int k (the first k devices), -1 (all), a list of indices like [0, 2], "
                     "or a string: '2' (the first 2), '-1' (all), '0, 2' or '2,' (those indices), 'auto'")


def parse_devices(devices: DevicesArg, num_available: int, interactive: bool = False,
                  kind: str = "device") -> list[int]:
    """Turn Lightning's ``devices`` argument into a list of device indices.

    ``num_available`` is how many devices there are to choose from; ``kind`` names them
    in error messages (``"CUDA device"``). Nothing here looks at the hardware, so the
    whole table can be checked on any machine.

    ===========  =======  ==================  ==========================
    devices      type     parsed              meaning
    ===========  =======  ==================  ==========================
    ``3``        int      ``[0, 1, 2]``       first 3 devices
    ``-1``       int      ``[0, 1, ...]``     all available devices
    ``[0]``      list     ``[0]``             device 0
    ``[1, 3]``   list     ``[1, 3]``          devices 1 and 3
    ``"3"``      str      ``[0, 1, 2]``       first 3 devices
    ``"3,"``     str      ``[3]``             device 3 (the comma makes it an index)
    ``"1, 3"``   str      ``[1, 3]``          devices 1 and 3
    ``"-1"``     str      ``[0, 1, ...]``     all available devices
    ``"0"``      str      ``[0]``             device 0 (zero devices is never meant)
    ``"auto"``   str      all, or ``[0]``     all from a script, one when ``interactive``
    ===========  =======  ==================  ==========================

    As in Lightning, a string with a single number is a *count* and a string with a comma
    is a list of *indices*: ``"3"`` is the first three devices, ``"3,"`` is device 3 alone.
    ``0`` (the int) is refused: a run needs at least one device.

    Errors: a count or an index beyond ``num_available`` names how many there are; a
    repeated index is refused; a float, a non-numeric string or a list holding a non-int
    is a ``TypeError``/``ValueError`` that lists the accepted forms.

    >>> parse_devices("3", 4), parse_devices("3,", 4), parse_devices([1, 3], 4), parse_devices(-1, 2)
    ([0, 1, 2], [3], [1, 3], [0, 1])
    """
    plural = f"{kind}s"
    if isinstance(devices, str):
        text = devices.strip()
        if text.lower() == "auto":
            return _first(1 if interactive else num_available, num_available, devices, plural)
        if "," in text:
            parts = [p.strip() for p in text.split(",") if p.strip()]
            if not parts or not all(_is_integer_text(p) for p in parts):
                raise ValueError(f"devices={devices!r} is not a list of device indices; devices takes {_DEVICES_ACCEPTED}.")
            return _check_indices([int(p) for p in parts], num_available, devices, plural)
        if not _is_integer_text(text):
            raise ValueError(f"devices={devices!r} is not understood; devices takes {_DEVICES_ACCEPTED}.")
        if int(text) == 0:
            return _check_indices([0], num_available, devices, plural)
        devices = int(text)  # "3" counts like 3; "-1" means all, like -1
    if isinstance(devices, numbers.Integral) and not isinstance(devices, bool):
        count = int(devices)
        if count == -1:
            return _first(num_available, num_available, devices, plural)
        if count == 0:
            raise ValueError(f"devices=0 would train on no {kind} at all. Pass devices=1 for one {kind}, [0] or '0,' "
                             "for the first one, or accelerator='cpu' to train on the CPU.")
        if count < 0:
            raise ValueError(f"devices={count} is not a number of {plural}; use a positive count, or -1 for all. "
                             f"devices takes {_DEVICES_ACCEPTED}.")
        return _first(count, num_available, devices, plural)
    if isinstance(devices, (list, tuple, range)):
        if len(devices) == 0:
            raise ValueError(f"devices={devices!r} is empty; name at least one {kind}. devices takes {_DEVICES_ACCEPTED}.")
        bad = [d for d in devices if isinstance(d, bool) or not isinstance(d, numbers.Integral)]
        if bad:
            raise TypeError(f"devices={devices!r} holds {bad[0]!r}, a {type(bad[0]).__name__}, where a device index "
                            f"(an int) belongs; devices takes {_DEVICES_ACCEPTED}.")
        return _check_indices([int(d) for d in devices], num_available, devices, plural)
    raise TypeError(f"devices={devices!r} is a {type(devices).__name__}; devices takes {_DEVICES_ACCEPTED}.")


def _is_integer_text(text: str) -> bool:
    return text.lstrip("+-").isdigit() and text.count("-") + text.count("+") <= 1


def _first(count: int, num_available: int, original: Any, plural: str) -> list[int]:
    if num_available < 1:
        raise ValueError(f"devices={original!r} asks for {plural}, but this machine has none.")
    if count > num_available:
        raise ValueError(
            f"devices={original!r} asks for {count} {plural}, but this machine has {num_available}. "
            f"Use devices={num_available} or -1 for all of them."
        )
    return list(range(count))


def _check_indices(indices: list[int], num_available: int, original: Any, plural: str) -> list[int]:
    repeated = sorted({i for i in indices if indices.count(i) > 1})
    if repeated:
        raise ValueError(f"devices={original!r} names {plural[:-1]} {repeated[0]} more than once; name each index once.")
    wrong = [i for i in indices if i < 0 or i >= num_available]
    if wrong:
        valid = f"valid indices are 0 to {num_available - 1}" if num_available else "there is nothing to choose from"
        raise ValueError(
            f"devices={original!r} names index {wrong[0]}, but this machine has {num_available} {plural}: {valid}. "
            "Indices count from 0 (with CUDA_VISIBLE_DEVICES set, among the visible devices)."
        )
    return indices


def num_devices_available(device_type: str) -> int:
    """How many devices of this type there are to choose from (CUDA: counted without initialising it)."""
    if device_type == "cuda":
        return cuda_device_count()
    if device_type == "cpu":
        return os.cpu_count() or 1
    return 1


def choose_devices(devices: DevicesArg, device_type: str, interactive: Optional[bool] = None) -> list[int]:
    """The device indices a run uses: :func:`parse_devices` with what this machine has.

    On the CPU and on MPS, ``"auto"`` is one device (as in Lightning). A CPU "device" is
    one process, so a count larger than the number of cores is allowed (it runs, slowly);
    ``-1`` on the CPU is one process per core. CUDA indices are relative to
    ``CUDA_VISIBLE_DEVICES``; :func:`~kerastorch.cuda_devices.cuda_visible_devices` turns
    them into the value a child process needs to see exactly these devices.
    """
    if interactive is None:
        interactive = is_interactive()
    if isinstance(devices, str) and devices.strip().lower() == "auto" and device_type != "cuda":
        devices = 1
    num_available = num_devices_available(device_type)
    if device_type == "cpu":
        num_available = max(num_available, _count_asked(devices))
    kind = {"cuda": "CUDA device", "mps": "MPS device", "cpu": "CPU process"}.get(device_type, "device")
    return parse_devices(devices, num_available, interactive=interactive, kind=kind)


def _count_asked(devices: Any) -> int:
    """The k of ``devices=k`` or ``"k"`` (0 for anything else)."""
    if isinstance(devices, str) and _is_integer_text(devices.strip()):
        devices = int(devices.strip())
    if isinstance(devices, numbers.Integral) and not isinstance(devices, bool):
        return max(int(devices), 0)
    return 0


def launched_by_distributed_runner() -> bool:
    """True when this process is one rank of a job started by torchrun or accelerate launch."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


@dataclass
class Runtime:
    """What the loop needs to know about where it runs. Built by :func:`build_runtime`."""

    accelerator: Any  # accelerate.Accelerator
    device: torch.device
    precision: str
    autocast_dtype: Optional[torch.dtype]
    param_dtype: Optional[torch.dtype]
    scaler: Optional[Any]  # torch.amp.GradScaler, for 16-mixed on CUDA only
    owns_state: bool  # True when fit built the accelerate state and must reset it
    output_device: Optional[torch.device] = None  # set for a net spread over devices (model parallel)

    @property
    def num_processes(self) -> int:
        return 1 if self.accelerator is None else self.accelerator.num_processes

    @property
    def is_main_process(self) -> bool:
        return True if self.accelerator is None else self.accelerator.is_main_process

    def reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum a tensor over all processes (the identity in a single process)."""
        if self.num_processes == 1:
            return tensor
        return self.accelerator.reduce(tensor, reduction="sum")

    @property
    def outputs_device(self) -> torch.device:
        """Where the net's outputs, the labels, the loss and the metrics live.

        The run's device, except for a model-parallel net, whose last piece may sit elsewhere.
        """
        return self.output_device or self.device

    def any_process(self, flag: bool) -> bool:
        """True on every process when ``flag`` is true on any one (so all stop together)."""
        if self.num_processes == 1:
            return bool(flag)
        return bool(self.reduce_sum(torch.tensor(float(bool(flag)), device=self.device)).item() > 0)

    def wait_for_everyone(self) -> None:
        """A barrier across processes (nothing in a single process)."""
        if self.num_processes > 1:
            self.accelerator.wait_for_everyone()

    def __post_init__(self) -> None:
        # Decided once: to_device runs every step.
        self.moves_batches = self.device.type != "cpu" or self.param_dtype is not None

    def autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)

    def to_device(self, batch):
        """Move a nested batch to the run's device (non-blocking from pinned memory) and cast
        floating tensors to the net's dtype under the *-true precisions."""
        if not self.moves_batches:
            return batch
        return _map_tensors(batch, self._move)

    def _move(self, tensor: torch.Tensor) -> torch.Tensor:
        dtype = self.param_dtype if (self.param_dtype is not None and tensor.is_floating_point()) else None
        return tensor.to(self.device, dtype=dtype, non_blocking=self.device.type == "cuda")

    def no_sync(self, net: torch.nn.Module):
        """Skip DDP's gradient all-reduce for a batch that does not end an accumulation group."""
        if isinstance(net, torch.nn.parallel.DistributedDataParallel):
            return net.no_sync()
        return contextlib.nullcontext()

    def describe(self) -> str:
        """The line fit prints first: where the run happens and in which precision."""
        where = str(self.device)
        if self.device.type == "cuda":
            where += f" ({torch.cuda.get_device_name(self.device)})"
        if self.num_processes > 1:
            where = f"{self.num_processes} processes ({self.device.type}, {self.accelerator.distributed_type.value})"
        return f"kerastorch: training on {where} in precision {self.precision}"

    def teardown(self) -> None:
        """Forget accelerate's process-wide state, so the next fit may choose differently."""
        if self.owns_state:
            reset_accelerate_state()


def _map_tensors(obj, fn):
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, dict):
        return type(obj)((k, _map_tensors(v, fn)) for k, v in obj.items())
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
        return type(obj)(*(_map_tensors(v, fn) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map_tensors(v, fn) for v in obj)
    return obj


def reset_accelerate_state() -> None:
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


def build_runtime(
    accelerator: str = "auto",
    devices: DevicesArg = "auto",
    precision: Any = "32-true",
    mixed_precision: Optional[str] = None,
    cpu: bool = False,
) -> Runtime:
    """Parse the three words and build accelerate's ``Accelerator`` for one process.

    accelerate's own mixed precision is left off on purpose: it wraps ``net.forward``
    with autocast and leaves that wrapper on the net after training. We autocast the
    forward and loss ourselves, in the loop, so the user's net comes back untouched.
    accelerate has no fp64 and ignores fp16 on the CPU; the ``*-true`` precisions
    convert the net and the floating inputs instead (see :class:`Runtime`).
    """
    from accelerate import Accelerator
    from accelerate.utils import patch_environment

    precision = parse_precision(precision, mixed_precision)
    device_type = parse_accelerator(accelerator, cpu=cpu)
    in_job = launched_by_distributed_runner()
    device = None
    if not in_job:
        chosen = choose_devices(devices, device_type)
        if len(chosen) > 1:
            from .launch import NeedsProcesses

            raise NeedsProcesses(chosen, device_type)  # fit starts the processes (kerastorch.launch)
        # accelerate has no device-id argument; its single-device override names the exact device.
        device = {"cuda": f"cuda:{chosen[0]}", "cpu": "cpu"}.get(device_type)  # MPS: accelerate's own setup
    if device_type in ("cpu", "mps") and precision == "16-mixed":
        warnings.warn(
            f"precision='16-mixed' is not supported on {device_type.upper()} (see the precision table); "
            "running 'bf16-mixed' instead. Pass precision='bf16-mixed' to silence this warning.",
            UserWarning,
            stacklevel=3,
        )
        precision = "bf16-mixed"

    if not in_job:
        reset_accelerate_state()
    with patch_environment(**({"ACCELERATE_TORCH_DEVICE": device} if device else {})):
        acc = Accelerator(cpu=device_type == "cpu", mixed_precision="no")
    if acc.device.type == "cuda":
        # Tensors made on "cuda" without an index (by a loss or a metric) land on the run's device.
        torch.cuda.set_device(acc.device)
        if precision.startswith("bf16") and not torch.cuda.is_bf16_supported():
            if not in_job:
                reset_accelerate_state()
            raise ValueError(f"precision={precision!r}: {torch.cuda.get_device_name(acc.device)} has no bfloat16 support. "
                             "Use precision='16-mixed' on this GPU.")
    if in_job:
        from .launch import check_job_formed

        check_job_formed(acc, device_type)
    scaler = None
    if precision == "16-mixed" and acc.device.type == "cuda":
        scaler = torch.amp.GradScaler("cuda")
    return Runtime(
        accelerator=acc,
        device=acc.device,
        precision=precision,
        autocast_dtype=_AUTOCAST_DTYPES.get(precision),
        param_dtype=_PARAM_DTYPES.get(precision),
        scaler=scaler,
        owns_state=not in_job,
    )


def uniform_floating_dtype(module: torch.nn.Module) -> Optional[torch.dtype]:
    """The one floating dtype of all the module's parameters, or None (none, or several)."""
    dtypes = {p.dtype for p in module.parameters() if p.is_floating_point()}
    return dtypes.pop() if len(dtypes) == 1 else None


def runtime_for_net(net: torch.nn.Module) -> Runtime:
    """A single-process runtime on the device and dtype the net already has (for evaluate/predict)."""
    tensors = list(net.parameters()) or list(net.buffers())
    device = tensors[0].device if tensors else torch.device("cpu")
    param_dtype = uniform_floating_dtype(net)
    if param_dtype == torch.float32:
        param_dtype = None
    return Runtime(accelerator=None, device=device, precision=TRUE_PRECISION_OF.get(param_dtype, "32-true"),
                   autocast_dtype=None, param_dtype=param_dtype, scaler=None, owns_state=False)
