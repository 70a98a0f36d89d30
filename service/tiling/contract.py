"""The typed contract between the tiling service and its sandbox workers.

What crosses the process boundary is MLIR text plus these models (they pickle; no MLIR object
ever does). Errors cross typed as well: a worker's IRError (with diagnostics), PlanError (with
its group), ShapeHintError / SearchInputError or ModuleTooLargeError reaches the caller as the
same exception type with the same fields.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from service.hardware.model import HardwareModel
from service.ir.plan import Level, Plan
from service.ir.tasks import AppliedPlan

# Shape hints as a request gives them ({"arg0": [128, 1024]} or "128x1024"), and buckets.
# Strict ints: `true` is not a dim of 1.
ShapeHints = dict[str, list[StrictInt] | str]
Buckets = dict[str, list[StrictInt]]
Strategy = Literal["tpe", "nsga2", "random", "exhaustive", "supertiling"]


class _Contract(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --------------------------------------------------------------------------- analyse


class OpSummary(_Contract):
    """A tileable op as the store's module row summarises it."""

    uid: int
    name: str
    kind: str
    loop_ranges: list[int | None]


class GroupSite(_Contract):
    """An op that may anchor a tile group, with the signature its group records are stored by."""

    anchor: int
    signature: str


class ModuleAnalysis(_Contract):
    """`analyse_request`'s answer: what the service needs before it claims a decision."""

    fingerprint: str
    ops: list[OpSummary]
    groups: list[GroupSite]


# --------------------------------------------------------------------------- warm starts


class RelativeMember(BaseModel):
    """A fused op named by its signature and where it sits from the anchor (edges away)."""

    signature: str
    relation: Literal["producer", "consumer"]
    distance: int | None


class RelativeGroupPlan(BaseModel):
    """A group's plan with its members named by structure, not uid: replayable on another module.
    Stored as a group record's plan (extra keys of older records are ignored)."""

    anchor_signature: str
    fuse: list[RelativeMember]
    levels: list[Level]


class WarmStart(_Contract):
    """A stored group plan to translate onto this module's group anchored at `anchor`."""

    signature: str
    anchor: int
    relative: RelativeGroupPlan


# --------------------------------------------------------------------------- search


class SearchTask(_Contract):
    """`search_and_realise`'s input besides the module text."""

    hardware: HardwareModel
    budget: int
    seconds: float
    strategy: Strategy
    seed: int
    shape_hints: ShapeHints | None = None
    buckets: Buckets | None = None
    warm_starts: list[WarmStart] = Field(default_factory=list)
    # Whole plans of this very module to start from (a refinement starts from the stored plan).
    warm_plans: list[Plan] = Field(default_factory=list)
    # A search that resumes a decision someone else left half done (a job item whose worker
    # died): its trials are numbered after the kept ones, and it starts from their best plan.
    trial_offset: int = Field(default=0, ge=0)
    resume_plan: Plan | None = None
    # Time the K plans predicted fastest and IREE's default with IREE on this machine, and keep
    # the fastest measured (IREE's own config when its default wins). 0: prediction only.
    measure_top: int = Field(default=0, ge=0)


class AnchorCompilationInfo(_Contract):
    """IREE's `compilation_info` attribute for one contraction/convolution anchor."""

    op: str
    compilation_info: str
    # IREE 3.13 silently drops compilation_info on a convolution without a batch dim (see
    # docs/benchmarks.md, session 18).
    honoured_by_iree: bool


class TrialOutcome(_Contract):
    """One evaluated plan of the search, as the store keeps it."""

    number: int
    plan: Plan
    plan_hash: str
    feasible: bool
    cost: dict[str, Any] | None = None
    latency_s: float | None = None
    reason: str | None = None


class GroupBest(_Contract):
    """A group of the best plan, relative to its anchor, for the group records (warm starts)."""

    signature: str
    plan: RelativeGroupPlan
    latency_s: float


class PlanMeasurement(_Contract):
    """One IREE timing the search took (a top plan or IREE's default), as the store keeps it,
    with what it takes to predict it again (the plan; the module is the request's)."""

    plan_hash: str
    plan: dict[str, Any]
    role: Literal["candidate", "default"]
    host_key: str = Field(description="the CPU it ran on (service.measure.cache.host_key)")
    cpu_s: float | None = Field(default=None, description="CPU time per benchmark thread (cpu_per_core_s)")
    default_cpu_s: float | None = Field(default=None, description="IREE's default's, timed in the same rounds")
    ok: bool
    median_s: float | None = None
    samples_s: list[float] = Field(default_factory=list)
    cpu_median_s: float | None = None
    cpu_samples_s: list[float] = Field(default_factory=list)
    config: list[dict[str, Any]] = Field(default_factory=list, description="forced configs, or IREE's own for the default")
    error: str | None = None
    iree_version: str


class SearchStats(_Contract):
    """How the search went; stored on the decision as `search_stats`."""

    strategy: str
    budget: int
    seed: int
    evaluations: int
    evaluations_per_s: float
    complete: bool
    space_size: int
    warnings: list[str]
    dispatch: list[dict[str, Any]] | None
    buckets: list[dict[str, Any]] | None
    # "measured" when IREE timings picked the plan (see `measured`), else "predicted".
    chosen_by: Literal["measured", "predicted"] = "predicted"
    # The measurement block (service.search.refine.Refinement.summary) plus `top` (K) and `kept`:
    # "candidate" (a measured plan), "iree_default" (IREE's own config measured fastest) or
    # "predicted" (nothing could be measured; `not_measurable` says why). None: not measured.
    measured: dict[str, Any] | None = None
    # IREE's default config of the module's contraction and its predicted cost, and whether the
    # answer left the module to it (service.search.guard.tune_from_iree_default). None: unknown.
    iree_default: dict[str, Any] | None = None


class Realisation(_Contract):
    """A plan applied to one module text: what a decision answers in that module's own IR."""

    realised: AppliedPlan | None = Field(description="None when the plan leaves the module untiled")
    compilation_info: dict[str, AnchorCompilationInfo]
    tuning_spec: str | None = None
    no_tuning_spec: str | None = Field(default=None, description="why there is no tuning spec")


class SearchOutcome(_Contract):
    """`search_and_realise`'s answer: the best plan realised, and what the store keeps of the search."""

    plan: Plan
    predicted: dict[str, Any]
    baseline: dict[str, Any] | None
    realised: AppliedPlan | None = Field(description="None when the plan leaves the module untiled")
    compilation_info: dict[str, AnchorCompilationInfo]
    tuning_spec: str | None = Field(default=None, description="IREE tuning spec for the plan's contraction anchors")
    no_tuning_spec: str | None = Field(default=None, description="why there is no tuning spec")
    trials: list[TrialOutcome]
    group_bests: list[GroupBest]
    stats: SearchStats
    measurements: list[PlanMeasurement] = Field(default_factory=list)


# --------------------------------------------------------------------------- long searches


class SearchStopped(Exception):
    """A search stopped on purpose by its observer (a cancelled or released job item)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason

    def __reduce__(self):  # crosses the process boundary with its reason
        return (SearchStopped, (self.reason,))


class SearchObserver(Protocol):
    """Sees a search's trials as they are found, in the sandbox process (it must pickle).
    Raising SearchStopped from `trials` or `check` stops the search; nothing is realised nor
    returned."""

    def trials(self, trials: list[TrialOutcome]) -> None: ...

    def check(self) -> None:
        """Asked while no trials come (IREE compiling and timing the best plans): raise
        SearchStopped to stop; the running IREE tool is killed."""
