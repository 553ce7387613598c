"""What the doctor's checks look at (:class:`Patient`), and how they read a batch: shared by the
checks of the model (:mod:`~kerastorch.tools.doctor`) and of the data (:mod:`~kerastorch.tools.data_checks`)."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import torch

from ..data.batches import unpack
from ..devices.runtime import Runtime
from ..helpers.protocols import TrainableModel


@dataclasses.dataclass
class Patient:
    """What the checks look at: the model, a few batches of each set, the run's device."""

    model: TrainableModel
    runtime: Runtime
    train_loader: Any
    val_loader: Any
    train_batches: list
    val_batches: list
    max_compared: int
    overfit_steps: int


def batch_parts(batch: Any) -> tuple[tuple, dict, Any]:
    """A batch's inputs (positional, by keyword) and labels."""
    return unpack(batch)[:3]


def inputs_tensor(batch: Any) -> Optional[torch.Tensor]:
    """A batch's first input tensor, or None."""
    args, kwargs, _ = batch_parts(batch)
    tensors = [t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor)]
    return tensors[0] if tensors else None


__all__ = ["Patient", "batch_parts", "inputs_tensor"]
