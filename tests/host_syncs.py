"""Count host syncs: the reads that make the host wait for a number from the device.

On a GPU every such read (``loss.item()``, ``float(t)``, ``if t:``, ``t.tolist()``, an
op whose output size depends on the values, such as ``nonzero``) stalls the queue of
kernels until the device has caught up. On the CPU nothing waits, but the program makes
the same reads, so counting them on the CPU tells how many a GPU run of the same code
would make — which is what :mod:`test_host_syncs` guards and ``benchmarks/peers.py`` reports.

Two layers see the reads, because no single one sees them all on the CPU:

- a ``TorchDispatchMode`` over the aten ops whose result the host must read
  (:data:`READ_OPS`): ``_local_scalar_dense`` (what ``item``, ``float``, ``int``,
  ``bool``, ``if t:``, ``t.__index__`` and the formatting of a 0-d tensor end in),
  ``nonzero`` (also ``argwhere`` and one-argument ``where``), ``masked_select``, indexing
  with a boolean mask, ``equal``, ``allclose``, the ``unique`` family, ``bincount``,
  ``histc`` with automatic range, ``repeat_interleave`` without ``output_size``; and a
  blocking copy from a device to the CPU (``.cpu()``, ``.to("cpu")`` of a CUDA tensor);
- a ``TorchFunctionMode`` over the reads that, on a CPU tensor, dispatch no aten op at
  all: ``tolist``, ``numpy``, ``__array__`` (``np.asarray(t)``), ``repr`` and ``format``.
  Inside one of these, the first layer counts nothing more, so each read counts once on
  any device.

What neither layer sees: waits made in C++ without an aten op (``torch.cuda.synchronize()``,
an event's or a stream's ``synchronize``, a collective's ``wait``), kernels that sync
inside themselves on CUDA, and a blocking copy from the host to the GPU. On a GPU torch sees
those itself: :func:`count_cuda_syncs` counts what ``torch.cuda.set_sync_debug_mode("warn")``
reports, and the guard test has CUDA variants that count with it and run under "error".

Every counted read keeps the Python stack that made it (:class:`HostSync`), so a count
can say where the reads come from, and reads can be sorted by who made them (a progress
bar's redraw, the epoch's end). On the CPU all tensors are host tensors, so a read of a
tensor that would stay on the CPU in a GPU run too (Adam's ``step`` counter, a sampler's
``randperm(n).tolist()``) counts like the others: compare counts with a bare loop that
makes the same ones, as :func:`syncs_per_step` and the guard test do.

It lives beside the tests (pytest puts ``tests/`` on the path, as for ``helpers.py``, and
fit's forked workers inherit it); ``benchmarks/peers.py`` adds ``tests/`` to its path, so
the guard and the benchmark count with one definition.

Example::

    >>> import torch
    >>> t = torch.tensor([0.5, 0.0, 2.0])
    >>> with count_host_syncs() as syncs:
    ...     total = t.sum()              # stays a tensor: no read
    ...     value = float(total)         # one read
    ...     nonzero = t.nonzero()        # one read (its size depends on the values)
    ...     values = t.tolist()          # one read
    >>> len(syncs), sorted(syncs.ops())
    (3, ['aten._local_scalar_dense', 'aten.nonzero', 'tolist'])
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import sys
import warnings
from typing import Any, Callable, Iterator, Optional

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

# aten ops (overload packets) whose result the host has to read; each call is one sync.
READ_OPS = {
    "aten::_local_scalar_dense",
    "aten::nonzero",
    "aten::masked_select",
    "aten::equal",
    "aten::allclose",
    "aten::_unique",
    "aten::_unique2",
    "aten::unique_dim",
    "aten::unique_consecutive",
    "aten::bincount",
}
# Reads only with some arguments: see _reads_the_device.
CONDITIONAL_OPS = {
    "aten::index",  # t[mask]: a boolean mask is turned into indices by a nonzero
    "aten::index_put",
    "aten::index_put_",
    "aten::_index_put_impl",
    "aten::_index_put_impl_",
    "aten::repeat_interleave",  # the output's size is the sum of the repeats, unless output_size is given
    "aten::histc",  # with min == max (the default), the range is read from the data
    "aten::_to_copy",  # .cpu() / .to("cpu") of a device tensor
    "aten::copy_",  # cpu_tensor.copy_(device_tensor)
}
# Tensor methods that read a CPU tensor's memory without dispatching an aten op.
READ_METHODS = {"tolist", "numpy", "__array__", "__repr__", "__format__"}

_HERE = os.path.abspath(__file__)
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
# The modes' own frames and the wrappers torch calls them through: not where a read is made.
_MACHINERY = {
    os.path.join(_TORCH_DIR, *parts)
    for parts in (("utils", "_python_dispatch.py"), ("overrides.py",), ("_dynamo", "eval_frame.py"), ("_compile.py",))
}
STACK_DEPTH = 12  # frames kept per read, innermost first


@dataclasses.dataclass(frozen=True)
class Frame:
    """One Python frame of a read's stack: where, and in which function (``Class.method``)."""

    file: str
    line: int
    function: str

    @property
    def in_torch(self) -> bool:
        return self.file.startswith(_TORCH_DIR)

    def __str__(self) -> str:
        return f"{short_path(self.file)}:{self.line} in {self.function}"


