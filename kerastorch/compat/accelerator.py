"""What torchkeras programs ask of ``model.accelerator``: accelerate's ``Accelerator`` while ``fit``
trains, a stand-in for this one process outside it (:class:`LocalAccelerator`), and the view a
program's ``StepRunner`` gets (:class:`RunnerAccelerator`)."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from ..strategies import unwrap


class LocalAccelerator:
    """What torchkeras programs ask of ``model.accelerator`` outside ``fit``, for this one process:
    the net's device, ``print``, ``unwrap_model``, ``prepare`` (which has nothing to do),
    ``get_state_dict`` and ``save``, and what a torchkeras StepRunner calls when ``evaluate`` runs it
    (``autocast``, ``gather``, ``backward``, ``clip_grad_norm_``). While ``fit`` runs,
    ``model.accelerator`` is accelerate's own."""

    num_processes = 1
    process_index = 0
    is_main_process = True
    is_local_main_process = True

    def __init__(self, net: torch.nn.Module):
        self.net = net

    @property
    def device(self) -> torch.device:
        tensors: list[torch.Tensor] = [*self.net.parameters()] or [*self.net.buffers()]
        return tensors[0].device if tensors else torch.device("cpu")

    def print(self, *args: Any, **kwargs: Any) -> None:
        print(*args, **kwargs)

    def unwrap_model(self, model: torch.nn.Module, **kwargs: Any) -> torch.nn.Module:
        return unwrap(model)

    def prepare(self, *objects: Any, **kwargs: Any) -> Any:
        return objects[0] if len(objects) == 1 else objects

    def get_state_dict(self, model: torch.nn.Module, **kwargs: Any) -> dict:
        return unwrap(model).state_dict()

    def save(self, obj: Any, path: Any, **kwargs: Any) -> None:
        torch.save(obj, path)

    def wait_for_everyone(self) -> None:
        """Nothing to wait for in one process."""

    def gather(self, tensor: Any) -> Any:
        return tensor

    # What a torchkeras StepRunner calls on its accelerator, for model.evaluate outside fit.
    sync_gradients = True

    def autocast(self, *args: Any, **kwargs: Any) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()  # outside fit the net runs in its own dtype

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        loss.backward(**kwargs)

    def clip_grad_norm_(self, parameters: Any, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)


class RunnerAccelerator:
    """accelerate's ``Accelerator`` as the program's runner sees it. ``autocast()`` is the run's
    mixed precision (fit builds accelerate's without one: see :func:`~kerastorch.devices.runtime.build_runtime`);
    ``gather`` is accelerate's ``gather_for_metrics`` for per-sample tensors, so that the samples
    repeated to even out the processes' last batches count once in metrics over gathered
    predictions. Everything else (``backward``, ``clip_grad_norm_``, ``device``, ``print``...)
    is accelerate's."""

    def __init__(self, runtime: Any):
        self._runtime = runtime

    def autocast(self, *args: Any, **kwargs: Any) -> Any:
        return self._runtime.autocast()

    def gather(self, data: Any) -> Any:
        accelerator = self._runtime.accelerator
        if self._runtime.num_processes == 1:
            return data
        if isinstance(data, torch.Tensor) and data.ndim == 0:  # one number per process (a batch's loss)
            return accelerator.gather(data)
        return accelerator.gather_for_metrics(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runtime.accelerator, name)


__all__ = ["LocalAccelerator", "RunnerAccelerator"]
