"""What the loop, the step, the strategies and the run need from a model, from the runtime they run
on and from the epochs they run: small Protocols, so that every layer is typed without importing
:class:`~kerastorch.KerasModel` or :class:`~kerastorch.devices.runtime.Runtime` (which sit above it)."""

from __future__ import annotations

from typing import Any, Optional, Protocol

import pandas as pd
import torch


class TrainableModel(Protocol):
    """The parts and calls of a model that ``fit``, ``evaluate`` and ``predict`` use."""

    net: torch.nn.Module
    loss_fn: Optional[Any]
    metrics_dict: dict
    optimizer: torch.optim.Optimizer
    lr_scheduler: Optional[Any]
    lr_scheduler_interval: str
    stop_training: bool
    history: pd.DataFrame
    runtime: Optional[Any]
    fit_step: Optional[Any]
    labels_at: Optional[Any]  # where batches hold their labels (KerasModel(labels_at=...))
    fit_report: Optional[Any]  # the last fit's report (model.diagnose())

    @property
    def is_main_process(self) -> bool: ...

    def forward_batch(self, batch: Any) -> tuple[torch.Tensor, Any, Any]: ...

    def predict_batch(self, batch: Any) -> Any: ...

    def train_step(self, batch: Any) -> Any: ...

    def start_reading(self, say: Optional[Any] = None) -> None: ...

    @property
    def uses_default_train_step(self) -> bool: ...

    @property
    def uses_default_forward_batch(self) -> bool: ...

    def print(self, *args: Any) -> None: ...


class RunRuntime(Protocol):
    """What a strategy and the loop use of the runtime a run trains on
    (:class:`~kerastorch.devices.runtime.Runtime`)."""

    device: torch.device
    precision: str
    num_processes: int
    is_main_process: bool
    scaler: Optional[Any]
    strategy: Any

    @property
    def accelerator(self) -> Any: ...

    def reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor: ...

    def autocast(self) -> Any: ...

    def to_device(self, batch: Any) -> Any: ...


class Epochs(Protocol):
    """How the loop trains and validates one epoch, and what it does when the epoch ends."""

    def train(self, loader: Any) -> dict[str, float]: ...

    def validate(self, loader: Any) -> dict[str, float]: ...

    def end_epoch(self, logs: dict) -> None: ...


__all__ = ["Epochs", "RunRuntime", "TrainableModel"]
