"""``KerasModel``: a net, a loss, metrics and an optimizer, trained with one ``fit`` call.

This class holds the user's objects and the arguments; the work is delegated:
:mod:`~kerastorch.runtime` chooses devices and precision, :mod:`~kerastorch.loop`
runs the epochs, :mod:`~kerastorch.callbacks` hold every optional behaviour and
:mod:`~kerastorch.checkpoint` reads and writes weights.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any, Optional, Sequence, Union

import pandas as pd
import torch
from torch import nn

from . import checks
from .batches import split_batch, split_inputs
from .callbacks import CallbackList, EarlyStopping, ProgressBar, RestoreBestWeights, TerminateOnNaN
from .callbacks.training_state import TrainingState, resumed_history, training_state_path
from .checkpoint import load_weights, save_weights, unwrap
from .distributed import process_share
from .launch import NeedsProcesses, fit_in_processes
from .loop import StepSettings, evaluate_epoch, fit_loop, predict_outputs
from .meters import EpochMeters, check_metrics
from .model_parallel import is_model_parallel, labels_to_outputs, model_parallel_runtime
from .placement import place_model
from .runtime import Runtime, build_runtime, runtime_for_net


class KerasModel:
    """Train a PyTorch ``net`` the Keras way.

    Example::

        model = kt.KerasModel(net, loss_fn=nn.CrossEntropyLoss(),
                              metrics_dict={"acc": torchmetrics.Accuracy(task="multiclass", num_classes=10)},
                              optimizer=torch.optim.Adam(net.parameters(), lr=1e-3))
        dfhistory = model.fit(dl_train, dl_val, epochs=20, patience=5, monitor="val_acc", mode="max")
        model.evaluate(dl_val)     # {"val_loss": ..., "val_acc": ...}
        model.predict(dl_test)     # a CPU tensor of outputs, rows in data order

    For a batch layout or a loss that the defaults do not cover, subclass and override
    :meth:`forward_batch` (and :meth:`predict_batch` for ``predict``).
    """

    def __init__(self, net: nn.Module, loss_fn: Optional[Any] = None, metrics_dict: Optional[dict] = None,
                 optimizer: Optional[torch.optim.Optimizer] = None, lr_scheduler: Optional[Any] = None,
                 lr_scheduler_interval: str = "epoch"):
        checks.check_model_parts(net, loss_fn, lr_scheduler, lr_scheduler_interval)
        self.net = net
        self.loss_fn = loss_fn
        self.metrics_dict = check_metrics(metrics_dict)
        self.optimizer = optimizer if optimizer is not None else torch.optim.Adam(net.parameters(), lr=1e-3)
        self.lr_scheduler = lr_scheduler
        self.lr_scheduler_interval = lr_scheduler_interval
        self.history = pd.DataFrame()
        self.stop_training = False
        self.runtime: Optional[Runtime] = None

    # -- the step: override these for custom batches ---------------------------------

    def forward_batch(self, batch: Any) -> tuple[torch.Tensor, Any, Any]:
        """Turn one batch into ``(loss, preds, labels)``; ``loss`` is the batch mean.

        The default reads ``(x, y)``, ``(x1, ..., xn, y)`` or a dict with a ``labels``
        key, calls the net and ``loss_fn``. Override it for anything else; fit, evaluate,
        the meters and the callbacks all go through it.
        """
        args, kwargs, labels = split_batch(batch)
        preds = self.net(*args, **kwargs)
        labels = labels_to_outputs(labels, preds)  # a model-parallel net's output may be on another device
        return self.loss_fn(preds, labels), preds, labels

    def predict_batch(self, batch: Any) -> Any:
        """The net's output for one batch; labels in the batch, if any, are ignored."""
        args, kwargs = split_inputs(batch)
        return self.net(*args, **kwargs)

    # -- training --------------------------------------------------------------------

    def fit(self, train_data: Iterable, val_data: Optional[Iterable] = None, epochs: int = 10,
            patience: Optional[int] = 5, monitor: Optional[str] = None, mode: str = "min", min_delta: float = 0.0,
            ckpt_path: Optional[Union[str, os.PathLike]] = None, resume: bool = False,
            callbacks: Optional[Sequence] = None,
            verbose: int = 1, plot: bool = False, quiet: Optional[bool] = None, wandb: bool = False,
            accelerator: str = "auto", devices: Any = "auto", precision: Any = "32-true",
            mixed_precision: Optional[str] = None, cpu: bool = False, gradient_accumulation_steps: int = 1,
            gradient_clip_val: Optional[float] = None, gradient_clip_algorithm: str = "norm") -> pd.DataFrame:
        """Train for ``epochs`` epochs and return the history, one row per epoch.

        Columns: ``epoch`` (1-based), ``train_loss``, ``train_<metric>``, ``lr``, ``val_loss``,
        ``val_<metric>``. Values are exact over each epoch's samples. ``monitor`` (default
        ``val_loss``, or ``train_loss`` without ``val_data``) picks the best epoch, whose
        weights are in ``net`` when fit returns; ``patience`` epochs without improvement
        stop training (``patience=None`` never stops early). Ctrl-C stops cleanly and
        returns the history so far.

        ``resume=True`` (with ``ckpt_path``) writes the whole training state to
        ``ckpt_path + ".state"`` after every epoch and, when that file exists, continues
        from it: a run killed at any moment and started again ends as if never stopped
        (see :class:`~kerastorch.callbacks.TrainingState`).

        ``accelerator``, ``devices`` and ``precision`` take Lightning's words;
        torchkeras's ``mixed_precision``, ``cpu``, ``quiet`` and ``ckpt_path`` work too.
        ``devices=k`` (k > 1) from a notebook or plain python starts k processes and loads
        the result back into this model (:mod:`kerastorch.launch`); in a script started by
        ``torchrun`` or ``accelerate launch``, fit runs as one rank of that job.
        """
        fit_arguments = dict(locals())  # this very call, replayed by each process fit_in_processes starts
        del fit_arguments["self"]
        if quiet is not None:
            verbose = 0 if quiet else verbose
        monitor = monitor or ("val_loss" if val_data is not None else "train_loss")
        checks.check_fit_arguments(self, train_data, val_data, epochs, patience, monitor, mode,
                                   gradient_accumulation_steps, gradient_clip_val, gradient_clip_algorithm,
                                   ckpt_path, verbose, resume=resume, callbacks=callbacks)
        if devices == "auto" and is_model_parallel(self.net):
            devices = 1  # the user placed the net's pieces; it trains in this one process
        try:
            runtime = build_runtime(accelerator, devices, precision, mixed_precision, cpu)
        except NeedsProcesses as request:  # devices=k from a notebook or plain python
            needs_processes = request
        else:
            needs_processes = None
        if needs_processes is not None:  # outside the except block, so the workers' errors do not chain to it
            return fit_in_processes(self, needs_processes, fit_arguments)
        if is_model_parallel(self.net):
            runtime = model_parallel_runtime(self, runtime, train_data)
        self.runtime = runtime
        try:
            self._place_net(runtime)
            checks.check_first_batch(self, train_data, runtime, "train_data")
            with process_share(self, runtime, train_data, val_data) as (train_data, val_data):
                if not runtime.is_main_process:  # one process prints and draws
                    verbose, plot, wandb = 0, False, False
                meters = {"train": EpochMeters("train", self.metrics_dict, runtime.outputs_device, runtime.reduce_sum),
                          "val": EpochMeters("val", self.metrics_dict, runtime.outputs_device, runtime.reduce_sum)}
                callback_list = self._callbacks_for_run(
                    callbacks, train_data, val_data, epochs, patience, monitor, mode, min_delta, ckpt_path, resume,
                    verbose, plot, wandb)
                settings = StepSettings(gradient_accumulation_steps, gradient_clip_val, gradient_clip_algorithm,
                                        self.lr_scheduler_interval, monitor)
                if verbose:
                    self.print(runtime.describe())
                return self._run(train_data, val_data, runtime, callback_list, meters, settings, epochs)
        finally:
            runtime.teardown()

    def _run(self, train_data, val_data, runtime, callbacks, meters, settings, epochs) -> pd.DataFrame:
        rows: list[dict] = []
        self.stop_training = False
        callbacks.call("on_train_begin", {})
        rows.extend(resumed_history(callbacks))
        try:
            if not self.stop_training:  # a resumed run that had already stopped early stays stopped
                fit_loop(self, train_data, val_data, runtime, callbacks, meters, settings, epochs, rows,
                         first_epoch=rows[-1]["epoch"] + 1 if rows else 1)
        except KeyboardInterrupt:
            self.print(f"Interrupted during epoch {len(rows) + 1}: returning the history of the {len(rows)} "
                       "finished epoch(s) with the best weights restored.")
        finally:
            self.history = history_frame(rows)
            callbacks.call("on_train_end", rows[-1] if rows else {})
        return self.history

    def _callbacks_for_run(self, callbacks, train_data, val_data, epochs, patience, monitor, mode, min_delta,
                           ckpt_path, resume, verbose, plot, wandb) -> CallbackList:
        """fit's own callbacks, the user's, the training state (it keeps theirs) and the progress bar, in that order."""
        builtins = self._builtin_callbacks(patience, monitor, mode, min_delta, ckpt_path, verbose, plot, wandb)
        chain = [*builtins[:-1], *(callbacks or [])]
        if resume:
            chain.append(TrainingState(training_state_path(ckpt_path), chain, (train_data, val_data),
                                       verbose=int(verbose > 0)))
        params = {"epochs": epochs, "steps": _length(train_data), "verbose": verbose, "monitor": monitor,
                  "mode": mode, "metrics": checks.run_names(self.metrics_dict, val_data is not None),
                  "ckpt_path": ckpt_path}
        return CallbackList([*chain, builtins[-1]], self, params)

    def _builtin_callbacks(self, patience, monitor, mode, min_delta, ckpt_path, verbose, plot, wandb) -> list:
        """What fit's own arguments switch on. The last one is drawn last (the progress bar)."""
        builtins: list = [TerminateOnNaN(verbose=int(verbose > 0)),
                          RestoreBestWeights(monitor, mode, min_delta, ckpt_path=ckpt_path)]
        if patience is not None:
            builtins.append(EarlyStopping(monitor, mode, patience, min_delta, verbose=int(verbose > 0)))
        if plot:
            from .plots import LivePlot

            builtins.append(LivePlot(monitor=monitor, mode=mode))
        if wandb:
            from .callbacks.wandb_logger import WandbLogger

            builtins.append(WandbLogger(**(wandb if isinstance(wandb, dict) else {})))
        builtins.append(ProgressBar(verbose=verbose))
        return builtins

    def _place_net(self, runtime: Runtime) -> None:
        spread = is_model_parallel(self.net)  # the user placed its pieces: only their dtype may change
        place_model(self.net, self.loss_fn, self.optimizer, runtime, move_net=not spread)
        if spread and isinstance(self.loss_fn, nn.Module):
            self.loss_fn.to(runtime.outputs_device)  # the loss meets the outputs where they come out

    # -- using a trained model ---------------------------------------------------------

    def evaluate(self, data: Iterable, quiet: bool = False) -> dict[str, float]:
        """Loss and metrics over ``data`` (eval mode, no gradients): ``{"val_loss": ..., "val_<m>": ...}``."""
        checks.check_loader(data, "data")
        checks.check_loss_fn(self)
        runtime = runtime_for_net(self.net)
        if is_model_parallel(self.net):
            runtime = model_parallel_runtime(self, runtime, data)
        meters = EpochMeters("val", self.metrics_dict, runtime.outputs_device)
        callbacks = CallbackList([ProgressBar(verbose=0 if quiet else 1)], self, {"epochs": 1, "steps": _length(data)})
        logs = evaluate_epoch(self, data, runtime, meters, callbacks)
        if not quiet:
            self.print(", ".join(f"{k}={v:.4g}" for k, v in logs.items()))
        return logs

    def predict(self, data: Iterable) -> Any:
        """The net's outputs for ``data``, on the CPU, rows in data order (eval mode, no gradients).

        ``data`` may be fit's loaders (labels are ignored) or loaders of inputs only.
        """
        checks.check_loader(data, "data")
        return predict_outputs(self, data, runtime_for_net(self.net))

    # -- weights ---------------------------------------------------------------------------

    def save_ckpt(self, path: Union[str, os.PathLike]) -> None:
        """Write the net's weights to ``path`` (safetensors, atomically)."""
        save_weights(unwrap(self.net).state_dict(), path)

    def load_ckpt(self, path: Union[str, os.PathLike]) -> None:
        """Load weights written by :meth:`save_ckpt` or ``fit(ckpt_path=...)`` into the net.

        Nothing in the file is executed: safetensors, or ``torch.load(weights_only=True)``.
        """
        state = load_weights(path)
        target = unwrap(self.net)
        try:
            target.load_state_dict(state)
        except RuntimeError as error:
            raise ValueError(f"The weights in {os.fspath(path)!r} do not fit this net ({type(target).__name__}): "
                             f"{error}") from None

    # -- helpers for callbacks -----------------------------------------------------------

    @property
    def is_main_process(self) -> bool:
        return self.runtime is None or self.runtime.is_main_process

    def print(self, *args: Any) -> None:
        """Print once (on the main process), without breaking a progress bar."""
        if self.is_main_process:
            from tqdm.auto import tqdm

            tqdm.write(" ".join(str(a) for a in args))


def history_frame(rows: list[dict]) -> pd.DataFrame:
    """One row per epoch; a fresh frame, so later epochs never change one already returned."""
    frame = pd.DataFrame(rows)
    if "epoch" in frame:
        frame["epoch"] = frame["epoch"].astype(int)
    return frame


def _length(data: Any) -> Optional[int]:
    try:
        return len(data)
    except TypeError:
        return None


__all__ = ["KerasModel", "history_frame"]
