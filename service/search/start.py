"""Start-plan repair: where each group's search starts, and what to do when that does not apply.

Each group starts at its first warm start, else its default knob values. When the whole
starting plan does not apply in MLIR, the failure is put down to one group (the one the IR core
names, else a standalone tiling not settled yet): a group starts without its boundary ops, then
untiled; a standalone tiling (an op no group tiles that does not fit memory) is tried with
scf.for, then the op is left whole. Otherwise every candidate of every group would carry the
failure.
"""

from __future__ import annotations

from typing import Protocol

from service.ir.plan import Group, Plan

from .candidate import Candidate, Evaluation
from .evaluator import PlanEvaluator
from .knobs import fuse_knob, group_name, is_fuse_knob, loop_knob, tile_knob
from .space import GroupSpec, SearchSpace


class SearchSteps(Protocol):
    """What start-plan repair uses of the search it repairs for (the engine's search)."""

    space: SearchSpace
    evaluator: PlanEvaluator
    warnings: list[str]
    left_whole: dict[int, str | None]  # standalone tilings MLIR cannot apply: uid -> why

    def plan_of(self, params_by_group: dict[str, dict]) -> Plan | str: ...

    def evaluate_one(self, plan: Plan, source: str, params: dict | None = None) -> Evaluation: ...

    def record(self, evs: list[Evaluation]) -> None: ...


def params_from_group(spec: GroupSpec, group: Group) -> dict | None:
    """Knob values reproducing a known group (warm start), or None if it is outside the space."""
    rank = len(spec.ranges)
    levels = list(group.levels)
    if any(len(lv.tile_sizes) != rank for lv in levels):
        return None
    outer = levels[0] if levels and any(lv for lv, t in zip(levels[0].tile_sizes, spec.iterator_types) if t == "parallel") else None
    rest = levels[1:] if outer else levels
    inner = next((lv for lv in rest if any(s for s, t in zip(lv.tile_sizes, spec.iterator_types) if t == "parallel")), None)
    red = next((lv for lv in levels if any(s for s, t in zip(lv.tile_sizes, spec.iterator_types) if t == "reduction")), None)
    p: dict = {loop_knob(spec.name): outer.loop if outer else "forall"}
    for d in spec.outer_choices:
        p[tile_knob(spec.name, "outer", d)] = outer.tile_sizes[d] if outer else 0
    for d in spec.inner_choices:
        p[tile_knob(spec.name, "inner", d)] = inner.tile_sizes[d] if inner else 0
    for d in spec.reduction_choices:
        p[tile_knob(spec.name, "red", d)] = red.tile_sizes[d] if red else 0
    for u in spec.optional:
        p[fuse_knob(spec.name, u)] = u in group.fuse
    knobs = {k.name: k.choices for k in spec.knobs()}
    if any(v not in knobs[k] for k, v in p.items()):
        return None
    return p


def without_boundary_ops(name: str, params: dict) -> dict:
    """The group's knobs with every optional boundary op left unfused: the start to try when
    fusing them fails in MLIR (a consumer fused beside a fill on dynamic shapes: "could not find
    next producer to fuse"), before the group starts untiled."""
    return {k: False if is_fuse_knob(k, name) else v for k, v in params.items()}


def score_warm_starts(search: SearchSteps, warm_start_plans: list[dict]) -> dict[str, list[dict]]:
    """Score the warm-start plans; each group's knob values in them, where in the space."""
    warm_by_group: dict[str, list[dict]] = {g.name: [] for g in search.space.groups}
    items = []
    for i, wp in enumerate(warm_start_plans):
        try:
            plan = Plan.model_validate(wp)
        except Exception as exc:
            search.warnings.append(f"warm start plan {i} ignored: {exc}")
            continue
        items.append((Candidate(params={}, source="warm_start", plan=plan), plan))
        for spec in search.space.groups:
            for grp in plan.groups:
                if grp.anchor == spec.anchor:
                    p = params_from_group(spec, grp)
                    if p is not None:
                        warm_by_group[spec.name].append(p)
    if items:
        search.record(search.evaluator.evaluate(items))
    return warm_by_group


