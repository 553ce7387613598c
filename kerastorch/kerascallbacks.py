"""torchkeras's callbacks by their names: ``from kerastorch.kerascallbacks import TensorBoardCallback``.

The classes live in :mod:`kerastorch.compat.kerascallbacks`; this module keeps torchkeras's import path.
"""

from .compat.kerascallbacks import (
    EpochCheckpoint,
    TensorBoardCallback,
    VisDisplay,
    VisMetric,
    VisProgress,
    WandbCallback,
)

__all__ = ["EpochCheckpoint", "TensorBoardCallback", "VisDisplay", "VisMetric", "VisProgress", "WandbCallback"]
