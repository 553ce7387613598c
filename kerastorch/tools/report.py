"""The one pair of report types: a :class:`Diagnosis` holding :class:`Finding` objects.

Both reports use them: ``model.doctor(...)`` (the set-up, before training) and
:func:`~kerastorch.tools.diagnosis.diagnose` (the run, after training). Printing either gives a few
plain lines, one per finding, ``[severity] kind: message``; in Jupyter a small table.

Example::

    report = kt.diagnose(history)
    for finding in report.findings:
        print(finding.kind, finding.epochs, finding.evidence)
"""

from __future__ import annotations

import dataclasses
import html
from typing import Any, Optional

import pandas as pd

SEVERITIES = ("error", "warning", "info")
TIMING_COLUMNS = ("epoch", "seconds", "data_wait_fraction")
RUN_HEADING = "What the curves say:"


@dataclasses.dataclass(frozen=True)
class Finding:
    """One thing a report saw.

    Attributes:
        kind: what it is about. In the run's report one of ``"overfitting"``, ``"underfitting"``,
            ``"lr_too_high"``, ``"lr_too_low"``, ``"not_converged"``, ``"diverged"``,
            ``"input_bound"``, ``"train_val_overlap"`` (stable names, safe to compare with); in the
            doctor's report, the name of the check that found it (``check`` says the same).
        severity: ``"error"``, ``"warning"`` or ``"info"``.
        message: what was seen, in one or two plain sentences; the run's findings also say what
            to try there.
        fix: the doctor's what to type instead (empty for the run's findings).
        epochs: the epochs the finding is about, or None.
        evidence: the numbers it rests on, by name.
    """

    kind: str
    severity: str
    message: str
    fix: str = ""
    epochs: Optional[tuple[int, ...]] = None
    evidence: dict[str, Any] = dataclasses.field(default_factory=dict, hash=False)  # a Finding stays hashable

    @property
    def check(self) -> str:
        """The doctor's name for ``kind``: the check that found it."""
        return self.kind


def empty_timing() -> pd.DataFrame:
    """The timing of a run that measured none: no rows, the columns a measured one has."""
    return pd.DataFrame({"epoch": pd.Series(dtype="int64"), "seconds": [], "data_wait_fraction": []})


@dataclasses.dataclass
class Diagnosis:
    """A report: its findings in the order they were found; printing shows errors first.

    ``source`` says whose report it is: ``"doctor"`` (the set-up) or ``"run"`` (a fit's curves).
    ``timing`` is, for a run, one row per epoch: ``epoch``, ``seconds``, ``data_wait_fraction`` (the
    share of the epoch spent waiting for the next batch); an empty frame when not measured.
    """

    findings: list[Finding]
    source: str = "doctor"
    timing: pd.DataFrame = dataclasses.field(default_factory=empty_timing, repr=False)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "warning"]

    @property
    def ok(self) -> bool:
        """No error: training can start (the doctor), or ran without diverging (a run)."""
        return not self.errors

    @property
    def kinds(self) -> list[str]:
        """The findings' kinds, in the order found."""
        return [f.kind for f in self.findings]

    def by_severity(self) -> list[Finding]:
        return sorted(self.findings, key=lambda f: SEVERITIES.index(f.severity))

    def heading(self) -> str:
        """The first line printed: the doctor's counts, or "What the curves say:" for a run."""
        if self.source == "run":
            return RUN_HEADING
        if not self.findings:
            return "doctor: no problems found."
        return f"doctor: {len(self.errors)} error(s), {len(self.warnings)} warning(s)"

    def __str__(self) -> str:
        if self.source == "run" and not self.findings:
            return ""  # nothing to say: fit prints nothing
        lines = [self.heading()]
        for finding in self.by_severity():
            lines.append(f"[{finding.severity}] {finding.kind}: {finding.message}")
            if finding.fix:
                lines.append(f"    fix: {finding.fix}")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        if not self.findings:
            return "" if self.source == "run" else f"<p>{html.escape(self.heading())}</p>"
        with_fix = any(f.fix for f in self.findings)
        rows = "".join(
            f"<tr><td>{html.escape(f.severity)}</td><td><code>{html.escape(f.kind)}</code></td>"
            f"<td>{html.escape(f.message)}</td>"
            + (f"<td><code>{html.escape(f.fix)}</code></td>" if with_fix else "")
            + "</tr>"
            for f in self.by_severity()
        )
        what, seen = ("check", "what was seen") if self.source == "doctor" else ("kind", "what was seen, what to try")
        head = f"<tr><th>severity</th><th>{what}</th><th>{seen}</th>" + (
            "<th>what to do</th></tr>" if with_fix else "</tr>"
        )
        caption = f"<caption>{html.escape(self.heading())}</caption>"
        return f"<table>{caption}{head}{rows}</table>"


__all__ = ["RUN_HEADING", "SEVERITIES", "TIMING_COLUMNS", "Diagnosis", "Finding", "empty_timing"]
