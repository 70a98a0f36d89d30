"""Plans -> transform-dialect scripts -> tiled clones.

A plan group is realised the way the diffusion seed describes: the group's sink (its last
consumer, or the anchor when nothing downstream is fused) is tiled with sizes mapped from the
anchor's loop dims through the indexing maps, and every other member is fused into that loop
nest, nearest first. Reduction dims of the anchor are tiled afterwards, on the anchor's copy
alone (consumers cannot live inside a partial reduction), with `scf.for`.

The script matches ops by their `ts.uid` attribute and names every loop it creates with a
`ts.loop` attribute (`g<group>.l<level>[.d<anchor dim>]`), so the origin map can say which loop
each copy sits in. The script is plain MLIR: `iree-opt --transform-interpreter` replays it.
"""

from __future__ import annotations

import functools
import os
import re
from contextlib import contextmanager
from dataclasses import dataclass, field

from .errors import Diagnostic, PlanError
from .graph import UID_ATTR, OpGraph, build_graph, tag_tileable_ops, uid_of, walk_ops
from .mlir import context, ir, transform_interpreter
from .origin import LOOP_ATTR, OriginMap, origin_map
from .parse import diagnostics_of, location_of
from .plan import Group, Plan

@dataclass
class GroupLayout:
    """What a plan group means on the graph: who is the sink, what feeds what."""

    index: int
    group: Group
    members: list[int]  # topological order
    sink: int
    producers: list[int]  # upstream of the anchor
    consumers: list[int]  # downstream of the anchor
    anchor_dims_of: dict[int, dict[int, int]]  # member uid -> {member loop dim: anchor loop dim}
    ins_producers: list[int]  # members that reach the anchor through its `ins`, not its inits
    crosses_reshape: bool


@dataclass
class Applied:
    module: ir.OpView  # the tiled clone
    origin: OriginMap
    script: str
    layouts: list[GroupLayout] = field(default_factory=list)


_GROUP_LOC_PREFIX = "tilesearch group "

# --------------------------------------------------------------------------- plan checks


def _topological(graph: OpGraph, uids: set[int]) -> list[int]:
    return [u for u in graph.topological_order() if u in uids]


def _dim_correspondence(graph: OpGraph, anchor: int, members: set[int]) -> dict[int, dict[int, int]]:
    """For each member, which of its loop dims walk the same index as an anchor loop dim.

    Propagated over edges between members, through the producer's result map and the
    consumer's operand map (both must read the tensor dim as a plain loop dim). Edges through
    reshapes carry no correspondence.
    """
    corr: dict[int, dict[int, int]] = {anchor: {d: d for d in range(len(graph.op(anchor).loop_ranges))}}
    changed = True
    while changed:
        changed = False
        for e in graph.edges:
            if e.producer not in members or e.consumer not in members or e.via:
                continue
            p, c = graph.op(e.producer), graph.op(e.consumer)
            if p.indexing_maps is None or c.indexing_maps is None:
                continue
            p_map = _results(p.indexing_maps[p.num_inputs + e.result])
            c_map = _results(c.indexing_maps[e.operand])
            if len(p_map) != len(c_map):
                continue
            for pd, cd in zip(p_map, c_map):
                if pd is None or cd is None:
                    continue
                # forward (producer known -> consumer) and backward (consumer known -> producer)
                if e.producer in corr and pd in corr[e.producer]:
                    if cd not in corr.setdefault(e.consumer, {}):
                        corr[e.consumer][cd] = corr[e.producer][pd]
                        changed = True
                if e.consumer in corr and cd in corr[e.consumer]:
                    if pd not in corr.setdefault(e.producer, {}):
                        corr[e.producer][pd] = corr[e.consumer][cd]
                        changed = True
    return corr


@functools.lru_cache(maxsize=1024)  # called per edge per plan; the same few maps recur
def _results(map_text: str) -> tuple[int | None, ...]:
    """Loop dim read by each result of an indexing map (None for non-trivial expressions)."""
    with context():
        amap = ir.AffineMapAttr(ir.Attribute.parse(_as_attr(map_text))).value
        return tuple(e.position if isinstance(e, ir.AffineDimExpr) else None for e in amap.results)


