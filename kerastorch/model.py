"""``KerasModel``: a net, a loss, metrics and an optimizer, trained with one ``fit`` call.

This module holds the user's objects and how a batch goes through them (:class:`ModelParts`:
``forward_batch``), the one training step (:meth:`KerasModel.train_step`), and hands ``fit``'s
keywords to the door (:mod:`kerastorch.arguments`). The rest is elsewhere: :mod:`kerastorch.run`
runs a fit, :mod:`kerastorch.training.loop` its epochs and optimizer steps,
:mod:`kerastorch.evaluation` evaluate and predict, :mod:`kerastorch.callbacks` every optional
behaviour and :mod:`kerastorch.files.weights` reads and writes weights.
"""

from __future__ import annotations

import contextlib
import inspect
import os
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import pandas as pd
import torch
from torch import nn
from tqdm.std import tqdm as text_tqdm

from . import arguments, evaluation, run
from .compat.module import ModuleLike
from .data.batches import (
    check_inputs_as,
    check_labels_at,
    describe_reading,
    split_batch,
    split_inputs,
    split_sample_weight,
)
from .data.sample_weights import weighted_loss
from .devices.runtime import Runtime
from .files.weights import load_weights, save_weights
from .strategies import Strategy, unwrap
from .tools import doctor as doctor_module
from .tools import interpret as interpret_module
from .tools import tuning
from .tools.doctor import Diagnosis
from .tools.interpret import Interpretation
from .tools.tuning import LRFinderResult
from .training import loop
from .training.labels import AS_GIVEN, LabelFix, label_fix
from .training.metric_meters import check_metrics
from .training.model_checks import check_model_parts
from .training.outputs import NoLossError, describe_output, has_fields, own_loss, predictions_of


