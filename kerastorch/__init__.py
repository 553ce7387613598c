"""kerastorch: a Keras-style ``fit`` for PyTorch.

>>> import kerastorch as kt
>>> model = kt.KerasModel(net, loss_fn, metrics_dict, optimizer)          # doctest: +SKIP
>>> dfhistory = model.fit(dl_train, dl_val, epochs=20, monitor="val_acc", mode="max")  # doctest: +SKIP

Who owns what, in the order a ``fit`` call goes through them:

| concern | where | what it owns |
| --- | --- | --- |
| the user's objects | ``model.py`` | ``KerasModel``: the net, loss, metrics, optimizer; its methods hand their keywords to the door |
| keywords | ``arguments.py`` (the door) | the call in kerastorch's words (Keras's, torchkeras's aliases), checks that join keywords, ``"auto"`` resolved |
| settings | ``settings.py`` | the frozen groups, each built and checked by name from the call (``from_keywords``); downstream trusts them |
| data | ``data/`` | one adapter per data form, turning it into loaders; reading a batch into inputs, labels, weights |
| where | ``devices/`` | Lightning's device words, who started us (torchrun, SLURM, MPI, Kubeflow, Ray), the plan, the runtime |
| how processes share the work | ``strategies/`` | single device, model parallel, DDP, FSDP behind one protocol; nothing else asks which runs |
| the run | ``run.py``, ``evaluation.py`` | fit's body: the plan, the loaders, the callbacks, then ``fit_loop``; evaluate and predict |
| training | ``training/`` | ``fit_loop`` → ``train_epoch`` → ``KerasModel.train_step`` with ``FitStep``; the model and first-batch checks, meters, history, the ``Callback`` base |
| small shared things | ``helpers/`` | train/eval modes, random generators, protocols, value checks, where output goes, plots |
| optional behaviour | ``callbacks/`` | best weights, early stopping, progress, resume, loggers ... each a callback with an ``order`` |
| around a fit | ``tools/`` | ``lr_find`` and one cycle, ``doctor``, the run's report (``diagnose``), ``interpret``, ``summary``, plots (reusing ``FitStep``) |
| torchkeras | ``compat/`` | its step classes as one more ``Epochs``, its callbacks, metrics and words, the ``nn.Module`` names |
| files | ``files/`` | weights and training-state files, written atomically, read without running code |

``kerastorch.kerascallbacks``, ``kerastorch.metrics`` and ``kerastorch.summary`` keep torchkeras's
import paths. Lightning's ``Trainer`` trains a ``kt.LightModel`` (``lightmodel.py``, with the
``lightning`` extra).
"""

import importlib as _importlib
import importlib.util as _importlib_util
import warnings as _warnings

# accelerate imports tqdm.auto, which warns at import in a Jupyter kernel without ipywidgets
# ("IProgress not found"). kerastorch draws its own progress and never shows tqdm's widgets, so that
# red warning would only send a beginner to install something they do not need: accelerate is
# imported first, quietly.
with _warnings.catch_warnings():
    _warnings.filterwarnings("ignore", message="IProgress not found")
    import accelerate as _accelerate  # noqa: F401

from . import (
    callbacks,
    devices,
    strategies,
)
from .callbacks import Callback
from .devices.environment import ClusterEnvironment, cluster_environment  # noqa: F401 (the page documents it here)
from .helpers.plots import plot_history
from .helpers.seed import seed_everything, seed_worker
from .model import KerasModel
from .summary import summary  # the module first: importing it later must not hide the function
from .tools.diagnosis import diagnose
from .tools.doctor import DoctorError
from .training.preemption import Preempted

__version__ = "0.3.0.dev0"

__all__ = [
    "Callback",
    "DoctorError",
    "KerasModel",
    "Preempted",
    "callbacks",
    "cluster_environment",
    "devices",
    "diagnose",
    "plot_history",
    "seed_everything",
    "seed_worker",
    "strategies",
    "summary",
]

# Names whose module needs an optional package: imported on first use, so that
# ``import kerastorch`` stays light and works without the extra.
_LAZY = {"LightModel": (".lightmodel", "lightning")}

# Names that moved to the module where they belong; still importable from here.
_MOVED = {
    "parse_devices": ".devices",
    "find_usable_cuda_devices": ".devices",
    "LivePlot": ".callbacks",
    "Diagnosis": ".tools.report",
    "Finding": ".tools.report",
    "Interpretation": ".tools.interpret",
    "LRFinderResult": ".tools.tuning",
}


def _installed(package: str) -> bool:
    try:  # finds the package without importing it
        return _importlib_util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False


# Listed only when importable, so that `from kerastorch import *` works without the extra.
__all__ += [name for name, (_, package) in _LAZY.items() if _installed(package)]


def __getattr__(name: str):
    if name in _LAZY:
        # Without the extra, the module raises an ImportError that names it.
        value = getattr(_importlib.import_module(_LAZY[name][0], __name__), name)
        globals()[name] = value
        return value
    if name in _MOVED:
        return getattr(_importlib.import_module(_MOVED[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