def _as_attr(map_text: str) -> str:
    return map_text if map_text.startswith("affine_map<") else f"affine_map<{map_text}>"


def layout_group(graph: OpGraph, index: int, group: Group) -> GroupLayout:
    """Check one group against the graph and work out its sink and dim mapping."""
    missing = [u for u in group.members if u not in graph.ops]
    if missing:
        raise PlanError(f"unknown op uid(s) {missing}; known uids are {sorted(graph.ops)}", index)
    if len(set(group.members)) != len(group.members):
        raise PlanError("an op is listed twice (anchor and fuse must be distinct)", index)
    anchor = graph.op(group.anchor)
    rank = len(anchor.loop_ranges)
    for lv_i, level in enumerate(group.levels):
        if len(level.tile_sizes) != rank:
            raise PlanError(
                f"level {lv_i} has {len(level.tile_sizes)} tile sizes but anchor {anchor.uid} "
                f"({anchor.name}) has {rank} loop dims {anchor.loop_ranges}",
                index,
            )
    if all(s == 0 for lv in group.levels for s in lv.tile_sizes):
        raise PlanError("every tile size is 0: the group tiles nothing", index)
    empty = [u for u in group.members if 0 in graph.op(u).loop_ranges]
    if empty:
        # MLIR 3.13's tiling segfaults on a zero-sized loop (computeTileSizes).
        raise PlanError(f"op(s) {empty} have a zero-sized loop dim: they compute nothing, so there is nothing to tile", index)

    members = set(group.members)
    for gid, uids in graph.fuse_groups.items():
        inside = [u for u in uids if u in members]
        outside = [u for u in uids if u not in members]
        if inside and outside:
            raise PlanError(
                f"fuse group {gid} is split: ops {inside} are in this loop nest but {outside} "
                f"are not; all members {sorted(uids)} must be fused together",
                index,
            )

    order = _topological(graph, members)
    sinks = [u for u in order if not any(c in members for c in graph.op(u).consumers)]
    if len(sinks) != 1:
        raise PlanError(
            f"the fused ops must end in one sink op, found {len(sinks)}: {sinks} "
            "(fuse only ops connected to the anchor through other fused ops)",
            index,
        )
    sink = sinks[0]
    for u in order:
        if u != sink and sink not in graph.downstream(u):
            raise PlanError(f"op {u} ({graph.op(u).name}) does not feed the sink op {sink}", index)

    upstream = graph.upstream(group.anchor)
    downstream = graph.downstream(group.anchor)
    producers = [u for u in order if u in upstream]
    consumers = [u for u in order if u in downstream]
    corr = _dim_correspondence(graph, group.anchor, members)

    # Members reaching the anchor through its ins (a fill feeding only the init stays out of
    # reduction loops: it must run once, before the partial sums).
    ins_producers: set[int] = set()
    for e in graph.edges_into(group.anchor):
        if e.producer in members and e.operand < anchor.num_inputs:
            ins_producers.add(e.producer)
            ins_producers |= graph.upstream(e.producer) & members

    crosses = any(
        e.via for e in graph.edges if e.producer in members and e.consumer in members
    )
    if sink != group.anchor:
        mapped = set(corr.get(sink, {}).values())
        for level in group.levels:
            lost = [d for d in anchor.parallel_dims if level.tile_sizes[d] and d not in mapped]
            if lost:
                via = sorted({v for e in graph.edges for v in e.via if e.producer in members})
                why = f" across {', '.join(via)}" if via else ""
                raise PlanError(
                    f"anchor dim(s) {lost} cannot be mapped to the sink op {sink} "
                    f"({graph.op(sink).name}){why}: consumer fusion needs the anchor's tiled dims "
                    "to reach the sink through plain indexing maps",
                    index,
                )
    _reject_single_for_multi_use_fusion(graph, index, group, members, sink)
    return GroupLayout(
        index=index,
        group=group,
        members=order,
        sink=sink,
        producers=producers,
        consumers=consumers,
        anchor_dims_of=corr,
        ins_producers=_topological(graph, ins_producers),
        crosses_reshape=crosses,
    )


