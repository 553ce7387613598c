"""kerastorch: a Keras-style ``fit`` for PyTorch.

>>> import kerastorch as kt
>>> model = kt.KerasModel(net, loss_fn, metrics_dict, optimizer)          # doctest: +SKIP
>>> dfhistory = model.fit(dl_train, dl_val, epochs=20, monitor="val_acc", mode="max")  # doctest: +SKIP
"""

import importlib as _importlib
import importlib.util as _importlib_util

from . import (
    _quiet_tqdm,  # noqa: F401 (first: accelerate imported quietly)
    callbacks,
)
from .callbacks import Callback, LivePlot
from .cuda_devices import find_usable_cuda_devices
from .doctor import Diagnosis, DoctorError, Finding
from .environment import ClusterEnvironment, cluster_environment
from .interpret import Interpretation
from .model import KerasModel
from .options import parse_devices
from .plots import plot_history
from .seed import seed_everything, seed_worker
from .summary import summary
from .tuning import LRFinderResult

__version__ = "0.1.0"

__all__ = [
    "Callback",
    "ClusterEnvironment",
    "Diagnosis",
    "DoctorError",
    "Finding",
    "Interpretation",
    "KerasModel",
    "LRFinderResult",
    "LivePlot",
    "callbacks",
    "cluster_environment",
    "find_usable_cuda_devices",
    "parse_devices",
    "plot_history",
    "seed_everything",
    "seed_worker",
    "summary",
]

# Names whose module needs an optional package: imported on first use, so that
# ``import kerastorch`` stays light and works without the extra.
_LAZY = {"LightModel": (".lightmodel", "lightning")}


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
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
