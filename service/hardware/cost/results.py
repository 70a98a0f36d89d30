"""What a cost estimate returns: per memory level, per loop nest, and for the module."""

from __future__ import annotations

from pydantic import BaseModel, Field


class LevelCost(BaseModel):
    name: str
    footprint_bytes: int = Field(description="Largest live set assigned to this level (one iteration of the loop depth meant for it).")
    traffic_bytes: int = Field(description="Bytes this level serves to the next inner level (innermost: to the compute units).")
    capacity_bytes: int
    time_s: float = 0.0


class NestCost(BaseModel):
    root_op: str
    uids: list[int]
    loops: list[dict] = Field(description="Loop nodes: depth, kind, trips, footprint_bytes.")
    latency_s: float
    compute_s: float
    overhead_s: float
    bound_by: str
    flops: float
    flops_by_uid: dict[int, float] = Field(default_factory=dict)
    active_cores: int
    waves: int
    levels: list[LevelCost]
    reasons: list[str] = Field(default_factory=list, description="This nest's share of Cost.reasons.")


class Cost(BaseModel):
    hardware: str
    hardware_hash: str
    latency_s: float
    feasible: bool
    reasons: list[str] = Field(default_factory=list, description="Why infeasible (empty when feasible).")
    notes: list[str] = Field(default_factory=list, description="Soft findings: cache overflows, defaulted dynamic dims.")
    bound_by: str
    levels: list[LevelCost]
    flops: float
    recompute_flops: float
    unfused_intermediate_bytes: int = 0
    nests: list[NestCost]



def kib(b: float) -> str:
    """A byte count for a reason or a note."""
    return f"{b / 1024:.0f} KiB" if b < 10 * 1024 * 1024 else f"{b / 1024 / 1024:.1f} MiB"