def _reject_single_for_multi_use_fusion(graph: OpGraph, index: int, group: Group, members: set[int], sink: int) -> None:
    """MLIR 3.13 aborts the process ("SmallVector unable to grow") when fuse_into_containing_op
    fuses a producer whose result is also used outside the group into a nest of ONE scf.for
    (parallel tiling of a single dim). Two loops or scf.forall work: reject only that shape."""
    shared = [u for u in members if u != sink and any(c not in members for c in graph.op(u).consumers)]
    if not shared:
        return
    anchor = graph.op(group.anchor)
    for li, level in enumerate(group.levels):
        tiled = [d for d in anchor.parallel_dims if level.tile_sizes[d]]
        if level.loop == "for" and len(tiled) == 1:
            raise PlanError(
                f"level {li} tiles one parallel dim with scf.for while fused op(s) {shared} also feed "
                "ops outside the group: MLIR aborts on that fusion (upstream bug in this version); "
                'use "loop": "forall", tile a second parallel dim, or leave those ops unfused',
                index,
            )


def check_plan(graph: OpGraph, plan: Plan, memo: dict | None = None) -> list[GroupLayout]:
    """Every group laid out, or a PlanError naming the group and the reason. `memo` (a dict the
    caller keeps for one graph) remembers each group's layout or error: a search checks
    thousands of plans that differ in one group."""
    if not plan.groups:
        raise PlanError("plan has no groups")
    seen: dict[int, int] = {}
    layouts = []
    for index, group in enumerate(plan.groups):
        for u in group.members:
            if u in seen:
                raise PlanError(f"op {u} is already in group {seen[u]}", index)
            seen[u] = index
        if memo is None:
            layouts.append(layout_group(graph, index, group))
            continue
        key = (index, group.anchor, tuple(group.fuse), tuple((tuple(lv.tile_sizes), lv.loop) for lv in group.levels))
        if key not in memo:
            try:
                memo[key] = layout_group(graph, index, group)
            except PlanError as err:
                memo[key] = err
        if isinstance(memo[key], PlanError):
            err = memo[key]  # a fresh exception: re-raising one instance grows its traceback
            raise PlanError(err.reason, err.group, list(err.diagnostics))
        layouts.append(memo[key])
    return layouts


# --------------------------------------------------------------------------- script text


