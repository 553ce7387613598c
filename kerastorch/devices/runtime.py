"""The runtime the loop talks to: the device, the autocast context, the grad scaler and the
few collective operations a run needs, on accelerate's engine.

:func:`build_runtime` turns a :class:`~kerastorch.devices.plan.Plan` that runs in this process
(alone, or as one rank of a job) into a :class:`Runtime`; :func:`runtime_for_net` is the
single-process runtime that ``evaluate`` and ``predict`` use, on the device and dtype the
net already has.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState, GradientState, PartialState
from accelerate.utils import patch_environment, recursively_apply

from ..strategies import Strategy, strategy_for_net
from .environment import ONE_PROCESS, ClusterEnvironment
from .plan import Plan
from .rendezvous import processes_met
from .words import AUTOCAST_DTYPES, PARAM_DTYPES, TRUE_PRECISION_OF


@dataclass
class Runtime:
    """What the loop needs to know about where it runs. Built by :func:`build_runtime`."""

    _accelerator: Any  # accelerate.Accelerator, or None: see the accelerator property
    device: torch.device
    precision: str
    autocast_dtype: Optional[torch.dtype]
    param_dtype: Optional[torch.dtype]
    scaler: Optional[Any]  # torch.amp.GradScaler, for 16-mixed on CUDA only
    owns_state: bool  # True when fit built the accelerate state and must reset it
    strategy: Strategy  # how the processes share the work
    output_device: Optional[torch.device] = None  # set for a net spread over devices (model parallel)
    callers_state: tuple = ()  # accelerate's state as the caller had it before fit (see saved_accelerate_state)
    cluster: ClusterEnvironment = ONE_PROCESS  # the launcher that started this process
    # Read from accelerate once, when the run starts: a finished run's Accelerator, asked later
    # (model.print after fit), would build accelerate's process-wide state anew for one process,
    # and a later notebook_launcher would fork children that inherit it.
    num_processes: int = field(init=False)
    is_main_process: bool = field(init=False)
    # Builds the Accelerator the first time someone asks for it (a run alone on the CPU): see build_runtime.
    _build_accelerator: Optional[Callable[[], Any]] = None

    @property
    def accelerator(self) -> Any:
        """accelerate's ``Accelerator`` of the run (None for the runtime of ``evaluate`` and ``predict``).
        A run alone on the CPU asks nothing of it: it is built when first asked for (by a torchkeras
        program's ``model.accelerator`` or its runner), so a plain fit never pays for it."""
        if self._accelerator is None and self._build_accelerator is not None:
            self._accelerator = self._build_accelerator()
        return self._accelerator

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
        acc = self._accelerator  # a run whose Accelerator comes later is one process, the main one
        self.num_processes = 1 if acc is None else acc.num_processes
        self.is_main_process = True if acc is None else acc.is_main_process
        # Decided once: to_device runs every step.
        self.moves_batches = self.device.type != "cpu" or self.param_dtype is not None
        self._no_autocast = contextlib.nullcontext()  # reusable, so the plain step builds nothing

    def set_param_dtype(self, dtype: Optional[torch.dtype]) -> None:
        """The dtype floating inputs are cast to (placement may decide it after the runtime is built)."""
        self.param_dtype = dtype
        self.moves_batches = self.device.type != "cpu" or dtype is not None

    def autocast(self):
        if self.autocast_dtype is None:
            return self._no_autocast
        return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)

    def to_device(self, batch):
        """Move a nested batch to the run's device (non-blocking from pinned memory) and cast
        floating tensors to the net's dtype under the *-true precisions."""
        if not self.moves_batches:
            return batch
        return recursively_apply(self._move, batch)

    def _move(self, tensor: torch.Tensor) -> torch.Tensor:
        dtype = self.param_dtype if (self.param_dtype is not None and tensor.is_floating_point()) else None
        return tensor.to(self.device, dtype=dtype, non_blocking=self.device.type == "cuda")

    def describe(self) -> str:
        """The line fit prints first: the launcher and the rank layout (in a job a launcher
        started), where the run happens and in which precision."""
        where = str(self.device)
        if self.device.type == "cuda":
            where += f" ({torch.cuda.get_device_name(self.device)})"
        if self.num_processes > 1:
            where = f"{self.num_processes} processes ({self.device.type}, {self.strategy.engine(self)})"
        started_by = "" if self.cluster.name == "local" else f"{self.cluster.describe()}: "
        return f"kerastorch: {started_by}training on {where} in precision {self.precision}"

    def teardown(self) -> None:
        """Forget accelerate's process-wide state, so the next fit may choose differently."""
        self._build_accelerator = None  # asked after the run, there is none to build
        if self.owns_state:
            reset_accelerate_state()
            restore_accelerate_state(self.callers_state)


def reset_accelerate_state() -> None:
    """Forget accelerate's process-wide state (a later Accelerator may choose other devices)."""
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


def saved_accelerate_state() -> tuple:
    """accelerate's process-wide state as it is now: an ``Accelerator`` the caller built before
    ``fit`` shares it, and must find it again afterwards (not reset under its feet)."""
    return tuple(dict(cls._shared_state) for cls in (PartialState, AcceleratorState, GradientState))


def restore_accelerate_state(saved: tuple) -> None:
    """Put back what :func:`saved_accelerate_state` saw (nothing, if it saw no state)."""
    # accelerate's states are borgs: every instance's __dict__ is the class's one _shared_state dict.
    for cls, state in zip((PartialState, AcceleratorState, GradientState), saved):
        cls._shared_state.update(state)


