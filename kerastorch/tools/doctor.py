"""``model.doctor(...)``: the mistakes a training loop can see in seconds, said in plain words.

A fixed list of checks runs on a few batches and returns a :class:`~kerastorch.tools.report.Diagnosis` of
:class:`~kerastorch.tools.report.Finding` objects (``check``, ``severity`` "error" / "warning" / "info",
``message`` with what was seen, ``fix`` with what to type instead). The checks of the model and its
training live here, those of the data in :mod:`~kerastorch.tools.data_checks`. The checks that train — one batch
overfitted for a few dozen steps, the first steps at the optimizer's rate — run inside
:func:`~kerastorch.training.snapshot.training_snapshot`, so afterwards the weights, buffers, optimizer,
scheduler and every RNG are exactly as before: ``doctor`` changes nothing.

Example::

    report = model.doctor(dl_train, dl_val)
    print(report)          # errors first; in Jupyter a small table
    report.errors          # [] on a healthy setup
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional

import torch
from torch import nn

from ..data.forms import FitData, prepare_data
from ..data.peek import rng_untouched, workers_as_they_were
from ..devices.runtime import runtime_for_net
from ..helpers.modes import eval_mode, train_mode
from ..helpers.protocols import TrainableModel
from ..settings import DataSettings, StepSettings
from ..training.callback import Callback
from ..training.callback_list import CallbackList
from ..training.first_batch_hints import broadcast_mismatch
from ..training.labels import label_fix
from ..training.loop import FitStep
from ..training.snapshot import training_snapshot
from .data_checks import (
    CLASSIFICATION_LOSSES,
    class_balance,
    finite_inputs,
    inputs_normalized,
    shuffled,
    train_val_overlap,
)
from .patient import Patient, batch_parts
from .report import Diagnosis, Finding


class DoctorError(ValueError):
    """``fit(doctor=True)`` found an error: training did not start."""


def doctor(
    model: TrainableModel,
    data: FitData,
    data_settings: Optional[DataSettings] = None,
    num_batches: int = 4,
    max_compared: int = 2000,
    overfit_steps: int = 60,
) -> Diagnosis:
    """Run every check (see the module docstring) and return the :class:`Diagnosis`; nothing is changed."""
    settings = data_settings or DataSettings()
    train_loader, val_loader = prepare_data(
        data, settings.batch_size, settings.shuffle, settings.validation_split, keep_float64=False, pin_memory=False
    )
    loaders = [loader for loader in (train_loader, val_loader) if loader is not None]
    with workers_as_they_were(loaders):  # looking at the first batches starts a persistent loader's workers
        return Diagnosis(_examine(model, train_loader, val_loader, num_batches, max_compared, overfit_steps))


def _examine(
    model: TrainableModel, train_loader: Any, val_loader: Any, num_batches: int, max_compared: int, overfit_steps: int
) -> list[Finding]:
    patient = Patient(
        model,
        runtime_for_net(model.net),
        train_loader,
        val_loader,
        _first_batches(train_loader, num_batches),
        _first_batches(val_loader, num_batches),
        max_compared,
        overfit_steps,
    )
    findings: list[Finding] = []
    loaders = [loader for loader in (train_loader, val_loader) if loader is not None]
    for name, check in CHECKS:
        # Each check starts from the model as it was, and leaves it so (some of them train).
        with training_snapshot(model, loaders):
            try:
                findings.extend(check(patient))
            except Exception as error:  # a check that cannot run says so; the report always comes back
                findings.append(
                    Finding(
                        name,
                        "warning",
                        f"the check could not run: {type(error).__name__}: {error}",
                        "Run fit once to see the full error, or look at this part of the setup.",
                    )
                )
    return findings


def check_before_fit(model: TrainableModel, train_loader: Any, val_loader: Any) -> Diagnosis:
    """``fit(doctor=True)``: print the report when there are errors or warnings; raise :class:`DoctorError` on an error."""
    report = doctor(model, FitData(train_loader, val_loader))
    if report.errors or report.warnings:
        model.print(str(report))
    if not report.ok:
        raise DoctorError(
            f"{report}\n\nTraining did not start. Fix the errors above, or pass doctor=False to train anyway."
        )
    return report


# -- what the checks share -------------------------------------------------------------------------


def _first_batches(loader: Any, count: int) -> list:
    if loader is None:
        return []
    batches = []
    with rng_untouched(loader):
        for batch in loader:
            batches.append(batch)
            if len(batches) == count:
                break
    return batches


def _outputs_and_labels(patient: Patient, batch: Any) -> tuple[Any, Any]:
    model, runtime = patient.model, patient.runtime
    args, kwargs, labels = batch_parts(runtime.to_device(batch))
    with eval_mode(model.net), torch.no_grad():
        return model.net(*args, **kwargs), labels


def _loss_name(loss_fn: Any) -> str:
    return type(loss_fn).__name__


def _train_steps(patient: Patient, batches: Callable[[int], Any], steps: int, callbacks: tuple = ()) -> list[float]:
    """Losses of ``steps`` training steps, each fit's own step (the model's ``train_step``), at the
    rates of :func:`_trial_rates`. The caller's snapshot puts everything back."""
    model, runtime = patient.model, patient.runtime
    _trial_rates(model.optimizer)
    fit_step = FitStep(model, runtime, StepSettings(), CallbackList(list(callbacks), model, {}))
    model.fit_step = fit_step  # what model.backward / model.optimizer_step use inside train_step
    losses: list[float] = []
    try:
        with train_mode(model.net):
            fit_step.start_epoch(None)
            for step in range(steps):
                loss, _, _ = fit_step.run(0, runtime.to_device(batches(step)))
                losses.append(float(loss.detach()))
                if not math.isfinite(losses[-1]):
                    break
    finally:
        model.fit_step = None
    return losses


