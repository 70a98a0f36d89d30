"""The origin map: which original op became which copies, in which loops (IRMapping-style).

Ops are tagged with `ts.uid` before cloning and MLIR carries a discardable attribute onto every
tiled and fused copy, so the tags ARE the mapping: reading the tiled clone tells, for each
original op, the loops each copy sits in and whether a copy still stands outside every loop
(a producer fused into one consumer that an un-fused consumer still reads).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .graph import OpGraph, walk_ops, uid_of
from .mlir import context, ir

LOOP_ATTR = "ts.loop"


@dataclass
class OpCopies:
    uid: int
    name: str
    loops: list[list[str]] = field(default_factory=list)  # per copy: enclosing ts.loop names, outermost first
    escapes: list[bool] = field(default_factory=list)  # per copy: its whole result leaves the loop nest

    @property
    def inside(self) -> list[list[str]]:
        return [lp for lp in self.loops if lp]

    @property
    def outside(self) -> bool:
        """An un-tiled copy still stands outside every loop."""
        return any(not lp for lp in self.loops)


@dataclass
class OriginMap:
    ops: dict[int, OpCopies]

    def copies(self, uid: int) -> OpCopies:
        return self.ops.get(uid, OpCopies(uid, "?"))

    def to_json(self) -> dict:
        return {
            str(uid): {
                "name": c.name,
                "copies": [{"loops": lp, "escapes": esc} for lp, esc in zip(c.loops, c.escapes)],
                "fused": bool(c.inside),
                "outside": c.outside,
            }
            for uid, c in sorted(self.ops.items())
        }


_SLICE_WRITES = ("tensor.insert_slice", "tensor.parallel_insert_slice")


def _result_escapes(op: ir.Operation) -> bool:
    """A tiled copy whose tile is written into a loop result: its full result materialises."""
    return any(use.owner.name in _SLICE_WRITES for r in op.results for use in r.uses)


def loop_group(op: ir.Operation) -> int | None:
    """The plan group (its index in the applied plan) whose tiling made this loop, read off its
    `ts.loop` label (`g<group>.l<level>[.d<anchor dim>]`); None for any other op."""
    if LOOP_ATTR not in op.attributes:
        return None
    label = ir.StringAttr(op.attributes[LOOP_ATTR]).value
    head = label.split(".", 1)[0]
    return int(head[1:]) if head[:1] == "g" and head[1:].isdigit() else None


def loop_level(op: ir.Operation) -> int | None:
    """The plan level (its index in the group's levels) whose tiling made this loop, read off its
    `ts.loop` label; None for any other op."""
    if LOOP_ATTR not in op.attributes:
        return None
    parts = ir.StringAttr(op.attributes[LOOP_ATTR]).value.split(".")
    return int(parts[1][1:]) if len(parts) > 1 and parts[1][:1] == "l" and parts[1][1:].isdigit() else None


def _enclosing_loops(op: ir.Operation) -> list[str]:
    names: list[str] = []
    parent = op.parent
    while parent is not None and parent.name != "func.func":
        if LOOP_ATTR in parent.attributes:
            names.append(ir.StringAttr(parent.attributes[LOOP_ATTR]).value)
        parent = parent.parent
    return list(reversed(names))


def origin_map(tiled: ir.Module | ir.OpView, graph: OpGraph) -> OriginMap:
    with context():
        result = {uid: OpCopies(uid, op.name) for uid, op in graph.ops.items()}
        for op in walk_ops(tiled.operation):
            uid = uid_of(op)
            if uid is None or uid not in result:
                continue
            loops = _enclosing_loops(op)
            result[uid].loops.append(loops)
            result[uid].escapes.append(bool(loops) and _result_escapes(op))
    return OriginMap(result)
