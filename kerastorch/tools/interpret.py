"""``model.interpret(data)``: what a trained classifier gets wrong, sample by sample.

The net runs once over ``data`` (eval mode, no gradients) and every sample's prediction,
label and loss are kept. :class:`Interpretation` then gives the confusion matrix (exact
counts), precision / recall / F1 per class with their averages (from the counts, as torchmetrics computes them), and the
samples with the highest losses, drawn as images when the inputs are images.

Covered: multi-class classification (one score per class; two classes included) and
binary classification with one logit (``BCEWithLogitsLoss``) or one probability
(``BCELoss``). Regression is not: :func:`interpret` says so.

Example::

    interp = model.interpret(dl_val)
    interp.confusion_matrix            # rows: true class, columns: predicted class
    interp.per_class                   # precision, recall, f1, support; macro and weighted averages
    interp.top_losses(9)               # the nine worst samples, by their position in dl_val
    interp.plot_top_losses(9)          # ... drawn, "label / pred / loss" above each
"""

from __future__ import annotations

import math
from typing import Any, Optional

import pandas as pd
import torch
from torch import nn

from ..data.batches import to_host, unpack
from ..data.forms import eval_loader
from ..data.sample_weights import per_sample_loss
from ..devices.runtime import runtime_for_net
from ..helpers.modes import eval_mode
from ..helpers.plots import new_figure
from ..helpers.protocols import TrainableModel

REGRESSION_LOSSES = (nn.MSELoss, nn.L1Loss, nn.SmoothL1Loss, nn.HuberLoss)


class Interpretation:
    """Per-sample results of a classifier over a data set (see the module docstring)."""

    def __init__(self, probs: torch.Tensor, labels: torch.Tensor, losses: torch.Tensor, inputs: Optional[torch.Tensor]):
        self.probs = probs  # (N, C): each class's probability
        self.labels = labels.long()
        self.losses = losses
        self.inputs = inputs
        self.preds = probs.argmax(dim=1)
        self.num_classes = probs.shape[1]

    @property
    def confusion_matrix(self) -> pd.DataFrame:
        """Exact counts: row = true class, column = predicted class."""
        k = self.num_classes
        counts = torch.bincount(self.labels * k + self.preds, minlength=k * k).reshape(k, k)
        frame = pd.DataFrame(counts.numpy(), index=range(k), columns=range(k))
        frame.index.name, frame.columns.name = "true", "predicted"
        return frame

    @property
    def per_class(self) -> pd.DataFrame:
        """Precision, recall, F1 and support per class, then the macro and the weighted averages."""
        k = self.num_classes
        # From the exact counts, as torchmetrics computes them (0 where a ratio has no samples).
        matrix = torch.tensor(self.confusion_matrix.to_numpy(), dtype=torch.float64)
        hits = matrix.diag()
        precision = hits / matrix.sum(dim=0).clamp_min(1)
        recall = hits / matrix.sum(dim=1).clamp_min(1)
        f1 = torch.where(precision + recall > 0, 2 * precision * recall / (precision + recall).clamp_min(1e-12), 0.0)
        frame = pd.DataFrame(
            {
                "precision": precision.numpy(),
                "recall": recall.numpy(),
                "f1": f1.numpy(),
                "support": matrix.sum(dim=1).long().numpy(),
            },
            index=[str(c) for c in range(k)],
        )
        weights = frame["support"] / frame["support"].sum()
        scores = ["precision", "recall", "f1"]
        frame.loc["macro avg"] = [*frame[scores].mean().tolist(), int(frame["support"].sum())]
        frame.loc["weighted avg"] = [
            *(frame[scores].iloc[:k].mul(weights.iloc[:k], axis=0).sum()).tolist(),
            int(frame["support"].iloc[:k].sum()),
        ]
        frame["support"] = frame["support"].astype(int)
        return frame

    def top_losses(self, k: int = 9) -> pd.DataFrame:
        """The ``k`` samples with the highest loss, indexed by their position in the data."""
        k = min(k, len(self.losses))
        order = torch.argsort(self.losses, descending=True, stable=True)[:k]
        return pd.DataFrame(
            {
                "loss": self.losses[order].numpy(),
                "label": self.labels[order].numpy(),
                "pred": self.preds[order].numpy(),
                "prob": self.probs[order, self.preds[order]].numpy(),
            },
            index=pd.Index(order.numpy(), name="sample"),
        )

    def plot_confusion_matrix(self, normalize: bool = False) -> Any:
        """The confusion matrix as an image (``normalize=True``: each row as fractions of its true class)."""
        matrix = self.confusion_matrix.to_numpy().astype(float)
        if normalize:
            matrix = matrix / matrix.sum(axis=1, keepdims=True).clip(min=1)
        size = 1.2 + 0.45 * self.num_classes
        fig = new_figure(figsize=(size + 1, size), layout="constrained")
        ax = fig.subplots()
        image = ax.imshow(matrix, cmap="Blues")
        fig.colorbar(image, ax=ax, shrink=0.8)
        for (row, col), value in pd.DataFrame(matrix).stack().items():
            text = f"{value:.2f}" if normalize else f"{int(value)}"
            ax.text(
                col,
                row,
                text,
                ha="center",
                va="center",
                fontsize="small",
                color="white" if value > matrix.max() / 2 else "black",
            )
        ax.set_xticks(range(self.num_classes))
        ax.set_yticks(range(self.num_classes))
        ax.set_xlabel("predicted")
        ax.set_ylabel("true")
        ax.set_title("confusion matrix" + (" (fraction of each true class)" if normalize else ""))
        return fig

    def plot_top_losses(self, k: int = 9) -> Any:
        """The ``k`` worst samples: images titled "label / pred / loss" when the inputs are images,
        else the table of :meth:`top_losses`."""
        table = self.top_losses(k)
        images = _as_images(self.inputs)
        if images is None:
            return table
        columns = min(len(table), 5)
        rows = math.ceil(len(table) / columns)
        fig = new_figure(figsize=(2.0 * columns, 2.2 * rows), layout="constrained")
        axes = fig.subplots(rows, columns, squeeze=False).reshape(-1)
        for ax, (index, row) in zip(axes, table.iterrows()):
            image = images[int(index)]
            ax.imshow(
                image.permute(1, 2, 0).numpy() if image.dim() == 3 else image.numpy(),
                cmap="gray" if image.dim() == 2 else None,
            )
            ax.set_title(f"{int(row['label'])} / {int(row['pred'])} / {row['loss']:.2f}", fontsize="small")
        for ax in axes:
            ax.axis("off")
        fig.suptitle("label / prediction / loss")
        return fig


