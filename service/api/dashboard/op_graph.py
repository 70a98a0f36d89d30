"""The op graph of a stored decision, for the decision page's DAG.

Two halves: `module_graph_task` runs in a sandbox worker (MLIR never runs in the API process)
and returns the module's op graph plus the search space's tile groups with the stops that
ended each group's growth; `dag_view` joins that with the decision's plan and origin map into
nodes and edges with a group, a fused mark and, for every edge the plan does not fuse, why.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from service.hardware.model import HardwareModel
from service.ir.tasks import cached_analysis
from service.search.space import build_space


def module_graph_task(source: str, hardware_json: str | None, shape_hints: dict[str, list[int]]) -> dict:
    """Op graph and space groups of a stored module. Runs in a sandbox worker.

    Without the decision's hardware model (a host profile measured elsewhere) the groups cannot
    be regrown, so the result then has no stop reasons (`groups` is None).
    """
    analysis = cached_analysis(source)
    graph = analysis.graph
    result: dict[str, Any] = {
        "ops": [
            {"uid": op.uid, "name": op.name, "kind": op.kind, "loop_ranges": list(op.loop_ranges),
             "iterator_types": list(op.iterator_types)}
            for op in graph.ops.values()
        ],
        "edges": [{"producer": e.producer, "consumer": e.consumer, "via": list(e.via)} for e in graph.edges],
        "groups": None,
    }
    if hardware_json is not None:
        space = build_space(graph, HardwareModel.model_validate_json(hardware_json), shape_hints)
        result["groups"] = [
            {"anchor": g.anchor, "fixed": list(g.fixed), "optional": list(g.optional),
             "stops": [{"uid": s.uid, "reason": s.reason} for s in g.stops], "notes": list(g.notes)}
            for g in space.groups
        ]
    return result


@dataclass
class DagNode:
    uid: int
    label: str  # the op name, e.g. linalg.matmul
    kind: str
    loop_ranges: list[int | None]
    group: int | None  # index of the plan's tile group, None when the plan leaves it untiled
    anchor: bool
    fused: bool  # computed inside a tile loop nest (origin map), not on its own

    @property
    def extents(self) -> str:
        """The loop ranges as MLIR writes a shape: a dynamic one is '?'."""
        return " × ".join("?" if r is None else str(r) for r in self.loop_ranges)


@dataclass
class DagEdge:
    producer: int
    consumer: int
    fused: bool
    reason: str | None  # why the plan does not fuse this producer into its consumer's loops
    via: list[str] = field(default_factory=list)


@dataclass
class DagView:
    nodes: list[DagNode]
    edges: list[DagEdge]
    # What the page must say it could not show (no hardware model, no graph).
    missing: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"nodes": [asdict(n) for n in self.nodes], "edges": [asdict(e) for e in self.edges]}


def _plan_groups(plan: dict | None) -> dict[int, int]:
    """uid -> index of the plan group it belongs to (anchor or fused member)."""
    member_of: dict[int, int] = {}
    for index, group in enumerate((plan or {}).get("groups", [])):
        for uid in [group["anchor"], *group.get("fuse", [])]:
            member_of[uid] = index
    return member_of


def _stop_reasons(groups: list[dict] | None) -> dict[tuple[int, int], str]:
    """(anchor, stopped uid) -> why the space's group around anchor did not take that op."""
    return {(g["anchor"], s["uid"]): s["reason"] for g in groups or [] for s in g["stops"]}


def _unfused_reason(producer: int, consumer: int, member_of: dict[int, int], anchors: list[int],
                    space_groups: list[dict] | None, stops: dict[tuple[int, int], str]) -> str:
    p_group, c_group = member_of.get(producer), member_of.get(consumer)
    for group in (p_group, c_group):
        if group is None:
            continue
        anchor = anchors[group]
        other = consumer if group == p_group else producer
        if (anchor, other) in stops:
            return stops[(anchor, other)]
        optional = next((g["optional"] for g in space_groups or [] if g["anchor"] == anchor), [])
        if other in optional:
            return "optional boundary op: the chosen plan leaves it out of the group"
    if p_group is None and c_group is None:
        return "neither op is tiled (both fit memory untiled)"
    if p_group is not None and c_group is not None:
        return f"different tile groups ({p_group} and {c_group})"
    if space_groups is None:
        return "not fused (the stop reason needs the decision's hardware model)"
    return "not reached by the group's growth"


def dag_view(graph: dict | None, plan: dict | None, origin_map: dict | None, *, missing: list[str] | None = None) -> DagView:
    """Nodes and edges for the page, from `module_graph_task`'s result, the plan and its origin map."""
    notes = list(missing or [])
    if graph is None:
        return DagView(nodes=[], edges=[], missing=notes)
    member_of = _plan_groups(plan)
    anchors = [g["anchor"] for g in (plan or {}).get("groups", [])]
    origin = {int(uid): entry for uid, entry in (origin_map or {}).items()}
    nodes = [
        DagNode(
            uid=op["uid"], label=op["name"], kind=op["kind"], loop_ranges=op["loop_ranges"],
            group=member_of.get(op["uid"]), anchor=op["uid"] in anchors,
            fused=bool(origin.get(op["uid"], {}).get("fused", False)) and op["uid"] not in anchors,
        )
        for op in graph["ops"]
    ]
    if graph.get("groups") is None:
        notes.append("stop reasons: the decision's hardware model is not known to this server")
    stops = _stop_reasons(graph.get("groups"))
    edges = []
    for e in graph["edges"]:
        p, c = e["producer"], e["consumer"]
        fused = p in member_of and member_of.get(p) == member_of.get(c)
        reason = None if fused else _unfused_reason(p, c, member_of, anchors, graph.get("groups"), stops)
        edges.append(DagEdge(producer=p, consumer=c, fused=fused, reason=reason, via=e.get("via", [])))
    return DagView(nodes=nodes, edges=edges, missing=notes)