def _trial_rates(optimizer: torch.optim.Optimizer) -> None:
    """A warm-up that starts from a learning rate of 0 would train nothing in a few trial steps:
    those param groups train at the rate the scheduler warms up to (its ``initial_lr``)."""
    for group in optimizer.param_groups:
        if group.get("lr") == 0 and group.get("initial_lr", 0) > 0:
            group["lr"] = group["initial_lr"]


def _loss_floor(loss_fn: Any, preds: Any, labels: Any) -> float:
    """The lowest mean loss any net can reach on these labels: 0, except for targets that are not
    certain (label smoothing, probability targets), whose entropy no prediction goes below."""
    if not isinstance(preds, torch.Tensor) or not isinstance(labels, torch.Tensor):
        return 0.0
    if getattr(loss_fn, "reduction", None) != "mean" or getattr(loss_fn, "weight", None) is not None:
        return 0.0
    if isinstance(loss_fn, nn.CrossEntropyLoss) and preds.dim() >= 2:
        classes = preds.shape[1]
        if labels.is_floating_point() and labels.shape == preds.shape:
            targets = labels.float()
        elif labels.dim() == preds.dim() - 1 and not labels.is_floating_point() and bool((labels >= 0).all()):
            targets = nn.functional.one_hot(labels.long(), classes).movedim(-1, 1).float()
        else:
            return 0.0
        targets = (1 - loss_fn.label_smoothing) * targets + loss_fn.label_smoothing / classes
        return float(-torch.special.xlogy(targets, targets).sum(dim=1).mean())
    if isinstance(loss_fn, (nn.BCEWithLogitsLoss, nn.BCELoss)) and labels.is_floating_point():
        if getattr(loss_fn, "pos_weight", None) is not None:
            return 0.0
        p = labels.float().clamp(0, 1)
        return float(-(torch.special.xlogy(p, p) + torch.special.xlogy(1 - p, 1 - p)).mean())
    return 0.0


# -- the checks, in the order they run ---------------------------------------------------------


