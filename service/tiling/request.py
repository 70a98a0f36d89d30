"""A tiling request as clients send it: strict types and bounds that keep one request cheap.

Bounds (a 422 names the one broken):
  * each dim of a shape hint or bucket value is 1..MAX_DIM (2^24): the cost model's work grows
    with the extents, and 2^30 already costs one evaluation tens of seconds;
  * one argument's hinted shape holds at most MAX_ELEMENTS (2^40) elements, rank at most MAX_RANK;
  * at most MAX_HINTS hinted arguments, MAX_BUCKET_NAMES buckets and MAX_BUCKET_VALUES values in
    all buckets together (each value is a search of its own).
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from service.hardware.model import HardwareModel
from service.search.shapes import parse_shape_hints

from .contract import Buckets, ShapeHints, Strategy

MAX_DIM = 2**24
MAX_ELEMENTS = 2**40
MAX_RANK = 8
MAX_HINTS = 64
MAX_BUCKET_NAMES = 8
MAX_BUCKET_VALUES = 32
MAX_MEASURE_TOP = 16  # each one an IREE compile (about a second) and timed runs

# The API answers while the client waits, within the request timeout (60 s by default): 64
# plans take seconds. `tilesearch tune` runs on the user's own machine with no such limit and
# defaults to 300. A later request with a larger budget refines the stored decision.
API_DEFAULT_BUDGET = 64


def _check_dims(what: str, dims: list[int]) -> None:
    for d in dims:
        if not 1 <= d <= MAX_DIM:
            raise ValueError(f"{what}: dim {d} is out of range; each dim must be 1..{MAX_DIM} (2^24)")


def bounded_shape_hints(hints: ShapeHints | None) -> ShapeHints | None:
    """Hints written "128x1024" become [128, 1024]: one spelling, so both forms share a decision.
    Bounded here, before any worker sees them (a tiling request's and a job item's alike)."""
    if not hints:
        return hints
    if len(hints) > MAX_HINTS:
        raise ValueError(f"{len(hints)} shape hints; at most {MAX_HINTS}")
    parsed = parse_shape_hints(hints)
    for name, dims in parsed.items():
        if len(dims) > MAX_RANK:
            raise ValueError(f"shape hint {name}: rank {len(dims)}; at most {MAX_RANK}")
        _check_dims(f"shape hint {name}", dims)
        if math.prod(dims) > MAX_ELEMENTS:
            raise ValueError(f"shape hint {name}: {math.prod(dims)} elements; at most {MAX_ELEMENTS} (2^40)")
    return parsed


# Shape hints as every request takes them (a tiling request, a job's model and each of its items).
BoundedShapeHints = Annotated[ShapeHints, AfterValidator(bounded_shape_hints)]


class TilingRequest(BaseModel):
    # Strict where a lax coercion would change the request: `true` is not a budget of 1.
    model_config = ConfigDict(extra="forbid")

    module: str = Field(description="MLIR module text")
    hardware: str | HardwareModel = Field(description="a hardware profile name or an inline model")
    budget: int = Field(default=API_DEFAULT_BUDGET, ge=1, le=5000, strict=True,
                        description="distinct plans to evaluate (the CLI's default is 300: it has no request timeout)")
    seconds: float | None = Field(default=None, gt=0, le=3600, strict=True,
                                  description="search time limit (at most 0.8 x the server's request timeout)")
    strategy: Strategy = "tpe"
    seed: int = Field(default=0, ge=0, le=2**31 - 1, strict=True)
    shape_hints: BoundedShapeHints | None = Field(
        default=None, description='every dim of a dynamic argument, e.g. {"arg0": [128, 1024]} or {"arg0": "128x1024"}; '
                                  '"f2.arg0" names the argument of function @f2 only; '
                                  f"each dim 1..{MAX_DIM}, at most {MAX_ELEMENTS} elements per argument")
    buckets: Buckets | None = Field(
        default=None, description=f'e.g. {{"arg0.0": [1, 16, 128]}}; at most {MAX_BUCKET_NAMES} buckets and '
                                  f"{MAX_BUCKET_VALUES} values in all, each 1..{MAX_DIM}")
    reuse: bool = Field(default=True, strict=True,
                        description="serve a stored decision / warm-start from stored groups")
    objective: Literal["latency"] = "latency"
    measure_top: int = Field(default=0, ge=0, le=MAX_MEASURE_TOP, strict=True,
                             description="time the K plans predicted fastest and IREE's default with IREE on the "
                                         "server's CPU (hardware host-cpu only) and keep the fastest measured; "
                                         "0: the predicted best. search_stats.chosen_by says which")

    @field_validator("buckets")
    @classmethod
    def _bounded_buckets(cls, buckets: Buckets | None) -> Buckets | None:
        if not buckets:
            return buckets
        if len(buckets) > MAX_BUCKET_NAMES:
            raise ValueError(f"{len(buckets)} buckets; at most {MAX_BUCKET_NAMES}")
        total = sum(len(values) for values in buckets.values())
        if total > MAX_BUCKET_VALUES:
            raise ValueError(f"{total} bucket values in all; at most {MAX_BUCKET_VALUES}")
        for name, values in buckets.items():
            _check_dims(f"bucket {name}", values)
        return buckets

    @model_validator(mode="after")
    def _measures_one_shape(self) -> "TilingRequest":
        if self.measure_top and self.buckets:
            raise ValueError("measure_top measures one shape: give shape_hints instead of buckets")
        return self
