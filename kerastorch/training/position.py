"""Where a fit is: the epoch in progress, the lr it began with and its training meters; and, in a
run resumed from a state saved in the middle of an epoch, the batch it goes on from.

The loop keeps it up to date once per epoch (nothing per step); a training state reads it to save
a position inside an epoch, and sets where a resumed run goes on.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional


@dataclasses.dataclass
class EpochResume:
    """An epoch a saved run left after ``batches`` training batches: the lr it began with (its
    history row's ``lr``) and its training meters' partial sums."""

    epoch: int
    batches: int
    lr: float
    meters: Optional[dict]


class RunPosition:
    """The epoch in progress (1-based; 0 before the first), its lr and training meters."""

    def __init__(self, train_meters: Any = None):
        self.epoch = 0
        self.lr = math.nan
        self.train_meters = train_meters
        self.resume: Optional[EpochResume] = None

    def begin_epoch(self, epoch: int, lr: float) -> float:
        """Epoch ``epoch`` begins with ``lr``; returns the lr of its history row (a resumed epoch's own)."""
        if self.resume is not None and self.resume.epoch == epoch:
            lr = self.resume.lr
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
