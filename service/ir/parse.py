"""MLIR text or bytecode -> verified module, or a typed error with line, column and message."""

from __future__ import annotations

from .errors import BufferSemanticsError, Diagnostic, FrontendDialectError, InvalidTextError, MLIRSyntaxError, MLIRVerifyError, ModuleTooLargeError
from .lexical import check_text
from .mlir import context, ir

BYTECODE_MAGIC = b"ML\xefR"


def location_of(loc: ir.Location) -> tuple[int | None, int | None]:
    """Line and column of a diagnostic: the first file location found inside `loc`."""
    try:
        flc = ir.FileLineColLoc(loc)
        return flc.start_line, flc.start_col
    except (TypeError, ValueError):
        pass
    for wrapper, inner in ((ir.CallSiteLoc, "caller"), (ir.NameLoc, "child_loc")):
        try:
            return location_of(getattr(wrapper(loc), inner))
        except (TypeError, ValueError, AttributeError):
            continue
    return None, None


def diagnostics_of(err: ir.MLIRError) -> list[Diagnostic]:
    """Typed diagnostics from an MLIRError (several when MLIR reports several)."""
    out: list[Diagnostic] = []
    for diag in err.error_diagnostics:
        line, col = location_of(diag.location)
        out.append(
            Diagnostic(
                message=str(diag.message),
                line=line,
                column=col,
                severity="error",
                notes=tuple(str(n.message) for n in diag.notes),
            )
        )
    if not out:
        out.append(Diagnostic(message=str(err)))
    return out


def count_ops(module: ir.Module) -> int:
    count = 0

    def visit(_op: ir.Operation) -> ir.WalkResult:
        nonlocal count
        count += 1
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return count


# All operations, nested ones included, may be this many times the limit on body operations
# (a linalg op's body holds a few ops of its own).
NESTED_OPS_FACTOR = 10


def count_body_ops(module: ir.Module) -> int:
    """Operations in function bodies plus other module-level ops: what the op limit counts
    (an op's own regions, e.g. a linalg body or a loop's body, are not counted)."""
    count = 0
    for op in module.body.operations:
        regions = list(op.operation.regions)
        if not regions:
            count += 1
        for region in regions:
            for block in region.blocks:
                count += len(block.operations)
    return count


def check_op_counts(module: ir.Module, max_ops: int) -> None:
    """ModuleTooLargeError past `max_ops` body operations, or past NESTED_OPS_FACTOR times that
    counting every nested operation."""
    body = count_body_ops(module)
    if body > max_ops:
        raise ModuleTooLargeError(ops=body, limit=max_ops)
    total, nested_limit = count_ops(module), max_ops * NESTED_OPS_FACTOR
    if total > nested_limit:
        raise ModuleTooLargeError(ops=total, limit=nested_limit,
                                  counted="operations counting those nested in regions")


def decode_source(data: bytes) -> str | bytes:
    """A file's bytes as MLIR takes them: bytecode as bytes, anything else as UTF-8 text.
    InvalidTextError names the line and column (in bytes) of the first byte that is not UTF-8."""
    if data.startswith(BYTECODE_MAGIC):
        return data
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line_start = data.rfind(b"\n", 0, exc.start) + 1
        raise InvalidTextError(f"it contains byte 0x{data[exc.start]:02x} ({exc.reason})",
                               data.count(b"\n", 0, exc.start) + 1, exc.start - line_start + 1) from None


def parse_module(source: str | bytes, *, max_ops: int | None = None) -> ir.Module:
    """Parse and verify MLIR text or bytecode in this process's context.

    Raises InvalidTextError (bytes that are not UTF-8, a lone surrogate, NUL) or NestingTooDeepError before MLIR sees the
    text, MLIRSyntaxError (with diagnostics) for text MLIR cannot parse, MLIRVerifyError when
    the verifier rejects the module, ModuleTooLargeError past `max_ops` (see check_op_counts).
    """
    if isinstance(source, (bytes, bytearray)):
        source = decode_source(bytes(source))
    if isinstance(source, str):
        check_text(source)
    if isinstance(source, str) and not source.strip():
        raise MLIRSyntaxError([Diagnostic("empty module: the text holds nothing but whitespace; send the MLIR module to tile")])
    with context():
        try:
            module = ir.Module.parse(source)
        except ir.MLIRError as err:
            raise MLIRSyntaxError(diagnostics_of(err)) from None
        if max_ops is not None:
            check_op_counts(module, max_ops)
        try:
            module.operation.verify()
        except ir.MLIRError as err:
            raise MLIRVerifyError(diagnostics_of(err), summary="MLIR module does not verify") from None
    return module


def check_tensor_semantics(module: ir.Module) -> None:
    """Raise BufferSemanticsError, naming the first linalg op that reads or writes a memref, or
    FrontendDialectError, naming the first torch-dialect op (a model not yet lowered to linalg)."""
    found: list[ir.Operation] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        if op.name.startswith("torch.") or (op.name.startswith("linalg.") and any(
                isinstance(v.type, (ir.MemRefType, ir.UnrankedMemRefType)) for v in op.operands)):
            found.append(op)
            return ir.WalkResult.INTERRUPT
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit, ir.WalkOrder.PRE_ORDER)
    if found:
        line, column = location_of(found[0].location)
        error = FrontendDialectError if found[0].name.startswith("torch.") else BufferSemanticsError
        raise error(found[0].name, line, column)
