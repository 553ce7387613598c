"""Where a fit is: the epoch in progress, the lr it began with and its training meters; and, in a
run resumed from a state saved in the middle of an epoch, the batch it goes on from.

The loop keeps it up to date once per epoch (nothing per step); a training state reads it to save
a position inside an epoch, and sets where a resumed run goes on.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional, Union


@dataclasses.dataclass
class EpochResume:
    """An epoch a saved run left after ``batches`` training batches: the learning rates it began with
    (its history row's ``lr``, ``lr_1``...; a state saved before there were several: ``lr`` alone, a
    float) and its training meters' partial sums."""

    epoch: int
    batches: int
    lr: Union[float, dict[str, float]]
    meters: Optional[dict]


class RunPosition:
    """The epoch in progress (1-based; 0 before the first), its learning rates and training meters."""

    def __init__(self, train_meters: Any = None):
        self.epoch = 0
        self.lr: dict[str, float] = {"lr": math.nan}  # each parameter group's, by its history column
        self.train_meters = train_meters
        self.resume: Optional[EpochResume] = None

    def begin_epoch(self, epoch: int, lr: dict[str, float]) -> dict[str, float]:
        """Epoch ``epoch`` begins with the learning rates ``lr``; returns those of its history row (a
        resumed epoch's own)."""
        if self.resume is not None and self.resume.epoch == epoch:
            saved = self.resume.lr
            lr = {**lr, **saved} if isinstance(saved, dict) else {**lr, "lr": saved}
        self.epoch, self.lr = epoch, lr
        return lr

    def continue_epoch(self, meters: Any) -> int:
        """The batch the epoch's training starts at: 0, or, in a resumed epoch, the first not yet
        trained (its meters then hold the saved partial sums)."""
        resume, self.resume = self.resume, None
        if resume is None or resume.epoch != self.epoch:
            return 0
        if resume.meters is not None:
            meters.load_state_dict(resume.meters)
        return resume.batches


__all__ = ["EpochResume", "RunPosition"]
