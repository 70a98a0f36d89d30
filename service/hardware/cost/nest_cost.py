"""The cost of one loop nest: compute time (flops, parallel waves over cores, vector-lane and
register-tile efficiency), the traffic and time of each memory level, loop overheads, and the
scratchpad checks that make a plan infeasible."""

from __future__ import annotations

import math
from dataclasses import dataclass

from service.ir.origin import loop_level

from ..model import HardwareModel
from .analyzer import Analyzer
from .latency import NestTerms, nest_latency_s
from .memory import misses, node_footprint
from .nest import Node
from .ops import opname
from .registers import check_vector_tile, compute_lanes, microkernel_efficiency, narrow_walk_efficiency, spilled_fraction
from .results import LevelCost, NestCost, kib


@dataclass
class _Parallelism:
    """The outermost scf.forall distributed over cores in waves."""

    active: int  # cores busy at once
    waves: int
    utilization: float  # of all cores, over the waves


@dataclass
class _ComputeWork:
    flops: float
    flops_by_uid: dict[int, float]
    inner_traffic: float  # bytes the innermost level serves the compute units
    streamed_bytes: float  # operand bytes of reducing ops, streamed when the innermost tile overflows
    lane_use: float  # flop-weighted vector-lane and register-tile efficiency
    element_type: str


def cost_nest(root: Node, op, an: Analyzer, hw: HardwareModel, all_reasons: list[str]) -> tuple[NestCost, dict[int, float]]:
    """A nest's cost (and its flops per uid): flops and register-tile efficiency give compute
    time, misses per memory level give transfer times, loop trips give overheads; combined by
    latency.nest_latency_s. Its infeasibility reasons are also appended to `all_reasons`."""
    reasons: list[str] = []  # this nest's, also added to all_reasons
    fp: dict[int, int] = {}
    nodes = list(root.subtree())
    band = band_levels(root)
    top = root.children[0] if root.children else None
    parallel = _parallelism(top, hw.compute.cores)
    work = _compute_work(nodes, plan_levels(root, band), hw, reasons)
    compute_s = work.flops / (hw.effective_peak(work.element_type) * parallel.utilization * work.lane_use) if work.flops else 0.0
    level_costs = _level_costs(root, op, an, hw, band, fp, parallel.active, work, reasons)
    overhead = _loop_overhead_s(nodes, top, parallel.active, hw)

    terms = NestTerms(compute_s=compute_s, level_times_s={lc.name: lc.time_s for lc in level_costs}, overhead_s=overhead)
    loops = [{"depth": n.depth, "level": band[n.id], "kind": n.kind, "trips": n.trips, "footprint_bytes": node_footprint(n, an, fp)}
             for n in nodes if n.kind != "root"]
    uids = sorted({c.uid for n in nodes for c in n.computes if c.uid is not None})
    all_reasons.extend(reasons)
    nest = NestCost(root_op=opname(op), uids=uids, loops=loops, latency_s=nest_latency_s(terms, hw.overlap_exponent),
                    compute_s=compute_s, overhead_s=overhead, bound_by=terms.bound_by(), flops=work.flops,
                    flops_by_uid=work.flops_by_uid, active_cores=parallel.active, waves=parallel.waves,
                    levels=level_costs, reasons=reasons)
    return nest, work.flops_by_uid


def band_levels(root: Node) -> dict[int, int]:
    """Tiling level of each loop node: loops perfectly nested in each other (one plan level tiling
    several dims makes one scf.for per dim) form one band and share a level."""
    levels = {root.id: 0}
    for n in root.subtree():
        for c in n.children:
            perfectly_nested = n.kind == "for" and c.kind == "for" and len(n.children) == 1 and not n.slices and not n.computes
            levels[c.id] = levels[n.id] + (0 if perfectly_nested else 1)
    return levels


def plan_levels(root: Node, band: dict[int, int]) -> dict[int, int]:
    """The plan level of each loop node, counted from 1 (the root is 0), read off the `ts.loop`
    label its tiling left: a plan level that tiles nothing makes no loop (a distribution of
    [0, 0, 0], IREE's one workgroup) yet still counts, as it does in IREE's config. Loops the plan
    did not make keep their band's level."""
    levels = {}
    for n in root.subtree():
        level = loop_level(n.op) if n.op is not None else None
        levels[n.id] = band[n.id] if level is None else level + 1
    return levels


