"""IR work as plain functions over text, for sandbox workers (the CLI's inspect and apply).

Inputs are MLIR text (or bytecode) and JSON-shaped plans; outputs are pydantic models, which
pickle across the process boundary. Modules are parsed once per worker (`cached_analysis`).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from .analysis import cached_analysis
from .plan import Plan
from .transform import apply_plan


class ModuleInspection(BaseModel):
    """A module's fingerprint and op graph (`OpGraph.to_json`: ops, edges, fuse groups)."""

    fingerprint: str
    ops: list[dict[str, Any]]
    edges: list[dict[str, Any]]
    fuse_groups: dict[str, Any]


class AppliedPlan(BaseModel):
    """A plan applied to a clone of the module: the tiled text, its script and origin map."""

    tiled_module: str
    transform_script: str
    origin: dict[str, Any]


def inspect_module(source: str | bytes, max_ops: int | None = None) -> ModuleInspection:
    """Fingerprint and op graph of a module."""
    a = cached_analysis(source, max_ops=max_ops)
    return ModuleInspection(fingerprint=a.fingerprint, **a.graph.to_json())


def apply_plan_to_text(source: str | bytes, plan: Plan | dict[str, Any], max_ops: int | None = None) -> AppliedPlan:
    """Tiled module text, transform script and origin map for a plan (PlanError if it breaks a rule)."""
    a = cached_analysis(source, max_ops=max_ops)
    applied = apply_plan(a.tagged, Plan.model_validate(plan), a.graph)
    return AppliedPlan(tiled_module=str(applied.module), transform_script=applied.script, origin=applied.origin.to_json())
