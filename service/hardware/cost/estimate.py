"""The cost of a tiled clone: its live top-level nests, each costed (or taken from a NestMemo),
summed into the module's Cost with recomputed flops and un-fused intermediates; and
cost_of_plan, the JSON entry the sandbox workers run."""

from __future__ import annotations

from dataclasses import dataclass, field

from service.ir.graph import holder_in, tag_tileable_ops
from service.ir.mlir import context, ir
from service.ir.origin import loop_group
from service.ir.parse import parse_module
from service.ir.plan import Plan
from service.ir.transform import apply_plan

from ..model import HardwareModel
from ..profiles import get_profile
from .analyzer import Analyzer
from .latency import module_latency_s
from .memory import outside_slices
from .nest import Node
from .nest_cost import cost_nest
from .ops import LOOP_OPS, dps_inits, is_tileable, opname, ranked
from .results import Cost, LevelCost, NestCost, kib

# Part of every decision key: a stored decision is served only under the model that chose it.
# Bump on any change that moves a plan's predicted cost.
COST_MODEL_VERSION = "cost-model/16"


# Ops that keep what they read alive: returned values, and values passed to a call (which may
# do anything with them).
_LIVE_ROOTS = ("func.return", "func.call")


def _top_level_nests(func) -> list:
    """Live top-level loops and standalone tileable ops of a function body, in order."""
    ops = list(func.regions[0].blocks[0].operations)
    position = {op.operation: i for i, op in enumerate(ops)}
    live_at: set[int] = set()
    live = []
    for i in reversed(range(len(ops))):
        op = ops[i]
        is_live = opname(op) in _LIVE_ROOTS or any(
            position.get(holder_in(u.owner.operation, position)) in live_at for r in op.results for u in r.uses
        )
        if not is_live:
            continue  # dead code left behind by fusion
        live_at.add(i)
        if opname(op) in LOOP_OPS or is_tileable(op):
            live.append(op)
    return list(reversed(live))


@dataclass
class NestMemo:
    """Nest costs a search reuses across the plans it scores: those of groups that tile one op
    on their own and fuse nothing. Such a group's nest is the same loops around the same op in
    every plan that has the group: its ops are its own, and what it reads from outside was made
    by a loop nest or not whatever the other groups do. The caller keys those groups (`keys`:
    the group's index in the applied plan -> a key of the group) and keeps `entries` for one
    module, hardware model and shape hints, on static shapes only (a dynamic dim is sized by
    walking the IR outside the nest). A nest that left a note is not kept (the note would be
    lost)."""

    keys: dict[int, object]
    entries: dict = field(default_factory=dict)  # key -> (NestCost, its flops by uid, unfused input bytes)
    limit: int = 4096

    def key_of(self, op) -> object | None:
        if not self.keys or opname(op) not in LOOP_OPS:
            return None
        group = loop_group(op.operation)
        return self.keys.get(group) if group is not None else None

    def keep(self, key: object, entry: tuple) -> None:
        if len(self.entries) >= self.limit:
            self.entries.clear()
        self.entries[key] = entry


def estimate_cost(
    tiled: ir.Module,
    hardware: HardwareModel,
    shape_hints: dict[str, object] | None = None,
    original: ir.Module | None = None,
    memo: NestMemo | None = None,
) -> Cost:
    """Cost of a tiled clone on `hardware`. `original` (the module before tiling, same uids)
    makes recompute_flops exact; without it only ops computed in several nests count. `memo`:
    nest costs kept from earlier plans of the same module (NestMemo)."""
    with context():
        # Declarations (external funcs) have no body and cost nothing here.
        funcs = [
            op for op in tiled.body.operations
            if opname(op) == "func.func" and len(op.regions[0].blocks) > 0
        ]
        nests: list[NestCost] = []
        reasons: list[str] = []
        notes: list[str] = []
        executed_by_uid: dict[int, float] = {}
        flops_by_nest_uid: list[dict[int, float]] = []
        unfused = 0
        for func in funcs:
            an = Analyzer(shape_hints, func)
            nest_ops = _top_level_nests(func)
            produced_by_nest: set = set()
            for op in nest_ops:
                key = memo.key_of(op) if memo is not None else None
                if key is not None and key in memo.entries:
                    nest, per_uid, unfused_in = memo.entries[key]
                    reasons.extend(nest.reasons)
                    unfused += unfused_in
                    produced_by_nest.update(op.results)
                    nests.append(nest)
                    flops_by_nest_uid.append(per_uid)
                    for uid, f in per_uid.items():
                        executed_by_uid[uid] = executed_by_uid.get(uid, 0.0) + f
                    continue
                notes_before = len(an.notes)
                root = _nest_tree(an, op)
                unfused_in = _unfused_input_bytes(root, an, produced_by_nest)
                unfused += unfused_in
                produced_by_nest.update(op.results)
                nest, per_uid = cost_nest(root, op, an, hardware, reasons)
                if key is not None and len(an.notes) == notes_before:
                    memo.keep(key, (nest, per_uid, unfused_in))
                nests.append(nest)
                flops_by_nest_uid.append(per_uid)
                for uid, f in per_uid.items():
                    executed_by_uid[uid] = executed_by_uid.get(uid, 0.0) + f
            notes.extend(an.notes)
        recompute = _recompute_flops(executed_by_uid, flops_by_nest_uid, original, hardware, shape_hints)
        if original is None and any(n.uids for n in nests):
            notes.append("recompute_flops counts only ops computed in several nests (pass the original module for halos)")
        levels = _sum_levels(nests, hardware)
        for lv, mem in zip(levels, hardware.memory_levels):
            if lv.footprint_bytes > lv.capacity_bytes and not mem.scratchpad and mem is not hardware.main_memory:
                notes.append(f"{lv.name} overflow (soft, cache): {kib(lv.footprint_bytes)} live > {kib(lv.capacity_bytes)} capacity")
        latency = module_latency_s(n.latency_s for n in nests)
        bound = max(nests, key=lambda n: n.latency_s).bound_by if nests else "compute"
        return Cost(
            hardware=hardware.name,
            hardware_hash=hardware.content_hash(),
            latency_s=latency,
            feasible=not reasons,
            reasons=reasons,
            notes=notes,
            bound_by=bound,
            levels=levels,
            flops=sum(n.flops for n in nests),
            recompute_flops=recompute,
            unfused_intermediate_bytes=unfused,
            nests=nests,
        )


