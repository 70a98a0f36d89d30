"""Group records: a group's best plan stored relative to its anchor, members named by op
signature and relation, so that it can be replayed on another module whose ops have the same
structure (a tuning database keyed by group structure)."""

from __future__ import annotations

import hashlib
import json

from service.ir.errors import PlanError
from service.ir.graph import OpGraph
from service.ir.plan import Group, Plan
from service.ir.transform import check_plan

from .contract import RelativeGroupPlan, RelativeMember, WarmStart


def group_signature(graph: OpGraph, anchor: int) -> str:
    """The anchor's structure and its direct neighbourhood: equal for the 'same' group elsewhere."""
    op = graph.op(anchor)
    parts = {
        "anchor": op.signature,
        "producers": sorted(graph.op(p).signature for p in op.producers),
        "consumers": sorted(graph.op(c).signature for c in op.consumers),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


def _distance(graph: OpGraph, src: int, dst: int, forward: bool) -> int | None:
    """Edges from src to dst along consumers (forward) or producers; None if unreachable."""
    frontier, seen, d = {src}, {src}, 0
    while frontier:
        if dst in frontier:
            return d
        nxt = set()
        for u in frontier:
            nxt |= set(graph.op(u).consumers if forward else graph.op(u).producers)
        frontier = nxt - seen
        seen |= nxt
        d += 1
    return None


def relative_group_plan(graph: OpGraph, group: Group) -> RelativeGroupPlan:
    """A plan group with members named by signature and relation to the anchor."""
    anchor = group.anchor
    fuse = []
    for uid in group.fuse:
        down = _distance(graph, anchor, uid, forward=True)
        relation = "consumer" if down is not None else "producer"
        dist = down if down is not None else _distance(graph, anchor, uid, forward=False)
        fuse.append(RelativeMember(signature=graph.op(uid).signature, relation=relation, distance=dist))
    return RelativeGroupPlan(anchor_signature=graph.op(anchor).signature, fuse=fuse, levels=list(group.levels))


def translate_group_plan(relative: RelativeGroupPlan, anchor: int, graph: OpGraph) -> Plan | None:
    """A one-group plan for this module from a stored relative group plan (None if it does not fit).

    Members are matched by signature among the anchor's producers or consumers, nearest first;
    unmatched members are left out (the search still starts from the anchor's tile sizes).
    """
    if graph.op(anchor).signature != relative.anchor_signature:
        return None
    taken: set[int] = {anchor}
    fuse: list[int] = []
    for member in relative.fuse:
        downstream = member.relation == "consumer"
        pool = graph.downstream(anchor) if downstream else graph.upstream(anchor)
        matches = sorted(
            (u for u in pool if u not in taken and graph.op(u).signature == member.signature),
            key=lambda u: abs((_distance(graph, anchor, u, downstream) or 0) - (member.distance or 0)),
        )
        if matches:
            taken.add(matches[0])
            fuse.append(matches[0])
    return Plan(groups=[Group(anchor=anchor, fuse=fuse, levels=relative.levels)])


def warm_start_plans(graph: OpGraph, warm_starts: list[WarmStart]) -> list[dict]:
    """Stored group plans translated to valid plans of this module, as the engine takes them."""
    plans = []
    for warm in warm_starts:
        try:  # a plan that no longer fits (ValidationError is a ValueError) is skipped
            plan = translate_group_plan(warm.relative, warm.anchor, graph)
            if plan is None:
                continue
            check_plan(graph, plan)
        except (PlanError, ValueError):
            continue
        plans.append(plan.model_dump())
    return plans