class ModelParts:
    """A net, its loss, metrics, optimizer and scheduler, and how a batch goes through them.

    Subclass and override :meth:`forward_batch` (and :meth:`predict_batch`) for a batch
    layout or a loss that the defaults and ``labels_at`` do not cover.
    """

    net: torch.nn.Module
    loss_fn: Optional[Any]
    metrics_dict: dict
    optimizer: torch.optim.Optimizer
    lr_scheduler: Optional[Any]
    lr_scheduler_interval: str
    labels_at: Optional[Union[int, str]]
    inputs_as: str  # "keywords": net(**inputs) for a dict batch; "dict": net(inputs)
    label_fix: Optional[LabelFix]  # decided on the first batch of a run; None until then

    def set_parts(
        self,
        net: torch.nn.Module,
        loss_fn: Optional[Any],
        metrics_dict: Optional[dict],
        optimizer: Optional[torch.optim.Optimizer],
        lr_scheduler: Optional[Any],
        lr_scheduler_interval: str,
        labels_at: Optional[Union[int, str]] = None,
        inputs_as: str = "keywords",
    ) -> None:
        """Check and keep the parts; Adam with lr=1e-3 when no optimizer is given."""
        check_model_parts(net, loss_fn, lr_scheduler, lr_scheduler_interval)
        self.net = net
        self.loss_fn = loss_fn
        self.metrics_dict = check_metrics(metrics_dict)
        self.optimizer = optimizer if optimizer is not None else torch.optim.Adam(net.parameters(), lr=1e-3)
        self.lr_scheduler = lr_scheduler
        self.lr_scheduler_interval = lr_scheduler_interval
        self.labels_at = check_labels_at(labels_at)
        self.inputs_as = check_inputs_as(inputs_as)
        self.start_reading()

    def start_reading(self, say: Optional[Callable[[str], Any]] = None) -> None:
        """Read the next batch afresh: a run (fit, evaluate) decides on its first batch how it reads
        the labels and the net's output, keeps that for its other batches, and ``say``s it once."""
        self.label_fix = None
        self._say_reading = say

    def forward_batch(self, batch: Any) -> tuple[torch.Tensor, Any, Any]:
        """Turn one batch into ``(loss, preds, labels)``; ``loss`` is the batch mean.

        The default reads ``(x, y)``, ``(x1, ..., xn, y)`` or a dict with a ``labels`` key (or the
        labels where ``labels_at`` says), calls the net and ``loss_fn``. A dict batch's inputs go to the
        net as keyword arguments, or as one dict with ``inputs_as="dict"``. Without a ``loss_fn``, the
        net computes its own loss: a dict batch goes to it whole, labels included, and its output's
        ``loss`` is used (a Hugging Face model's ``ModelOutput``, or any object or dict with
        ``loss``); the predictions are the output's ``logits``. Labels of shape ``(N,)`` for outputs
        ``(N, 1)`` and integer labels for a loss that needs floats are fixed as Keras does
        (:mod:`~kerastorch.training.labels`). Override it for anything else; training,
        evaluation, the meters and the callbacks all go through it. A batch with sample weights (a
        ``sample_weight`` key in a dict, or what ``fit(sample_weight=..., class_weight=...)`` makes)
        gets the weighted loss of :mod:`kerastorch.data.sample_weights`.
        """
        kwargs: Mapping[str, Any]
        if type(batch) in (list, tuple) and len(batch) == 2 and self.labels_at is None:
            # (x, y), the usual batch: read as the two calls below would read it, without their
            # cost (about 1.7 us a step on a 2-core CPU).
            plain, sample_weight, args, kwargs, labels = batch, None, (batch[0],), {}, batch[1]
        else:
            plain, sample_weight = split_sample_weight(batch)
            args, kwargs, labels = split_batch(plain, self.labels_at)
        if self.loss_fn is None and isinstance(plain, Mapping):
            kwargs = plain  # the net computes its own loss: it gets the labels too (Hugging Face's way)
        if kwargs and self.inputs_as == "dict":
            args, kwargs = (kwargs,), {}  # a net whose forward takes one dict
        output = self.net(*args, **kwargs)
        preds = output if isinstance(output, torch.Tensor) else predictions_of(output)  # the common case first
        if isinstance(labels, torch.Tensor) and isinstance(preds, torch.Tensor) and labels.device != preds.device:
            labels = labels.to(preds.device, non_blocking=True)  # a net spread over devices ends on another one
        fix = self.label_fix if self.label_fix is not None else self._decide_reading(plain, output, preds, labels)
        if self.loss_fn is None:
            loss = own_loss(output)
            if sample_weight is not None:
                raise ValueError(
                    "Sample weights need each sample's loss, but the net computes its own (one number for the batch, "
                    "as loss_fn is None). Pass a loss_fn (e.g. nn.CrossEntropyLoss()) to weight the samples."
                )
            return loss, preds, labels  # type: ignore[return-value]
        loss_labels = labels
        if fix is not AS_GIVEN:  # decided on the first batch: a view or a cast, no wait for the device
            loss_labels, labels = fix.for_loss(labels), fix.for_metrics(labels)
        if sample_weight is not None:
            return weighted_loss(self.loss_fn, preds, loss_labels, sample_weight), preds, labels
        return self.loss_fn(preds, loss_labels), preds, labels

    @property
    def uses_default_forward_batch(self) -> bool:
        """True unless a subclass overrides :meth:`forward_batch` (the loss and the batch layout are then its own)."""
        return type(self).forward_batch is ModelParts.forward_batch

    def predict_batch(self, batch: Any) -> Any:
        """The net's output for one batch (its ``logits`` for an output with fields); labels in the batch,
        if any, are ignored (read as ``forward_batch`` reads them)."""
        args, kwargs = split_inputs(batch, self.labels_at)
        if kwargs and self.inputs_as == "dict":
            args, kwargs = (kwargs,), {}
        return predictions_of(self.net(*args, **kwargs))

    def _reading_of(self, batch: Any) -> str:
        """How this model calls the net on ``batch``, and where it finds the labels, in the batch's words."""
        labels_to_net = self.loss_fn is None and isinstance(batch, Mapping)
        return describe_reading(batch, self.labels_at, labels_to_net, one_dict=self.inputs_as == "dict")

    def _decide_reading(self, batch: Any, output: Any, preds: Any, labels: Any) -> LabelFix:
        """On a run's first batch: the net's own loss or the labels fixed for ``loss_fn``, said once."""
        if self.loss_fn is None:
            if own_loss(output) is None:
                kind = type(self).__name__
                raise NoLossError(
                    f"{kind} has no loss_fn. Pass one, e.g. {kind}(net, loss_fn=nn.CrossEntropyLoss()), or let the "
                    "net compute its own (as Hugging Face models do: a dict batch with 'labels' goes to the net "
                    "whole, and its output's .loss is used). kerastorch called "
                    f"{self._reading_of(batch)}, and the net "
                    f"returned {describe_output(output)}, which has no loss. Or override forward_batch to compute "
                    "the loss yourself."
                )
            fix = AS_GIVEN
            note = (
                f"No loss_fn: the net computes its own loss. kerastorch calls "
                f"{self._reading_of(batch)} and uses the "
                f"output's loss; the metrics and predict get its {'logits' if has_fields(output) else 'output'}."
            )
        else:
            fix = label_fix(self.loss_fn, preds, labels)
            note = fix.note
            if has_fields(output):
                note = (
                    f"The net returns {describe_output(output)}: the loss, the metrics and predict get its logits. "
                    + note
                )
        self.label_fix = fix
        say = getattr(self, "_say_reading", None)
        if note and say is not None:
            say(note)
        return fix


