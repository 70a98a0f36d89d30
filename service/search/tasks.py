"""Search work as plain functions over text and JSON, for sandbox workers (see service.tiling).

Also the translation of group records (warm starts): a group's best plan is stored relative to
its anchor, members named by op signature and relation, so it can be replayed on another
module whose ops have the same structure.
"""

from __future__ import annotations

import hashlib
import json

from service.hardware.model import HardwareModel
from service.ir.graph import OpGraph
from service.ir.plan import Plan
from service.ir.tasks import apply_plan_to_text, cached_analysis


def group_signature(graph: OpGraph, anchor: int) -> str:
    """The anchor's structure and its direct neighbourhood: equal for the 'same' group elsewhere."""
    op = graph.op(anchor)
    parts = {
        "anchor": op.signature,
        "producers": sorted(graph.op(p).signature for p in op.producers),
        "consumers": sorted(graph.op(c).signature for c in op.consumers),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


def check_search_shapes(source: str, shape_hints: dict | None, buckets: dict | None) -> None:
    """Raise ShapeHintError when the hints or buckets do not fit the module (before a search is
    claimed: a request with a misfit records no decision)."""
    from .shapes import check_shapes, parse_buckets, parse_shape_hints

    hints, bucket_map = parse_shape_hints(shape_hints), parse_buckets(buckets)
    a = cached_analysis(source)
    check_shapes(a.module, a.graph, hints, bucket_map)


def analyse_request(source: str, max_ops: int | None) -> dict:
    """Fingerprint, op summary and the group signature of every op (possible anchors)."""
    a = cached_analysis(source, max_ops=max_ops)
    g = a.graph
    return {
        "fingerprint": a.fingerprint,
        "ops": [{"uid": op.uid, "name": op.name, "kind": op.kind, "loop_ranges": op.loop_ranges} for op in g.ops.values()],
        "groups": [{"anchor": uid, "signature": group_signature(g, uid)} for uid in g.topological_order()],
    }


def _distance(graph: OpGraph, src: int, dst: int, forward: bool) -> int | None:
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


def relative_group_plan(graph: OpGraph, group: dict) -> dict:
    """A plan group with members named by signature and relation to the anchor."""
    anchor = group["anchor"]
    fuse = []
    for uid in group.get("fuse", []):
        down = _distance(graph, anchor, uid, forward=True)
        relation = "consumer" if down is not None else "producer"
        dist = down if down is not None else _distance(graph, anchor, uid, forward=False)
        fuse.append({"signature": graph.op(uid).signature, "relation": relation, "distance": dist})
    return {"anchor_signature": graph.op(anchor).signature, "fuse": fuse, "levels": group["levels"]}


def translate_group_plan(relative: dict, group: dict, graph: OpGraph) -> dict | None:
    """A full plan for this module from a stored relative group plan (None if it does not fit).

    `group` is an `analyse_request` group entry. Members are matched by signature among the
    anchor's producers or consumers, nearest first; unmatched members are left out (the
    search still starts from the anchor's tile sizes).
    """
    anchor = group["anchor"]
    if graph.op(anchor).signature != relative["anchor_signature"]:
        return None
    taken: set[int] = {anchor}
    fuse: list[int] = []
    for member in relative["fuse"]:
        pool = graph.downstream(anchor) if member["relation"] == "consumer" else graph.upstream(anchor)
        matches = sorted(
            (u for u in pool if u not in taken and graph.op(u).signature == member["signature"]),
            key=lambda u: abs((_distance(graph, anchor, u, member["relation"] == "consumer") or 0) - (member["distance"] or 0)),
        )
        if matches:
            taken.add(matches[0])
            fuse.append(matches[0])
    return {"groups": [{"anchor": anchor, "fuse": fuse, "levels": relative["levels"]}]}


def warm_start_plans(graph: OpGraph, records: list[dict]) -> list[dict]:
    """Stored group plans ({"anchor", "relative"}) translated to valid plans of this module."""
    from service.ir.errors import PlanError
    from service.ir.transform import check_plan

    plans = []
    for record in records:
        plan = translate_group_plan(record["relative"], record, graph)
        if plan is None:
            continue
        try:
            check_plan(graph, Plan.model_validate(plan))
        except (PlanError, ValueError):
            continue
        plans.append(plan)
    return plans


def compilation_infos(graph: OpGraph, plan: dict, translation_info: str | None = None) -> dict:
    """IREE `compilation_info` attribute text per contraction/convolution anchor of the plan,
    with `translation_info` (default: the pipeline without options)."""
    from service.measure.lowering import CONFIGURABLE_KINDS, compilation_info_text, lowering_config_from_levels

    out = {}
    for group in plan.get("groups", []):
        op = graph.op(group["anchor"])
        if op.kind not in CONFIGURABLE_KINDS or len(group["levels"]) > 3:
            continue
        config = lowering_config_from_levels(group["levels"], op.iterator_types, anchor=op.name)
        out[str(op.uid)] = {
            "op": op.name,
            "compilation_info": compilation_info_text(config, translation_info),
            # IREE silently drops compilation_info on linalg.conv_2d_* (see README).
            "honoured_by_iree": op.kind == "contraction",
        }
    return out


def _translation_info_for(hardware: HardwareModel) -> str | None:
    """The pipeline options IREE uses on this machine when the plan is for it (host-cpu is the
    machine the service runs on): on AVX2 IREE peels remainders, and a compilation_info without
    `enable_loop_peeling` there compiles masked vectors (2.4x slower on a dynamic matmul)."""
    if hardware.name != "host-cpu":
        return None
    from service.measure.tools import host_translation_info

    return host_translation_info()


def search_and_realise(source: str, hardware_json: str, params: dict) -> dict:
    """Search (in this worker, one process), then realise the best plan: tiled IR, script,
    origin map, IREE compilation_info, trials and group records for the store."""
    from service.search.engine import tune

    hardware = HardwareModel.model_validate_json(hardware_json)
    graph = cached_analysis(source).graph
    warm = warm_start_plans(graph, params.pop("warm_start_groups", []))
    # Plans are evaluated in a worker this job process keeps (pebble's workers may start
    # processes): a plan that crashes MLIR costs that plan, as in the CLI, not the request.
    result = tune(source, hardware, workers=1, keep_pool=True, warm_start_plans=warm or None, **params)
    plan = result.plan
    realised = apply_plan_to_text(source, plan) if plan.get("groups") else {
        "tiled_module": None, "transform_script": None, "origin": None}
    trials = [
        {
            "number": i,
            "plan": t.plan,
            "plan_hash": t.plan_hash or "",
            "feasible": t.feasible,
            "cost": t.cost,
            "latency_s": t.latency_s,
            "reason": t.reason,
        }
        for i, t in enumerate(result.trials)
        if t.plan is not None
    ]
    group_records = []
    latency = result.predicted.get("latency_s")
    if result.feasible and latency is not None:
        for group in plan.get("groups", []):
            group_records.append({
                "signature": group_signature(graph, group["anchor"]),
                "plan": relative_group_plan(graph, group),
                "latency_s": float(latency),
            })
    return {
        "plan": plan,
        "predicted": result.predicted,
        "baseline": result.baseline,
        "transform_script": realised["transform_script"],
        "tiled_module": realised["tiled_module"],
        "origin": realised["origin"],
        "compilation_info": compilation_infos(graph, plan, _translation_info_for(hardware)),
        "trials": trials,
        "group_records": group_records,
        "search_stats": {
            "strategy": result.strategy,
            "budget": result.budget,
            "seed": result.seed,
            "evaluations": result.evaluations,
            "evaluations_per_s": result.evaluations_per_s,
            "complete": result.complete,
            "space_size": result.space_size,
            "warnings": result.warnings,
            "dispatch": result.dispatch,
            "buckets": [b.model_dump() for b in result.buckets] if result.buckets else None,
        },
    }