def labels_in_range(patient: Patient) -> list[Finding]:
    loss_fn = patient.model.loss_fn
    preds, labels = _outputs_and_labels(patient, patient.train_batches[0])
    if not isinstance(preds, torch.Tensor) or not isinstance(labels, torch.Tensor):
        return []
    if isinstance(loss_fn, CLASSIFICATION_LOSSES) and preds.dim() >= 2 and labels.dim() == preds.dim() - 1:
        classes = preds.shape[1]
        every = torch.cat([batch_parts(b)[2].reshape(-1) for b in patient.train_batches])
        outside = every[(every < 0) | (every >= classes)]
        if outside.numel():
            return [
                Finding(
                    "labels_in_range",
                    "error",
                    f"{outside.numel()} of {every.numel()} labels looked at lie outside [0, {classes}): e.g. "
                    f"{sorted(set(outside.tolist()))[:5]}, but the net has {classes} outputs.",
                    f"Give the last layer one output per class (nn.Linear(..., {int(every.max()) + 1})), or "
                    "number the classes from 0 (y = y - y.min()).",
                )
            ]
    reading = label_fix(loss_fn, preds, labels)
    if reading.note:  # fit reshapes or casts these labels on every batch, as Keras does: worth knowing only
        return [
            Finding(
                "labels_in_range",
                "info",
                reading.note,
                "Nothing to do: fit does this on every batch. Reshape or cast the labels yourself to make it explicit.",
            )
        ]
    mismatch = broadcast_mismatch(loss_fn, preds, labels)
    if mismatch:
        problem, fix = mismatch.split(" Make the shapes equal: ")
        return [Finding("labels_in_range", "error", problem, "Make the shapes equal: " + fix)]
    if isinstance(loss_fn, (nn.BCEWithLogitsLoss, nn.BCELoss)) and not labels.is_floating_point():
        return [
            Finding(
                "labels_in_range",
                "error",
                f"{_loss_name(loss_fn)} gets integer labels ({str(labels.dtype).replace('torch.', '')}); it "
                "needs float targets in [0, 1] with the outputs' shape.",
                "y = y.float() (and y.reshape(-1, 1) for a net with one output).",
            )
        ]
    return []


def logits_not_probabilities(patient: Patient) -> list[Finding]:
    loss_fn = patient.model.loss_fn
    preds, _ = _outputs_and_labels(patient, patient.train_batches[0])
    if not isinstance(preds, torch.Tensor) or not preds.is_floating_point():
        return []
    in_unit = bool((preds >= 0).all() and (preds <= 1).all())
    if isinstance(loss_fn, nn.CrossEntropyLoss) and preds.dim() >= 2 and in_unit:
        sums = preds.sum(dim=1)
        if torch.allclose(sums, torch.ones_like(sums), atol=1e-3):
            return [
                Finding(
                    "logits_not_probabilities",
                    "error",
                    "The outputs already sum to 1 over the classes (a softmax), but CrossEntropyLoss applies its "
                    "own log-softmax: the gradients almost vanish and the net learns very slowly.",
                    "Remove the final nn.Softmax / softmax from the net: CrossEntropyLoss wants raw scores "
                    "(logits). Apply softmax yourself after predict for probabilities.",
                )
            ]
    if isinstance(loss_fn, nn.BCEWithLogitsLoss) and in_unit and preds.numel() > 1 and _squashed(patient):
        return [
            Finding(
                "logits_not_probabilities",
                "warning",
                "Every output lies in [0, 1], as after a sigmoid, but BCEWithLogitsLoss applies its own sigmoid.",
                "Remove the final nn.Sigmoid from the net (or use nn.BCELoss with it).",
            )
        ]
    if isinstance(loss_fn, nn.BCELoss) and not in_unit:
        return [
            Finding(
                "logits_not_probabilities",
                "error",
                f"BCELoss needs probabilities in [0, 1], but the outputs range from {float(preds.min()):.3g} to "
                f"{float(preds.max()):.3g} (raw scores).",
                "Use loss_fn=nn.BCEWithLogitsLoss(), which takes raw scores and is more stable.",
            )
        ]
    return []


def _squashed(patient: Patient) -> bool:
    """True when the net's outputs come out of a sigmoid: its last layer is one, or they stay inside
    [0, 1] after training on the batch. A fresh net's raw scores can lie in [0, 1] by chance (small
    weights, a positive bias); trained towards 0/1 labels they leave it, and a sigmoid's never do."""
    last: list[nn.Module] = []
    leaves = [m for m in patient.model.net.modules() if not any(True for _ in m.children())]
    hooks = [m.register_forward_hook(lambda module, args, out: last.append(module)) for m in leaves]
    try:
        _outputs_and_labels(patient, patient.train_batches[0])
    finally:
        for hook in hooks:
            hook.remove()
    if last and isinstance(last[-1], nn.Sigmoid):
        return True
    batch = patient.train_batches[0]
    _train_steps(patient, lambda step: batch, 20)
    preds, _ = _outputs_and_labels(patient, batch)
    return bool((preds >= 0).all() and (preds <= 1).all())


