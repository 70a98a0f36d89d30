"""What a search answers: the best plan, its cost, the baselines, the trials and the warnings."""

from __future__ import annotations

from pydantic import BaseModel, Field

from .candidate import Evaluation
from .space import SPACE_VERSION


class BucketResult(BaseModel):
    name: str
    value: int
    range: list[int | None] = Field(description="[low exclusive, high inclusive]; None = unbounded")
    shape_hints: dict[str, list[int]]
    plan: dict
    predicted: dict
    baseline: dict | None


class TuneResult(BaseModel):
    plan: dict = Field(description="best plan JSON ({'groups': []} = leave the module untiled)")
    plan_hash: str
    predicted: dict = Field(description="the best plan's cost (Cost.model_dump()): latency_s, feasible, bound_by, ...")
    feasible: bool
    baseline: dict | None = Field(description="the super-tiling baseline: plan and its cost")
    untiled: dict | None = None
    strategy: str
    seed: int
    budget: int
    seconds_limit: float | None
    evaluations: int = Field(description="distinct plans applied and costed")
    evaluations_per_s: float
    elapsed_s: float
    complete: bool = Field(description="False when the time budget cut the search short")
    space_size: int
    space_version: str = SPACE_VERSION
    groups: list[dict] = Field(default_factory=list, description="tile groups: anchor, members, stops with reasons, notes")
    trials: list[Evaluation] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    shape_hints: dict[str, list[int]] = Field(default_factory=dict)
    buckets: list[BucketResult] | None = None
    dispatch: list[dict] | None = Field(default=None, description="which bucket plan serves which range of the bucketed dim")
    measured: dict | None = Field(default=None, description="measure-in-the-loop refinement (service.search.refine): "
                                  "the top plans and IREE's default timed on this machine, and which answered")
    iree_default: dict | None = Field(default=None, description="IREE's default config of the module's contraction "
                                      "(service.search.guard): anchor, config, predicted_s, and whether it was kept "
                                      "(kept: the plan is untiled, IREE configures the op) and why")

    def summary(self) -> dict:
        """The CLI's --json shape."""
        return {
            "plan": self.plan,
            "predicted": {"latency_s": self.predicted.get("latency_s"), "feasible": self.feasible, "bound_by": self.predicted.get("bound_by"),
                          **({"reasons": self.predicted.get("reasons", [])} if not self.feasible else {})},
            "baseline": {"latency_s": (self.baseline or {}).get("latency_s"), "feasible": (self.baseline or {}).get("feasible")},
            "evaluations": self.evaluations,
            "evaluations_per_s": self.evaluations_per_s,
            "complete": self.complete,
            "warnings": self.warnings,
            **({"dispatch": self.dispatch} if self.dispatch else {}),
            **({"measured": self.measured} if self.measured else {}),
            **({"iree_default": self.iree_default} if self.iree_default else {}),
        }
