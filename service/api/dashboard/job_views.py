"""View models of the jobs pages: a job's summary, its items with their decisions' predicted and
measured times, a model's dispatches left to IREE, and the items-finished-over-time series.

As in views.py, every number a template prints is computed here (None: no value, printed "—");
times are seconds. A model is not a stored concept of its own: it is submitted as a job
(kind "model") whose items are its tunable dispatches, so the model pages are these pages.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from service.api.dashboard.views import Measured, measured_of
from service.store.jobs import JobSummary
from service.store.models import Decision, JobItem

ACTIVE_STATES = ("queued", "running")
COUNT_ORDER = ("done", "running", "queued", "failed", "cancelled")


def hardware_label(hardware: Any) -> str:
    """A profile name, or an inline model's name (marked inline: this server may not know it)."""
    if isinstance(hardware, str):
        return hardware
    if isinstance(hardware, dict):
        return f"{hardware.get('name') or '?'} (inline)"
    return "?"


@dataclass
class JobRow:
    id: int
    kind: str  # "model" or "items"
    state: str
    counts: dict[str, int]
    total: int
    finished: int  # done + failed + cancelled
    percent: float
    trials: int
    eta_s: float | None
    hardware: str
    hardware_link: str | None  # a profile's page; None for an inline model
    options: dict[str, Any]
    created_at: datetime

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES


def job_row(summary: JobSummary) -> JobRow:
    job, counts = summary.job, summary.counts
    total = sum(counts.values())
    finished = counts.get("done", 0) + counts.get("failed", 0) + counts.get("cancelled", 0)
    return JobRow(
        id=job.id, kind=job.kind, state=summary.state, counts=counts, total=total, finished=finished,
        percent=100.0 * finished / total if total else 0.0, trials=summary.trials,
        eta_s=summary.eta_s if summary.state in ACTIVE_STATES else None,
        hardware=hardware_label(job.hardware),
        hardware_link=f"/hardware/{job.hardware}" if isinstance(job.hardware, str) else None,
        options=dict(job.options or {}), created_at=job.created_at,
    )


@dataclass
class ItemRow:
    id: int
    position: int
    name: str
    state: str
    weight: int
    trials: int
    attempts: int
    decision_id: int | None
    predicted_s: float | None  # the decision's predicted latency, one call
    weighted_s: float | None  # weight x predicted: this dispatch's share of one model run
    measured: Measured | None
    cache: str | None
    error: str | None
    no_spec: str | None = None  # why the item's decision adds nothing to the job's spec (IREE's default kept, ...)

    @property
    def why(self) -> str:
        """Tuned, or why not (yet): what the per-dispatch view says of this item."""
        cache = f" (cache {self.cache})" if self.cache else ""
        if self.state == "done" and self.no_spec:
            return f"not in the spec: {self.no_spec}{cache}"
        if self.state == "done":
            return "tuned" + cache
        if self.state == "failed":
            return "failed: " + (self.error or "no error recorded")
        if self.state == "cancelled":
            return "cancelled before it finished"
        return "searching" if self.state == "running" else "waiting for a worker"


def _latency(decision: Decision | None) -> float | None:
    value = ((decision.predicted_cost if decision else None) or {}).get("latency_s")
    return float(value) if isinstance(value, (int, float)) else None


def item_rows(items: list[JobItem], decisions: dict[int, Decision]) -> list[ItemRow]:
    rows = []
    for item in items:
        decision = decisions.get(item.decision_id) if item.decision_id is not None else None
        predicted = _latency(decision)
        rows.append(ItemRow(
            id=item.id, position=item.position, name=item.name, state=item.state.value, weight=item.weight,
            trials=item.trials, attempts=item.attempts, decision_id=item.decision_id, predicted_s=predicted,
            weighted_s=predicted * item.weight if predicted is not None else None,
            measured=measured_of(decision.search_stats) if decision else None, cache=item.cache, error=item.error,
            no_spec=(decision.search_stats or {}).get("no_tuning_spec") if decision else None,
        ))
    return rows


@dataclass(frozen=True)
class LeftToIree:
    name: str
    weight: int | None
    root_op: str | None
    reason: str


def left_to_iree(notes: Any) -> list[LeftToIree]:
    """A model job's dispatches tilesearch does not tune (IREE's default config applies), with why."""
    found = (notes or {}).get("left_to_iree") if isinstance(notes, dict) else None
    rows = []
    for d in found or []:
        if isinstance(d, dict):
            weight = d.get("weight")
            rows.append(LeftToIree(name=str(d.get("name") or "?"), weight=weight if isinstance(weight, int) else None,
                                   root_op=d.get("root_op") if isinstance(d.get("root_op"), str) else None,
                                   reason=str(d.get("reason") or "no reason recorded")))
    return rows


def finished_series(created_at: datetime, finished: list[tuple[datetime, str]]) -> dict[str, list[float]]:
    """Items finished (done, failed) against seconds since the job was created: the chart's data.
    Starts at (0, 0) so one finished item still draws a line."""
    start = _aware(created_at)
    times = sorted(max(0.0, (_aware(at) - start).total_seconds()) for at, _ in finished)
    return {"t_s": [0.0, *(round(t, 3) for t in times)], "finished": [0, *range(1, len(times) + 1)]}


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)  # SQLite reads back naive UTC