def overfits_one_batch(patient: Patient) -> list[Finding]:
    batch = patient.train_batches[0]
    preds, labels = _outputs_and_labels(patient, batch)
    floor = _loss_floor(patient.model.loss_fn, preds, labels)  # label smoothing: the loss cannot reach 0
    losses = _train_steps(patient, lambda step: batch, patient.overfit_steps)
    first, last = losses[0], min(losses)
    if math.isfinite(last) and (last - floor < 0.2 * (first - floor) or last - floor < 1e-2):
        return []
    return [
        Finding(
            "overfits_one_batch",
            "warning",
            f"Trained {len(losses)} steps on one batch, the loss went from {first:.4g} to {last:.4g} only"
            + (f" (it cannot go below {floor:.4g} on these labels)" if floor > 0 else "")
            + ": a net that cannot learn one batch by heart will not learn the data set.",
            "Check the learning rate (model.lr_find(...)), that the net is big enough, and that the labels "
            "reach the loss as you expect.",
        )
    ]


class _GradientsSeen(Callback):
    """After each backward pass: which parameters got a gradient, and which a non-zero one."""

    def __init__(self, parameters: dict[str, nn.Parameter]):
        self.parameters = parameters
        self.connected: set[str] = set()
        self.moving: set[str] = set()

    def on_after_backward(self) -> None:
        for name, param in self.parameters.items():
            if param.grad is not None:
                self.connected.add(name)
                if bool(param.grad.abs().sum() > 0):
                    self.moving.add(name)


LEARNING_STEPS = 3  # a parameter behind one that starts at zero (LoRA's B) gets gradients from step 2


def all_parameters_learn(patient: Patient) -> list[Finding]:
    model, batches = patient.model, patient.train_batches
    named = dict(model.net.named_parameters())
    frozen = [name for name, param in named.items() if not param.requires_grad]
    seen = _GradientsSeen({name: param for name, param in named.items() if param.requires_grad})
    _train_steps(patient, lambda step: batches[step % len(batches)], LEARNING_STEPS, callbacks=(seen,))
    # Layers that start at zero (LoRA's B, a residual branch's last layer) hold back the gradients
    # of the layers before them for a step, not for good: only a gradient that stays zero is a problem.
    silent = [name for name in seen.parameters if name not in seen.moving]
    findings = []
    if silent:
        findings.append(
            Finding(
                "all_parameters_learn",
                "warning",
                f"{len(silent)} parameter(s) got no gradient from the loss in {LEARNING_STEPS} training steps: "
                f"{', '.join(silent[:5])}{' ...' if len(silent) > 5 else ''}. They never learn.",
                "Use these layers in forward (or remove them); a layer defined but never called, a "
                ".detach() / torch.no_grad() in forward, or a multiplication by zero cuts them off.",
            )
        )
    if frozen:
        findings.append(
            Finding(
                "all_parameters_learn",
                "info",
                f"{len(frozen)} parameter(s) are frozen (requires_grad=False): {', '.join(frozen[:5])}"
                f"{' ...' if len(frozen) > 5 else ''}.",
                "Fine if on purpose (fine-tuning).",
            )
        )
    return findings


def learning_rate(patient: Patient) -> list[Finding]:
    batches = patient.train_batches
    losses = _train_steps(patient, lambda step: batches[step % len(batches)], 8)
    lr = patient.model.optimizer.param_groups[0]["lr"]  # the rate trained at (a warm-up's target)
    if not math.isfinite(losses[-1]) or (len(losses) > 2 and min(losses[2:]) > 1.5 * losses[0]):
        return [
            Finding(
                "learning_rate",
                "error",
                f"At the optimizer's learning rate {lr:g} the loss rises at once: {losses[0]:.4g} -> "
                f"{losses[-1]:.4g} over {len(losses)} steps.",
                "Lower the learning rate (try model.lr_find(train_data) for a suggestion), or clip "
                "gradients: fit(..., gradient_clip_val=1.0).",
            )
        ]
    return []


CHECKS: list[tuple[str, Callable[[Patient], list[Finding]]]] = [
    ("labels_in_range", labels_in_range),
    ("logits_not_probabilities", logits_not_probabilities),
    ("train_val_overlap", train_val_overlap),
    ("inputs_normalized", inputs_normalized),
    ("class_balance", class_balance),
    ("shuffled", shuffled),
    ("overfits_one_batch", overfits_one_batch),
    ("all_parameters_learn", all_parameters_learn),
    ("finite_inputs", finite_inputs),
    ("learning_rate", learning_rate),
]

__all__ = ["CHECKS", "Diagnosis", "DoctorError", "Finding", "check_before_fit", "doctor"]