class _ScriptWriter:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self._n = 0
        self.group = -1

    def fresh(self, stem: str) -> str:
        self._n += 1
        return f"%{stem}{self._n}"

    def emit(self, line: str) -> None:
        # Every op carries loc("tilesearch group N"): a failure names its group exactly.
        if not line.endswith("{"):
            line = f'{line} loc("{_GROUP_LOC_PREFIX}{self.group}")'
        self.lines.append("    " + line)

    def match_uid(self, uid: int, scope: str) -> str:
        h = self.fresh("op")
        self.emit(
            f"{h} = transform.structured.match attributes{{{UID_ATTR} = {uid} : i64}} in {scope} "
            ": (!transform.any_op) -> !transform.any_op"
        )
        return h

    def annotate_loop(self, loop: str, name: str) -> None:
        p = self.fresh("name")
        self.emit(f'{p} = transform.param.constant "{name}" -> !transform.any_param')
        self.emit(f'transform.annotate {loop} "{LOOP_ATTR}" = {p} : !transform.any_op, !transform.any_param')

    def tile(self, target: str, sizes: list[int], loop: str) -> tuple[str, list[str]]:
        """Tile `target`; returns (tiled op handle, loop handles outermost first)."""
        sizes_txt = ", ".join(str(s) for s in sizes)
        tiled = self.fresh("tiled")
        if loop == "forall":
            forall = self.fresh("forall")
            self.emit(
                f"{tiled}, {forall} = transform.structured.tile_using_forall {target} "
                f"tile_sizes [{sizes_txt}] : (!transform.any_op) -> (!transform.any_op, !transform.any_op)"
            )
            return tiled, [forall]
        loops = [self.fresh("for") for s in sizes if s]
        types = ", ".join(["!transform.any_op"] * (1 + len(loops)))
        self.emit(
            f"{tiled}, {', '.join(loops)} = transform.structured.tile_using_for {target} "
            f"tile_sizes [{sizes_txt}] : (!transform.any_op) -> ({types})"
        )
        return tiled, loops

    def fuse_into(self, producer: str, loop: str) -> str:
        fused, new_loop = self.fresh("fused"), self.fresh("loop")
        self.emit(
            f"{fused}, {new_loop} = transform.structured.fuse_into_containing_op {producer} into {loop} "
            ": (!transform.any_op, !transform.any_op) -> (!transform.any_op, !transform.any_op)"
        )
        return new_loop

    def bubble_up_slices(self, funcs: str) -> None:
        # Rewrites extract_slice(expand_shape(x)) into expand_shape(extract_slice(x)) so the
        # producer of x becomes fusible: fusion across the reshape (the TilingInterface-split seed).
        self.emit(f"transform.apply_patterns to {funcs} {{")
        self.lines.append("      transform.apply_patterns.tensor.bubble_up_extract_slice")
        self.emit("} : !transform.any_op")

    def text(self) -> str:
        head = [
            "module attributes {transform.with_named_sequence} {",
            "  transform.named_sequence @__transform_main(%root: !transform.any_op {transform.readonly}) {",
            "    // generated by tilesearch: ops are matched by their ts.uid attribute",
        ]
        return "\n".join(head + self.lines + ["    transform.yield", "  }", "}", ""])


def _emit_group(w: _ScriptWriter, graph: OpGraph, lay: GroupLayout, funcs: str) -> None:
    g = lay.group
    anchor = graph.op(g.anchor)
    w.group = lay.index
    w.lines.append(f"    // group {lay.index}: anchor {g.anchor} ({anchor.name}), sink {lay.sink}, fuse {g.fuse}")
    scope = "%root"
    target = lay.sink
    fusable = [u for u in reversed(lay.members) if u != target]
    for li, level in enumerate(g.levels):
        parallel = [s if t == "parallel" else 0 for s, t in zip(level.tile_sizes, anchor.iterator_types)]
        reduction = [s if t == "reduction" else 0 for s, t in zip(level.tile_sizes, anchor.iterator_types)]
        if any(parallel):
            corr = lay.anchor_dims_of.get(target, {})
            target_rank = len(graph.op(target).loop_ranges)
            sizes = [parallel[corr[d]] if d in corr else 0 for d in range(target_rank)]
            handle = w.match_uid(target, scope)
            _, loops = w.tile(handle, sizes, level.loop)
            if level.loop == "for":
                # A producer reaching the target only through its init becomes the scf.for
                # iter_arg init: it cannot move into the loop and stays one level out.
                fusable_here = [u for u in fusable if u not in _init_only_producers(graph, lay, target)]
                names = [f"g{lay.index}.l{li}.d{corr.get(d, d)}" for d, s in enumerate(sizes) if s]
            else:
                fusable_here = fusable
                names = [f"g{lay.index}.l{li}"]
            loops[-1] = _fuse_members(w, fusable_here, scope, loops[-1], lay, funcs)
            # Named after fusion: fusing into an scf.forall may replace the loop op.
            for loop, name in zip(loops, names):
                w.annotate_loop(loop, name)
            scope = loops[-1]
        if any(reduction):
            # Partial sums cannot be shared with consumers: from here on only the anchor and
            # the producers of its ins are tiled.
            target = g.anchor
            fusable = [u for u in reversed(lay.ins_producers)]
            handle = w.match_uid(target, scope)
            _, loops = w.tile(handle, reduction, "for")
            loops[-1] = _fuse_members(w, fusable, scope, loops[-1], lay, funcs)
            for loop, d in zip(loops, [d for d, s in enumerate(reduction) if s]):
                w.annotate_loop(loop, f"g{lay.index}.l{li}.d{d}")
            scope = loops[-1]