@dataclasses.dataclass(frozen=True)
class HostSync:
    """One read: the op (``aten.nonzero``, ``tolist``...) and the stack that made it."""

    op: str
    stack: tuple[Frame, ...]

    @property
    def site(self) -> str:
        """Where the read is made, for people: the innermost frame outside torch, and torch's
        own innermost frame when torch made it (``Adam.step`` reading its step counter)."""
        outside = next((f for f in self.stack if not f.in_torch), None)
        inside = self.stack[0] if self.stack and self.stack[0].in_torch else None
        parts = [str(frame) for frame in (outside, inside) if frame is not None]
        return " via ".join(parts) if parts else "?"

    def chain(self, depth: int = 4) -> str:
        """The innermost ``depth`` frames, innermost first: ``a.py:3 in f <- b.py:9 in g``."""
        return " <- ".join(str(frame) for frame in self.stack[:depth])

    def passes_through(self, function: str) -> bool:
        """True when a frame of the stack is ``function`` (``"ProgressBar.on_train_batch_end"``,
        or a bare name such as ``"on_train_batch_end"``)."""
        return any(frame.function == function or frame.function.rsplit(".", 1)[-1] == function for frame in self.stack)


class HostSyncs(list):
    """The reads counted in one ``with count_host_syncs()`` block, in order."""

    def ops(self) -> list[str]:
        return [sync.op for sync in self]

    def by_site(self) -> collections.Counter:
        """How many reads each (op, site) made."""
        return collections.Counter((sync.op, sync.site) for sync in self)

    def where(self, keep: Callable[[HostSync], bool]) -> HostSyncs:
        return HostSyncs(sync for sync in self if keep(sync))

    def describe(self, limit: int = 10) -> str:
        lines = [f"{count} x {op} at {site}" for (op, site), count in self.by_site().most_common(limit)]
        return "\n".join(lines) if lines else "(no reads)"


class _CountingModes:
    """The two modes, sharing the list they append to and a flag that stops the dispatch layer
    counting the aten ops that a method read it already counted dispatches (``tolist`` of a
    CUDA tensor copies it to the CPU)."""

    def __init__(self, syncs: HostSyncs):
        self.syncs = syncs
        self.inside_a_read = False

    def record(self, op: str) -> None:
        self.syncs.append(HostSync(op, _stack()))


class _DispatchCounter(TorchDispatchMode):
    def __init__(self, shared: _CountingModes):
        super().__init__()
        self.shared = shared

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not self.shared.inside_a_read and _reads_the_device(func, args, kwargs):
            self.shared.record(str(func.overloadpacket))  # "aten.nonzero"
        return func(*args, **kwargs)


class _MethodCounter(TorchFunctionMode):
    def __init__(self, shared: _CountingModes):
        super().__init__()
        self.shared = shared

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name not in READ_METHODS or self.shared.inside_a_read:
            return func(*args, **kwargs)
        self.shared.record(name)
        self.shared.inside_a_read = True
        try:
            return func(*args, **kwargs)
        finally:
            self.shared.inside_a_read = False


def _reads_the_device(func: Any, args: tuple, kwargs: dict) -> bool:
    packet = func.overloadpacket._qualified_op_name  # "aten::nonzero"
    if packet in READ_OPS:
        return True
    if packet not in CONDITIONAL_OPS:
        return False
    if packet == "aten::index" or packet.startswith(("aten::index_put", "aten::_index_put_impl")):
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices or ())
    if packet == "aten::repeat_interleave":
        return kwargs.get("output_size") is None and (len(args) < 4 or args[3] is None)
    if packet == "aten::histc":
        low = args[2] if len(args) > 2 else kwargs.get("min", 0)
        high = args[3] if len(args) > 3 else kwargs.get("max", 0)
        return low == high
    if packet == "aten::_to_copy":
        source, device = args[0], kwargs.get("device")
        return (
            device is not None
            and torch.device(device).type == "cpu"
            and source.device.type != "cpu"
            and not kwargs.get("non_blocking", False)
        )
    if packet == "aten::copy_":
        target, source = args[0], args[1]
        non_blocking = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
        return target.device.type == "cpu" and source.device.type != "cpu" and not non_blocking
    return False


def _stack() -> tuple[Frame, ...]:
    frames: list[Frame] = []
    frame: Optional[Any] = sys._getframe(2)
    while frame is not None and len(frames) < STACK_DEPTH:
        file = os.path.abspath(frame.f_code.co_filename)
        if file != _HERE and file not in _MACHINERY:
            frames.append(Frame(file, frame.f_lineno, _qualified_name(frame)))
        frame = frame.f_back
    return tuple(frames)


def _qualified_name(frame: Any) -> str:
    qualname = getattr(frame.f_code, "co_qualname", None)  # Python 3.11+
    if qualname is not None:
        return qualname
    owner = frame.f_locals.get("self")
    name = frame.f_code.co_name
    return f"{type(owner).__name__}.{name}" if owner is not None else name


