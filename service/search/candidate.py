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
    # The plan group (its index in the plan's canonical, anchor-sorted order) the IR core put a
    # rejection down to (PlanError.group). The search's own: `reason` says it to the caller.
    failed_group: int | None = Field(default=None, exclude=True)

    @property
    def objective(self) -> float:
        """What strategies minimise: latency, with anything unusable far behind. The scalar
        part of `rank`: it orders as `rank` does except among infeasible plans, whose broken
        limits it does not count."""
        if self.latency_s is None:
            return float("inf")
        return self.latency_s if self.feasible else self.latency_s * 1e3 + 1.0

    @property
    def violations(self) -> int:
        """Hardware limits the evaluation breaks (0 when feasible)."""
        if self.feasible:
            return 0
        return len(self.cost["reasons"]) if self.cost else 1 << 30

    @property
    def rank(self) -> tuple[int, float, str]:
        """Lower is better: feasible first, then fewer broken limits (the least bad plan when no
        plan fits: an op that cannot be tiled at all leaves every plan infeasible, and an
        infeasible plan's latency says little), then the objective, ties by plan hash."""
        return (self.violations, self.objective, self.plan_hash or "")


def is_better(best: Evaluation | None, other: Evaluation) -> bool:
    """Is `other` better than `best` so far (None: nothing yet)? Only costed evaluations count."""
    if other.latency_s is None:
        return False
    if best is None or best.latency_s is None:
        return True
    return other.rank < best.rank
