"""Bodies of /v1/jobs, built from the store's rows and summaries (no ORM object on the wire)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from service.jobs.contract import JobRequest
from service.store.jobs import JobSummary
from service.store.models import JobItem

__all__ = ["JobRequest", "JobAccepted", "JobOut", "JobPage", "ItemOut", "ItemPage", "ItemCounts"]

JobState = Literal["queued", "running", "succeeded", "failed", "cancelled"]


class ItemCounts(BaseModel):
    total: int
    queued: int
    running: int
    done: int
    failed: int
    cancelled: int


class ItemOut(BaseModel):
    id: int
    position: int
    name: str
    state: str
    weight: int = Field(description="times one run of the model dispatches it (1 for listed modules)")
    attempts: int = Field(description="runs started (more than one: taken over or retried)")
    trials: int = Field(description="trials stored, by every run")
    decision_id: int | None = Field(description="the decision (GET /v1/tilings/{id}) once done")
    cache: str | None = Field(description="hit, warm or miss")
    error: str | None
    started_at: datetime | None
    finished_at: datetime | None

    @classmethod
    def from_row(cls, row: JobItem) -> "ItemOut":
        return cls(id=row.id, position=row.position, name=row.name, state=row.state.value, weight=row.weight,
                   attempts=row.attempts, trials=row.trials, decision_id=row.decision_id, cache=row.cache,
                   error=row.error, started_at=row.started_at, finished_at=row.finished_at)


class ItemPage(BaseModel):
    items: list[ItemOut]
    next_cursor: str | None


class JobAccepted(BaseModel):
    id: int
    state: JobState
    items: ItemCounts


class JobOut(BaseModel):
    id: int
    state: JobState
    kind: str
    hardware: Any
    options: dict[str, Any]
    queue: str
    items: ItemCounts
    trials: int = Field(description="trials stored over all items")
    eta_s: float | None = Field(description="seconds left at the rate items have finished (None: none has yet)")
    notes: Any | None = Field(description="for a model: the dispatches left to IREE, with why")
    created_at: datetime
    items_detail: list[ItemOut] = Field(description="the first page of items; more at /v1/jobs/{id}/items")
    items_next_cursor: str | None

    @classmethod
    def from_summary(cls, summary: JobSummary, first_items: list[JobItem], next_cursor: str | None) -> "JobOut":
        job = summary.job
        return cls(id=job.id, state=summary.state, kind=job.kind, hardware=job.hardware, options=job.options,
                   queue=job.queue, items=counts(summary), trials=summary.trials, eta_s=summary.eta_s,
                   notes=job.notes, created_at=job.created_at,
                   items_detail=[ItemOut.from_row(i) for i in first_items], items_next_cursor=next_cursor)


class JobPage(BaseModel):
    items: list[JobOut]
    next_cursor: str | None


def counts(summary: JobSummary) -> ItemCounts:
    return ItemCounts(total=sum(summary.counts.values()), **summary.counts)