def short_path(file: str) -> str:
    """``file`` from its package on: ``kerastorch/step.py``, ``torch/optim/adam.py``, ``tests/x.py``
    (from the innermost of those folders, wherever the checkout is)."""
    markers = [os.sep + name + os.sep for name in ("kerastorch", "site-packages", "tests")]
    marker = max(markers, key=file.rfind)
    if file.rfind(marker) < 0:
        return os.path.basename(file)
    tail = file.rsplit(marker, 1)[1]
    return tail if "site-packages" in marker else marker.strip(os.sep) + os.sep + tail


@contextlib.contextmanager
def count_host_syncs() -> Iterator[HostSyncs]:
    """Count the host syncs made in the block, in this thread; yields the list of reads."""
    syncs = HostSyncs()
    shared = _CountingModes(syncs)
    with _MethodCounter(shared), _DispatchCounter(shared):
        yield syncs


_WARNINGS_MODULE = os.path.abspath(warnings.__file__)
CUDA_SYNC_MESSAGE = "called a synchronizing CUDA operation"  # torch's text in "warn" mode


@contextlib.contextmanager
def count_cuda_syncs() -> Iterator[HostSyncs]:
    """Count the synchronizing CUDA calls made in the block, as torch itself reports them with
    ``torch.cuda.set_sync_debug_mode("warn")``: every read of a GPU value, a blocking copy
    either way, a stream or device synchronize. Each is a :class:`HostSync` with op
    ``"cuda sync"`` and the Python stack that made it. Needs a CUDA GPU."""
    syncs = HostSyncs()

    def record(message, category, filename, lineno, file=None, line=None):
        if CUDA_SYNC_MESSAGE not in str(message):
            return
        stack = tuple(frame for frame in _stack() if frame.file != _WARNINGS_MODULE)
        syncs.append(HostSync("cuda sync", stack))

    previous_mode = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record  # called where the warning is raised: the stack is the caller's
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield syncs
        finally:
            torch.cuda.set_sync_debug_mode(previous_mode)


@dataclasses.dataclass
class StepSyncs:
    """Reads per step, from two runs that differ only in their number of steps."""

    short: HostSyncs
    long: HostSyncs
    steps: tuple[int, int]

    @property
    def per_step(self) -> float:
        return (len(self.long) - len(self.short)) / (self.steps[1] - self.steps[0])

    def grew(self, key: Callable[[HostSync], Any] = lambda sync: (sync.op, sync.site)) -> dict:
        """Reads per step of each ``key`` (default: op and site) whose count grew with the steps."""
        extra = collections.Counter(map(key, self.long))
        extra.subtract(collections.Counter(map(key, self.short)))
        span = self.steps[1] - self.steps[0]
        return {k: count / span for k, count in extra.most_common() if count != 0}

    def describe(self) -> str:
        lines = [f"{count:g} per step: {op} at {site}" for (op, site), count in self.grew().items()]
        return "\n".join(lines) if lines else "(no read grew with the steps)"

    def added_over(self, baseline: StepSyncs, depth: int = 4) -> str:
        """The reads per step that this run makes and ``baseline`` does not, matched by op and by
        the line that reads (Adam's ``_get_value`` is the same line in both), each with its
        innermost ``depth`` frames."""
        line = lambda sync: (sync.op, sync.stack[0] if sync.stack else None)
        extra = collections.Counter(self.grew(line))
        extra.subtract(collections.Counter(baseline.grew(line)))
        example = {line(sync): sync for sync in self.long}
        lines = [
            f"{count:+g} per step: {example[key].op} at {example[key].chain(depth)}"
            for key, count in extra.most_common()
            if count > 0
        ]
        return "\n".join(lines) if lines else "(none)"


def syncs_per_step(
    run: Callable[[int], Any],
    steps: tuple[int, int] = (8, 24),
    ignore: Optional[Callable[[HostSync], bool]] = None,
    counter: Callable[[], Any] = count_host_syncs,
) -> StepSyncs:
    """Reads per step of ``run(n)`` (which runs n steps): counted in a run of ``steps[0]`` and
    one of ``steps[1]``, the difference divided by the difference in steps.

    What happens once per run or per epoch (set-up, first-batch checks, the epoch's end, a
    sampler's shuffle) cancels out; what happens every k steps counts 1/k per step. Reads
    for which ``ignore`` is true (e.g. a progress bar's redraws, which follow the clock,
    not the steps) are left out of both runs. ``counter``: :func:`count_host_syncs`, or
    :func:`count_cuda_syncs` on a GPU.
    """
    counted = []
    for n in steps:
        with counter() as syncs:
            run(n)
        counted.append(syncs if ignore is None else syncs.where(lambda sync: not ignore(sync)))
    return StepSyncs(counted[0], counted[1], steps)


__all__ = ["HostSync", "HostSyncs", "StepSyncs", "count_cuda_syncs", "count_host_syncs", "syncs_per_step"]
