"""The tile-and-fuse candidate space: tile groups grown around anchors, and their knobs.

A group is an anchor (contraction, convolution, reduction; then any op that does not fit memory
untiled, as in super tiling) grown by diffusion fusion: a BFS over producers AND consumers that
stops at ops the IR core cannot fuse, each stop recorded with its reason. Fuse-group members
always join together. Knobs per group mirror IREE's CPU levels (and any memory hierarchy):
  level 0: parallel tile sizes of the anchor + loop kind (forall distributes over cores),
  level 1: inner parallel tile sizes (multiples of the vector width on the innermost dim),
  level 2: reduction tile sizes (scf.for on the anchor copy),
plus one fuse-or-not switch per optional boundary op.
"""

from __future__ import annotations

import json
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from service.hardware.cost import DEFAULT_DYNAMIC_EXTENT
from service.hardware.model import HardwareModel
from service.ir.errors import PlanError
from service.ir.graph import OpGraph, TileableOp, element_bytes
from service.ir.hints import hint_for
from service.ir.plan import Group, Level, Plan
from service.ir.transform import layout_group

from .knobs import fuse_knob, group_name, group_of, loop_knob, tile_knob
from .tile_sizes import inner_sizes, outer_sizes, reduction_sizes, single_row_dims, vectorizes_first_input

ANCHOR_KINDS = ("contraction", "convolution", "reduction")
# 5: shared fills get a copy per reader (service/ir/graph.py), which renumbers the ops after them.
# 6: a contraction's batch dims get register tiles of 1 (inner_sizes).
# 7: a contraction's register tile may have 6 rows, which need not divide the rows enclosing them.
# 9: a contraction's vector level leaves no long dim untiled (_fit_vector_tile).
# 10: the innermost dim's tiles divide it or leave whole vectors (outer_sizes), and may be the
#     largest divisor under a vector (inner_sizes); a 1x1 convolution's output channels keep
#     register tiles of 1 (single_row_dims).
# 11: a contraction's rows that 8 does not divide also get their largest divisor up to 8.
# 12: where remainders are masked (hardware), a reduction tile divides the reduction.
# 13: the same plans, another answer: a single module's search on host-cpu starts from IREE's own
#     config and answers it unless a tiled plan is predicted clearly faster (search/guard.py), so
#     decisions stored before are searched again rather than served.
# 14: on a CPU, a convolution's vector level follows IREE's decomposition to 1-D convolutions
#     (_decomposable_convolution).
# 15: a 1x1 convolution read with a step (stride 2) gives its output channels register rows
#     (single_row_dims).
# 16: a contraction vectorized along its first input (a 1x1 convolution over NCHW, image first,
#     pixels collapsed) keeps register tiles of one output channel (single_row_dims).
# 18: on a CPU, the super-tiling baseline is not an answer for a contraction or convolution: given
#     to IREE as a config, its one memory level makes the whole tile one vector (engine.py).
SPACE_VERSION = "search-space/18"
# --------------------------------------------------------------------------- shapes


@dataclass
class ShapeContext:
    """Loop ranges with dynamic dims resolved from shape hints (or the stated default)."""

    hints: dict[str, list[int]]
    defaulted: list[str] = field(default_factory=list)  # dynamic dims that got the default

    def loop_ranges(self, op: TileableOp) -> list[int]:
        out: list[int] = []
        for d, r in enumerate(op.loop_ranges):
            if r is not None:
                out.append(r)
                continue
            dyn = op.dynamic_dims.get(d)
            hint = hint_for(self.hints, op.func, dyn.arg_index) if dyn and dyn.arg_index is not None else None
            if hint is not None and dyn.dim < len(hint):
                out.append(hint[dyn.dim])
            else:
                where = f"arg{dyn.arg_index} dim {dyn.dim} of @{op.func}" if dyn and dyn.arg_index is not None else f"op {op.uid} loop {d}"
                if where not in self.defaulted:
                    self.defaulted.append(where)
                out.append(DEFAULT_DYNAMIC_EXTENT)
        return out