def start_context(search: SearchSteps, warm_by_group: dict[str, list[dict]], repair: bool) -> dict[str, dict]:
    """Each group's starting knob values: its first warm start, else its default. With `repair`,
    the starting plan is scored, and when it does not apply, what of it does (applicable_context)."""
    context: dict[str, dict] = {}
    for spec in search.space.groups:
        start = (warm_by_group[spec.name] or [spec.default_params()])[0]
        if not isinstance(spec.to_group(start), str):
            context[spec.name] = start
    if repair and search.space.groups and context:
        start_ev = search.evaluate_one(search.plan_of(context), "default")
        search.record([start_ev])
        if start_ev.stage != "cost":
            context = applicable_context(search, context)
    return context


def settle_standalone(search: SearchSteps, failed: Group, reason: str | None) -> bool:
    """A standalone tiling (an op no group tiles that does not fit memory; every plan carries
    it) that MLIR could not apply: try it with scf.for, then leave the op whole
    (tensor.concat along its concat dim). False if `failed` is not one."""
    uid, standalone = failed.anchor, search.space.standalone
    if failed.fuse or uid in standalone and standalone[uid] is None:
        return False
    if uid not in standalone and failed.levels[0].loop == "forall":
        levels = [lv.model_copy(update={"loop": "for"}) for lv in failed.levels]
        standalone[uid] = failed.model_copy(update={"levels": levels})
    else:
        standalone[uid] = None
        search.left_whole[uid] = reason  # warned about at the end unless a group of the plan tiles it
    return True


def blamed_group(search: SearchSteps, plan: Plan, ev: Evaluation, searched: dict[str, dict]) -> Group | None:
    """The group of `plan` a failure is put down to: the one the IR core names, else (MLIR
    located the failure in the payload only) the first standalone tiling not settled yet; None
    when there is none to suspect."""
    # The IR core numbers the groups as the worker applied them: in canonical_json's order.
    applied = sorted(plan.groups, key=lambda g: g.anchor)
    if ev.failed_group is not None and ev.failed_group < len(applied):
        return applied[ev.failed_group]
    unsettled = [g for g in plan.groups if group_name(g.anchor) not in searched and not g.fuse
                 and search.space.standalone.get(g.anchor, g) is not None]
    return unsettled[0] if unsettled else None


def _warn_untiled(search: SearchSteps, name: str, ev: Evaluation) -> None:
    search.warnings.append(f"group {name} starts untiled: its starting tiling does not apply ({ev.reason})")


def applicable_context(search: SearchSteps, start: dict[str, dict]) -> dict[str, dict]:
    """The starting groups that apply together; a group whose starting tiling MLIR cannot
    apply (e.g. producer fusion across a collapse_shape) starts without its boundary ops,
    then untiled, or every candidate of every other group would carry its failure. The
    failing group is read off the failure (one evaluation per failing group); when the
    failure names none, groups are added one at a time."""
    kept = dict(start)
    while kept:
        plan = search.plan_of(kept)
        if isinstance(plan, str):
            break
        ev = search.evaluate_one(plan, "default")
        search.record([ev])
        if ev.stage == "cost":
            return kept
        failed = blamed_group(search, plan, ev, kept)
        if failed is None:
            break
        name = group_name(failed.anchor)
        if name in kept and without_boundary_ops(name, kept[name]) != kept[name]:
            kept[name] = without_boundary_ops(name, kept[name])
        elif name in kept:
            del kept[name]
            _warn_untiled(search, name, ev)
        elif not settle_standalone(search, failed, ev.reason):
            break
    kept = {}
    for name, params in start.items():
        while True:
            plan = search.plan_of({**kept, name: params})
            ev = search.evaluate_one(plan, "default", params)
            search.record([ev])
            if ev.stage == "cost":
                kept[name] = params
                break
            # A standalone tiling that fails is settled and the group tried again: it is not
            # the group's failure, and every candidate would carry it.
            failed = blamed_group(search, plan, ev, {**kept, name: params}) if not isinstance(plan, str) else None
            if failed is not None and group_name(failed.anchor) not in {**kept, name: params} \
                    and settle_standalone(search, failed, ev.reason):
                continue
            if without_boundary_ops(name, params) != params:
                params = without_boundary_ops(name, params)
                continue
            if not any(w.startswith(f"group {name} starts untiled") for w in search.warnings):
                _warn_untiled(search, name, ev)
            break
    return kept