def _init_only_producers(graph: OpGraph, lay: GroupLayout, target: int) -> set[int]:
    """Members that feed `target` only through its init (destination) operands."""
    members = set(lay.members)
    op = graph.op(target)
    via_ins: set[int] = set()
    via_init: set[int] = set()
    for e in graph.edges_into(target):
        if e.producer not in members:
            continue
        reach = {e.producer} | (graph.upstream(e.producer) & members)
        (via_ins if e.operand < op.num_inputs else via_init).update(reach)
    # Members reaching the target through other members (consumer chains) are not init-only.
    others = {u for u in members if u != target and target in graph.downstream(u)} - via_init
    return via_init - via_ins - {u for u in others}


def _fuse_members(w: _ScriptWriter, uids: list[int], scope: str, loop: str, lay: GroupLayout, funcs: str) -> str:
    """Fuse the copies of `uids` found in `scope` into `loop`, nearest first; returns the loop."""
    if lay.crosses_reshape:
        w.bubble_up_slices(funcs)
    handles = [w.match_uid(u, scope) for u in uids]
    for h in handles:
        loop = w.fuse_into(h, loop)
    return loop


def transform_script(graph: OpGraph, plan: Plan) -> tuple[str, list[GroupLayout]]:
    """The transform script realising `plan`, and its group layouts."""
    layouts = check_plan(graph, plan)
    w = _ScriptWriter()
    funcs = w.fresh("funcs")
    w.emit(f'{funcs} = transform.structured.match ops{{["func.func"]}} in %root : (!transform.any_op) -> !transform.any_op')
    for lay in layouts:
        _emit_group(w, graph, lay, funcs)
    w.group = -1
    w.emit(f"transform.apply_dce to {funcs} : !transform.any_op")
    w.emit(f"transform.apply_cse to {funcs} : !transform.any_op")
    return w.text(), layouts


# --------------------------------------------------------------------------- apply


def is_tagged(module: ir.Module | ir.OpView) -> bool:
    return any(uid_of(op) is not None for op in walk_ops(module.operation))


class ScriptFailed(Exception):
    def __init__(self, diagnostics: list[Diagnostic], groups: list[int]) -> None:
        super().__init__("; ".join(d.message for d in diagnostics))
        self.diagnostics = diagnostics
        self.groups = groups


_REPORT_LINE = re.compile(
    r'^(?:Diagnostic message )?at loc\("(?P<file>[^"]*)"(?::(?P<line>\d+):(?P<col>\d+))?\): ?(?P<msg>.*)$'
)


def _diagnostics_from_report(report: str) -> list[tuple[Diagnostic, int | None]]:
    """(diagnostic, plan group) pairs from the interpreter's failure report.

    Lines located in the script carry loc("tilesearch group N"); the others point into the
    payload module, i.e. the user's text (line:column).
    """
    out: list[tuple[Diagnostic, int | None]] = []
    for raw in report.replace("at loc(", "\nat loc(").splitlines():
        m = _REPORT_LINE.match(raw.strip())
        if not m or m["msg"].startswith("see current operation") or not m["msg"]:
            continue
        if m["file"].startswith(_GROUP_LOC_PREFIX):
            out.append((Diagnostic(message=m["msg"], severity="note"), int(m["file"].removeprefix(_GROUP_LOC_PREFIX))))
        else:
            line, col = (int(m["line"]), int(m["col"])) if m["line"] else (None, None)
            out.append((Diagnostic(message=m["msg"], line=line, column=col), None))
    return out


def _group_of(loc: ir.Location) -> int | None:
    try:
        name = ir.NameLoc(loc).name_str
    except (TypeError, ValueError):
        return None
    if name.startswith(_GROUP_LOC_PREFIX):
        return int(name.removeprefix(_GROUP_LOC_PREFIX))
    return None