def op_bytes(op: TileableOp, shapes: ShapeContext) -> int:
    """The footprint of an untiled op (super tiling's measure): the sum of its tensor operands
    and results."""
    ranges = shapes.loop_ranges(op)
    total = 0
    for shape_list, etype in zip(op.operand_shapes, op.operand_element_types):
        if shape_list is None:
            continue
        n = 1
        for i, s in enumerate(shape_list):
            n *= s if s is not None else (ranges[i] if i < len(ranges) else DEFAULT_DYNAMIC_EXTENT)
        total += n * element_bytes(etype)
    return total


def available_memory(hardware: HardwareModel) -> int:
    """The memory an untiled op must fit in: the largest per-core level below main memory (a
    shared last-level cache is split among cores), else the first level below main memory."""
    below = hardware.memory_levels[1:]
    private = [lv for lv in below if not lv.shared]
    if private:
        return max(lv.capacity_bytes for lv in private)
    return below[0].capacity_bytes if below else hardware.memory_levels[0].capacity_bytes


def innermost_memory(hardware: HardwareModel) -> int:
    return hardware.memory_levels[-1].capacity_bytes


# --------------------------------------------------------------------------- groups


@dataclass
class Stop:
    uid: int
    reason: str


@dataclass
class GroupSpec:
    """One tile group of the space: fixed members, optional boundary ops, knob choices."""

    index: int
    anchor: int
    fixed: list[int]  # fused members besides the anchor (fuse-group partners, chains)
    optional: list[int]  # boundary ops: fuse or not is a knob
    stops: list[Stop]
    notes: list[str]
    ranges: list[int]  # anchor loop ranges (dynamic dims resolved)
    iterator_types: list[str]
    outer_choices: dict[int, list[int]]  # anchor parallel dim -> level-0 sizes
    inner_choices: dict[int, list[int]]  # anchor parallel dim -> level-1 sizes
    reduction_choices: dict[int, list[int]]  # anchor reduction dim -> level-2 sizes
    optional_units: dict[int, list[int]] = field(default_factory=dict)  # optional op -> ops joining with it
    optional_parent: dict[int, int] = field(default_factory=dict)  # optional op -> member it was reached from
    vector_limit_bytes: int | None = None  # hardware's largest vector tile (IREE CPU: 512 native vectors)
    anchor_kind: str = ""  # the anchor op's kind (contraction, convolution, reduction, ...)
    # The plan must choose the register tile: IREE's own for this op is known slow (an image-first
    # contraction's 8 output channels), and a plan that leaves it to IREE is priced as if ideal.
    needs_register_tile: bool = False
    elem_bytes: int = 4
    outside_consumers: dict[int, list[int]] = field(default_factory=dict)  # optional producer -> consumers not in the group
    # Inner dims whose tile need not divide its outer tile: a contraction's register-tile rows
    # (IREE peels the remaining rows; inner_sizes), an image-first contraction's pixels (masked).
    peeled: tuple[int, ...] = ()
    _knob_names: tuple[str, ...] | None = field(default=None, repr=False, compare=False)
    _groups: dict[tuple, Group | str] = field(default_factory=dict, repr=False, compare=False)  # to_group memo

    @property
    def name(self) -> str:
        return group_name(self.anchor)

    @property
    def ops(self) -> list[int]:
        """Every op any of this group's plans tiles: anchor, fixed and optional members."""
        units = [u for unit in self.optional_units.values() for u in unit]
        return sorted({self.anchor, *self.fixed, *self.optional, *units})

    def knobs(self) -> list["Knob"]:
        ks = [Knob(tile_knob(self.name, "outer", d), c) for d, c in self.outer_choices.items()]
        ks.append(Knob(loop_knob(self.name), ["forall", "for"]))
        ks += [Knob(tile_knob(self.name, "inner", d), c) for d, c in self.inner_choices.items()]
        ks += [Knob(tile_knob(self.name, "red", d), c) for d, c in self.reduction_choices.items()]
        ks += [Knob(fuse_knob(self.name, u), [True, False]) for u in self.optional]
        return ks

    def size(self) -> int:
        return math.prod(len(k.choices) for k in self.knobs())

    def to_group(self, params: dict) -> Group | str:
        """The plan group for these knob values, or why the combination is invalid. Memoized:
        a search builds each whole plan from every group's values, most of them unchanged."""
        if self._knob_names is None:
            self._knob_names = tuple(k.name for k in self.knobs())
        key = tuple(params.get(name) for name in self._knob_names)
        if key not in self._groups:
            self._groups[key] = self._to_group(params)
        return self._groups[key]

    def _to_group(self, params: dict) -> Group | str:
        rank = len(self.ranges)
        outer = [0] * rank
        inner = [0] * rank
        red = [0] * rank
        for d in self.outer_choices:
            outer[d] = params[tile_knob(self.name, "outer", d)]
        for d in self.inner_choices:
            inner[d] = params[tile_knob(self.name, "inner", d)]
        for d in self.reduction_choices:
            red[d] = params[tile_knob(self.name, "red", d)]
        why = self._fit_vector_tile(outer, inner, red)
        if why is not None:
            return why
        if not any(outer) and not any(inner) and not any(red):
            return "every tile size is 0: the group tiles nothing"
        if self.needs_register_tile and not any(inner):
            return ("no register tile: IREE's own for a contraction vectorized along its first input (8 output "
                    "channels) runs its outer products element by element")
        # Levels are positional (distribution, vector parallel, vector reduction, as IREE's CPU
        # config): an untiled level stays as zeros unless nothing follows it.
        levels = [
            Level(tile_sizes=outer, loop=params[loop_knob(self.name)]),
            Level(tile_sizes=inner, loop="for"),
            Level(tile_sizes=red, loop="for"),
        ]
        while not any(levels[-1].tile_sizes):
            levels.pop()
        fuse = list(self.fixed)
        included = {self.anchor, *self.fixed}
        # BFS order: an optional op joins only when the member it was reached from has joined
        # (a broadcast feeding an un-fused add would be a second sink).
        for u in self.optional:
            if params.get(fuse_knob(self.name, u), True) and self.optional_parent.get(u, self.anchor) in included:
                fuse += [v for v in self.optional_units.get(u, [u]) if v not in fuse]
                included.add(u)
        outer_loop = params[loop_knob(self.name)] if any(outer) else "for"
        shared = [u for u in fuse if self.outside_consumers.get(u)]
        if shared and (not any(outer) or outer_loop == "for"):
            # MLIR 3.13 aborts the process (LLVM ERROR in SmallVector) fusing a producer that has
            # uses outside the loop into an scf.for; only scf.forall survives it.
            return f"op(s) {shared} feed consumers outside the group: fusing them needs forall loops only (scf.for fusion aborts MLIR)"
        return Group(anchor=self.anchor, fuse=sorted(fuse), levels=levels)

    def identity(self, params: dict) -> str:
        """A key of the plan group these knob values make: equal for knob values that make the
        same group (the repair below, fuse switches under an un-fused parent, ...)."""
        grp = self.to_group(params)
        if isinstance(grp, str):
            return "invalid:" + json.dumps(params, sort_keys=True)
        return grp.model_dump_json()

    def _fit_vector_tile(self, outer: list[int], inner: list[int], red: list[int]) -> str | None:
        """Make the knob values a valid plan, in place: knob values are upper bounds, each tile
        becomes the largest valid choice at or below it. An inner tile must be smaller than and
        divide its outer tile; the vector tile (IREE's rule: innermost parallel tiles, 0 = the
        enclosing extent, times reduction tiles, 0 = the whole reduction) must stay under the
        hardware limit, so the largest of its extents shrinks until it does. A repair rather
        than a rejection: most raw knob combinations break one of these, and every rejected
        suggestion costs the sampler a full ask. Returns why no valid plan is near, or None.

        A contraction's plan with a vector level tiles every long dim there: an untiled (0)
        register dim longer than its largest choice becomes that choice, since IREE would make
        the whole extent one vector (a 1x2304 tile, 144 accumulators, measured 5x slower than
        IREE's default on a Zen 4) that the cost model, seeing no register loop, cannot price."""
        if self.anchor_kind == "contraction" and (any(inner) or any(red)):
            for d, choices in self.inner_choices.items():
                span = outer[d] or self.ranges[d]
                fitting = [c for c in choices if 0 < c < span and (span % c == 0 or d in self.peeled)]
                if not inner[d] and fitting and span > max(choices):
                    inner[d] = max(fitting)
        for d, choices in self.inner_choices.items():
            span = outer[d] or self.ranges[d]
            if inner[d] and (inner[d] >= span or span % inner[d] and d not in self.peeled):
                inner[d] = max((c for c in choices if 0 < c < min(inner[d], span) and (span % c == 0 or d in self.peeled)),
                               default=0)
        if not self.vector_limit_bytes:
            return None

        extent = [(inner[d] or outer[d] or r) if t == "parallel" else (red[d] or r)
                  for d, (t, r) in enumerate(zip(self.iterator_types, self.ranges))]
        while (elems := math.prod(extent)) * self.elem_bytes >= self.vector_limit_bytes:
            # The largest extent shrinks first, to its largest smaller choice; on ties the
            # reduction (IREE's default is small), then the first dim.
            best = None
            for d, choices in self.reduction_choices.items():
                smaller = max((c for c in choices if 0 < c < extent[d]), default=0)
                if smaller and (best is None or (extent[d], 1, -d) > best[0]):
                    best = ((extent[d], 1, -d), d, smaller, red)
            for d, choices in self.inner_choices.items():
                span = outer[d] or self.ranges[d]
                smaller = max((c for c in choices if 0 < c < extent[d] and (span % c == 0 or d in self.peeled)), default=0)
                if smaller and (best is None or (extent[d], 0, -d) > best[0]):
                    best = ((extent[d], 0, -d), d, smaller, inner)
            if best is None:
                return f"vector tile of {elems} elements ({elems * self.elem_bytes} B) >= the {self.vector_limit_bytes} B limit, and no smaller tile choice"
            _, d, size, tiles = best
            tiles[d] = extent[d] = size
        return None

    def default_params(self) -> dict:
        """A modest starting point: 64-wide distribution tiles, everything optional fused. A
        contraction starts where IREE's own CPU config for f32 matmuls does (read off its
        dumped configs for 60 shapes of the fidelity corpus): distribution 64 x 64, register
        tiles of 8 rows x one vector, a reduction tile of one vector; the search keeps it unless
        it predicts something clearly faster (engine.KEEP_START_MARGIN). Other anchors get the
        vector tile the repair makes of untiled inner levels."""
        p = self._one_level_params(lambda tiles: min(tiles, key=lambda s: abs(s - 64)))
        if self.anchor_kind != "contraction" or not self.inner_choices:
            return p
        parallel = sorted(self.inner_choices)
        lanes = min((c for c in self.inner_choices.get(parallel[-1], []) if c), default=None)
        for d in parallel:
            choices = [c for c in self.inner_choices[d] if c]
            if not choices:
                continue
            if d == parallel[-1]:  # the vector dim: one vector
                pick = min(choices)
            elif len(parallel) > 1 and d == parallel[-2]:  # the rows
                pick = min(choices, key=lambda c: abs(c - 8))
            else:  # batch-like dims
                pick = min(choices)
            p[tile_knob(self.name, "inner", d)] = pick
        for d, choices in self.reduction_choices.items():
            p[tile_knob(self.name, "red", d)] = min((c for c in choices if c), key=lambda c: abs(c - (lanes or 2)),
                                                    default=0)
        return p

    def smallest_params(self) -> dict:
        """The smallest footprint: the smallest distribution tile on every dim, one level,
        everything optional fused (its intermediates stay inside the tile)."""
        return self._one_level_params(min)

    def _one_level_params(self, pick: Callable[[list[int]], int]) -> dict:
        p: dict = {}
        for d, c in self.outer_choices.items():
            p[tile_knob(self.name, "outer", d)] = pick([s for s in c if s] or c)
        p[loop_knob(self.name)] = "forall"
        for d, c in self.inner_choices.items():  # untiled where the knob allows it (a batch dim: 1)
            p[tile_knob(self.name, "inner", d)] = 0 if 0 in c else min(c)
        for d, c in self.reduction_choices.items():  # untiled where the knob allows it (a filter tap: 1)
            p[tile_knob(self.name, "red", d)] = 0 if 0 in c else min(c)
        for u in self.optional:
            p[fuse_knob(self.name, u)] = True
        return p


