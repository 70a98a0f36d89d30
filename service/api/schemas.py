"""Request and response bodies of the HTTP API. Responses are built from ORM rows here, so no
ORM object ever reaches the wire."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from service.hardware.model import HardwareModel
from service.store.models import Decision, Trial
from service.tiling.hardware import HardwareSource, NamedHardware
from service.tiling.learning import CalibrationStatus, HardwareLearning, HostFidelity
from service.tiling.request import TilingRequest
from service.tiling.service import CacheState, TilingOutcome

__all__ = [
    "TilingRequest",
    "DecisionSummary",
    "DecisionOut",
    "DecisionPage",
    "TrialOut",
    "TrialPage",
    "HardwareOut",
    "HardwareDetail",
    "HardwareList",
    "Health",
    "Readiness",
    "ErrorBody",
]


# Response fields that are not ORM columns (computed, or about the request).
_DERIVED = {"status", "complete", "cache", "request_timings", "no_tuning_spec"}


class DecisionSummary(BaseModel):
    """A decision without its large texts (list pages)."""

    id: int
    key: str
    status: str
    module_fingerprint: str
    hardware_hash: str
    search_space_version: str
    cost_model_version: str
    objective: str
    shape_bucket: str
    provider_version: str
    plan: Any | None = None
    predicted_cost: dict[str, Any] | None = None
    baseline: dict[str, Any] | None = None
    complete: bool | None = Field(default=None, description="False when the search time limit cut the budget")
    error: str | None = None
    created_at: datetime
    updated_at: datetime

    @classmethod
    def from_row(cls, row: Decision, **extra: Any) -> "DecisionSummary":
        fields = {name: getattr(row, name) for name in cls.model_fields if name not in _DERIVED and hasattr(row, name)}
        fields["status"] = str(getattr(row.status, "value", row.status))
        fields["complete"] = (row.search_stats or {}).get("complete")
        if "no_tuning_spec" in cls.model_fields:
            fields["no_tuning_spec"] = (row.search_stats or {}).get("no_tuning_spec")
        return cls(**fields, **extra)


class DecisionOut(DecisionSummary):
    """A whole decision: plan, costs, the transform script, the tiled module and provenance."""

    cache: CacheState | None = Field(default=None, description="hit | warm | miss | refined (POST only)")
    transform_script: str | None = None
    tiled_module: str | None = None
    compilation_info: dict[str, Any] | None = Field(default=None, description="IREE compilation_info per anchor")
    tuning_spec: str | None = Field(default=None, description="IREE tuning spec giving the plan's contraction anchors "
                                    "their configs: iree-compile --iree-codegen-tuning-spec-path=FILE --mlir-disable-threading")
    no_tuning_spec: str | None = Field(default=None, description="why tuning_spec is null (a dynamic dim, a convolution, "
                                       "nothing tiled, ...)")
    origin_map: dict[str, Any] | None = None
    search_stats: dict[str, Any] | None = None
    timings: dict[str, Any] | None = Field(default=None, description="timings of the search that made it")
    request_timings: dict[str, float] | None = Field(default=None, description="timings of this request (POST only)")

    @classmethod
    def from_outcome(cls, outcome: TilingOutcome) -> "DecisionOut":
        """A POST's answer: the decision, its texts in the requester's own IR."""
        out = cls.from_row(outcome.decision, cache=outcome.cache, request_timings=outcome.timings)
        realisation = outcome.realisation
        if realisation is None:
            return out
        realised = realisation.realised
        return out.model_copy(update={
            "tiled_module": realised.tiled_module if realised else None,
            "transform_script": realised.transform_script if realised else None,
            "origin_map": realised.origin if realised else None,
            "compilation_info": {uid: info.model_dump() for uid, info in realisation.compilation_info.items()},
            "tuning_spec": realisation.tuning_spec,
            # The stored reason (IREE's default kept, by prediction or measurement) holds for any
            # text of the same structure; re-applying an untiled plan only knows it tiles nothing.
            "no_tuning_spec": None if realisation.tuning_spec else out.no_tuning_spec or realisation.no_tuning_spec,
        })


class DecisionPage(BaseModel):
    items: list[DecisionSummary]
    next_cursor: str | None = Field(description="pass as ?cursor= for the next page; null on the last")


class TrialOut(BaseModel):
    number: int
    plan: Any
    plan_hash: str
    feasible: bool
    cost: dict[str, Any] | None = None
    latency_s: float | None = None
    reason: str | None = None

    @classmethod
    def from_row(cls, row: Trial) -> "TrialOut":
        return cls(**{name: getattr(row, name) for name in cls.model_fields})


class TrialPage(BaseModel):
    items: list[TrialOut]
    next_cursor: str | None


class HardwareOut(BaseModel):
    name: str
    hash: str
    source: HardwareSource
    calibration_version: int | None = Field(
        default=None, description="the calibration fitted to this host's measurements that the name resolves to")
    spec: HardwareModel

    @classmethod
    def from_named(cls, named: NamedHardware) -> "HardwareOut":
        return cls(name=named.model.name, hash=named.model.content_hash(), source=named.source,
                   calibration_version=named.calibration_version, spec=named.model)


class HardwareDetail(HardwareOut):
    """A hardware model with its fidelity on this host's stored measurements and its calibration."""

    fidelity: HostFidelity
    calibration: CalibrationStatus

    @classmethod
    def from_parts(cls, named: NamedHardware, learning: HardwareLearning) -> "HardwareDetail":
        return cls(**HardwareOut.from_named(named).model_dump(), fidelity=learning.fidelity,
                   calibration=learning.calibration)


class HardwareList(BaseModel):
    items: list[HardwareOut]


class Health(BaseModel):
    status: Literal["ok"]


class Readiness(BaseModel):
    ready: bool
    detail: str


class ErrorInfo(BaseModel):
    error: str
    message: str
    diagnostics: list[dict[str, Any]] | None = None
    known: list[str] | None = None


class ErrorBody(BaseModel):
    detail: ErrorInfo | str | list[Any]