def _nest_tree(an: Analyzer, op) -> Node:
    """The loop tree of one top-level nest (a loop, or a tileable op standing alone), with the
    whole tensors it reads and writes outside any slice."""
    root = an.new_node(None, "root", 1, None)
    an.build_body(root, [op])
    for r in op.results:  # the nest's results live in main memory, outside the nest
        an.value_node.pop(r, None)
    # A zero-sized iteration space reads and writes nothing.
    if is_tileable(op) and not any(c.points == 0 for c in root.computes):
        # A standalone op reads whole operands, and its results land in main memory.
        root.slices += [an.whole(an.resolve(o), root) for o in op.operands if ranked(o) is not None]
        root.slices += [an.whole(r, root, is_write=True) for r in op.results]
    elif not is_tileable(op):
        # A loop nest's results are its insert_slices into their destinations, counted there;
        # only a result computed without any lands whole.
        written = {s.source for n in root.subtree() for s in n.slices if s.is_write}
        root.slices += [an.whole(r, root, is_write=True) for r, init in zip(op.results, dps_inits(op))
                        if an.resolve(init) not in written]
    return root


def _unfused_input_bytes(root: Node, an: Analyzer, produced_by_nest: set) -> int:
    """Bytes of the nest's inputs an earlier nest produced: they went through main memory."""
    unfused = 0
    for s, _ in outside_slices(root, an):
        if not s.is_write and s.source in produced_by_nest:
            unfused += s.source_bytes
    return unfused


def _sum_levels(nests: list[NestCost], hw: HardwareModel) -> list[LevelCost]:
    out = []
    for i, lv in enumerate(hw.memory_levels):
        out.append(
            LevelCost(
                name=lv.name,
                footprint_bytes=max((n.levels[i].footprint_bytes for n in nests), default=0),
                traffic_bytes=sum(n.levels[i].traffic_bytes for n in nests),
                capacity_bytes=lv.capacity_bytes,
                time_s=sum(n.levels[i].time_s for n in nests),
            )
        )
    return out


def _recompute_flops(executed: dict[int, float], per_nest: list[dict[int, float]], original: ir.Module | None, hw: HardwareModel, hints) -> float:
    """Flops computed beyond what the untiled program needs, per original op (uid)."""
    if original is not None:
        base: dict[int, float] = {}
        for n in estimate_cost(original, hw, hints).nests:
            for uid, f in n.flops_by_uid.items():
                base[int(uid)] = base.get(int(uid), 0.0) + f
        return sum(max(0.0, f - base[uid]) for uid, f in executed.items() if uid in base)
    # Without the original: an op computed in several nests is recomputed in all but the largest.
    return sum(f - max(d.get(uid, 0.0) for d in per_nest) for uid, f in executed.items())


def cost_of_plan(source: str | bytes, plan_json: dict, hardware_name: str, shape_hints: dict[str, object] | None = None) -> dict:
    """Parse, apply a plan to a clone, and cost it; JSON in, JSON out (runs in sandbox workers)."""
    hardware = get_profile(hardware_name)
    plan = Plan.model_validate(plan_json)
    with context():
        tagged = tag_tileable_ops(parse_module(source))
        tiled = apply_plan(tagged, plan).module
        return estimate_cost(tiled, hardware, shape_hints, original=tagged).model_dump(mode="json")
