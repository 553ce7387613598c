"""kerastorch: a Keras-style ``fit`` for PyTorch.

>>> import kerastorch as kt
>>> model = kt.KerasModel(net, loss_fn, metrics_dict, optimizer)          # doctest: +SKIP
>>> dfhistory = model.fit(dl_train, dl_val, epochs=20, monitor="val_acc", mode="max")  # doctest: +SKIP
"""

from . import callbacks
from .callbacks import Callback
from .model import KerasModel
from .plots import LivePlot, plot_history
from .runtime import parse_devices
from .seed import seed_everything, seed_worker
from .summary import summary

__version__ = "0.1.0"

__all__ = [
    "Callback",
    "KerasModel",
    "LivePlot",
    "callbacks",
    "parse_devices",
    "plot_history",
    "seed_everything",
    "seed_worker",
    "summary",
]
