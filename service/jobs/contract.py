"""What a client submits as a job, and what the sandbox answers about a model's dispatches."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from service.hardware.model import HardwareModel
from service.tiling.contract import Strategy
from service.tiling.request import BoundedShapeHints

MAX_ITEMS = 2000


class JobItemIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=200)
    module: str = Field(min_length=1, description="MLIR module text")
    # As a tiling request's: a bad hint is refused on submit, not item by item on a worker.
    shape_hints: BoundedShapeHints | None = None


class ModelDispatch(BaseModel):
    """One of a model's dispatches that a job tunes: IREE's dispatch as a module of its own."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=200, description="IREE's function name of the dispatch")
    module: str = Field(min_length=1, description="the dispatch's MLIR module text")
    weight: int = Field(ge=1, strict=True, description="times one run of the model dispatches it")


class LeftToIree(BaseModel):
    """One of a model's dispatches that keeps IREE's own config, and why."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(max_length=200)
    weight: int | None = None
    root_op: str | None = Field(default=None, max_length=200)
    reason: str = Field(max_length=2000)
    dynamic: bool = Field(default=False, description="its shapes are dynamic: the model's inputs sized by shape hints "
                                                     "would make it static")


def _one_printable_line(text: str) -> bool:
    """Text a spec's header comment can carry as it is: one line, no control characters."""
    return bool(text.strip()) and not any(c < " " or c == "\x7f" for c in text)


class ModelItems(BaseModel):
    """A model's dispatches as a job takes them: the tunable ones, and why the others are not."""

    model_config = ConfigDict(extra="forbid")

    tunable: list[ModelDispatch] = Field(max_length=MAX_ITEMS)
    left_to_iree: list[LeftToIree] = Field(default_factory=list, max_length=10 * MAX_ITEMS)
    still_dynamic: list[str] = Field(default_factory=list, max_length=1000,
                                     description="the model's inputs its shape hints left open, `argN (type)`")

    @field_validator("still_dynamic")
    @classmethod
    def _header_lines(cls, inputs: list[str]) -> list[str]:
        """Named in the spec's header comment."""
        if bad := [i for i in inputs if len(i) > 500 or not _one_printable_line(i)]:
            raise ValueError(f'"still_dynamic" {bad[0][:80]!r}: one printable line of at most 500 characters each')
        return inputs

    def only_dynamic(self) -> list[str] | None:
        """The dispatches left to IREE for their dynamic shapes when nothing else tunes (the model
        needs its inputs sized), else None."""
        dynamic = [d.name for d in self.left_to_iree if d.dynamic]
        return dynamic if dynamic and not self.tunable else None

    def why_nothing_to_tune(self, model: str) -> str | None:
        """Why a job over `model` (how to name it) has no item, with the first reasons; None when
        one of its dispatches is tunable."""
        if self.tunable:
            return None
        return (f"{model} has no dispatch tilesearch tunes (a single static contraction root): "
                + "; ".join(f"{d.name}: {d.reason}" for d in self.left_to_iree[:5]))


class JobRequest(BaseModel):
    """A batch of searches. Each item's result is an ordinary decision: a later POST /v1/tilings
    of the same module on the same hardware is a hit."""

    model_config = ConfigDict(extra="forbid")

    items: list[JobItemIn] | None = Field(default=None, max_length=MAX_ITEMS)
    model: str | None = Field(default=None, description="a whole model (MLIR IREE compiles); its tunable dispatches "
                                                        "become the items")
    dispatches: ModelItems | None = Field(
        default=None, description="a model's dispatches as IREE formed them on the client (`tilesearch job submit "
                                  "MODEL` sends these, so a model's weights never cross the wire): the tunable ones "
                                  "become the items, with their weights")
    shape_hints: BoundedShapeHints | None = Field(
        default=None, description='a model\'s dynamic inputs sized, {"arg0": [1, 128]} (argN: its N-th input), as '
                                  "`model tune --shape-hint` sizes them: the job tunes the model so sized and its spec "
                                  'matches that model. With "dispatches", the sizes the client gave them (for the spec)')
    sized_model: str | None = Field(
        default=None, max_length=200, description='with "shape_hints": the file name of the model so sized where '
                                                  "the client is (`job submit` writes it), named in the spec's header")
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

    @field_validator("sized_model")
    @classmethod
    def _a_file_name(cls, name: str | None) -> str | None:
        """Written into the spec's header comment: one printable line naming a model file."""
        if name is None:
            return name
        if not _one_printable_line(name):
            raise ValueError('"sized_model" is the sized model\'s file name: printable characters on one line')
        if not name.lower().endswith((".mlir", ".onnx")):
            raise ValueError(f'"sized_model" {name!r}: a sized model is written as *.mlir or *.onnx, like the model')
        return name

    @model_validator(mode="after")
    def _one_input(self) -> "JobRequest":
        if sum(x is not None for x in (self.items, self.model, self.dispatches)) != 1:
            raise ValueError('give exactly one of "items" (a list of modules), "model" (MLIR text) or "dispatches" '
                             "(a model's dispatches formed by IREE)")
        if self.shape_hints is not None and self.items is not None:
            raise ValueError('"shape_hints" size a model\'s inputs: give each item its own "shape_hints" instead')
        if self.sized_model is not None and self.shape_hints is None:
            raise ValueError('"sized_model" names the model sized by "shape_hints": give "shape_hints" too')
        if self.sized_model is not None and self.model is not None and not self.sized_model.lower().endswith(".mlir"):
            raise ValueError(f'"sized_model" {self.sized_model!r}: the server sizes MLIR text, so the model so '
                             "sized is *.mlir")
        if self.items is not None and not self.items:
            raise ValueError('"items" is empty: give at least one module')
        names = ([i.name for i in self.items] if self.items is not None else
                 [d.name for d in self.dispatches.tunable] if self.dispatches is not None else [])
        if len(set(names)) != len(names):
            raise ValueError("item names must be unique within a job")
        return self

    @property
    def is_model(self) -> bool:
        return self.model is not None or self.dispatches is not None