class KerasModel(ModuleLike, ModelParts):
    """Train a PyTorch ``net`` the Keras way.

    Args:
        net: the ``torch.nn.Module`` to train.
        loss_fn: called as ``loss_fn(preds, labels)``, returning the batch mean (e.g.
            ``nn.CrossEntropyLoss()``). None: the net computes its own loss (a Hugging Face model,
            given the labels of a dict batch, returns it as ``output.loss``), or an overridden
            :meth:`train_step` or :meth:`forward_batch` does.
        metrics_dict: ``{name: metric}``; a metric is a torchmetrics ``Metric``, a module with
            ``forward``/``compute``/``reset`` (torchkeras's pattern) or a function
            ``f(preds, labels) -> tensor``. Logged as ``train_<name>`` and ``val_<name>``.
        optimizer: a ``torch.optim.Optimizer`` over the net's parameters (default: Adam, lr=1e-3).
        lr_scheduler: a ``torch.optim.lr_scheduler`` object over that optimizer, a timm scheduler
            (``step(epoch)`` and ``step_update(num_updates)``), or None. It is called once before
            training (and put back), so one that does not take fit's calls fails before the first batch.
        lr_scheduler_interval: ``"epoch"`` (default) or ``"step"``: when the scheduler steps.
            ``ReduceLROnPlateau`` steps per epoch with the monitored value; a timm scheduler gets
            ``step(epoch, metric)`` after every epoch and ``step_update(num_updates)`` after every
            optimizer step, as timm's own training script calls it (its ``t_in_epochs`` decides).
        labels_at: where a batch holds its labels, when not where kerastorch looks (the last item of
            a tuple; a ``labels``, ``label`` or ``y`` key of a dict): their position in a tuple batch
            (``labels_at=0`` reads ``(labels, text, offsets)`` as ``net(text, offsets)``), or their key
            in a dict batch. ``fit``, ``evaluate`` and ``predict`` read batches the same way.
        inputs_as: how a dict batch's inputs (every key but the labels) reach the net: ``"keywords"``
            (default) calls ``net(**inputs)``; ``"dict"`` calls ``net(inputs)``, one dict, for a net whose
            ``forward`` takes one (``forward(self, x: dict)``, pytorch_tabular's style).

    Example::

        model = kt.KerasModel(net, loss_fn=nn.CrossEntropyLoss(),
                              metrics_dict={"acc": torchmetrics.Accuracy(task="multiclass", num_classes=10)},
                              optimizer=torch.optim.Adam(net.parameters(), lr=1e-3))
        dfhistory = model.fit(dl_train, dl_val, epochs=20, patience=5, monitor="val_acc", mode="max")
        model.evaluate(dl_val)     # {"val_loss": ..., "val_acc": ...}
        model.predict(dl_test)     # a CPU tensor of outputs, rows in data order

    Batches whose labels are not last say where they are with ``labels_at``; a net that computes
    its own loss (a Hugging Face model) needs no ``loss_fn``. For a batch layout or a loss that
    these do not cover, subclass and override :meth:`forward_batch` (and :meth:`predict_batch`
    for ``predict``); for a custom update (two optimizers, a GAN), override :meth:`train_step`.

    torchkeras programs change the step their own way, ``KerasModel.StepRunner = MyStepRunner``
    (and rarely ``EpochRunner``): ``fit`` and ``evaluate`` run that class on each batch inside
    kerastorch's loop (:mod:`kerastorch.compat.runners`).
    """

    def __init__(
        self,
        net: nn.Module,
        loss_fn: Optional[Any] = None,
        metrics_dict: Optional[dict] = None,
        optimizer: Optional[torch.optim.Optimizer] = None,
        lr_scheduler: Optional[Any] = None,
        lr_scheduler_interval: str = "epoch",
        labels_at: Optional[Union[int, str]] = None,
        inputs_as: str = "keywords",
    ):
        self.set_parts(net, loss_fn, metrics_dict, optimizer, lr_scheduler, lr_scheduler_interval, labels_at, inputs_as)
        self.history = pd.DataFrame()
        self.stop_training = False
        self.runtime: Optional[Runtime] = None
        self.fit_step: Optional[loop.FitStep] = None  # set while fit trains
        self.run_id: Optional[str] = None  # the Weights & Biases run's id, once a WandbLogger started one
        self.fit_report: Optional[Diagnosis] = None  # the last fit's report: model.diagnose()
        # The last fit's choices, read back by programs (model.ckpt_path, model.mode).
        self.ckpt_path: Optional[Union[str, os.PathLike]] = None
        self.monitor: Optional[str] = None
        self.mode: Optional[str] = None

    # -- training --------------------------------------------------------------------

    def fit(
        self,
        train_data: Any = None,
        val_data: Any = None,
        epochs: int = 10,
        patience: Union[int, str, None] = "auto",
        monitor: Optional[str] = "auto",
        mode: str = "auto",
        min_delta: float = 0.0,
        ckpt_path: Optional[Union[str, os.PathLike]] = None,
        resume: bool = False,
        callbacks: Optional[Sequence] = None,
        verbose: int = 1,
        plot: bool = False,
        quiet: Optional[bool] = None,
        wandb: Union[bool, dict] = False,
        accelerator: str = "auto",
        devices: Any = "auto",
        precision: Any = "32-true",
        strategy: Union[str, Strategy] = "auto",
        mixed_precision: Optional[str] = None,
        cpu: bool = False,
        gradient_accumulation_steps: int = 1,
        gradient_clip_val: Optional[float] = None,
        gradient_clip_algorithm: str = "norm",
        *,
        restore_best_weights: bool = True,
        x: Any = None,
        y: Any = None,
        validation_data: Any = None,
        batch_size: Optional[int] = None,
        shuffle: bool = True,
        validation_split: float = 0.0,
        class_weight: Union[dict, str, None] = None,
        sample_weight: Any = None,
        steps_per_epoch: Optional[int] = None,
        validation_freq: Union[int, Sequence[int]] = 1,
        initial_epoch: int = 0,
        validation_steps: Optional[int] = None,
        validation_batch_size: Optional[int] = None,
        weighted_metrics: Optional[dict] = None,
        doctor: bool = False,
        compile: Union[bool, str, dict] = False,
        fsdp_wrap: Optional[Sequence[type]] = None,
        on_oom: str = "split",
    ) -> pd.DataFrame:
        """Train for ``epochs`` epochs and return the history, one row per epoch.

        Columns: ``epoch`` (1-based), ``train_loss``, ``train_<metric>``, ``lr``, ``val_loss``,
        ``val_<metric>`` (a ``train_step`` that returns a dict gives ``train_<name>`` per value);
        values are exact over each epoch's samples. The best epoch's weights are in ``net`` when
        fit returns — also after early stopping, a NaN loss or Ctrl-C (which returns the history
        so far) — unless ``restore_best_weights=False`` or ``monitor=None``.

        Args:
            train_data: a DataLoader (or any re-iterable of batches) of ``(x, y)``,
                ``(x1, ..., xn, y)`` or dicts with a ``labels`` key; or, the Keras way, a torch
                Dataset, an array ``X`` (a tensor, NumPy array or pandas DataFrame) with ``y``, a
                tuple ``(X1, X2)`` or dict ``{"a": X1, "b": X2}`` of inputs with ``y``, a tuple
                ``(X, y)`` / ``(X, y, sample_weight)`` / ``((X1, X2), y)`` (read as Keras reads
                ``validation_data``), or a dict of arrays with a ``labels`` key.
            val_data: data like ``train_data``, evaluated after every epoch; or None. After arrays
                ``X``, ``(X1, X2)`` or a dict of them, a bare array in this place is ``y`` (Keras's
                ``fit(X, y)``).
            epochs: how many epochs to train (a resumed run counts the ones already done).
            patience: stop after this many epochs without improvement of ``monitor``;
                None never stops early; ``"auto"``: 5, or None when ``monitor=None``. Unused when
                ``callbacks`` holds an ``EarlyStopping``.
            monitor: the history column that picks the best epoch: ``"auto"`` is ``val_loss``, or
                ``train_loss`` without validation data (nothing, for a ``train_step`` whose values
                hold no loss); ``None`` monitors nothing: no best epoch, no early stopping, the last
                epoch's weights stay. A value a ``train_step`` returns (``"train_g_loss"``) works too.
                Checked before the first batch.
            mode: ``"min"`` (lower is better, a loss), ``"max"`` (an accuracy), or ``"auto"``: the
                metric's ``higher_is_better`` if it has one (torchmetrics), else ``"max"`` for names
                with acc, auc, f1, precision, recall, iou, dice, r2 or score, ``"min"`` otherwise.
                fit's first printed line says which was chosen.
            min_delta: the smallest change that counts as an improvement.
            ckpt_path: also write the best weights to this file, atomically: safetensors, or torch's
                format (``torch.load(path, weights_only=True)`` reads it) for ``.pt`` / ``.pth`` /
                ``.ckpt`` / ``.bin`` or no extension. It is written on a thread while the next
                epoch trains (before callbacks of yours that may read it, see ``Callback``), and is
                whole when ``fit`` returns.
            resume: with ``ckpt_path``, write the whole training state to ``ckpt_path + ".state"``
                after every epoch and continue from it when it exists (see
                :class:`~kerastorch.callbacks.TrainingState`).
            callbacks: a list of :class:`~kerastorch.Callback` (or torchkeras-style callbacks).
            verbose: 0 silent, 1 progress bars, 2 one line per epoch.
            plot: redraw the history plot after every epoch (:class:`~kerastorch.LivePlot`).
            quiet: torchkeras's word: ``quiet=True`` is ``verbose=0``.
            wandb: log to Weights & Biases (True, or a dict of ``WandbLogger`` arguments).
            accelerator: ``"auto"``, ``"cpu"``, ``"gpu"``, ``"cuda"`` or ``"mps"`` (Lightning's words).
            devices: ``k``, ``-1``, ``[0, 2]``, ``"0, 2"``, ``"auto"``...: see :func:`~kerastorch.parse_devices`.
                k > 1 from a notebook or plain python starts k processes and loads the result
                back into this model; under ``torchrun`` / ``accelerate launch`` fit runs as one rank.
            precision: ``"32-true"``, ``"16-mixed"``, ``"bf16-mixed"``, ``"16-true"``, ``"bf16-true"``,
                ``"64-true"`` or the aliases ``32``, ``64``, ``16``, ``"bf16"``.
            strategy: how several processes train: ``"auto"`` or ``"ddp"`` (DistributedDataParallel:
                each process holds the whole net), or ``"fsdp"`` (torch's ``fully_shard``: each of k
                processes holds 1/k of the parameters, gradients and optimizer state; see
                :mod:`kerastorch.strategies.fsdp`).
            mixed_precision: torchkeras's word: ``"no"``, ``"fp16"`` or ``"bf16"``.
            cpu: torchkeras's word: ``cpu=True`` is ``accelerator="cpu"``.
            gradient_accumulation_steps: update once every this many batches (4 batches of b
                update like one batch of 4b).
            gradient_clip_val: clip gradients to this norm (or value); None does not clip.
            gradient_clip_algorithm: ``"norm"`` or ``"value"``.
            restore_best_weights: True puts the best epoch's weights back in ``net`` when fit returns;
                False keeps the last epoch's (the best epoch is still marked, and written to
                ``ckpt_path``). Weights of an epoch whose loss is NaN are never kept.
            x: Keras's name for ``train_data``.
            y: the labels beside an array ``X`` (one per sample).
            validation_data: Keras's name for ``val_data``.
            batch_size: samples per batch of the loaders kerastorch builds (default 32); not
                for a DataLoader, which has its own.
            shuffle: shuffle the training samples every epoch (loaders kerastorch builds).
            validation_split: validate on the **last** fraction of the samples, taken before
                shuffling, exactly as Keras does: the first ``floor(n * (1 - validation_split))``
                samples train (arrays and Datasets with a length).
            class_weight: ``{class: weight}`` or ``"balanced"``: each sample's loss is weighted
                by its class's weight (any data form, DataLoaders too).
            sample_weight: one weight per sample, beside an array ``X`` (in your own dict
                batches: a ``sample_weight`` key). The weighted loss of a batch of n is
                ``(1/n) * sum(w_i * loss_i)`` (see :mod:`kerastorch.data.sample_weights`); metrics are unweighted.
            steps_per_epoch: an epoch is this many batches; the next epoch continues the same
                iterator (for endless streams, or shorter epochs). Without ``batch_size``, the
                batches kerastorch makes are sized so that this many cover the data (Keras's rule).
            validation_freq: validate every n epochs, or (Keras's list) the epochs listed, e.g.
                ``[1, 5, 10]``; the other rows' ``val_*`` cells are NaN,
                and early stopping, the best weights and ReduceLROnPlateau look at validated
                epochs only.
            initial_epoch: Keras's: the epochs already done. fit trains epochs
                ``initial_epoch + 1 .. epochs`` (the history counts from 1: ``initial_epoch=2``
                starts at the row ``epoch == 3``, Keras's third epoch). Only the numbering and the
                count change; for a run that continues with its weights, optimizer and history, use
                ``resume=True`` (the two cannot be combined).
            validation_steps: validate on the first n batches of the validation data, each time
                from its start (Keras's); without a batch size, the batches kerastorch makes are
                sized so that n cover it.
            validation_batch_size: samples per validation batch (default: ``batch_size``'s); not
                for a validation DataLoader.
            weighted_metrics: ``{name: f(preds, labels)}`` averaged with the sample weights
                (``sum w_i * m_i / sum w_i``; ``f`` returns one value per sample, or per batch),
                logged as ``train_<name>`` / ``val_<name>``; ``metrics_dict``'s metrics stay unweighted.
            compile: ``True`` runs the net through ``torch.compile`` for this fit (a dict is passed to
                it, ``"strict"`` raises instead of warning when compiling fails); checkpoints keep the
                module's own keys and ``net`` is your module object again afterwards.
            fsdp_wrap: with ``strategy="fsdp"``, the module classes sharded as blocks (e.g.
                ``[nn.TransformerEncoderLayer]``); by default each direct child of the net that holds
                parameters.
            doctor: run :meth:`doctor` first; print its report, and on an error stop before
                training (:class:`~kerastorch.tools.doctor.DoctorError`).
            on_oom: what a training step that runs out of memory does. ``"split"`` (the default) trains
                that batch again as micro-batches (half its samples, then a quarter, ...) whose gradients
                add up to the same update, says so once and keeps that size for the other batches;
                validation does the same without gradients. ``"split_batchnorm"`` splits a net with
                BatchNorm layers too (they then normalise over micro-batches), which ``"split"`` refuses.
                ``"raise"``: torch's error, as it comes. See :mod:`kerastorch.training.out_of_memory`.

        Returns:
            The history, a pandas DataFrame (also kept as ``model.history``).
        """
        data, settings = arguments.fit_arguments(self, _called(locals()))
        return self._fit(data, settings)

    def _fit(self, data: Any, settings: Any, lr_schedule: Any = None) -> pd.DataFrame:
        watch = settings.monitoring
        self.ckpt_path, self.monitor, self.mode = watch.ckpt_path, watch.monitor, watch.mode
        self.fit_report = None  # a fit that fails leaves no report of an earlier one behind
        self.history = run.fit(self, data, settings, lr_schedule)
        return self.history

    # -- tuning ------------------------------------------------------------------------

    def lr_find(
        self,
        train_data: Any = None,
        y: Any = None,
        *,
        start_lr: float = 1e-7,
        end_lr: float = 10.0,
        num_steps: int = 100,
        smoothing: float = 0.98,
        diverge: float = 4.0,
        x: Any = None,
        batch_size: Optional[int] = None,
        shuffle: bool = True,
        validation_split: float = 0.0,
        sample_weight: Any = None,
        accelerator: str = "auto",
        devices: Any = "auto",
        precision: Any = "32-true",
        mixed_precision: Optional[str] = None,
        cpu: bool = False,
    ) -> LRFinderResult:
        """Find a learning rate, changing nothing (:mod:`kerastorch.tools.tuning`).

        Trains at most ``num_steps`` batches with the learning rate rising exponentially from
        ``start_lr`` to ``end_lr``, stops when the smoothed loss passes ``diverge`` times its
        best, and puts everything back: weights, buffers, optimizer state and learning rates,
        scheduler and every RNG, so ``fit`` afterwards trains as if ``lr_find`` had not run.

        Args:
            train_data: fit's training data forms (a loader, a Dataset, ``(X, y)``, an array ``X``).
            y: the labels beside an array ``X``.
            start_lr: the first learning rate tried.
            end_lr: the last learning rate tried.
            num_steps: at most this many batches (the data is cycled if it has fewer).
            smoothing: the loss's exponential smoothing factor (0 for none).
            diverge: stop once the smoothed loss exceeds this factor times its best.
            x: Keras's name for ``train_data``.
            batch_size: as in ``fit``. shuffle: as in ``fit``.
            validation_split: as in ``fit``: the validation rows are not used to find the rate.
            sample_weight: as in ``fit``.
            accelerator: as in ``fit``. devices: as in ``fit``; with several devices the finder
                runs on the first of them in this process (one is enough to find a rate).
            precision: as in ``fit``. mixed_precision: as in ``fit``. cpu: as in ``fit``.

        Returns:
            An :class:`~kerastorch.tools.tuning.LRFinderResult`: ``.suggestion``, ``.history``
            (``lr``, ``loss``), ``.plot()``; in Jupyter it shows as its plot.

        Example::

            result = model.lr_find(dl_train)
            model.optimizer.param_groups[0]["lr"] = result.suggestion
        """
        data, devices_settings, data_settings, finder = arguments.finder_arguments(_called(locals()))
        self.start_reading()  # this data's first batch decides how its labels are read
        return tuning.lr_find(self, data, devices_settings, data_settings, finder)

    def fit_one_cycle(
        self,
        train_data: Any = None,
        val_data: Any = None,
        epochs: int = 10,
        max_lr: Optional[float] = None,
        **fit_arguments: Any,
    ) -> pd.DataFrame:
        """``fit`` with a one-cycle learning rate (torch's ``OneCycleLR``, stepped every batch).

        The rate rises from ``max_lr / 25`` to ``max_lr`` over the first 30 % of the steps and
        falls to ``max_lr / 25e4`` by the last one; the history's ``lr`` column shows the cycle.
        ``max_lr=None`` runs :meth:`lr_find` first and uses its suggestion (printed). Every
        other argument is ``fit``'s. A model built with its own ``lr_scheduler`` is refused:
        the cycle is the schedule. When it returns (also after an early stop, Ctrl-C or an
        error) the optimizer's learning rates, momentum and betas are as they were, so a
        ``fit`` after it trains at the optimizer's own rate, not at the cycle's last one.

        Example::

            history = model.fit_one_cycle(dl_train, dl_val, epochs=10)   # max_lr from lr_find
        """
        if self.lr_scheduler is not None:
            raise ValueError(
                f"fit_one_cycle sets a one-cycle schedule, but this KerasModel already has lr_scheduler="
                f"{type(self.lr_scheduler).__name__}; two schedules would fight over the learning rate. Build the "
                "KerasModel without lr_scheduler=, or call fit instead."
            )
        max_lr = arguments.max_lr_argument(max_lr)
        # fit's arguments as a call to fit binds them: fit's signature is the only one written.
        called = inspect.signature(KerasModel.fit).bind(self, train_data, val_data, epochs, **fit_arguments)
        called.apply_defaults()
        data, settings = arguments.fit_arguments(self, _called(called.arguments))
        if max_lr is None:
            max_lr = tuning.lr_find(self, *tuning.finder_for_fit(data, settings)).suggestion
            if settings.output.verbose:
                self.print(f"fit_one_cycle: max_lr={max_lr:.3g}, the learning-rate finder's suggestion.")
        return self._fit(data, settings, lr_schedule=tuning.OneCycle(max_lr))

    # -- the training step: override train_step for a custom update ---------------------

    def train_step(self, batch: Any) -> Any:
        """One training step on a batch already on the device.

        The default: :meth:`forward_batch` under :meth:`autocast`, :meth:`backward`, then
        :meth:`optimizer_step`; it returns ``(loss, preds, labels)``, which feed ``train_loss`` and
        the train metrics. Override it for an update of your own (two optimizers, a GAN, a batch
        without labels), using the same three calls, which keep gradient accumulation, mixed
        precision, clipping, the scheduler and the callbacks' step hooks working. An overridden
        step needs no ``loss_fn`` and may return, instead of ``(loss, preds, labels)``, a dict of
        named batch means, e.g. ``{"d_loss": d_loss, "g_loss": g_loss}``: they become the history
        columns ``train_d_loss`` and ``train_g_loss`` (exact epoch means, summed on the device), which
        ``monitor`` may name (a ``"loss"`` key is ``train_loss``).

        Gradients: each batch that begins an accumulation group starts with none (fit zeroes the
        gradients of every parameter of ``net``), and ``optimizer_step(opt)`` zeroes ``opt``'s own
        after its update. Within one step they add up as in PyTorch: a backward reaches every
        parameter its loss depends on, so step the discriminator on ``fake.detach()`` before the
        generator's backward, or zero an optimizer yourself (``opt.zero_grad()``) first.

        Before training, fit runs your step once on the first batch inside a snapshot of the
        whole training state (weights, every optimizer of the model, the scheduler, the random
        generators), so a mistake fails before any weight changes, and the names it returns are
        known before the first epoch.

        Example::

            class TwoOptimizers(kt.KerasModel):
                def train_step(self, batch):
                    with self.autocast():
                        loss, preds, labels = self.forward_batch(batch)
                    self.backward(loss)
                    self.optimizer_step(self.optimizer)
                    self.optimizer_step(self.head_optimizer)
                    return loss, preds, labels
        """
        with self.autocast():
            loss, preds, labels = self.forward_batch(batch)
        self.backward(loss)
        self.optimizer_step()
        return loss, preds, labels

    @property
    def uses_default_train_step(self) -> bool:
        """True unless a subclass overrides :meth:`train_step` (fit then checks the first batch inside it)."""
        return type(self).train_step is KerasModel.train_step

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of a batch's loss, inside :meth:`train_step` (scaled and accumulated as fit was asked)."""
        self._running_step("backward").backward(loss)

    def optimizer_step(self, optimizer: Optional[torch.optim.Optimizer] = None) -> None:
        """Step ``optimizer`` (default: the model's) inside :meth:`train_step`, when an accumulation group
        ends, then zero its gradients."""
        self._running_step("optimizer_step").optimizer_step(optimizer)

    def autocast(self) -> contextlib.AbstractContextManager:
        """The run's mixed-precision context for the forward pass and the loss (a no-op in full precision)."""
        return self._running_step("autocast").runtime.autocast()

    def _running_step(self, name: str) -> loop.FitStep:
        if self.fit_step is None:
            raise RuntimeError(f"model.{name}() works inside train_step while fit trains; it was called outside fit.")
        return self.fit_step

    # -- using a trained model ---------------------------------------------------------

    def evaluate(
        self,
        data: Any = None,
        y: Any = None,
        batch_size: Optional[int] = None,
        verbose: int = 1,
        sample_weight: Any = None,
        steps: Optional[int] = None,
        callbacks: Optional[Sequence] = None,
        return_dict: bool = True,
        *,
        x: Any = None,
        val_data: Any = None,
        quiet: Optional[bool] = None,
    ) -> Any:
        """Loss and metrics over ``data``, in eval mode, without gradients (Keras's keywords, in Keras's order).

        Args:
            data: batches like fit's ``val_data``: a loader, a Dataset, ``(X, y)``, ``(X, y, sample_weight)``,
                or an array ``X`` (or a tuple / dict of inputs) with ``y``.
            y: the labels beside an array ``X``.
            batch_size: samples per batch when kerastorch builds the loader (default 32).
            verbose: 0 prints nothing; 1 or 2 print the values.
            sample_weight: one weight per sample beside an array ``X``: the loss is
                ``(1/N) * sum(w_i * loss_i)``, as in ``fit`` (metrics are unweighted).
            steps: evaluate the first n batches only; without ``batch_size``, the batches kerastorch
                makes are sized so that n cover the data (Keras's rule).
            callbacks: callbacks whose test hooks run: ``on_test_begin``, ``on_test_batch_begin/end``,
                ``on_test_end(logs)``.
            return_dict: True (the default) returns a dict; False returns Keras's list of the
                values in the same order (the loss first), or a single number when there is only
                the loss. Keras's default is False: kerastorch keeps the dict that its users read
                by name.
            x: Keras's name for ``data``. val_data: torchkeras's name for ``data``.
            quiet: torchkeras's word: ``quiet=True`` is ``verbose=0``.

        Returns:
            ``{"val_loss": ..., "val_<metric>": ...}``, exact over the samples (the history's names);
            with ``return_dict=False``, ``[val_loss, val_<metric>, ...]`` or a single float.
        """
        given, settings = arguments.evaluate_arguments(_called(locals()))
        return evaluation.evaluate(self, given, settings)

    def predict(
        self,
        data: Any = None,
        batch_size: Optional[int] = None,
        verbose: int = 1,
        steps: Optional[int] = None,
        callbacks: Optional[Sequence] = None,
        *,
        x: Any = None,
        concatenate: bool = True,
    ) -> Any:
        """The net's outputs for ``data``, in eval mode, without gradients (Keras's keywords, in Keras's order).

        Args:
            data: an array ``X``; a tuple or list of arrays ``[X1, X2]`` (every array is an input: predict
                takes no labels); a dict of arrays (the net's keyword arguments); a Dataset or a loader
                (labels in its batches are ignored); or a generator of batches, gone through once.
            batch_size: samples per batch when kerastorch builds the loader (default 32).
            verbose: 1 shows a progress bar when predicting takes more than a few seconds; 0 and 2 never.
            steps: predict the first n batches only (for an endless generator); without
                ``batch_size``, the batches kerastorch makes are sized so that n cover the data.
            callbacks: callbacks whose predict hooks run: ``on_predict_begin``,
                ``on_predict_batch_begin(batch)``, ``on_predict_batch_end(batch, {"outputs": ...})``,
                ``on_predict_end``.
            x: Keras's name for ``data``.
            concatenate: True (the default) joins the batches' outputs into one; False returns a list
                with each batch's outputs, for outputs whose shapes differ from batch to batch past the
                first dimension (a tagger's or a language model's on sequences padded per batch), which
                the default refuses at the first batch that differs, naming the shapes.

        Returns:
            The outputs on the CPU, rows in input order (a tensor, or the net's structure of tensors);
            from a DataLoader with ``batch_size=None`` over rows of arrays (a tensor, a ``TensorDataset``:
            each item one sample) the samples' outputs stacked, one row each. With ``concatenate=False``,
            a list with each batch's outputs on the CPU, as the net returned them (half precision as
            float32).

        Example::

            tags = model.predict(dl_test, concatenate=False)  # [(16, 11, 5), (16, 9, 5), ...]
        """
        given, settings = arguments.predict_arguments(_called(locals()))
        return evaluation.predict(self, given, settings)

    # -- diagnosis and interpretation ----------------------------------------------------

    def diagnose(self) -> Diagnosis:
        """The last fit's report: what the curves say (:mod:`kerastorch.tools.diagnosis`).

        ``fit`` prints it when it ends, when there is something to say (``verbose >= 1``). Its
        ``findings`` are :class:`~kerastorch.Finding` objects (``kind``, ``epochs``, ``message``,
        ``evidence``); its ``timing`` has one row per epoch: ``epoch``, ``seconds`` (the epoch's
        training pass) and ``data_wait_fraction`` (the share of them spent waiting for the next batch).
        Printing it gives the lines fit printed (nothing for a healthy run). After Ctrl-C, fit keeps
        the report without printing it; a fit that raises (a preemption too) leaves none.

        Example::

            model.fit(dl_train, dl_val, epochs=20)
            report = model.diagnose()
            report.kinds          # e.g. ['overfitting']
            report.timing         # seconds and data_wait_fraction, per epoch
        """
        if self.fit_report is None:
            raise RuntimeError(
                "model.diagnose() reads the report of the last fit, and this model has none: it has not been "
                "fit yet, or its last fit stopped with an error. Call model.fit(...) first; for a history you "
                "have, kt.diagnose(history) reads its curves."
            )
        return self.fit_report

    def doctor(
        self,
        train_data: Any = None,
        val_data: Any = None,
        *,
        y: Any = None,
        batch_size: Optional[int] = None,
        num_batches: int = 4,
        overfit_steps: int = 60,
    ) -> Diagnosis:
        """Look for beginners' mistakes in a few seconds, changing nothing (:mod:`kerastorch.tools.doctor`).

        Args:
            train_data: fit's training data forms. val_data: fit's validation data forms (or None).
            y: the labels beside an array ``X``. batch_size: as in ``fit``.
            num_batches: how many batches of each set the checks look at.
            overfit_steps: how many steps the one-batch overfitting check trains.

        Returns:
            A :class:`~kerastorch.tools.doctor.Diagnosis`: ``.findings``, ``.errors``; printing it is a
            short report (in Jupyter a table).
        """
        data, data_settings = arguments.doctor_arguments(_called(locals()))
        self.start_reading()  # this data's first batch decides how its labels are read
        return doctor_module.doctor(self, data, data_settings, num_batches=num_batches, overfit_steps=overfit_steps)

    def interpret(self, data: Any, y: Any = None, batch_size: Optional[int] = None) -> Interpretation:
        """Explain a trained classifier on ``data`` (:mod:`kerastorch.tools.interpret`): the confusion matrix,
        per-class scores and the samples with the highest losses.

        Args:
            data: fit's data forms, with labels. y: the labels beside an array ``X``.
            batch_size: as in ``fit``.
        """
        return interpret_module.interpret(self, data, y, batch_size)

    # -- weights ---------------------------------------------------------------------------

    def save_ckpt(self, path: Union[str, os.PathLike]) -> None:
        """Write the net's weights to ``path``, atomically: safetensors, or torch's format for
        ``.pt`` / ``.pth`` / ``.ckpt`` / ``.bin`` or no extension."""
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
            raise ValueError(
                f"The weights in {os.fspath(path)!r} do not fit this net ({type(target).__name__}): {error}"
            ) from None

    # -- helpers for callbacks -----------------------------------------------------------

    @property
    def is_main_process(self) -> bool:
        return self.runtime is None or self.runtime.is_main_process

    def print(self, *args: Any) -> None:
        """Print once (on the main process), without breaking a progress bar."""
        if self.is_main_process:
            # tqdm's plain class: tqdm.auto warns at import in a kernel without ipywidgets.
            text_tqdm.write(" ".join(str(a) for a in args))


def _called(arguments: Mapping[str, Any]) -> dict:
    """A method's arguments as it was called with them, every parameter by name with its default
    filled in (its ``locals()`` on entry, or its signature bound to a call), for the door."""
    return {name: value for name, value in arguments.items() if name != "self"}


__all__ = ["KerasModel"]