def build_runtime(plan: Plan) -> Runtime:
    """Build accelerate's ``Accelerator`` for a plan that runs ``"here"`` or as one ``"rank"``.

    accelerate's own mixed precision is left off on purpose: it wraps ``net.forward``
    with autocast and leaves that wrapper on the net after training. We autocast the
    forward and loss ourselves, in the step, so the user's net comes back untouched.
    accelerate has no fp64 and ignores fp16 on the CPU; the ``*-true`` precisions
    convert the net and the floating inputs instead (see :class:`Runtime`).
    """
    if plan.where not in ("here", "rank"):
        raise ValueError(f"build_runtime runs a plan in this process; this one runs in {plan.where!r}.")
    if plan.where == "here" and plan.device_type == "cpu":
        return runtime_alone_on_the_cpu(plan)
    in_job = plan.where == "rank"
    precision = plan.precision
    callers_state = () if in_job else saved_accelerate_state()
    if not in_job:
        reset_accelerate_state()
    if in_job:
        # SLURM's, MPI's or Kubeflow's rank layout in torchrun's words, which torch's env:// and accelerate
        # read. Kept after the run: accelerate and a process group made later read them again.
        os.environ.update(plan.cluster.torch_env())
    # accelerate has no device-id argument; its single-device override names the exact device. A rank on
    # the CPU says so too: Ray Train sets the override to the worker's GPU, which accelerator="cpu" declines.
    device = plan.single_device() or ("cpu" if in_job and plan.device_type == "cpu" else None)
    with patch_environment(**({"ACCELERATE_TORCH_DEVICE": device} if device else {})), processes_met(plan.cluster):
        acc = Accelerator(cpu=plan.device_type == "cpu", mixed_precision="no")
    if acc.device.type == "cuda":
        # Tensors made on "cuda" without an index (by a loss or a metric) land on the run's device.
        torch.cuda.set_device(acc.device)
        if precision.startswith("bf16") and not torch.cuda.is_bf16_supported():
            if not in_job:
                reset_accelerate_state()
                restore_accelerate_state(callers_state)
            raise ValueError(
                f"precision={precision!r}: {torch.cuda.get_device_name(acc.device)} has no bfloat16 support. "
                "Use precision='16-mixed' on this GPU."
            )
    if in_job:
        check_job_formed(acc, plan)
    scaler = None
    if precision == "16-mixed" and acc.device.type == "cuda":
        scaler = torch.amp.GradScaler("cuda")
    return Runtime(
        _accelerator=acc,
        device=acc.device,
        precision=precision,
        autocast_dtype=AUTOCAST_DTYPES.get(precision),
        param_dtype=PARAM_DTYPES.get(precision),
        scaler=scaler,
        owns_state=not in_job,
        strategy=plan.strategy,
        callers_state=callers_state,
        cluster=plan.cluster,
    )


def runtime_alone_on_the_cpu(plan: Plan) -> Runtime:
    """The runtime of a run in this process on the CPU. Nothing in it needs accelerate (one process,
    no device to choose), so the ``Accelerator`` — a millisecond of a short fit — is built only if
    someone asks for it (see :attr:`Runtime.accelerator`), the caller's accelerate state saved and
    reset then, as :func:`build_runtime` does, and put back by :meth:`Runtime.teardown`."""
    runtime = Runtime(
        _accelerator=None,
        device=torch.device("cpu"),
        precision=plan.precision,
        autocast_dtype=AUTOCAST_DTYPES.get(plan.precision),
        param_dtype=PARAM_DTYPES.get(plan.precision),
        scaler=None,
        owns_state=False,
        strategy=plan.strategy,
        cluster=plan.cluster,
    )

    def build() -> Accelerator:
        runtime.callers_state = saved_accelerate_state()
        reset_accelerate_state()
        runtime.owns_state = True
        with patch_environment(ACCELERATE_TORCH_DEVICE="cpu"):
            return Accelerator(cpu=True, mixed_precision="no")

    runtime._build_accelerator = build
    return runtime


def check_job_formed(accelerator: Accelerator, plan: Plan) -> None:
    """In a job a launcher started: refuse to train alone when the job has several processes."""
    cluster = plan.cluster
    started_by = f"fit(devices={plan.world_size})" if cluster.name == "local" else cluster.launcher
    if accelerator.num_processes != plan.world_size:
        raise RuntimeError(
            f"This process is one of {plan.world_size} processes started by {started_by}, but on "
            f"{plan.device_type!r} accelerate formed a group of {accelerator.num_processes}: every process would "
            "train alone on all of the data. Several processes run on CUDA GPUs or on the CPU (gloo): pass "
            "accelerator='cpu' or 'cuda' to fit, or start a single process."
        )


def uniform_floating_dtype(module: torch.nn.Module) -> Optional[torch.dtype]:
    """The one floating dtype of all the module's parameters, or None (none, or several)."""
    dtypes = {p.dtype for p in module.parameters() if p.is_floating_point()}
    return dtypes.pop() if len(dtypes) == 1 else None


def runtime_for_net(net: torch.nn.Module) -> Runtime:
    """A single-process runtime on the device and dtype the net already has (for evaluate/predict)."""
    tensors: list[torch.Tensor] = [*net.parameters()] or [*net.buffers()]
    device = tensors[0].device if tensors else torch.device("cpu")
    param_dtype = uniform_floating_dtype(net)
    if param_dtype == torch.float32:
        param_dtype = None
    precision = TRUE_PRECISION_OF.get(param_dtype, "32-true") if param_dtype is not None else "32-true"
    return Runtime(
        _accelerator=None,
        device=device,
        precision=precision,
        autocast_dtype=None,
        param_dtype=param_dtype,
        scaler=None,
        owns_state=False,
        strategy=strategy_for_net(net),
    )
