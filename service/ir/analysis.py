"""One call from MLIR source to everything the rest of tilesearch needs to know about it."""

from __future__ import annotations

from dataclasses import dataclass

from .fingerprint import module_fingerprint
from .graph import OpGraph, build_graph, tag_tileable_ops
from .mlir import ir
from .parse import parse_module


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
    tagged = tag_tileable_ops(module)
    return Analysis(module=module, tagged=tagged, graph=build_graph(tagged), fingerprint=module_fingerprint(module))
