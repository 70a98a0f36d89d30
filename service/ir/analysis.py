"""One call from MLIR source to everything the rest of tilesearch needs to know about it, and
the one per-process cache of analysed modules (workers see the same module many times)."""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

from .fingerprint import module_fingerprint
from .graph import OpGraph, build_graph, tag_tileable_ops
from .mlir import context, ir
from .parse import check_op_counts, check_tensor_semantics, parse_module

ANALYSES_KEPT = 16
# Parsed modules hold their constants: the cache also stops at this much source text (a
# parsed module takes a few times its text in memory).
ANALYSES_KEPT_BYTES = 32 * 1024 * 1024


@dataclass
class Analysis:
    """A parsed module, its uid-tagged copy (what plans are applied to) and its op graph."""

    module: ir.Module
    tagged: ir.OpView
    graph: OpGraph
    fingerprint: str


def analyze(source: str | bytes, *, max_ops: int | None = None) -> Analysis:
    """Parse, verify, tag tileable ops and build the op graph. Raises the IR core's typed errors."""
    module = parse_module(source, max_ops=max_ops)
    with context():
        check_tensor_semantics(module)
    tagged = tag_tileable_ops(module)
    return Analysis(module=module, tagged=tagged, graph=build_graph(tagged), fingerprint=module_fingerprint(module))


def source_key(source: str | bytes) -> str:
    """What the caches of one process know a module by: the sha256 of its text (or bytecode)."""
    data = source if isinstance(source, bytes) else source.encode("utf-8", "surrogatepass")
    return hashlib.sha256(data).hexdigest()


@dataclass
class _Cached:
    analysis: Analysis
    size: int
    checked_max_ops: int | None = None  # the smallest op limit this module passed


_analyses: OrderedDict[str, _Cached] = OrderedDict()


def cached_analysis(source: str | bytes, max_ops: int | None = None) -> Analysis:
    """`analyze`, kept for the last ANALYSES_KEPT module texts of this process.

    `max_ops` holds on every call, also when the text was first analysed without a limit.
    The result is shared: callers must not mutate its module (plans are applied to clones).
    """
    key = source_key(source)
    cached = _analyses.get(key)
    if cached is None:
        cached = _Cached(analyze(source, max_ops=max_ops), size=len(source), checked_max_ops=max_ops)
        _analyses[key] = cached
        while len(_analyses) > 1 and (len(_analyses) > ANALYSES_KEPT
                                      or sum(c.size for c in _analyses.values()) > ANALYSES_KEPT_BYTES):
            _analyses.popitem(last=False)
    else:
        _analyses.move_to_end(key)
        if max_ops is not None and (cached.checked_max_ops is None or max_ops < cached.checked_max_ops):
            check_op_counts(cached.analysis.module, max_ops)
            cached.checked_max_ops = max_ops
    return cached.analysis