@contextmanager
def _stderr_silenced():
    """The interpreter prints a failed script's diagnostics, op dumps included (up to 20 KB a
    plan), to the process's stderr as well as raising them; they are read from the exception,
    and a search tries thousands of plans, so the copy on fd 2 goes to /dev/null."""
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def run_script(module: ir.Module | ir.OpView, script: str) -> None:
    """Apply a transform script to `module` in place (callers pass a clone).

    Raises ScriptFailed with MLIR's diagnostics (payload locations as line/column) and the
    plan groups whose script ops failed.
    """
    with context() as ctx:
        parsed = ir.Module.parse(script)
        entry = next(
            op for op in parsed.body.operations
            if "sym_name" in op.operation.attributes
            and ir.StringAttr(op.operation.attributes["sym_name"]).value == "__transform_main"
        )
        diagnostics: list[Diagnostic] = []
        groups: list[int] = []

        def collect(diag: ir.DiagnosticInfo) -> bool:
            group = _group_of(diag.location)
            if group is not None and group >= 0:
                groups.append(group)
            line, col = (None, None) if group is not None else location_of(diag.location)
            diagnostics.append(
                Diagnostic(
                    message=str(diag.message),
                    line=line,
                    column=col,
                    severity=str(diag.severity).rsplit(".", 1)[-1].lower(),
                    notes=tuple(str(n.message) for n in diag.notes),
                )
            )
            return True  # handled: keep MLIR from printing to stderr

        handler = ctx.attach_diagnostic_handler(collect)
        try:
            with _stderr_silenced():
                transform_interpreter.apply_named_sequence(module.operation, entry, parsed)
        except ir.MLIRError as exc:
            diagnostics.extend(diagnostics_of(exc))
            raise ScriptFailed(diagnostics, groups) from None
        except ValueError as exc:
            # This binding reports the interpreter's diagnostics only inside the exception text.
            reported = _diagnostics_from_report(str(exc))
            diagnostics.extend(d for d, _ in reported)
            groups.extend(g for _, g in reported if g is not None)
            if not diagnostics:
                diagnostics.append(Diagnostic(message=str(exc).splitlines()[0]))
            raise ScriptFailed(diagnostics, groups) from None
        finally:
            handler.detach()


def apply_plan(module: ir.Module | ir.OpView, plan: Plan, graph: OpGraph | None = None) -> Applied:
    """Apply `plan` to a CLONE of `module` (tagged with ts.uid; tagged here if it is not).

    The input is never modified. Raises PlanError naming the group when the plan breaks a rule
    or MLIR cannot apply it.
    """
    with context():
        tagged = module if is_tagged(module) else tag_tileable_ops(module)
        graph = graph or build_graph(tagged)
        clone, script, layouts = tiled_clone(tagged, plan, graph)
        return Applied(module=clone, origin=origin_map(clone, graph), script=script, layouts=layouts)


def tiled_clone(tagged: ir.Module | ir.OpView, plan: Plan, graph: OpGraph) -> tuple[ir.OpView, str, list[GroupLayout]]:
    """The tiled clone of an already tagged module, its script and layouts, without the origin
    map (the search scores thousands of clones and reads only their IR). Raises PlanError."""
    with context():
        script, layouts = transform_script(graph, plan)
        clone = tagged.operation.clone()
        try:
            run_script(clone, script)
        except ScriptFailed as failed:
            clone.operation.erase()
            errors = [d for d in failed.diagnostics if d.severity == "error"] or failed.diagnostics
            reason = "MLIR could not apply the plan: " + "; ".join(dict.fromkeys(d.message for d in errors))
            raise PlanError(reason, failed.groups[0] if failed.groups else None, failed.diagnostics) from None
        try:
            clone.operation.verify()
        except ir.MLIRError as err:
            diags = diagnostics_of(err)
            clone.operation.erase()
            raise PlanError("the tiled module does not verify", None, diags) from None
        return clone, script, layouts


__all__ = [
    "Applied",
    "GroupLayout",
    "LOOP_ATTR",
    "apply_plan",
    "check_plan",
    "layout_group",
    "run_script",
    "tiled_clone",
    "transform_script",
]
