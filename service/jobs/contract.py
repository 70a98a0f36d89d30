"""What a client submits as a job, and what the sandbox answers about a model's dispatches."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from service.hardware.model import HardwareModel
from service.tiling.contract import ShapeHints, Strategy

MAX_ITEMS = 2000


class JobItemIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=200)
    module: str = Field(min_length=1, description="MLIR module text")
    shape_hints: ShapeHints | None = None


class JobRequest(BaseModel):
    """A batch of searches. Each item's result is an ordinary decision: a later POST /v1/tilings
    of the same module on the same hardware is a hit."""

    model_config = ConfigDict(extra="forbid")

    items: list[JobItemIn] | None = Field(default=None, max_length=MAX_ITEMS)
    model: str | None = Field(default=None, description="a whole model (MLIR IREE compiles); its tunable dispatches "
                                                        "become the items")
    hardware: str | HardwareModel = Field(description="a hardware profile name or an inline model")
    # Strict as a tiling request's (service.tiling.request): "5", 1.0 or true is not a budget.
    budget: int = Field(default=64, ge=1, le=5000, strict=True, description="distinct plans to evaluate per item")
    seconds: float | None = Field(default=None, gt=0, le=3600, strict=True, description="search time limit per item")
    strategy: Strategy = "tpe"
    seed: int = Field(default=0, ge=0, le=2**31 - 1, strict=True)
    measure_top: int = Field(default=0, ge=0, le=16, strict=True,
                             description="K best plans per item timed with IREE on the worker; such items run only on "
                                         "workers of the job's hardware")
    reuse: bool = Field(default=True, strict=True)

    @model_validator(mode="after")
    def _one_input(self) -> "JobRequest":
        if (self.items is None) == (self.model is None):
            raise ValueError('give exactly one of "items" (a list of modules) or "model" (MLIR text)')
        if self.items is not None and not self.items:
            raise ValueError('"items" is empty: give at least one module')
        if self.items is not None and len({i.name for i in self.items}) != len(self.items):
            raise ValueError("item names must be unique within a job")
        return self


class ModelDispatch(BaseModel):
    name: str
    module: str
    weight: int


class ModelItems(BaseModel):
    """A model's dispatches as a job takes them: the tunable ones, and why the others are not."""

    tunable: list[ModelDispatch]
    left_to_iree: list[dict[str, str | int | None]]