def _parallelism(top: Node | None, cores: int) -> _Parallelism:
    if top is not None and top.kind == "forall":
        waves = -(-top.trips // cores)
        return _Parallelism(active=min(cores, top.trips), waves=waves, utilization=top.trips / (waves * cores))
    return _Parallelism(active=1, waves=1, utilization=1 / cores)


def _compute_work(nodes: list[Node], level: dict[int, int], hw: HardwareModel, reasons: list[str]) -> _ComputeWork:
    """Flops, vector-lane use and compute-side (innermost level) traffic of the nest's computes
    (`level`: each node's plan level, plan_levels); a vector tile past IREE's limit adds a reason."""
    flops = 0.0
    per_uid: dict[int, float] = {}
    inner_traffic = 0.0
    weighted_lane_use = 0.0
    elem_type = "f32"
    for n in nodes:
        for c in n.computes:
            runs = n.executions * n.trips if n.kind != "root" else 1
            f = runs * c.points * c.flops_per_point
            flops += f
            inner_traffic += runs * c.operand_bytes
            carried = bool(c.carried_acc_bytes) and n.kind != "root"
            # The loops carrying the accumulator (its own scf.for, and any enclosing one whose
            # iter_args feed it) run `acc_trips` steps per run of the outermost of them.
            carry_runs = (c.accumulator_loop or n).executions if carried else runs
            if carried:
                # The compiler keeps a loop-carried accumulator in registers across the
                # reduction loops (IREE hoists its transfer_read/write): it moves once per run of
                # the outermost, plus what spills past the register file every step.
                spilled = spilled_fraction(c, hw)
                inner_traffic -= (runs - carry_runs) * c.carried_acc_bytes * (1.0 - spilled)
            if c.uid is not None:
                per_uid[c.uid] = per_uid.get(c.uid, 0.0) + f
            lanes = compute_lanes(c, hw)
            last = c.parallel_tile[-1] if c.parallel_tile else 1
            # A carried accumulator lives through every trip of the loops that carry it.
            acc_trips = max(1, runs // carry_runs) if carried else 1
            weighted_lane_use += f * (last / (math.ceil(last / lanes) * lanes)) * microkernel_efficiency(c, level[n.id], hw, acc_trips)
            if f and c.flops_per_point:
                elem_type = c.element_type
            check_vector_tile(c, level[n.id], hw, reasons)
    streamed_bytes = sum(
        (n.executions * n.trips if n.kind != "root" else 1) * c.points * c.element_bytes
        for n in nodes for c in n.computes if c.reduction_tile
    )
    return _ComputeWork(flops=flops, flops_by_uid=per_uid, inner_traffic=inner_traffic, streamed_bytes=streamed_bytes,
                        lane_use=weighted_lane_use / flops if flops else 1.0, element_type=elem_type)


def _level_costs(root: Node, op, an: Analyzer, hw: HardwareModel, band: dict[int, int], fp: dict[int, int], active: int,
                 work: _ComputeWork, reasons: list[str]) -> list[LevelCost]:
    """Footprint, traffic and transfer time per memory level: level i serves the misses of level
    i + 1; the innermost serves the compute units. A scratchpad overflow adds a reason."""
    nodes = list(root.subtree())
    max_depth = max(band.values())
    # A band's tile is one iteration of its innermost loop (e.g. the j loop of an i/j band).
    band_tiles = [n for n in nodes if not (len(n.children) == 1 and band[n.children[0].id] == band[n.id])]
    footprint_at_depth = [max((node_footprint(n, an, fp) for n in band_tiles if band[n.id] == d), default=0) for d in range(max_depth + 1)]
    levels = hw.memory_levels
    level_costs: list[LevelCost] = []
    walks = _narrow_walks(nodes, hw)
    for i, lv in enumerate(levels):
        depth = max(0, max_depth - (len(levels) - 1 - i))
        footprint = footprint_at_depth[depth] * (active if lv.shared and depth >= 1 else 1)
        slowed = 0.0  # bytes' worth of the level's time lost to B's rows read a line at a time
        if i + 1 < len(levels):
            inner = levels[i + 1]
            cap = inner.capacity_bytes / (active if inner.shared else 1)
            whole = inner.capacity_bytes if inner.shared else None
            traffic = misses(root, cap, an, fp, whole)
            if lv.shared:
                # A line lost from L1 waits on this level; from a core's own L2 the wait is short
                # and partly hidden (a Zen 4 lost 0.77 there, not 0.4: docs/benchmarks.md).
                slowed = sum(misses(root, cap, an, fp, whole, of=b) * (1.0 / eff - 1.0) for b, eff in walks)
        else:
            traffic = work.inner_traffic
        if i == len(levels) - 2 and not levels[-1].scratchpad and footprint_at_depth[max_depth] > levels[-1].capacity_bytes:
            # The innermost tile overflows the innermost cache: operands of reducing ops stream
            # from this level with reuse of one vector load per vector FMA only.
            traffic += work.streamed_bytes
        eff = hw.calibration.bandwidth_efficiency.get(lv.name, 1.0)
        # A shared level's bandwidth is the chip's with every core pulling; a core draws only its
        # share (the misses it keeps in flight), so a nest on fewer cores gets less of it.
        share = min(1.0, active / hw.compute.cores) if lv.shared else active
        bandwidth = lv.bandwidth_bytes_per_s * eff * share
        t = (traffic + slowed) / bandwidth
        level_costs.append(LevelCost(name=lv.name, footprint_bytes=int(footprint), traffic_bytes=int(traffic), capacity_bytes=lv.capacity_bytes, time_s=t))
        if lv.scratchpad and footprint_at_depth[depth] > lv.capacity_bytes:
            reasons.append(
                f"{lv.name} overflow: {kib(footprint_at_depth[depth])} live > {kib(lv.capacity_bytes)} capacity "
                f"(loop depth {depth} of nest at {opname(op)})"
            )
    return level_costs


def _narrow_walks(nodes: list[Node], hw: HardwareModel) -> list[tuple[object, float]]:
    """(B's whole tensor, the fraction of a level's bandwidth its reads get) of the nest's
    contractions whose register tile reads B a line of each row at a time and loses the next
    line before it reads it (registers.narrow_walk_efficiency)."""
    walks: list[tuple[object, float]] = []
    for n in nodes:
        for c in n.computes:
            if c.rhs_root is not None and not any(b == c.rhs_root for b, _ in walks):
                eff = narrow_walk_efficiency(c, hw)
                if eff < 1.0:
                    walks.append((c.rhs_root, eff))
    return walks


def _loop_overhead_s(nodes: list[Node], top: Node | None, active: int, hw: HardwareModel) -> float:
    """Loop overheads: iterations inside the distributed forall run on `active` cores at once;
    the innermost loops' share is what the core does not hide under their work."""
    overhead = 0.0
    for n in nodes:
        if n.kind == "root":
            continue
        iterations = n.executions * n.trips
        in_forall = top is not None and top.kind == "forall"
        share = hw.innermost_loop_overhead_fraction if not n.children else 1.0
        overhead += iterations * hw.effective_loop_overhead_s() * share / (active if in_forall else 1)
    return overhead
