"""torchkeras's metrics by their names: ``from kerastorch.metrics import Accuracy, AUC``.

The classes live in :mod:`kerastorch.compat.metrics`; this module keeps torchkeras's import path.
"""

from .compat.metrics import AUC, IOU, KS, Accuracy, Precision, Recall

__all__ = ["AUC", "IOU", "KS", "Accuracy", "Precision", "Recall"]
