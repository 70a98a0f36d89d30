"""Typed errors of the IR core. Each says what to fix; none is a crash."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Diagnostic:
    """One MLIR diagnostic, located in the submitted text when MLIR knows where."""

    message: str
    line: int | None = None
    column: int | None = None
    severity: str = "error"
    notes: tuple[str, ...] = ()

    def __str__(self) -> str:
        where = f"{self.line}:{self.column}: " if self.line is not None else ""
        return f"{where}{self.severity}: {self.message}"

    def to_json(self) -> dict:
        return {
            "message": self.message,
            "line": self.line,
            "column": self.column,
            "severity": self.severity,
            "notes": list(self.notes),
        }


class IRError(Exception):
    """Base class: anything the IR core rejects about its input."""

    def __reduce__(self):
        # Errors cross process boundaries (sandbox workers): rebuild them from their fields.
        if dataclasses.is_dataclass(self):
            return (self.__class__, tuple(getattr(self, f.name) for f in dataclasses.fields(self)))
        return super().__reduce__()

    def to_json(self) -> dict:
        out = {"error": type(self).__name__, "message": str(self)}
        diags = getattr(self, "diagnostics", None)
        if diags:
            out["diagnostics"] = [d.to_json() for d in diags]
        if getattr(self, "group", None) is not None:
            out["group"] = self.group
        return out


@dataclass
class MLIRSyntaxError(IRError):
    """The text (or bytecode) does not parse or does not verify."""

    diagnostics: list[Diagnostic] = field(default_factory=list)
    summary: str = "MLIR module does not parse"

    def __str__(self) -> str:
        lines = [self.summary] + [f"  {d}" for d in self.diagnostics]
        return "\n".join(lines)


class MLIRVerifyError(MLIRSyntaxError):
    """The module parsed but the verifier rejected it."""


@dataclass
class ModuleTooLargeError(IRError):
    """Too many operations. `counted` says which: the limit is on the operations in function
    bodies (top level: an op's own region, e.g. a linalg body, is not counted), and a second,
    looser bound applies to all operations including nested ones."""

    ops: int
    limit: int
    counted: str = "operations in function bodies (not counting ops nested in their regions)"

    def __str__(self) -> str:
        return f"module has {self.ops} {self.counted}, more than the limit of {self.limit}"


@dataclass
class PlanError(IRError):
    """A plan is malformed, breaks a rule (fuse groups) or MLIR cannot apply it."""

    reason: str
    group: int | None = None
    diagnostics: list[Diagnostic] = field(default_factory=list)

    def __str__(self) -> str:
        where = f"group {self.group}: " if self.group is not None else ""
        extra = "".join(f"\n  {d}" for d in self.diagnostics)
        return f"{where}{self.reason}{extra}"


@dataclass
class NotAModelError(IRError):
    """The text is not a whole model as IREE prints it for its dispatches."""

    message: str

    def __str__(self) -> str:
        return self.message


@dataclass
class InvalidTextError(IRError):
    """The module is not text MLIR can read (a lone surrogate, a NUL character)."""

    reason: str
    line: int | None = None
    column: int | None = None

    def __str__(self) -> str:
        where = f" at line {self.line}, column {self.column}" if self.line is not None else ""
        return f"the module is not valid UTF-8 text: {self.reason}{where}"


@dataclass
class NestingTooDeepError(IRError):
    """Brackets nest deeper than the limit: refused before MLIR's recursive parser sees them."""

    depth: int
    limit: int
    line: int
    column: int

    def __str__(self) -> str:
        return (f"the module is too deeply nested: brackets ({{ ( [ <) reach depth {self.depth} at line {self.line}, "
                f"column {self.column}, more than the limit of {self.limit}")


@dataclass
class _OpError(IRError):
    """An error about one op of the module, at its line and column when MLIR knows them."""

    op: str
    line: int | None = None
    column: int | None = None

    @property
    def op_where(self) -> str:
        return f"{self.op} at line {self.line}, column {self.column}" if self.line is not None else self.op


@dataclass
class FrontendDialectError(_OpError):
    """The module is a framework's program (torch dialect, as iree-import-onnx and iree-turbine
    write it), not linalg: nothing in it is tileable until IREE lowers it."""

    def __str__(self) -> str:
        return (f"{self.op_where} is torch dialect (what iree-import-onnx and iree-turbine write): tilesearch tiles "
                "linalg on tensors, IREE's input form. `tilesearch model tune FILE` lowers the model with IREE and tunes "
                "each dispatch; `iree-compile --compile-to=input FILE` prints its linalg")


@dataclass
class BufferSemanticsError(_OpError):
    """A linalg op works on memrefs: tilesearch tiles and fuses linalg on tensors (IREE's input
    form), and a config matched by shape would reach tensor ops it was never searched for."""

    def __str__(self) -> str:
        return (f"{self.op_where} works on memrefs (buffers): tilesearch tiles linalg on tensors, IREE's input "
                "form; give the module before bufferization (tensor operands, results returned)")
