"""Built-in callbacks. ``fit`` adds some of them from its own arguments; pass others in ``callbacks``."""

from .base import Callback, CallbackList
from .best_weights import RestoreBestWeights
from .early_stopping import EarlyStopping
from .monitor import MonitorCallback
from .progress import ProgressBar
from .terminate_on_nan import TerminateOnNaN
from .training_state import TrainingState

__all__ = [
    "Callback",
    "CallbackList",
    "EarlyStopping",
    "MonitorCallback",
    "ProgressBar",
    "RestoreBestWeights",
    "TerminateOnNaN",
    "TrainingState",
]
