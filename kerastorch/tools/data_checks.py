"""The doctor's checks of the data: validation samples that are also training samples, inputs on
very different scales, a rare class, an unshuffled loader with sorted labels, NaN or infinite values.
Each takes the doctor's :class:`~kerastorch.tools.patient.Patient` and returns its findings."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, SequentialSampler

from ..data.loaders import training_labels
from ..data.overlap import count_overlap
from .patient import Patient, batch_parts, inputs_tensor
from .report import Finding

CLASSIFICATION_LOSSES = (nn.CrossEntropyLoss, nn.NLLLoss)


def train_val_overlap(patient: Patient) -> list[Finding]:
    if patient.val_loader is None:
        return []
    overlap = count_overlap(patient.train_loader, patient.val_loader, limit=patient.max_compared)
    if overlap is None:
        return []
    compared = f"({overlap.train_compared} training and {overlap.compared} validation samples compared)"
    if not overlap.count:
        return [Finding("train_val_overlap", "info", f"No sample is in both sets {compared}.")]
    if not overlap.leak:
        return [
            Finding(
                "train_val_overlap",
                "info",
                f"{overlap.fraction:.0%} of the validation samples also appear in the training data, about as often "
                f"as the training samples repeat each other ({overlap.train_repeated:.0%} of them do) {compared}: "
                "duplicated rows, as tabular data with few distinct values has, not a leak.",
            )
        ]
    return [
        Finding(
            "train_val_overlap",
            "warning",
            f"{overlap.count} of the {overlap.compared} validation samples compared are also in the training "
            f"data ({overlap.train_compared} training samples compared): the validation scores are too good.",
            "Split the data once, before building the loaders (fit(X, y, validation_split=0.2), or "
            "torch.utils.data.random_split), and drop duplicates.",
            evidence={"count": overlap.count, "fraction": overlap.fraction},
        )
    ]


def inputs_normalized(patient: Patient) -> list[Finding]:
    found = [inputs_tensor(b) for b in patient.train_batches]
    tensors = [t.float() for t in found if t is not None and t.is_floating_point()]
    if not tensors:
        return []
    values = torch.cat([t.reshape(t.shape[0], -1) for t in tensors])
    mean, std = float(values.mean()), float(values.std())
    per_feature = values.std(dim=0)
    if abs(mean) > 5 or std > 10:
        return [
            Finding(
                "inputs_normalized",
                "warning",
                f"The input features have mean {mean:.3g} and standard deviation {std:.3g}; nets train best "
                "on inputs of mean about 0 and standard deviation about 1.",
                "Standardize with the training data's statistics: x = (x - mean) / std (e.g. "
                "sklearn.preprocessing.StandardScaler fitted on the training set).",
            )
        ]
    if values.shape[1] > 1 and float(per_feature.max()) > 50 * max(float(per_feature.median()), 1e-12):
        return [
            Finding(
                "inputs_normalized",
                "warning",
                f"The features' scales differ a lot: standard deviations from {float(per_feature.min()):.3g} "
                f"to {float(per_feature.max()):.3g}.",
                "Standardize each feature (x - mean) / std, with the training data's statistics.",
            )
        ]
    return []


def class_balance(patient: Patient) -> list[Finding]:
    if not isinstance(patient.model.loss_fn, CLASSIFICATION_LOSSES + (nn.BCEWithLogitsLoss, nn.BCELoss)):
        return []
    first_labels = batch_parts(patient.train_batches[0])[2]
    binary = isinstance(patient.model.loss_fn, (nn.BCEWithLogitsLoss, nn.BCELoss))
    if binary and isinstance(first_labels, torch.Tensor) and first_labels.dim() >= 2 and first_labels.shape[-1] > 1:
        return []  # multi-label tags: rare positives are their nature (pos_weight weights them if needed)
    labels = training_labels(patient.train_loader)
    if labels.numel() == 0:
        return []
    if labels.is_floating_point() and not bool(((labels == 0) | (labels == 1)).all()):
        return []  # soft targets, no classes to count
    labels = labels.long() if labels.is_floating_point() else labels
    counts = torch.bincount(labels.reshape(-1).clamp_min(0))
    present = counts[counts > 0]
    if present.numel() < 2:
        return [
            Finding(
                "class_balance",
                "warning",
                f"The training labels hold a single class ({int(labels[0])}).",
                "Check the labels: a classifier needs examples of every class.",
            )
        ]
    rare, common = int(present.min()), int(present.max())
    if rare < 0.1 * common:
        rarest = int(torch.nonzero(counts == rare)[0])
        return [
            Finding(
                "class_balance",
                "warning",
                f"Class {rarest} has {rare} training samples against {common} for the most common class: the net "
                "can score well by ignoring it.",
                "fit(..., class_weight='balanced'), or a WeightedRandomSampler, or collect more samples of it."
                + (
                    f" With one output, nn.BCEWithLogitsLoss(pos_weight=torch.tensor([{common / rare:.3g}])) "
                    "weights the positives too."
                    if binary and rarest == 1
                    else ""
                ),
            )
        ]
    return []


def shuffled(patient: Patient) -> list[Finding]:
    loader = patient.train_loader
    if not isinstance(loader, DataLoader) or not isinstance(loader.sampler, SequentialSampler):
        return []
    labels = torch.cat([torch.as_tensor(batch_parts(b)[2]).reshape(-1).float() for b in patient.train_batches])
    if labels.numel() > 1 and bool((labels[1:] >= labels[:-1]).all()):
        return [
            Finding(
                "shuffled",
                "warning",
                f"The training loader is not shuffled and its first {labels.numel()} labels come sorted: each "
                "epoch the net sees one class after another and forgets the earlier ones.",
                "DataLoader(dataset, batch_size=..., shuffle=True), or fit(X, y) which shuffles.",
            )
        ]
    return []


def finite_inputs(patient: Patient) -> list[Finding]:
    findings = []
    for which, batches in (("training", patient.train_batches), ("validation", patient.val_batches)):
        for batch in batches:
            args, kwargs, labels = batch_parts(batch)
            for part, tensor in [("inputs", t) for t in (*args, *kwargs.values())] + [("labels", labels)]:
                if (
                    isinstance(tensor, torch.Tensor)
                    and tensor.is_floating_point()
                    and not bool(torch.isfinite(tensor).all())
                ):
                    bad = int((~torch.isfinite(tensor)).sum())
                    findings.append(
                        Finding(
                            "finite_inputs",
                            "error",
                            f"The {which} {part} hold {bad} NaN or infinite value(s) in the first "
                            "batches looked at: the loss will become NaN.",
                            "Fill or drop missing values before training (e.g. df.fillna(...) or "
                            "df.dropna()), and look for divisions by zero in the preprocessing.",
                        )
                    )
                    return findings
    return findings


__all__ = [
    "class_balance",
    "finite_inputs",
    "inputs_normalized",
    "shuffled",
    "train_val_overlap",
]
