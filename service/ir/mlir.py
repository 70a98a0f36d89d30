"""The ONE module that imports the MLIR Python bindings.

The upstream bindings ship inside `iree-base-compiler` (pinned in pyproject.toml). Swapping the
provider means editing this file only. Everything else imports `ir`, `linalg`, ... from here.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import shutil
import sys
from pathlib import Path

from iree.compiler import ir
from iree.compiler.dialects import func, linalg, tensor
from iree.compiler.dialects.transform import interpreter as transform_interpreter
from iree.compiler.passmanager import PassManager

__all__ = [
    "ir",
    "func",
    "linalg",
    "tensor",
    "transform_interpreter",
    "PassManager",
    "context",
    "provider_version",
    "tool_path",
    "attribute_names",
    "trust_ir_when_printing",
]

_PROVIDER = "iree-base-compiler"
_context: ir.Context | None = None
_printing_trusts_ir = False


def context() -> ir.Context:
    """This process's MLIR context. Creating one costs ~8 ms, so it is made once and reused.

    MLIR objects never leave the process: callers pass MLIR text between processes.
    """
    global _context
    if _context is None:
        _context = ir.Context()
    return _context


def trust_ir_when_printing() -> None:
    """Tell MLIR's printer, for the rest of this process, not to verify an op before printing it
    (the global option --mlir-print-assume-verified; valid IR prints the same either way).

    Upstream's fuse_into_containing_op prints the producer and the whole containing loop into a
    diagnostic on every fusion, failed or not, and the printer verifies what it prints: that
    verification dominates the cost of applying a plan. For the search's evaluation workers,
    which verify every tiled clone themselves. LLVM's options can be parsed once per process
    (IREE aborts on a second parse), hence the flag.
    """
    global _printing_trusts_ir
    if _printing_trusts_ir:
        return
    from iree.compiler.api import _initializeGlobalCL

    _initializeGlobalCL("tilesearch", "--mlir-print-assume-verified")
    _printing_trusts_ir = True


@functools.cache  # constant for the process; reading package metadata costs ~1 ms
def provider_version() -> str:
    """Name and version of the MLIR provider; part of every decision key."""
    return f"{_PROVIDER}=={importlib.metadata.version(_PROVIDER)}"


@functools.cache
def tool_path(name: str) -> str:
    """Path of an IREE/MLIR command-line tool (iree-opt, iree-compile, ...) from the same wheels:
    the native binary where the wheel ships one, not the console script that starts Python to run
    it (0.16 s and 0.24 CPU seconds a call, a third of a small job item's CPU: docs/benchmarks.md);
    else the script next to this interpreter (iree-import-onnx is Python), else PATH."""
    native = _native_tool(name)
    if native is not None:
        return native
    here = Path(sys.executable).parent / name
    if here.exists() and os.access(here, os.X_OK):
        return str(here)
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"{name} not found next to {sys.executable} or on PATH")
    return found


def _native_tool(name: str) -> str | None:
    """The compiler wheel's own binary (iree-compile, iree-opt, ...), or the runtime wheel's
    (iree-benchmark-module, iree-run-module, ...) beside its benchmark tool; None for another."""
    from iree.compiler.tools import binaries

    try:
        return binaries.find_tool(name)
    except ValueError:  # not one of the compiler's binaries
        pass
    from iree.runtime.benchmark import benchmark_exe

    candidate = Path(benchmark_exe()).resolve().parent / name
    return str(candidate) if candidate.is_file() and os.access(candidate, os.X_OK) else None


def attribute_names(op: ir.Operation) -> list[str]:
    """Names of an op's attributes (iteration yields names or NamedAttributes by version)."""
    return [a if isinstance(a, str) else a.name for a in op.attributes]
