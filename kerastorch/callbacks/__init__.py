"""Built-in callbacks. ``fit`` adds some of them from its own arguments; pass others in ``callbacks``.

``TensorBoard``, ``WandbLogger``, ``MLflowLogger`` and ``OptunaPruning`` need optional packages
(``kerastorch[tensorboard]``, ``[wandb]``, ``[mlflow]``, ``[optuna]``), imported only when one
of them is created. Inside a Ray Train worker ``fit`` adds its own ``RayTrainReport``
(``ray_report.py``, ``kerastorch[ray]``), which reports every epoch to Ray.

The training state that ``BackupAndRestore`` and ``fit(resume=True)`` write is
``training_state.py``'s; what it holds besides the run's position (every optimizer, scheduler
and grad scaler the model holds, the callbacks' states) is ``state_contents.py``'s, and what a
saved state must match to resume is ``resume_checks.py``'s.
"""

import importlib as _importlib

from ..training.callback import Callback
from ..training.callback_list import CallbackList  # noqa: F401 (importable: the run's list, not a callback)
from .backup_and_restore import BackupAndRestore
from .best_weights import RestoreBestWeights
from .csv_logger import CSVLogger
from .early_stopping import EarlyStopping
from .ema import EMA
from .lambda_callback import LambdaCallback
from .live_plot import LivePlot
from .lr_scheduler import LearningRateScheduler
from .mlflow_logger import MLflowLogger
from .model_checkpoint import ModelCheckpoint
from .monitor import MonitorCallback  # noqa: F401 (importable: the base of the monitoring callbacks)
from .optuna_pruning import OptunaPruning
from .progress import ProgressBar
from .reduce_lr_on_plateau import ReduceLROnPlateau
from .swa import SWA
from .tensorboard import TensorBoard
from .terminate_on_nan import TerminateOnNaN
from .training_state import TrainingState
from .wandb_logger import WandbLogger

__all__ = [
    "BackupAndRestore",
    "CSVLogger",
    "Callback",
    "EMA",
    "EarlyStopping",
    "LambdaCallback",
    "LearningRateScheduler",
    "LivePlot",
    "MLflowLogger",
    "ModelCheckpoint",
    "OptunaPruning",
    "ProgressBar",
    "ReduceLROnPlateau",
    "RestoreBestWeights",
    "SWA",
    "TensorBoard",
    "TerminateOnNaN",
    "TrainingState",
    "WandbLogger",
]

# Importable from here as before; they live where they belong now.
_MOVED = {"TorchkerasCallback": "kerastorch.compat.callbacks"}


def __getattr__(name: str):
    if name in _MOVED:
        return getattr(_importlib.import_module(_MOVED[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