def interpret(model: TrainableModel, data: Any, y: Any = None, batch_size: Optional[int] = None) -> Interpretation:
    """Run the net over ``data`` once and keep every sample's result (see the module docstring)."""
    loss_fn = model.loss_fn
    if isinstance(loss_fn, REGRESSION_LOSSES):
        raise ValueError(
            f"interpret explains classifiers; loss_fn is {type(loss_fn).__name__}, a regression loss. For "
            "a regression, compare model.predict(X) with y (the residuals y - prediction)."
        )
    if not isinstance(getattr(loss_fn, "reduction", None), str):
        raise ValueError(
            "interpret needs each sample's loss, from a torch loss with a reduction attribute (e.g. "
            f"nn.CrossEntropyLoss()); loss_fn is {type(loss_fn).__name__}."
        )
    loader = eval_loader(data, y, batch_size, needs_labels=True)
    runtime = runtime_for_net(model.net)
    per_sample = per_sample_loss(loss_fn)
    probs, labels, losses, inputs = [], [], [], []
    with eval_mode(model.net), torch.no_grad():
        for batch in loader:
            args, kwargs, batch_labels, _ = unpack(runtime.to_device(batch))
            outputs = model.net(*args, **kwargs)
            batch_losses = per_sample(outputs, batch_labels)
            losses.append(batch_losses.reshape(batch_losses.shape[0], -1).mean(dim=1).float().cpu())
            probs.append(_probabilities(outputs, loss_fn).cpu())
            labels.append(to_host(batch_labels).reshape(-1))
            first = next((t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor)), None)
            inputs.append(to_host(first) if first is not None else None)
    kept = torch.cat([i for i in inputs if i is not None]) if all(i is not None for i in inputs) else None
    return Interpretation(torch.cat(probs), torch.cat(labels), torch.cat(losses), kept)


def _probabilities(outputs: torch.Tensor, loss_fn: Any) -> torch.Tensor:
    """(N, C) class probabilities from multi-class scores or one binary logit / probability."""
    outputs = outputs.float()
    if outputs.dim() == 2 and outputs.shape[1] > 1:
        return torch.softmax(outputs, dim=1) if not isinstance(loss_fn, nn.NLLLoss) else outputs.exp()
    if isinstance(loss_fn, (nn.BCEWithLogitsLoss, nn.BCELoss)):
        positive = outputs.reshape(-1)
        positive = torch.sigmoid(positive) if isinstance(loss_fn, nn.BCEWithLogitsLoss) else positive
        return torch.stack([1 - positive, positive], dim=1)
    raise ValueError(
        f"interpret covers classifiers with one score per class, or one logit with BCEWithLogitsLoss; "
        f"the net's outputs have shape {tuple(outputs.shape)} with {type(loss_fn).__name__}."
    )


def _as_images(inputs: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """Inputs as (N, H, W) or (N, 3, H, W) images, or None when they are not images."""
    if inputs is None or not inputs.is_floating_point():
        return None
    if inputs.dim() == 4 and inputs.shape[1] == 1:
        return inputs[:, 0]
    if inputs.dim() == 4 and inputs.shape[1] == 3:
        low, high = inputs.amin(), inputs.amax()
        return (inputs - low) / (high - low).clamp_min(1e-12)
    if inputs.dim() == 3:
        return inputs
    if inputs.dim() == 2 and inputs.shape[1] > 1 and math.isqrt(inputs.shape[1]) ** 2 == inputs.shape[1]:
        side = math.isqrt(inputs.shape[1])  # flat vectors of a perfect square size: 64 = 8 x 8
        return inputs.reshape(-1, side, side)
    return None


__all__ = ["Interpretation", "interpret"]
