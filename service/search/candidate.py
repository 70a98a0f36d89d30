"""Candidates (what a strategy proposes) and evaluations (what the engine learned about them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, Field

from service.ir.plan import Plan


@dataclass
class Candidate:
    """Knob values a strategy proposed (`params`), for one group search or a whole plan."""

    params: dict[str, Any]
    source: str  # strategy name
    plan: Plan | None = None  # set by the strategy for whole-plan candidates (super tiling, warm start)
    token: Any = field(default=None, repr=False)  # strategy-private (e.g. an Optuna trial)


class Evaluation(BaseModel):
    """One evaluated (or pruned) candidate: everything the store and the dashboard need."""

    plan: dict | None = Field(description="plan JSON (None when the knobs did not form a plan)")
    plan_hash: str | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    source: str = ""
    feasible: bool = False
    latency_s: float | None = None
    peak_footprint_bytes: int | None = None
    bound_by: str | None = None
    reason: str | None = Field(default=None, description="why infeasible, rejected or pruned")
    stage: str = Field(default="cost", description="pruned | rejected (IR core) | cost")
    cost: dict | None = Field(default=None, description="the cost model's breakdown (Cost.model_dump())")
    seconds: float = 0.0
    cached: bool = False

    @property
    def objective(self) -> float:
        """What strategies minimise: latency, with anything unusable far behind."""
        if self.latency_s is None:
            return float("inf")
        return self.latency_s if self.feasible else self.latency_s * 1e3 + 1.0
