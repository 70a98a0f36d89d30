"""Memory per loop node: what one iteration keeps live (footprint) and what a level of given
capacity fetches (misses).

- Footprint of one iteration of a node = data brought in from outside the node (deduplicated,
  union over inner loops) + the peak of intermediates live at once in its body (real program
  order, destination-passing ops reuse their dying init), not a max over ops.
- Traffic into a level of capacity C: walk down the tree to the shallowest node whose one
  iteration fits C; from there, every slice from outside is fetched once per iteration in which
  it changes (invariant slices stay resident across iterations), times the enclosing trips.
"""

from __future__ import annotations

from service.ir.graph import holder_in
from service.ir.mlir import ir

from .analyzer import Analyzer
from .nest import Node, Slice
from .ops import dps_inits, is_tileable, opname


def _defined_inside(node: Node, v: ir.Value, an: Analyzer) -> bool:
    owner = an.value_node.get(v)
    while owner is not None:
        if owner is node:
            return True
        owner = owner.parent
    return False


def outside_slices(node: Node, an: Analyzer) -> list[tuple[Slice, int]]:
    """Slices in node's subtree whose data lives outside node, deduplicated, with their union
    bytes over one iteration of node (inner loops that move the slice multiply it, capped at the
    source tensor)."""
    if node.id not in an.outside:
        an.outside[node.id] = _compute_outside_slices(node, an)
    return an.outside[node.id]


def _compute_outside_slices(node: Node, an: Analyzer) -> list[tuple[Slice, int]]:
    seen: dict[tuple, tuple[Slice, int]] = {}
    for n in node.subtree():
        for s in n.slices:
            if _defined_inside(node, s.source, an):
                continue
            inner_moves = 1
            m = n
            while m is not node:
                if m.id in s.deps:
                    inner_moves *= m.trips
                m = m.parent
            union = min(s.bytes * inner_moves, s.source_bytes or s.bytes * inner_moves)
            key = (s.key, n.id if n is not node else None)
            if key not in seen or seen[key][1] < union:
                seen[key] = (s, union)
    # A read and a write of the same tile are one buffer.
    by_tile: dict[tuple, tuple[Slice, int]] = {}
    for (k, _), (s, u) in seen.items():
        if k not in by_tile or by_tile[k][1] < u:
            by_tile[k] = (s, u)
    return list(by_tile.values())


def intermediate_peak(node: Node, an: Analyzer) -> int:
    """Peak bytes of intermediates (linalg results used by later ops) live at once in node's body."""
    if node.id not in an.intermediate_peaks:
        an.intermediate_peaks[node.id] = _compute_intermediate_peak(node, an)
    return an.intermediate_peaks[node.id]


def _compute_intermediate_peak(node: Node, an: Analyzer) -> int:
    items = node.items
    position = {op.operation: i for i, op in enumerate(items)}
    live: dict[ir.Value, tuple[int, int, int]] = {}  # value -> (start, end, bytes)
    for i, op in enumerate(items):
        if not is_tileable(op):
            continue
        for r in op.results:
            uses = list(r.uses)
            end = _last_use(uses, position)
            if end is None or all(opname(u.owner) in ("tensor.insert_slice", "tensor.parallel_insert_slice", "scf.yield") for u in uses):
                continue  # the nest's output tile: counted as its destination slice
            size = an.bytes_of(r)
            inits = dps_inits(op)
            # An op writing into a dying intermediate reuses that buffer.
            for init in inits:
                if init in live and live[init][1] == i:
                    start, _, b = live.pop(init)
                    live[r] = (start, end, max(b, size))
                    break
            else:
                live[r] = (i, end, size)
    peak = 0
    child_peak = {id(c.op): intermediate_peak(c, an) for c in node.children}
    for i, op in enumerate(items):
        here = sum(b for s, e, b in live.values() if s <= i <= e) + child_peak.get(id(op), 0)
        peak = max(peak, here)
    return peak


def _last_use(uses, position: dict) -> int | None:
    """Index of the last body op (`position`: op -> index) using a value, directly or nested."""
    last = None
    for use in uses:
        holder = holder_in(use.owner.operation, position)
        if holder is not None:
            i = position[holder]
            last = i if last is None or i > last else last
    return last


def node_footprint(node: Node, an: Analyzer, cache: dict[int, int]) -> int:
    if node.id not in cache:
        cache[node.id] = sum(u for _, u in outside_slices(node, an)) + intermediate_peak(node, an)
    return cache[node.id]


def misses(node: Node, capacity: float, an: Analyzer, fp: dict[int, int], whole: float | None = None,
           of: ir.Value | None = None) -> float:
    """Bytes brought into a level of `capacity` (a core's share) during ONE execution of `node`
    (all its trips). `whole`: the level's full capacity when all cores share it. The footprint of
    the root or of the distributed forall is the union of what every core touches, so it is
    held against the whole shared cache; one iteration's footprint, against a core's share.
    `of`: only the bytes of tiles cut from this tensor (Analyzer.root_tensor)."""
    def counted(s: Slice) -> bool:
        return of is None or an.root_tensor(s.source) == of

    limit = whole if whole is not None and node.kind in ("root", "forall") else capacity
    if node_footprint(node, an, fp) <= limit:
        total = 0.0
        for s, union in outside_slices(node, an):
            # Invariant in this loop: stays resident across its iterations.
            if counted(s):
                total += union * (node.trips if node.id in s.deps else 1)
        return total
    per_iteration = 0.0
    for s in node.slices:
        if not _defined_inside(node, s.source, an) or s.node is node:
            if _feeds_compute_here(s, node) and counted(s):
                per_iteration += s.bytes
    if of is None:
        for c in node.computes:  # intermediates spill when the iteration does not fit
            per_iteration += sum(an.bytes_of(r) for r in c.op.results)
    for child in node.children:
        per_iteration += misses(child, capacity, an, fp, whole, of)
    return per_iteration * node.trips


def _feeds_compute_here(s: Slice, node: Node) -> bool:
    """A slice counts at this level unless it is only sliced further by inner loops (then the
    inner loops fetch the parts)."""
    if s.is_write or not node.children:
        return True
    return bool(node.computes)