@dataclass(frozen=True)
class Knob:
    name: str
    choices: list

    def __hash__(self) -> int:  # choices is a list; the name identifies the knob
        return hash(self.name)


@dataclass
class SearchSpace:
    graph: OpGraph
    groups: list[GroupSpec]
    untiled: list[int]  # ops in no group (they fit memory, or could not be grouped)
    notes: list[str]
    shapes: ShapeContext
    # Standalone tilings settled by applying them (service.search.start): uid -> the group to use, or None
    # when MLIR cannot tile the op on its own (tensor.concat along its concat dim).
    standalone: dict[int, Group | None] = field(default_factory=dict)

    def knobs(self) -> list[Knob]:
        return [k for g in self.groups for k in g.knobs()]

    def size(self) -> int:
        return math.prod(g.size() for g in self.groups) if self.groups else 1

    def to_plan(self, params: dict) -> Plan | str:
        """Plan for a full assignment; params missing for a group leave that group untiled."""
        groups = []
        present = {group_of(k) for k in params}
        for g in self.groups:
            if g.name not in present:
                continue
            grp = g.to_group(params)
            if isinstance(grp, str):
                return f"group {g.index} (anchor {g.anchor}): {grp}"
            groups.append(grp)
        return Plan(groups=groups)


# --------------------------------------------------------------------------- tile sizes


