"""What the curves say: the run's report, read from the history fit returns.

:func:`diagnose` reads a history (one row per epoch) and returns a
:class:`~kerastorch.tools.report.Diagnosis` whose findings each name a ``kind``, the epochs it is
about, one or two plain sentences with what to try, and the numbers it rests on. A healthy run that
converges gets no finding. ``fit`` makes one at its end, with what only the run measures (each
epoch's timing, where a NaN loss came from, the overlap of the data; see
:mod:`kerastorch.tools.fit_report`), and ``model.diagnose()`` returns it. The rules, and their
thresholds (the constants below):

- ``"diverged"``: the training loss became NaN or infinite (or the validation loss infinite; a NaN
  validation loss is an epoch that was not validated). The other curve rules read the epochs before.
- ``"lr_too_high"``: the training loss rose, from one epoch to the next, by more than
  ``LR_HIGH_JUMP`` (a quarter) of the first epoch's training loss; or the validation loss jumped up
  that much from one epoch to the next and, later, down that much; or the training loss ended above
  where it started; or (with ``start_loss``, which fit measures) the first epoch's training loss
  averaged ``LR_HIGH_START`` (2) times the loss before the first step or more: it rose inside the
  first epoch.
- ``"lr_too_low"``: over at least two epochs the training loss (and the validation loss, if any)
  stayed within ``LR_LOW_RANGE`` (1%) of its first value.
- ``"overfitting"``: the validation loss rose for ``OVERFIT_EPOCHS`` (3) or more validated epochs
  after its lowest point, ending ``OVERFIT_RISE`` (10%) or more above it, while the training loss
  fell at every epoch.
- ``"not_converged"``: the last epoch still lowered the training loss by ``NOT_CONVERGED_DROP`` (2%)
  of the first epoch's training loss or more, or (over three epochs or more) by ``NOT_CONVERGED_PACE``
  (half) of the run's average drop per epoch or more; and the validation loss (if any) reached its
  lowest value there, as did the monitored value (``monitor=``, when it is given). Not said when the
  learning rate looks too high or too low: that finding comes first.
- ``"underfitting"``: the run did not learn enough. Without knowing the task, "enough" is measured
  against the first epoch: the last training loss is still ``UNDERFIT_SHARE`` (half) or more of the
  first epoch's; it improved by less than ``FLAT_CHANGE`` (2%) over the last ``FLAT_EPOCHS`` (3)
  epochs; and the validation loss (if any) is within ``ALIKE`` (20%) of the training loss.
  Not said when the learning rate looks wrong, or when the run is still improving.
- ``"input_bound"``: from a timing frame, the loop waited for the next batch ``INPUT_BOUND_FRACTION``
  (half) or more of the time (the first epoch left out when there are more, as it starts the workers).
- ``"train_val_overlap"``: from an :class:`~kerastorch.data.overlap.Overlap`, validation samples
  found in the training data more often than repeated rows explain.

Example::

    history = model.fit(dl_train, dl_val, epochs=20)
    report = kt.diagnose(history)     # pass fit's monitor= and mode= if you changed them
    print(report)                      # nothing when there is nothing to say
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional

import numpy as np
import pandas as pd

from ..data.overlap import Overlap
from ..helpers.plots import best_epoch
from .report import TIMING_COLUMNS, Diagnosis, Finding, empty_timing

LR_HIGH_JUMP = 0.25
LR_HIGH_START = 2.0
LR_LOW_RANGE = 0.01
OVERFIT_EPOCHS = 3
OVERFIT_RISE = 0.10
NOT_CONVERGED_DROP = 0.02
NOT_CONVERGED_PACE = 0.5
UNDERFIT_SHARE = 0.5
FLAT_EPOCHS = 3
FLAT_CHANGE = 0.02
ALIKE = 0.20
INPUT_BOUND_FRACTION = 0.5

KINDS = (
    "overfitting",
    "underfitting",
    "lr_too_high",
    "lr_too_low",
    "not_converged",
    "diverged",
    "input_bound",
    "train_val_overlap",
)


@dataclasses.dataclass(frozen=True)
class Divergence:
    """Where a loss became NaN or infinite, as the run found it (see :mod:`kerastorch.tools.fit_report`).

    After training, the run replays its data with the finite weights it put back, forward only, and
    stops at the first batch that gives a NaN or infinite value.

    Attributes:
        epoch: the epoch whose loss was NaN or infinite (from 1).
        batch: the first batch of that replay (from 1, in the loader's order) that gave a NaN or infinite
            value; None when none did, or when the run did not replay.
        inputs_finite: whether that batch's inputs held only finite values, or None when not known.
        module: with ``batch``, the first module whose output on it was not finite: its qualified name in
            the net (``"encoder.2"``), ``"the net itself"`` (its own forward's code, or its own weights),
            or ``"the loss function"``. Without ``batch``, the first module
            of the net that held NaN or infinite weights when the run stopped. None when not known.
        labels_finite: whether that batch's labels held only finite values, or None when not known.
        weights_finite: whether every weight of the net was finite when the run stopped, or None when
            not known.
        replayed: how many batches the replay read (0: no replay).
        data: ``"training"`` or ``"validation"``: the data whose loss was not finite, and replayed.
    """

    epoch: int
    batch: Optional[int] = None
    inputs_finite: Optional[bool] = None
    module: Optional[str] = None
    labels_finite: Optional[bool] = None
    weights_finite: Optional[bool] = None
    replayed: int = 0
    data: str = "training"


@dataclasses.dataclass
class Curves:
    """The losses of the epochs before any divergence: ``val`` NaN where an epoch was not validated."""

    epochs: np.ndarray
    train: np.ndarray
    val: Optional[np.ndarray]

    @property
    def validated(self) -> np.ndarray:
        return np.zeros(0, dtype=bool) if self.val is None else np.isfinite(self.val)


def diagnose(
    history: pd.DataFrame,
    timing: Optional[pd.DataFrame] = None,
    divergence: Optional[Divergence] = None,
    overlap: Optional[Overlap] = None,
    *,
    monitor: Optional[str] = "auto",
    mode: str = "min",
    restore_best_weights: bool = True,
    start_loss: Optional[float] = None,
) -> Diagnosis:
    """What the curves say about a run: a :class:`~kerastorch.tools.report.Diagnosis` whose
    findings are the rules of :mod:`kerastorch.tools.diagnosis` that apply.

    Args:
        history: the DataFrame ``fit`` returns (``epoch``, ``train_loss``, ``val_loss`` ...).
        timing: one row per epoch: ``epoch``, ``seconds``, ``data_wait_fraction``; None when not measured.
        divergence: where a NaN loss came from, when the run looked (:class:`Divergence`).
        overlap: validation samples also in the training data
            (:func:`~kerastorch.data.overlap.count_overlap`).
        monitor: as given to ``fit``, to say which epoch's weights it kept: ``"auto"`` is
            ``val_loss``, or ``train_loss`` without validation; None, no epoch was kept.
        mode: as given to ``fit``: ``"min"`` or ``"max"``.
        restore_best_weights: as given to ``fit``: False, the last epoch's weights stayed.
        start_loss: the training loss of the first batch before the first step (fit measures it, in
            eval mode, for a run that begins with its first epoch); None when not known.

    >>> report = kt.diagnose(history)   # doctest: +SKIP
    >>> print(report)                   # doctest: +SKIP
    """
    if not isinstance(history, pd.DataFrame):
        raise TypeError(
            f"diagnose takes the DataFrame that fit returns (model.history); got a {type(history).__name__}."
        )
    if mode not in ("min", "max"):
        raise ValueError(f"mode={mode!r}; use 'min' (lower is better, e.g. a loss) or 'max' (e.g. accuracy).")
    timing = empty_timing() if timing is None else _checked_timing(timing)
    findings: list[Finding] = []
    curves = None
    if len(history) and "train_loss" in history:
        curves, diverged = _curves(history)
        if diverged is not None or divergence is not None:
            findings.append(_diverged(diverged, divergence))
    elif divergence is not None:
        findings.append(_diverged(None, divergence))
    if overlap is not None and overlap.leak:
        findings.append(_overlap_finding(overlap))
    if curves is not None and len(curves.train):
        if monitor == "auto":
            monitor = "val_loss" if "val_loss" in history else "train_loss"
        best = best_epoch(history, monitor, mode) if monitor else None
        kept = (best[0], str(monitor)) if best is not None and restore_best_weights else None
        findings.extend(_curve_findings(curves, kept, monitor, None if best is None else best[0], start_loss))
    findings.extend(_input_bound(timing))
    return Diagnosis(findings, source="run", timing=timing)


# -- reading the history ---------------------------------------------------------------------------


def _curves(history: pd.DataFrame) -> tuple[Curves, Optional[int]]:
    """The curves up to the first epoch whose training loss is not finite (or validation loss
    infinite), and that epoch (None when every epoch is finite)."""
    epochs = history["epoch"].to_numpy() if "epoch" in history else np.arange(1, len(history) + 1)
    train = history["train_loss"].to_numpy(dtype=float)
    val = history["val_loss"].to_numpy(dtype=float) if "val_loss" in history else None
    bad = ~np.isfinite(train)
    if val is not None:
        bad |= np.isinf(val)
    first_bad = int(np.argmax(bad)) if bad.any() else len(train)
    cut = slice(0, first_bad)
    curves = Curves(epochs[cut].astype(int), train[cut], None if val is None else val[cut])
    if curves.val is not None and not curves.validated.any():
        curves.val = None  # never validated: as without validation data
    return curves, (int(epochs[first_bad]) if first_bad < len(train) else None)


def _curve_findings(
    curves: Curves,
    kept: Optional[tuple[int, str]],
    monitor: Optional[str],
    best_at: Optional[int],
    start_loss: Optional[float] = None,
) -> list[Finding]:
    findings: list[Finding] = []
    too_high = _lr_too_high(curves, start_loss)
    too_low = None if too_high else _lr_too_low(curves)
    still_improving = None if too_high or too_low else _not_converged(curves, best_at)
    findings += [f for f in (too_high, too_low) if f is not None]
    overfit = _overfitting(curves, kept, monitor)
    if overfit is not None:
        findings.append(overfit)
    if not (too_high or too_low or still_improving or overfit):
        under = _underfitting(curves)
        if under is not None:
            findings.append(under)
    if still_improving is not None:
        findings.append(still_improving)
    return findings


def _lr_too_high(curves: Curves, start_loss: Optional[float] = None) -> Optional[Finding]:
    train, epochs = curves.train, curves.epochs
    jump = LR_HIGH_JUMP * abs(train[0])
    rises = np.diff(train)
    at = np.nonzero(rises > jump)[0]
    said_start: dict[str, float] = {}  # the loss before the first step, when the finding rests on it
    if len(at):
        i = int(at[0]) + 1
        seen = f"the training loss rose from {train[i - 1]:.4g} at epoch {epochs[i - 1]} to {train[i]:.4g} at epoch {epochs[i]}"
        about: tuple[int, ...] = (int(epochs[i - 1]), int(epochs[i]))
    elif start_loss is not None and 0 < start_loss < math.inf and train[0] >= LR_HIGH_START * start_loss:
        seen = (
            f"the first epoch's training loss averaged {train[0]:.4g}, {train[0] / start_loss:.1f} times the "
            f"loss before the first step ({start_loss:.4g}): it rose inside epoch {epochs[0]}"
        )
        about = (int(epochs[0]),)
        said_start = {"start_loss": float(start_loss)}
    elif train[-1] > train[0]:
        seen = f"the training loss ended higher than it started ({train[0]:.4g} at epoch {epochs[0]}, {train[-1]:.4g} at epoch {epochs[-1]})"
        about = (int(epochs[0]), int(epochs[-1]))
    else:
        val, val_epochs = (
            (curves.val[curves.validated], epochs[curves.validated]) if curves.val is not None else ([], [])
        )
        changes = np.diff(val)
        ups = np.nonzero(changes > jump)[0]
        downs = np.nonzero(changes < -jump)[0]
        later = downs[downs > ups[0]] if len(ups) else downs[:0]
        if not len(later):
            return None
        up, down = int(ups[0]) + 1, int(later[0]) + 1
        seen = (
            f"the validation loss jumped from {val[up - 1]:.4g} to {val[up]:.4g} at epoch {val_epochs[up]} and fell "
            f"back to {val[down]:.4g} at epoch {val_epochs[down]}"
        )
        about = tuple(int(e) for e in val_epochs[up - 1 : down + 1])
    return Finding(
        "lr_too_high",
        "warning",
        f"The learning rate looks too high: {seen}. Lower it (model.lr_find(train_data) suggests one), or "
        "clip gradients with fit(..., gradient_clip_val=1.0).",
        epochs=about,
        evidence={
            "first_train_loss": float(train[0]),
            "last_train_loss": float(train[-1]),
            **said_start,
        },
    )


def _lr_too_low(curves: Curves) -> Optional[Finding]:
    train = curves.train
    if len(train) < 2:
        return None
    spans = [np.ptp(train) / abs(train[0]) if train[0] else math.inf]
    if curves.val is not None:
        val = curves.val[curves.validated]
        spans.append(np.ptp(val) / abs(val[0]) if val[0] else math.inf)
    if max(spans) >= LR_LOW_RANGE:
        return None
    return Finding(
        "lr_too_low",
        "warning",
        f"The training loss barely moved in {len(train)} epochs ({train[0]:.4g} to {train[-1]:.4g}): the learning "
        "rate looks too low, or the parameters do not train. Try model.lr_find(train_data) for a learning rate, "
        "and check that the optimizer holds the net's parameters.",
        epochs=(int(curves.epochs[0]), int(curves.epochs[-1])),
        evidence={
            "first_train_loss": float(train[0]),
            "last_train_loss": float(train[-1]),
            "change": float(max(spans)),
        },
    )


def _overfitting(curves: Curves, kept: Optional[tuple[int, str]], monitor: Optional[str]) -> Optional[Finding]:
    if curves.val is None:
        return None
    validated = curves.validated
    val, epochs, train = curves.val[validated], curves.epochs[validated], curves.train[validated]
    best = int(np.argmin(val))
    after = len(val) - 1 - best
    if after < OVERFIT_EPOCHS or val[-1] < val[best] * (1 + OVERFIT_RISE):
        return None
    turned = int(epochs[best])
    if not (np.diff(curves.train[curves.epochs >= turned]) < 0).all():
        return None  # a training loss that bounces too: noise, or a learning rate too high, not overfitting
    if kept is not None and kept[0] < int(curves.epochs[-1]):
        weights = f" The weights of epoch {kept[0]} (its best {kept[1]}) were put back when fit returned."
    elif monitor is None:
        weights = " Early stopping keeps the best epoch: fit(..., monitor='val_loss', patience=3)."
    else:
        weights = ""
    return Finding(
        "overfitting",
        "warning",
        f"The validation loss was lowest at epoch {turned} ({val[best]:.4g}) and rose over the "
        f"{int(epochs[-1]) - turned} epochs after it, "
        f"to {val[-1]:.4g}, while the training loss kept falling: the net learns the training samples by heart."
        f"{weights} Try weight_decay= on the optimizer, nn.Dropout layers, more data, or a smaller patience=.",
        epochs=tuple(int(e) for e in epochs[best:]),
        evidence={
            "turned_at": turned,
            "best_val_loss": float(val[best]),
            "last_val_loss": float(val[-1]),
            "train_loss_at_turn": float(train[best]),
            "last_train_loss": float(train[-1]),
        },
    )


def _not_converged(curves: Curves, best_at: Optional[int]) -> Optional[Finding]:
    train = curves.train
    if len(train) < 2:
        return None
    drop = float(train[-2] - train[-1])
    pace = (train[0] - train[-1]) / (len(train) - 1)  # the average drop per epoch
    steady = len(train) >= 3 and drop > 0 and drop >= NOT_CONVERGED_PACE * pace
    if drop < NOT_CONVERGED_DROP * abs(train[0]) and not steady:
        return None
    if best_at is not None and best_at != int(curves.epochs[-1]):
        return None  # the monitored value was best at an earlier epoch: more of the same would not help it
    if curves.val is not None:
        val = curves.val[curves.validated]
        if not curves.validated[-1] or len(val) < 2 or val[-1] >= val[:-1].min():
            return None  # the validation loss has stopped improving: enough training
    last = int(curves.epochs[-1])
    return Finding(
        "not_converged",
        "info",
        f"Still improving at the last epoch: epoch {last} lowered the training loss from {train[-2]:.4g} to "
        f"{train[-1]:.4g}"
        + (", and the validation loss to its lowest" if curves.val is not None else "")
        + f". Train longer: fit(..., epochs={2 * last}) with patience= to stop when it levels off.",
        epochs=(last,),
        evidence={"train_loss_drop": drop, "first_train_loss": float(train[0])},
    )


def _underfitting(curves: Curves) -> Optional[Finding]:
    train = curves.train
    if len(train) <= FLAT_EPOCHS or train[0] <= 0:
        return None
    share = train[-1] / train[0]
    before_flat = train[-FLAT_EPOCHS - 1]
    improved = 1 - train[-FLAT_EPOCHS:].min() / before_flat if before_flat > 0 else 0.0
    if share < UNDERFIT_SHARE or improved >= FLAT_CHANGE:
        return None
    evidence: dict[str, Any] = {"first_train_loss": float(train[0]), "last_train_loss": float(train[-1])}
    alike = ""
    if curves.val is not None:
        validated = curves.validated
        val, train_then = curves.val[validated][-1], curves.train[validated][-1]
        if abs(val - train_then) > ALIKE * abs(train_then):
            return None
        evidence["last_val_loss"] = float(val)
        alike = f", and the validation loss is as high ({val:.4g})"
    return Finding(
        "underfitting",
        "warning",
        f"The training loss stopped near {train[-1]:.4g}, {share:.0%} of its first epoch's {train[0]:.4g}{alike}: "
        "the net learns little. Try a bigger net (more or wider layers), less regularisation (weight_decay=, "
        "nn.Dropout), or model.lr_find(train_data); noisy data may allow no better.",
        epochs=tuple(int(e) for e in curves.epochs[-FLAT_EPOCHS:]),
        evidence=evidence,
    )


LOSS_FUNCTION = "the loss function"
NET_ITSELF = "the net itself"  # the root module: its own forward's code, or its own weights
LOWER_LR = (
    "Lower the learning rate (model.lr_find(train_data) suggests one), or clip gradients with "
    "fit(..., gradient_clip_val=1.0)."
)


def _diverged(epoch: Optional[int], divergence: Optional[Divergence]) -> Finding:
    if divergence is not None:
        epoch = divergence.epoch
    evidence: dict[str, Any] = {"epoch": epoch}
    said = [f"The loss became NaN or infinite at epoch {epoch}, and fit stopped."]
    advice = LOWER_LR
    d = divergence
    if d is not None:
        known = {k: v for k, v in dataclasses.asdict(d).items() if v is not None and k != "epoch"}
        evidence.update({k: v for k, v in known.items() if k != "replayed" or v})
    if d is not None and d.batch is not None:
        dirty = [part for part, ok in (("inputs", d.inputs_finite), ("labels", d.labels_finite)) if ok is False]
        said.append(
            f"Replayed with the weights fit put back, batch {d.batch} of the {d.data} data still gives NaN or "
            "infinite values" + (f": its {' and '.join(dirty)} hold some." if dirty else ".")
        )
        if d.module is not None:
            said.append(f"The first to output NaN or infinite values was {_named(d.module)}.")
        if dirty:
            advice = "Clean the data first (model.doctor(train_data) finds NaN values)."
        elif d.module == LOSS_FUNCTION:
            advice = "Look for a log of 0 or a division by 0 in the loss (a relative error with a label of 0 has one)."
        elif d.module is not None:
            advice = "Look in its forward for a log, a square root or a division of values that can be 0 or negative."
    elif d is not None:
        if d.replayed:
            said.append(
                f"Replayed with the weights fit put back, all {d.replayed} batches of the {d.data} data gave finite "
                "values: the data and the loss are not to blame, the updates are."
            )
        if d.module is not None:
            said.append(f"When fit stopped, the first module holding NaN or infinite weights was {_named(d.module)}.")
        elif d.weights_finite:
            said.append("When fit stopped, the weights were still finite, but so large that a value overflowed.")
    said.append(advice)
    return Finding(
        "diverged", "error", " ".join(said), epochs=(epoch,) if epoch is not None else None, evidence=evidence
    )


def _named(module: str) -> str:
    return module if module in (LOSS_FUNCTION, NET_ITSELF) else f"the module {module!r}"


# -- what fit measured beside the history ------------------------------------------------------------


def _checked_timing(timing: pd.DataFrame) -> pd.DataFrame:
    if not isinstance(timing, pd.DataFrame) or not set(TIMING_COLUMNS) <= set(timing.columns):
        raise ValueError(
            f"timing must be a DataFrame with the columns {list(TIMING_COLUMNS)} (one row per epoch); "
            f"got {type(timing).__name__}"
            + (f" with the columns {list(timing.columns)}" if isinstance(timing, pd.DataFrame) else "")
            + "."
        )
    return timing


def _input_bound(timing: pd.DataFrame) -> list[Finding]:
    rows = timing.dropna(subset=["seconds", "data_wait_fraction"])
    if len(rows) > 1:
        rows = rows.iloc[1:]  # the first epoch starts the loader's workers
    seconds = rows["seconds"].to_numpy(dtype=float)
    if not len(rows) or seconds.sum() <= 0:
        return []
    waited = float((rows["data_wait_fraction"].to_numpy(dtype=float) * seconds).sum() / seconds.sum())
    if waited < INPUT_BOUND_FRACTION:
        return []
    epochs = tuple(int(e) for e in rows["epoch"])
    return [
        Finding(
            "input_bound",
            "info",
            f"The loop spent {waited:.0%} of its time waiting for the next batch: the data, not the net, sets the "
            "speed. Try DataLoader(..., num_workers=4, pin_memory=True), data held in memory as tensors, or "
            "lighter transforms.",
            epochs=epochs,
            evidence={"data_wait_fraction": waited, "seconds": float(seconds.sum())},
        )
    ]


def _overlap_finding(overlap: Overlap) -> Finding:
    return Finding(
        "train_val_overlap",
        "warning",
        f"{overlap.count} of the {overlap.compared} validation samples ({overlap.fraction:.0%}) are also in the "
        "training data: the validation scores look better than they are. Split the data once, before building "
        "the loaders (fit(X, y, validation_split=0.2) or torch.utils.data.random_split), and drop duplicates.",
        evidence={"count": overlap.count, "fraction": overlap.fraction, "compared": overlap.compared},
    )


__all__ = ["KINDS", "Divergence", "diagnose"]
