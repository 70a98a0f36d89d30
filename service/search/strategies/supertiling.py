"""Super tiling, the baseline every search scores: one whole plan, made without search.

Post-order DFS over the data-flow DAG; an op that does not fit the available memory is tiled
along one dim by footprint / available memory with its producers fused, and fuse groups (ops
of one later pattern) are tiled together. `supertiling_plan` makes the plan and
`SuperTilingStrategy` proposes it once.
"""

from __future__ import annotations

import math

from service.hardware.model import HardwareModel
from service.ir.errors import PlanError
from service.ir.graph import OpGraph
from service.ir.plan import Group, Level, Plan
from service.ir.transform import layout_group

from ..candidate import Candidate, Evaluation
from ..space import ShapeContext, innermost_memory, op_bytes


class SuperTilingStrategy:
    """The super tiling plan, proposed once."""

    def __init__(self, plan: Plan) -> None:
        self.name = "supertiling"
        self.plan = plan
        self.done = False

    def suggest(self) -> Candidate | None:
        if self.done:
            return None
        self.done = True
        return Candidate(params={}, source=self.name, plan=self.plan)

    def tell(self, candidate: Candidate, evaluation: Evaluation) -> None:
        pass


def _post_order(graph: OpGraph) -> list[int]:
    """DFS over the data-flow DAG from its sources along consumer edges, post-order: every op
    comes after all its consumers (so a consumer is tiled before its producers are considered)."""
    order: list[int] = []
    visited: set[int] = set()

    def visit(root: int) -> None:
        # Iterative (a chain of thousands of ops would exceed Python's recursion limit): each
        # stack entry is an op and the index of the next consumer to descend into.
        visited.add(root)
        stack = [(root, 0)]
        while stack:
            u, i = stack.pop()
            consumers = graph.op(u).consumers
            while i < len(consumers) and consumers[i] in visited:
                i += 1
            if i < len(consumers):
                stack.append((u, i + 1))
                visited.add(consumers[i])
                stack.append((consumers[i], 0))
            else:
                order.append(u)

    for u in graph.topological_order():
        if not graph.op(u).producers and u not in visited:
            visit(u)
    for u in graph.topological_order():  # ops on cycles through non-tileable ops (defensive)
        if u not in visited:
            visit(u)
    return order


def _fuse_group_footprint(graph: OpGraph, uid: int, shapes: ShapeContext) -> int:
    """Super tiling's footprint of a fuse group: an op counts only if no consumer is in its
    group; then the group's inputs (operands not produced inside the group) plus its output
    stand for the whole pattern."""
    op = graph.op(uid)
    members = {v for g in op.fuse_groups for v in graph.fuse_groups.get(g, [])}
    if any(c in members for c in op.consumers):
        return 0
    total = 0
    for m in members:
        mop = graph.op(m)
        inside = {e.operand for e in graph.edges_into(m) if e.producer in members}
        ranges = shapes.loop_ranges(mop)
        for i in range(mop.num_inputs):
            shape = mop.operand_shapes[i]
            if shape is None or i in inside:
                continue
            total += math.prod(s if s is not None else ranges[0] for s in shape) * 4
    out = op.result_shapes[0] if op.result_shapes else []
    return total + math.prod(s or 1 for s in out) * 4


def _fits_group(graph: OpGraph, anchor: int, fuse: list[int], sizes: list[int]) -> bool:
    try:
        layout_group(graph, 0, Group(anchor=anchor, fuse=fuse, levels=[Level(tile_sizes=sizes, loop="for")]))
        return True
    except PlanError:
        return False


def supertiling_plan(graph: OpGraph, hardware: HardwareModel, shapes: ShapeContext) -> tuple[Plan, list[str]]:
    """Super tiling as described: post-order DFS; an op not yet fused that does not fit the
    available memory is tiled along dim 1 (dim 0 if 1-D) by factor = footprint / available
    memory, its producers fused; repeat with a bigger factor while max-over-fused-ops / factor
    still does not fit. Available memory = the innermost level (super tiling's on-chip memory).
    Fused ops are never tiled again (its multi-consumer TODO, kept on purpose: this is the
    baseline)."""
    avail = innermost_memory(hardware)
    fused: set[int] = set()
    groups: list[Group] = []
    notes: list[str] = []
    for uid in _post_order(graph):
        if uid in fused:
            continue
        op = graph.op(uid)
        footprint = _fuse_group_footprint(graph, uid, shapes) if op.fuse_groups else op_bytes(op, shapes)
        if footprint <= avail or op.kind == "fill" and not op.fuse_groups:
            continue
        ranges = shapes.loop_ranges(op)
        if not ranges:
            continue
        dim = 1 if len(ranges) > 1 else 0
        producers = sorted(u for u in graph.upstream(uid) if u not in fused)
        # tileConsumerAndFuseProducersUsingSCF fuses what it can: drop producers MLIR's rules reject.
        fuse = producers
        if not _fits_group(graph, uid, fuse, [0] * dim + [1] + [0] * (len(ranges) - dim - 1)):
            direct = [e.producer for e in graph.edges_into(uid) if not e.via and e.producer not in fused]
            fuse = sorted(set(direct) | {v for d in direct for v in graph.upstream(d) if v not in fused})
            if not _fits_group(graph, uid, fuse, [0] * dim + [1] + [0] * (len(ranges) - dim - 1)):
                fuse = []
        factor = math.ceil(footprint / avail)
        biggest = max([op_bytes(graph.op(u), shapes) for u in [uid, *fuse]] + [footprint])
        while True:
            tile = max(1, math.ceil(ranges[dim] / factor))
            if biggest / factor <= avail or tile == 1:
                break
            factor = max(factor + 1, math.ceil(biggest / avail))
        if tile >= ranges[dim]:
            continue
        if biggest / factor > avail:
            notes.append(f"super tiling: op {uid} still does not fit with tile 1 on dim {dim}")
        sizes = [0] * len(ranges)
        sizes[dim] = tile
        members = {uid, *fuse}
        shared = [u for u in fuse if any(c not in members for c in graph.op(u).consumers)]
        # scf.for, as super tiling's tileConsumerAndFuseProducersUsingSCF; but MLIR aborts fusing a
        # producer with outside uses into scf.for, so those groups use scf.forall.
        loop = "forall" if shared and graph.op(uid).iterator_types[dim] == "parallel" else "for"
        if shared and loop == "for":
            fuse = [u for u in fuse if u not in shared]
        groups.append(Group(anchor=uid, fuse=fuse, levels=[Level(tile_sizes=sizes, loop=loop)]))
        fused.update(fuse)
        fused.add(uid)
    return Plan(groups=groups), notes