def choose_anchors(graph: OpGraph, hardware: HardwareModel, shapes: ShapeContext) -> list[int]:
    """Contractions, convolutions, reductions in topological order; then ops that do not fit."""
    # An op with a zero-sized dim computes nothing (and MLIR's tiling crashes on it).
    order = [u for u in graph.topological_order() if 0 not in shapes.loop_ranges(graph.op(u))]
    anchors = [u for u in order if graph.op(u).kind in ANCHOR_KINDS]
    limit = available_memory(hardware)
    anchors += [
        u for u in order
        if u not in anchors and graph.op(u).kind != "fill" and op_bytes(graph.op(u), shapes) > limit
    ]
    return anchors


def _fuse_unit(graph: OpGraph, uid: int) -> list[int]:
    """An op together with every op sharing one of its fuse groups (transitively)."""
    unit, stack = {uid}, [uid]
    while stack:
        for gid in graph.op(stack.pop()).fuse_groups:
            for v in graph.fuse_groups.get(gid, []):
                if v not in unit:
                    unit.add(v)
                    stack.append(v)
    return sorted(unit)


def _probe_group(graph: OpGraph, anchor: int, members: list[int], ranges: list[int], iterators: list[str]) -> str | None:
    """Why `members` cannot form a group around `anchor` (IR core rules), or None if it can."""
    sizes = [max(1, r // 2) if t == "parallel" else 0 for r, t in zip(ranges, iterators)]
    if not any(sizes):
        sizes = [max(1, r // 2) for r in ranges]
    try:
        layout_group(graph, 0, Group(anchor=anchor, fuse=sorted(set(members) - {anchor}), levels=[Level(tile_sizes=sizes, loop="forall")]))
    except PlanError as err:
        return err.reason
    return None


def grow_group(graph: OpGraph, anchor: int, claimed: dict[int, int], ranges: list[int]):
    """Diffusion BFS from the anchor over producers and consumers.

    Returns (fixed members, optional boundary ops, units of optional ops, the member each
    optional op was reached from, optional producers' consumers outside the group, stops, notes).
    Anchor-kind ops, ops claimed by another group, and ops the IR core would reject stop the
    growth; ops feeding only inits (fills) are fixed; other fusible neighbours are optional.
    """
    op = graph.op(anchor)
    fixed = [u for u in _fuse_unit(graph, anchor) if u != anchor]
    members = {anchor, *fixed}
    optional: list[int] = []
    units: dict[int, list[int]] = {}
    parent: dict[int, int] = {}
    outside_of: dict[int, list[int]] = {}
    stops: list[Stop] = []
    notes: list[str] = []
    queue = deque((u, anchor) for u in sorted(set(graph.op(anchor).producers) | set(graph.op(anchor).consumers)))
    for f in fixed:
        queue.extend((v, f) for v in graph.op(f).producers + graph.op(f).consumers)
    seen = set(members)
    while queue:
        u, via = queue.popleft()
        if u in seen:
            continue
        seen.add(u)
        cand = graph.op(u)
        unit = _fuse_unit(graph, u)
        if u in claimed:
            stops.append(Stop(u, f"already in group of anchor {claimed[u]}"))
            continue
        if cand.kind in ANCHOR_KINDS:
            stops.append(Stop(u, f"{cand.kind} op: anchors its own group (a tiled reduction cannot share the loop)"))
            continue
        if u in graph.downstream(anchor) and any(v in graph.upstream(anchor) for v in unit):
            stops.append(Stop(u, "fuse group spans both sides of the anchor"))
            continue
        reason = _probe_group(graph, anchor, sorted(members | set(unit)), ranges, op.iterator_types)
        if reason is not None:
            stops.append(Stop(u, reason))
            continue
        members |= set(unit)
        # A fill or an op that only initialises the anchor's accumulator is always worth fusing.
        if cand.kind == "fill":
            fixed += [v for v in unit if v not in fixed]
        else:
            optional.append(u)
            units[u] = unit
            parent[u] = via
        outside = [c for c in cand.consumers if c not in members and c not in graph.upstream(anchor)]
        if outside and u in graph.upstream(anchor):
            outside_of[u] = outside
            notes.append(
                f"op {u} ({cand.name}) also feeds {outside} outside this group: when fused, its "
                "full-size result is still computed for them (charged by the cost model as "
                "recompute + memory); when not fused it is tiled on its own if it does not fit"
            )
        for v in cand.producers + cand.consumers:
            if v not in seen:
                queue.append((v, u))
    return fixed, optional, units, parent, outside_of, stops, notes


def build_space(graph: OpGraph, hardware: HardwareModel, shape_hints: dict[str, list[int]] | None = None) -> SearchSpace:
    shapes = ShapeContext(hints=dict(shape_hints or {}))
    claimed: dict[int, int] = {}
    groups: list[GroupSpec] = []
    notes: list[str] = []
    vector_bytes = hardware.compute.vector_width_bytes
    for anchor in choose_anchors(graph, hardware, shapes):
        if anchor in claimed:
            continue
        op = graph.op(anchor)
        ranges = shapes.loop_ranges(op)
        fixed, optional, units, parent, outside_of, stops, gnotes = grow_group(graph, anchor, claimed, ranges)
        # Units must not be claimed already; fixed fuse-group partners can be claimed only if
        # another group took them, which would split a fuse group: skip this anchor then.
        if any(u in claimed for u in fixed):
            notes.append(f"op {anchor}: its fuse group is already tiled with anchor {claimed[next(u for u in fixed if u in claimed)]}")
            continue
        parallel, reduction = op.parallel_dims, op.reduction_dims
        vec = max(1, vector_bytes // element_bytes(op.element_type))
        innermost = parallel[-1] if parallel else None
        single = single_row_dims(op)
        rows = [d for d in parallel if op.kind == "contraction" and d != innermost and d not in op.batch_dims
                and d not in single]
        spec = GroupSpec(
            index=len(groups),
            anchor=anchor,
            fixed=sorted(fixed),
            optional=optional,
            optional_units=units,
            optional_parent=parent,
            outside_consumers=outside_of,
            stops=stops,
            notes=gnotes,
            ranges=ranges,
            iterator_types=list(op.iterator_types),
            outer_choices={d: outer_sizes(ranges[d], dynamic=op.loop_ranges[d] is None,
                                          vector_elems=vec if d == innermost else None)
                           for d in parallel if ranges[d] > 1},
            inner_choices={d: inner_sizes(ranges[d], vec, d == innermost, op.kind == "convolution",
                                          batch=op.kind == "contraction" and (d in op.batch_dims or d in single)
                                          and d != innermost,
                                          rows=d in rows)
                           for d in parallel if ranges[d] > 1},
            # An image-first contraction's pixels too: one output channel by one or two vectors of
            # pixels over a pixel tile they do not divide (32 of 49) ran fastest on most of
            # pointwise_fidelity.py's shapes, 1.8x IREE's default (docs/benchmarks.md, session 26).
            peeled=tuple(rows) + ((innermost,) if innermost is not None and vectorizes_first_input(op) else ()),
            reduction_choices={d: reduction_sizes(ranges[d], dividing=hardware.compute.masked_remainders)
                               for d in reduction if ranges[d] > 4},
            vector_limit_bytes=hardware.max_vector_tile_bytes,
            elem_bytes=element_bytes(op.element_type),
            anchor_kind=op.kind,
            needs_register_tile=vectorizes_first_input(op),
        )
        transposed_k = op.rhs_contiguous_reduction_dim()
        if transposed_k is not None and innermost is not None:
            _one_transpose_block(spec, innermost, transposed_k, vec)
        if op.kind == "convolution" and hardware.is_cpu:
            _decomposable_convolution(spec, op, vec)
        groups.append(spec)
        for u in [anchor, *fixed, *[v for o in optional for v in units[o]]]:
            claimed[u] = anchor
    # Optional members may be left out by a candidate; they are then tiled on their own if they
    # do not fit (see standalone_groups), else left untiled and charged as un-fused.
    untiled = [u for u in graph.topological_order() if u not in claimed]
    empty = [u for u in untiled if 0 in shapes.loop_ranges(graph.op(u))]
    if empty:
        notes.append(f"op(s) {empty} have a zero-sized dim: they compute nothing and are not tiled")
    return SearchSpace(graph=graph, groups=groups, untiled=untiled, notes=notes, shapes=shapes)


def _one_transpose_block(spec: GroupSpec, n: int, k: int, lanes: int) -> None:
    """A contraction whose B is contiguous along k (weights stored [n, k]): IREE reads B's tile
    along k and transposes it in registers, lanes x lanes at a time. A register tile of one
    vector of n by one vector's lanes of k is that one block; a shorter k leaves partial
    transposes and strided element loads, and a wider n or a longer k keeps several blocks live
    beside the accumulators, which spill (docs/benchmarks.md: the transposed-B sweep). The space offers that
    one block: n = lanes, k = lanes (the whole k when it is shorter)."""
    if spec.ranges[n] > lanes:
        spec.inner_choices[n] = [lanes]
    if k in spec.reduction_choices and spec.ranges[k] > lanes:
        spec.reduction_choices[k] = [lanes]


def _decomposable_convolution(spec: GroupSpec, op: TileableOp, lanes: int) -> None:
    """IREE's CPU convolution pipeline (ConvTileAndDecomposeExpert) decomposes each vector tile
    of a 2-D convolution into 1-D ones, which needs the tile to span one output row and one
    filter row (IREE's own configs: [1, 16, 1, 7] over n, f, oh, ow, and filter tiles of 1).
    So a vector tile takes one image of the batch, one output row and one filter tap; along the
    output row, a divisor of it up to two vectors (IREE: 7 of 28), or a whole vector; output
    channels (when not the innermost dim, which keeps its vector choices) half a vector to two.
    A depthwise convolution may keep its filter row whole (IREE's own: [1, 1, 4, 16] over n, oh,
    ow, c with filter tiles [1, 3]), its channels taking the output channels' choices."""
    dims = op.convolution_dims()
    if dims is None:
        return
    present = lambda d: spec.ranges[d] > 1  # noqa: E731
    ones = [*dims.batch, *dims.output_image[:-1]]
    for d in filter(present, ones):
        spec.inner_choices[d] = [1]
    for d in filter(present, dims.filter_loop[:-1]):
        spec.reduction_choices[d] = [1]
    for d in filter(present, dims.filter_loop[-1:]):
        spec.reduction_choices[d] = [1] if dims.output_channel else [0, 1]
    innermost = op.parallel_dims[-1]
    for d in filter(present, dims.output_image[-1:]):
        extent = spec.ranges[d]
        spec.inner_choices[d] = sorted({x for x in range(1, min(extent, 2 * lanes) + 1) if extent % x == 0 and x < extent}
                                       | ({lanes} if lanes < extent else set()))
    for d in filter(present, dims.output_channel or dims.depth):
        if d != innermost:
            spec.inner_choices[d] = sorted({x for x in (lanes // 2, lanes, 2 * lanes) if 0 < x < spec.ranges[d]}) or [0]


def standalone_group(graph: OpGraph, uid: int, shapes: ShapeContext, hardware: HardwareModel) -> Group | None:
    """A left-out op that does not fit memory, tiled on its own (as super tiling does for a
    multi-consumer producer): parallel dims halved until one tile fits the available memory,
    distributed with forall."""
    op = graph.op(uid)
    total = op_bytes(op, shapes)
    limit = available_memory(hardware)
    ranges = shapes.loop_ranges(op)
    if total <= limit or 0 in ranges:  # fits, or computes nothing
        return None
    sizes = [r if t == "parallel" else 0 for r, t in zip(ranges, op.iterator_types)]
    par = op.parallel_dims
    if not par:
        return None
    frac = 1.0
    while total * frac > limit and any(sizes[d] > 1 for d in par):
        d = max(par, key=lambda i: sizes[i])
        frac *= (sizes[d] // 2) / sizes[d]
        sizes[d] //= 2
    sizes = [s if s < r else 0 for s, r in zip(sizes, ranges)]
    if not any(sizes):
        return None
    return Group(anchor=uid, fuse=[], levels=[Level(tile_sizes=sizes, loop="forall")])


def complete_plan(space: SearchSpace, plan: Plan, hardware: HardwareModel) -> Plan:
    """Add standalone groups for ops no group of `plan` tiles and that do not fit memory."""
    covered = {u for g in plan.groups for u in g.members}
    extra = []
    for uid in space.graph.topological_order():
        if uid in covered or space.graph.op(uid).fuse_groups:
            continue
        g = space.standalone[uid] if uid in space.standalone else standalone_group(space.graph, uid, space.shapes, hardware)
        if g is not None:
            extra.append(g)
    return Plan(groups=[*plan.groups, *extra]) if extra else plan
