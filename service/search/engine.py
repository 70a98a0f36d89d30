"""The search engine: strategies propose, the IR core applies plans to clones, the cost model scores.

Groups are searched in turn (coordinate descent): while one group's knobs are searched, every
other group is held at its best so far, so each evaluation is a whole-module cost and all
evaluations are comparable. Evaluations run in worker processes (MLIR holds the GIL), in
batches; each worker parses the module once and reuses it (cache keyed by the text's hash).
Results are told to the strategy in the order it suggested, so a seed fixes the outcome.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Any, Callable

from pydantic import BaseModel, Field

from service.hardware.model import HardwareModel
from service.ir.analysis import analyze
from service.ir.errors import PlanError
from service.ir.hints import hint_for
from service.ir.mlir import trust_ir_when_printing
from service.ir.plan import Group, Plan
from service.ir.transform import check_plan

from .candidate import Candidate, Evaluation
from .shapes import bucket_hints, bucketed_dims, check_shapes, parse_buckets, parse_shape_hints, several_functions
from .space import DEFAULT_DYNAMIC_EXTENT, SPACE_VERSION, GroupSpec, build_space, complete_plan
from .strategies import Strategy, SuperTilingStrategy, check_strategy, make_strategy, supertiling_plan

log = logging.getLogger(__name__)

ProgressFn = Callable[[int, int, float | None], None]  # (evaluations, budget, best latency)
_TASK_TIMEOUT_S = 60.0
_PLANS_PER_TASK = 2
# Candidates per strategy round: a function of how many the group's search has proposed, never
# of the worker count, so a seed fixes the results. Small rounds while TPE is learning the
# space (it hears back after each round), then larger ones that keep both cores busy while the
# strategy proposes (mlp_chain, TPE, budget 200: 16 a round after the first 64 proposals raises
# evaluations/s by ~15%, and best-at-50 is as good as with 8 throughout; README).
_BATCH_SMALL, _BATCH_LARGE, _BATCH_GROWS_AFTER = 8, 16, 64
_CONVERGED_AFTER = 200  # suggestions in a row without a new plan: the strategy has converged
# Workers yield to the strategy process (measured on 2 cores, mlp_chain TPE: ~160 evals/s at
# niceness 0, ~200 at 15). They are the search's own helpers and die with it; under outside
# load they also yield to it, as a background autotuner should.
_WORKER_NICENESS = 15


def _batch_size(proposed: int) -> int:
    return _BATCH_SMALL if proposed < _BATCH_GROWS_AFTER else _BATCH_LARGE


# --------------------------------------------------------------------------- worker side

_analyses: OrderedDict[str, Any] = OrderedDict()
_extracts: OrderedDict[tuple, Any] = OrderedDict()  # (source hash, scope) -> (module, graph) | reason
_hardware: dict[str, HardwareModel] = {}
# Nest costs kept across plans (service.hardware.cost.NestMemo), per (source hash, scope,
# hardware, shape hints).
_nest_costs: OrderedDict[tuple, dict] = OrderedDict()


def _source_key(source: str) -> str:
    """What a worker's caches know a module by."""
    return hashlib.sha256(source.encode()).hexdigest()


def _analysis(source: str):
    key = _source_key(source)
    if key not in _analyses:
        _analyses[key] = analyze(source)
        if len(_analyses) > 8:
            _analyses.popitem(last=False)
    _analyses.move_to_end(key)
    return _analyses[key]


def _hardware_of(hardware_json: str) -> HardwareModel:
    if hardware_json not in _hardware:
        _hardware[hardware_json] = HardwareModel.model_validate_json(hardware_json)
    return _hardware[hardware_json]


def _extract(source: str, scope: tuple[int, ...]):
    """(tagged extract, its graph) of the scope's ops, cached per worker; raises NotExtractable."""
    from service.ir.extract import NotExtractable, extract_ops
    from service.ir.graph import build_graph

    key = (_source_key(source), scope)
    if key not in _extracts:
        try:
            module = extract_ops(_analysis(source).tagged, set(scope))
            _extracts[key] = (module, build_graph(module))
        except NotExtractable as err:
            _extracts[key] = str(err)
        if len(_extracts) > 32:
            _extracts.popitem(last=False)
    found = _extracts[key]
    if isinstance(found, str):
        raise NotExtractable(found)
    return found


def prepare_scope(source: str, scope: list[int]) -> str | None:
    """Build the extract of `scope` (cached); why it cannot be built, or None."""
    from service.ir.extract import NotExtractable

    try:
        _extract(source, tuple(scope))
    except NotExtractable as err:
        return str(err)
    return None


def _kept_nest_costs(source: str, scope: list[int] | None, hardware_json: str, shape_hints: dict, graph) -> dict | None:
    """This worker's kept nest costs (NestMemo.entries) for the module, scope, hardware and
    hints; None on dynamic shapes (see NestMemo)."""
    if not graph.has_static_shapes():
        return None
    key = (_source_key(source), tuple(scope or ()), hardware_json, json.dumps(shape_hints or {}, sort_keys=True))
    if key not in _nest_costs:
        _nest_costs[key] = {}
        if len(_nest_costs) > 8:
            _nest_costs.popitem(last=False)
    _nest_costs.move_to_end(key)
    return _nest_costs[key]


def _single_op_groups(layouts) -> dict[int, tuple]:
    """Plan groups that tile one op and fuse nothing, by index in the applied plan: the groups
    NestMemo keeps the nests of."""
    return {lay.index: (lay.group.anchor, tuple((tuple(lv.tile_sizes), lv.loop) for lv in lay.group.levels))
            for lay in layouts if not lay.group.fuse}


def peak_footprint(cost) -> int:
    levels = cost.levels[1:] or cost.levels
    return max((lv.footprint_bytes for lv in levels), default=0)


def evaluate_plans(source: str, hardware_json: str, shape_hints: dict, plans: list[dict], exact: bool = False,
                   scope: list[int] | None = None) -> list[dict]:
    """Apply each plan to a clone and score it. Runs in a worker; text and JSON in and out.

    exact=False skips the cost model's pass over the untiled original, which only refines the
    recompute_flops breakdown (latency and feasibility are the same) and doubles the cost.
    With `scope` (op uids), each plan's groups anchored in it are applied to the extract of
    those ops (service.ir.extract) and only its nests are costed."""
    from service.hardware.cost import NestMemo, estimate_cost
    from service.ir.mlir import context
    from service.ir.transform import tiled_clone

    if scope is None:
        a = _analysis(source)
        payload, graph = a.tagged, a.graph
    else:
        payload, graph = _extract(source, tuple(scope))
    hw = _hardware_of(hardware_json)
    kept = _kept_nest_costs(source, scope, hardware_json, shape_hints, graph)
    out = []
    for plan_json in plans:
        t0 = time.perf_counter()
        plan = Plan.model_validate(plan_json)
        if scope is not None:
            plan = Plan(groups=[g for g in plan.groups if g.anchor in scope])
        tiled = None
        try:
            tiled, _, layouts = tiled_clone(payload, plan, graph) if plan.groups else (payload, "", [])
            memo = NestMemo(keys=_single_op_groups(layouts), entries=kept) if kept is not None else None
            cost = estimate_cost(tiled, hw, shape_hints or None, original=payload if exact else None, memo=memo)
        except PlanError as err:
            out.append({"stage": "rejected", "reason": str(err), "seconds": time.perf_counter() - t0})
            continue
        except Exception as exc:  # a bug on one plan costs that plan, not its batch or the request
            log.warning("evaluating plan %s failed", plan_json, exc_info=True)
            out.append({"stage": "rejected", "reason": f"evaluation failed (a tilesearch bug): {type(exc).__name__}: {exc}",
                        "seconds": time.perf_counter() - t0})
            continue
        finally:
            if tiled is not None and tiled is not payload:
                with context():
                    tiled.operation.erase()
        out.append({
            "stage": "cost",
            "feasible": cost.feasible,
            "latency_s": cost.latency_s,
            "bound_by": cost.bound_by,
            "peak_footprint_bytes": peak_footprint(cost),
            "reason": "; ".join(cost.reasons) or None,
            "cost": cost.model_dump(mode="json"),
            "seconds": time.perf_counter() - t0,
        })
    return out


def _evaluate_in_worker(source: str, hardware_json: str, shape_hints: dict, plans: list[dict], exact: bool = False,
                        scope: list[int] | None = None) -> list[dict]:
    """evaluate_plans at a lower priority than the search: the strategy (Optuna's ask) is the
    serial part, and when it waits for a core behind the workers they soon wait for it."""
    os.setpriority(os.PRIO_PROCESS, 0, _WORKER_NICENESS)
    trust_ir_when_printing()
    return evaluate_plans(source, hardware_json, shape_hints, plans, exact, scope)


def _warm_up(source: str, hardware_json: str) -> bool:
    trust_ir_when_printing()
    _analysis(source)
    _hardware_of(hardware_json)
    return True


# --------------------------------------------------------------------------- results


class BucketResult(BaseModel):
    name: str
    value: int
    range: list[int | None] = Field(description="[low exclusive, high inclusive]; None = unbounded")
    shape_hints: dict[str, list[int]]
    plan: dict
    predicted: dict
    baseline: dict | None


class TuneResult(BaseModel):
    plan: dict = Field(description="best plan JSON ({'groups': []} = leave the module untiled)")
    plan_hash: str
    predicted: dict = Field(description="the best plan's cost (Cost.model_dump()): latency_s, feasible, bound_by, ...")
    feasible: bool
    baseline: dict | None = Field(description="seed 000 super tiling: plan and its cost")
    untiled: dict | None = None
    strategy: str
    seed: int
    budget: int
    seconds_limit: float | None
    evaluations: int = Field(description="distinct plans applied and costed")
    evaluations_per_s: float
    elapsed_s: float
    complete: bool = Field(description="False when the time budget cut the search short")
    space_size: int
    space_version: str = SPACE_VERSION
    groups: list[dict] = Field(default_factory=list, description="tile groups: anchor, members, stops with reasons, notes")
    trials: list[Evaluation] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    shape_hints: dict[str, list[int]] = Field(default_factory=dict)
    buckets: list[BucketResult] | None = None
    dispatch: list[dict] | None = Field(default=None, description="which bucket plan serves which range of the bucketed dim")
    measured: dict | None = Field(default=None, description="measure-in-the-loop refinement (service.measure.refine): "
                                  "the top plans and IREE's default timed on this machine, and which answered")

    def summary(self) -> dict:
        """The CLI's --json shape."""
        return {
            "plan": self.plan,
            "predicted": {"latency_s": self.predicted.get("latency_s"), "feasible": self.feasible, "bound_by": self.predicted.get("bound_by"),
                          **({"reasons": self.predicted.get("reasons", [])} if not self.feasible else {})},
            "baseline": {"latency_s": (self.baseline or {}).get("latency_s"), "feasible": (self.baseline or {}).get("feasible")},
            "evaluations": self.evaluations,
            "evaluations_per_s": self.evaluations_per_s,
            "complete": self.complete,
            "warnings": self.warnings,
            **({"dispatch": self.dispatch} if self.dispatch else {}),
            **({"measured": self.measured} if self.measured else {}),
        }


# --------------------------------------------------------------------------- evaluation


def _within_or_outside(plan: Plan, ops) -> bool:
    """Every group of `plan` lies wholly inside `ops` or wholly outside them."""
    inside = set(ops)
    return all(set(g.members) <= inside or not set(g.members) & inside for g in plan.groups)


@dataclass(frozen=True)
class GroupScope:
    """Score one group's plans on the extract of its ops (service.ir.extract) while the rest of
    the module is held at the search context. The cost model prices each loop nest on its own,
    so the whole module's latency is the extract's plus the rest's, measured once per group as
    the context plan's whole-module latency minus its extract latency; the rest's infeasibility
    reasons carry over the same way."""

    group: str
    ops: tuple[int, ...]
    rest_latency_s: float
    rest_reasons: tuple[str, ...]

    def covers(self, plan: Plan) -> bool:
        """No plan group straddles the scope's boundary (else: evaluate the whole module)."""
        return _within_or_outside(plan, self.ops)

    def to_module(self, r: dict) -> dict:
        """A worker's extract result as the whole module's."""
        if r.get("stage") != "cost":
            return r
        reasons = [*self.rest_reasons, *r["cost"]["reasons"]]
        latency = r["latency_s"] + self.rest_latency_s
        feasible = r["feasible"] and not self.rest_reasons
        scope = {"group": self.group, "ops": list(self.ops), "group_latency_s": r["latency_s"], "rest_latency_s": self.rest_latency_s}
        cost = {**r["cost"], "latency_s": latency, "feasible": feasible, "reasons": reasons, "scope": scope}
        return {**r, "latency_s": latency, "feasible": feasible, "reason": "; ".join(reasons) or None, "cost": cost}


# Evaluation pools kept for the life of this process, by worker count, for callers that search
# again and again (the API's job workers): starting a pool costs ~3 s a search.
_KEPT_POOLS: dict[int, Any] = {}


def _kept_pool(workers: int, *, replace: bool = False):
    from service.ir.sandbox import Sandbox

    if replace:
        _KEPT_POOLS.pop(workers).close()
    if workers not in _KEPT_POOLS:
        _KEPT_POOLS[workers] = Sandbox(workers)
    return _KEPT_POOLS[workers]


class Evaluator:
    """Cache by plan hash in front of a pool of `workers` processes (started for this search, or
    with `keep_pool` the process's kept one), or in this process when workers is 0 (no crash
    isolation)."""

    def __init__(self, source: str, hardware: HardwareModel, shape_hints: dict, workers: int,
                 keep_pool: bool = False) -> None:
        self.source = source
        self.hardware_json = hardware.canonical_json()
        self.hints = shape_hints
        self.cache: dict[str, Evaluation] = {}
        self.in_flight: set[str] = set()
        self.evaluations = 0
        self.sandbox = None
        self.owns_pool = not keep_pool
        if workers >= 1:
            from service.ir.sandbox import Sandbox

            self.sandbox = _kept_pool(workers) if keep_pool else Sandbox(workers)
            try:
                self._warm_up(workers)
            except Exception:
                if self.owns_pool:
                    raise
                # The kept pool broke (a crash pebble could not recover from): start a new one.
                self.sandbox = _kept_pool(workers, replace=True)
                self._warm_up(workers)
        self.workers = workers

    def _warm_up(self, workers: int) -> None:
        futures = [self.sandbox.submit(_warm_up, self.source, self.hardware_json, timeout=_TASK_TIMEOUT_S) for _ in range(workers)]
        for f in futures:
            f.result()

    def close(self) -> None:
        if self.sandbox is not None and self.owns_pool:
            self.sandbox.close()

    def _dispatch(self, plans: list[dict], scope: list[int] | None = None) -> list:
        """Start evaluating `plans`; returns (chunk, future-or-results) pairs."""
        if self.sandbox is None:
            return [(plans, evaluate_plans(self.source, self.hardware_json, self.hints, plans, False, scope))]
        chunk = max(1, min(_PLANS_PER_TASK, -(-len(plans) // self.workers)))
        chunks = [plans[i:i + chunk] for i in range(0, len(plans), chunk)]
        return [(c, self.sandbox.submit(_evaluate_in_worker, self.source, self.hardware_json, self.hints, c, False, scope, timeout=_TASK_TIMEOUT_S)) for c in chunks]

    @staticmethod
    def _gather(dispatched: list) -> list[dict]:
        out: list[dict] = []
        for c, f in dispatched:
            if isinstance(f, list):
                out += f
                continue
            try:
                out += f.result()
            except Exception as exc:  # a worker crash or timeout costs these plans, not the search
                out += [{"stage": "rejected", "reason": f"evaluation failed: {type(exc).__name__}: {exc}"}] * len(c)
        return out

    def _run(self, fn, *args):
        if self.sandbox is None:
            return fn(*args)
        return self.sandbox.submit(fn, *args, timeout=_TASK_TIMEOUT_S).result()

    def rescore(self, ev: Evaluation) -> Evaluation:
        """The full whole-module breakdown (exact recompute flops) for a plan worth reporting."""
        if ev.plan is None or ev.stage != "cost":
            return ev
        try:
            r = self._run(evaluate_plans, self.source, self.hardware_json, self.hints, [ev.plan], True)[0]
        except Exception:  # a worker crash or timeout: keep the breakdown the search computed
            log.warning("re-costing the chosen plan failed; reporting the search's estimate", exc_info=True)
            return ev
        return ev.model_copy(update={"cost": r.get("cost", ev.cost)})

    def group_scope(self, group: str, ops: list[int], context: Evaluation) -> GroupScope | str:
        """The scope for searching `ops` alone around the context plan (evaluated on the whole
        module), or why the whole module must be used."""
        if context.stage != "cost" or context.plan is None or context.cost is None:
            return "the context plan has no whole-module cost"
        try:
            reason = self._run(prepare_scope, self.source, ops)
        except Exception as exc:  # a worker crash or timeout costs the extract, not the search
            return f"building the extract failed: {type(exc).__name__}: {exc}"
        if reason is not None:
            return reason
        plan = Plan.model_validate(context.plan)
        if not _within_or_outside(plan, ops):
            return "a group of the context plan straddles the extract's boundary"
        raw = self._gather(self._dispatch([context.plan], ops))[0]
        if raw.get("stage") != "cost":
            return f"the context plan does not apply to the extract: {raw.get('reason')}"
        rest = Counter(context.cost["reasons"]) - Counter(raw["cost"]["reasons"])
        return GroupScope(group, tuple(ops), context.latency_s - raw["latency_s"], tuple(rest.elements()))

    def submit(self, items: list[tuple[Candidate, Plan | str]], scope: GroupScope | None = None) -> tuple:
        """Start a batch. Plans already cached or in flight are not sent again; pruned ones
        (a reason instead of a plan) cost nothing. Counts evaluations at submission. With a
        scope, plans it covers are scored on its extract."""
        new: dict[str, Plan] = {}
        for _, plan in items:
            if isinstance(plan, str):
                continue
            h = plan.plan_hash()
            if h not in self.cache and h not in self.in_flight and h not in new:
                new[h] = plan
        self.in_flight.update(new)
        self.evaluations += len(new)
        placed = [(h, p, scope if scope is not None and scope.covers(p) else None) for h, p in new.items()]
        scoped = [x for x in placed if x[2] is not None]
        whole = [x for x in placed if x[2] is None]
        dispatched = []
        if scoped:
            dispatched += self._dispatch([json.loads(p.canonical_json()) for _, p, _ in scoped], list(scope.ops))
        if whole:
            dispatched += self._dispatch([json.loads(p.canonical_json()) for _, p, _ in whole])
        return items, scoped + whole, dispatched

    def collect(self, pending: tuple) -> list[Evaluation]:
        """Evaluations of a submitted batch, in the order given (earlier batches first)."""
        items, new, dispatched = pending
        owners: dict[str, Candidate] = {}
        for cand, plan in items:
            if not isinstance(plan, str):
                owners.setdefault(plan.plan_hash(), cand)
        for (h, plan, scope), r in zip(new, self._gather(dispatched)):
            if scope is not None:
                r = scope.to_module(r)
            self.in_flight.discard(h)
            owner = owners[h]
            self.cache[h] = Evaluation(plan=json.loads(plan.canonical_json()), plan_hash=h, params=owner.params, source=owner.source, **r)
        results: list[Evaluation] = []
        first_use: set[str] = {h for h, _, _ in new}
        for cand, plan in items:
            if isinstance(plan, str):
                results.append(Evaluation(plan=None, params=cand.params, source=cand.source, reason=plan, stage="pruned"))
                continue
            h = plan.plan_hash()
            ev = self.cache[h]
            if h in first_use:
                first_use.discard(h)
                results.append(ev)
            else:
                results.append(ev.model_copy(update={"params": cand.params, "source": cand.source, "cached": True}))
        return results

    def evaluate(self, items: list[tuple[Candidate, Plan | str]]) -> list[Evaluation]:
        return self.collect(self.submit(items))


def _knob_shape(spec: GroupSpec, graph) -> tuple:
    """Groups with the same anchor op and the same knobs (kinds and choices, in order) are
    twins: the same layer repeated. Fuse knobs name op uids, so only their kind counts."""
    kinds = tuple(k.name.split(".")[1] + ("" if k.name.split(".")[1] == "fuse" else k.name.rsplit(".", 1)[1])
                  for k in spec.knobs())
    return (graph.op(spec.anchor).name, kinds, tuple(tuple(k.choices) for k in spec.knobs()))


def _translate(twin: tuple[GroupSpec, dict], spec: GroupSpec) -> dict:
    """The twin's knob values under this group's knob names (same order)."""
    other, params = twin
    return {mine.name: params[theirs.name] for theirs, mine in zip(other.knobs(), spec.knobs()) if theirs.name in params}


def _violations(ev: Evaluation) -> int:
    """Hardware limits an evaluation breaks (0 when feasible)."""
    if ev.feasible:
        return 0
    return len(ev.cost["reasons"]) if ev.cost else 1 << 30


def _better(a: Evaluation | None, b: Evaluation) -> bool:
    """Is b better than a: feasible first, then fewer broken limits (the least bad plan when no
    plan fits: an op that cannot be tiled at all leaves every plan infeasible, and an
    infeasible plan's latency says little), then lower latency, ties by plan hash."""
    if b.latency_s is None:
        return False
    if a is None or a.latency_s is None:
        return True
    return (_violations(b), b.objective, b.plan_hash or "") < (_violations(a), a.objective, a.plan_hash or "")


def _params_from_group(spec: GroupSpec, group) -> dict | None:
    """Knob values reproducing a known group (warm start), or None if it is outside the space."""
    rank = len(spec.ranges)
    levels = list(group.levels)
    if any(len(lv.tile_sizes) != rank for lv in levels):
        return None
    outer = levels[0] if levels and any(lv for lv, t in zip(levels[0].tile_sizes, spec.iterator_types) if t == "parallel") else None
    rest = levels[1:] if outer else levels
    inner = next((lv for lv in rest if any(s for s, t in zip(lv.tile_sizes, spec.iterator_types) if t == "parallel")), None)
    red = next((lv for lv in levels if any(s for s, t in zip(lv.tile_sizes, spec.iterator_types) if t == "reduction")), None)
    p: dict = {f"{spec.name}.outer.loop": outer.loop if outer else "forall"}
    for d, choices in spec.outer_choices.items():
        p[f"{spec.name}.outer.d{d}"] = outer.tile_sizes[d] if outer else 0
    for d in spec.inner_choices:
        p[f"{spec.name}.inner.d{d}"] = inner.tile_sizes[d] if inner else 0
    for d in spec.reduction_choices:
        p[f"{spec.name}.red.d{d}"] = red.tile_sizes[d] if red else 0
    for u in spec.optional:
        p[f"{spec.name}.fuse.{u}"] = u in group.fuse
    knobs = {k.name: k.choices for k in spec.knobs()}
    if any(v not in knobs[k] for k, v in p.items()):
        return None
    return p


def _group_info(spec: GroupSpec) -> dict:
    return {
        "anchor": spec.anchor,
        "fixed": spec.fixed,
        "optional": spec.optional,
        "stops": [{"uid": s.uid, "reason": s.reason} for s in spec.stops],
        "notes": spec.notes,
        "space_size": spec.size(),
    }


def _without_boundary_ops(name: str, params: dict) -> dict:
    """The group's knobs with every optional boundary op left unfused: the start to try when
    fusing them fails in MLIR (a consumer fused beside a fill on dynamic shapes: "could not find
    next producer to fuse"), before the group starts untiled."""
    return {k: False if k.startswith(f"{name}.fuse.") else v for k, v in params.items()}


def _judged(ev: Evaluation, spec: GroupSpec) -> Evaluation:
    """The evaluation as `spec`'s search sees it: infeasible only for the reasons of the group's
    own loop nests. While another group's current tiling overflows a scratchpad, every candidate
    here is infeasible, and the search must still tell a plan that fits from one that does not."""
    if ev.feasible or ev.stage != "cost" or ev.cost is None:
        return ev
    scored_for = (ev.cost.get("scope") or {}).get("group", spec.name)
    if scored_for != spec.name:  # cached from another group's extract: no view of ours
        return ev
    ops = set(spec.ops)
    own = [r for n in ev.cost["nests"] if ops & set(n["uids"]) for r in n.get("reasons", [])]
    return ev if own else ev.model_copy(update={"feasible": True})


class _Search:
    """One search of one module on one hardware model, step by step (`run`).

    The steps share what the search has learnt so far: the context (each group's knob values,
    the other groups are held at while one is searched), the trials and the best of them, the
    standalone tilings MLIR could not apply, and the warnings for the answer."""

    def __init__(self, source: str, hardware: HardwareModel, *, budget: int, seconds: float | None, strategy: str,
                 seed: int, shape_hints: dict[str, list[int]], warm_start_plans: list[dict] | None, workers: int,
                 progress: ProgressFn | None, keep_pool: bool) -> None:
        check_strategy(strategy)  # before any evaluation: a typo costs nothing
        self.t_start = time.perf_counter()
        self.deadline = self.t_start + seconds if seconds else None
        self.source, self.hardware, self.budget, self.seconds = source, hardware, budget, seconds
        self.strategy, self.seed, self.shape_hints, self.progress = strategy, seed, shape_hints, progress
        self.warm_start_plans = warm_start_plans or []
        self.graph = analyze(source).graph
        self.space = build_space(self.graph, hardware, shape_hints)
        self.warnings: list[str] = list(self.space.notes)
        if not self.graph.ops:
            self.warnings.append("nothing to tile: the module has no op implementing TilingInterface (linalg, tensor.pad, ...)")
        if self.space.shapes.defaulted:
            self.warnings.insert(0, f"dynamic dims without a shape hint: {', '.join(self.space.shapes.defaulted)}; each is "
                                    f"assumed {DEFAULT_DYNAMIC_EXTENT}; pass --shape-hint argN=AxB or --bucket "
                                    "NAME=v1,v2,... for plans that match your shapes")
        self.evaluator = Evaluator(source, hardware, shape_hints, workers, keep_pool)
        self.trials: list[Evaluation] = []
        self.best: Evaluation | None = None
        self.context: dict[str, dict] = {}  # group name -> its knob values in the plan so far
        self.left_whole: dict[int, str | None] = {}  # standalone tilings MLIR cannot apply: uid -> why
        self.layouts: dict = {}  # check_plan's memo for this graph
        self.complete = True

    # ----- bookkeeping

    def record(self, evs: list[Evaluation]) -> None:
        for ev in evs:
            self.trials.append(ev)
            if _better(self.best, ev):
                self.best = ev
        if self.progress:
            self.progress(self.evaluator.evaluations, self.budget, self.best.latency_s if self.best else None)

    def evaluate_one(self, plan: Plan, source: str, params: dict | None = None) -> Evaluation:
        (ev,) = self.evaluator.evaluate([(Candidate(params=params or {}, source=source), plan)])
        return ev

    def plan_of(self, params_by_group: dict[str, dict]) -> Plan | str:
        """The plan for these knobs, or why it is invalid (the IR core's cheap check)."""
        merged = {k: v for p in params_by_group.values() for k, v in p.items()}
        plan = self.space.to_plan(merged)
        if isinstance(plan, str):
            return plan
        plan = complete_plan(self.space, plan, self.hardware)
        if plan.groups:
            try:
                check_plan(self.graph, plan, self.layouts)
            except PlanError as err:
                return str(err)
        return plan

    # ----- the steps

    def run(self) -> TuneResult:
        t_search = time.perf_counter()
        try:
            baseline_ev, untiled_ev = self.score_baselines()
            warm_by_group = self.score_warm_starts()
            self.start_context(warm_by_group)
            if self.strategy != "supertiling" and self.space.groups:
                self.search_groups(warm_by_group)
            search_s = max(time.perf_counter() - t_search, 1e-9)
            self.best = self.evaluator.rescore(self.best)
            baseline_ev = self.evaluator.rescore(baseline_ev)
        finally:
            self.evaluator.close()
        return self.result(baseline_ev, untiled_ev, search_s)

    def score_baselines(self) -> tuple[Evaluation, Evaluation]:
        """The super-tiling baseline (seed 000) and the untiled module: always scored, whatever
        the budget."""
        st_plan, st_notes = supertiling_plan(self.graph, self.hardware, self.space.shapes)
        self.warnings += st_notes
        st_cand = SuperTilingStrategy(st_plan).suggest()
        untiled_cand = Candidate(params={}, source="untiled", plan=Plan())
        baseline_ev, untiled_ev = self.evaluator.evaluate([(st_cand, st_plan), (untiled_cand, Plan())])
        self.record([baseline_ev, untiled_ev])
        if baseline_ev.stage != "cost":
            self.warnings.append(f"the super-tiling baseline could not be applied: {baseline_ev.reason}")
        return baseline_ev, untiled_ev

    def score_warm_starts(self) -> dict[str, list[dict]]:
        """Score the warm-start plans; each group's knob values in them, where in the space."""
        warm_by_group: dict[str, list[dict]] = {g.name: [] for g in self.space.groups}
        items = []
        for i, wp in enumerate(self.warm_start_plans):
            try:
                plan = Plan.model_validate(wp)
            except Exception as exc:
                self.warnings.append(f"warm start plan {i} ignored: {exc}")
                continue
            items.append((Candidate(params={}, source="warm_start", plan=plan), plan))
            for spec in self.space.groups:
                for grp in plan.groups:
                    if grp.anchor == spec.anchor:
                        p = _params_from_group(spec, grp)
                        if p is not None:
                            warm_by_group[spec.name].append(p)
        if items:
            self.record(self.evaluator.evaluate(items))
        return warm_by_group

    def start_context(self, warm_by_group: dict[str, list[dict]]) -> None:
        """Each group starts at its first warm start, else its default; when that plan does not
        apply, at what of it does (applicable_context)."""
        for spec in self.space.groups:
            start = (warm_by_group[spec.name] or [spec.default_params()])[0]
            if not isinstance(spec.to_group(start), str):
                self.context[spec.name] = start
        if self.space.groups and self.context and self.strategy != "supertiling":
            start_ev = self.evaluate_one(self.plan_of(self.context), "default")
            self.record([start_ev])
            if start_ev.stage != "cost":
                self.context = self.applicable_context(self.context)

    def settle_standalone(self, failed: Group, reason: str | None) -> bool:
        """A standalone tiling (an op no group tiles that does not fit memory; every plan carries
        it) that MLIR could not apply: try it with scf.for, then leave the op whole
        (tensor.concat along its concat dim). False if `failed` is not one."""
        uid, standalone = failed.anchor, self.space.standalone
        if failed.fuse or uid in standalone and standalone[uid] is None:
            return False
        if uid not in standalone and failed.levels[0].loop == "forall":
            levels = [lv.model_copy(update={"loop": "for"}) for lv in failed.levels]
            standalone[uid] = failed.model_copy(update={"levels": levels})
        else:
            standalone[uid] = None
            self.left_whole[uid] = reason  # warned about at the end unless a group of the plan tiles it
        return True

    def blamed_group(self, plan: Plan, ev: Evaluation, searched: dict[str, dict]) -> Group | None:
        """The group of `plan` a failure is put down to: the one MLIR names, else (MLIR located
        the failure in the payload only) the first standalone tiling not settled yet; None when
        there is none to suspect."""
        named = re.match(r"group (\d+): ", ev.reason or "")
        # MLIR numbers the groups as the worker applied them: in canonical_json's order.
        applied = sorted(plan.groups, key=lambda g: g.anchor)
        if named and int(named[1]) < len(applied):
            return applied[int(named[1])]
        unsettled = [g for g in plan.groups if f"g{g.anchor}" not in searched and not g.fuse
                     and self.space.standalone.get(g.anchor, g) is not None]
        return unsettled[0] if unsettled else None

    def applicable_context(self, start: dict[str, dict]) -> dict[str, dict]:
        """The starting groups that apply together; a group whose starting tiling MLIR cannot
        apply (e.g. producer fusion across a collapse_shape) starts without its boundary ops,
        then untiled, or every candidate of every other group would carry its failure. The
        failing group is read off the failure (one evaluation per failing group); when the
        failure names none, groups are added one at a time."""
        kept = dict(start)
        while kept:
            plan = self.plan_of(kept)
            if isinstance(plan, str):
                break
            ev = self.evaluate_one(plan, "default")
            self.record([ev])
            if ev.stage == "cost":
                return kept
            failed = self.blamed_group(plan, ev, kept)
            if failed is None:
                break
            name = f"g{failed.anchor}"
            if name in kept and _without_boundary_ops(name, kept[name]) != kept[name]:
                kept[name] = _without_boundary_ops(name, kept[name])
            elif name in kept:
                del kept[name]
                self.warnings.append(f"group {name} starts untiled: its starting tiling does not apply ({ev.reason})")
            elif not self.settle_standalone(failed, ev.reason):
                break
        kept = {}
        for name, params in start.items():
            while True:
                plan = self.plan_of({**kept, name: params})
                ev = self.evaluate_one(plan, "default", params)
                self.record([ev])
                if ev.stage == "cost":
                    kept[name] = params
                    break
                # A standalone tiling that fails is settled and the group tried again: it is not
                # the group's failure (a concat that cannot be tiled on its own once made every
                # group start untiled, and every candidate carry it).
                failed = self.blamed_group(plan, ev, {**kept, name: params}) if not isinstance(plan, str) else None
                if failed is not None and f"g{failed.anchor}" not in {**kept, name: params} \
                        and self.settle_standalone(failed, ev.reason):
                    continue
                if _without_boundary_ops(name, params) != params:
                    params = _without_boundary_ops(name, params)
                    continue
                if not any(w.startswith(f"group {name} starts untiled") for w in self.warnings):
                    self.warnings.append(f"group {name} starts untiled: its starting tiling does not apply ({ev.reason})")
                break
        return kept

    def budget_shares(self) -> dict[str, float]:
        """Each group's share of the search budget: half split evenly, half by its nests' share
        of the starting plan's latency (in a model the matmuls dominate, a layernorm group should
        not get as many evaluations as the FFN's)."""
        groups = self.space.groups
        even = {g.name: 1.0 / len(groups) for g in groups}
        plan = self.plan_of(self.context) if self.context else None
        if plan is None or isinstance(plan, str):
            return even
        ev = self.evaluate_one(plan, "context")
        if ev.stage != "cost" or not ev.cost:
            return even
        spent = {g.name: sum(n["latency_s"] for n in ev.cost["nests"] if set(g.ops) & set(n["uids"])) for g in groups}
        total = sum(spent.values())
        if total <= 0:
            return even
        return {name: 0.5 * even[name] + 0.5 * spent[name] / total for name in even}

    def search_groups(self, warm_by_group: dict[str, list[dict]]) -> None:
        """Coordinate descent: each group in turn, with its share of the budget and the time."""
        groups = self.space.groups
        shares = self.budget_shares()
        unsearched: list[str] = []  # groups the budget or the time limit never reached
        # The best of each group searched so far, by the shape of its knobs: a repeated layer
        # (encoder blocks) starts from its twin's best.
        twins: dict[tuple, tuple[GroupSpec, dict]] = {}
        for gi, spec in enumerate(groups):
            left = sum(shares[g.name] for g in groups[gi:])
            group_budget = int((self.budget - self.evaluator.evaluations) * shares[spec.name] / left)
            # The time left is shared out like the budget: with a time limit and a large budget,
            # the first group once spent all of it and left the others unsearched.
            group_deadline = None
            if self.deadline:
                now = time.perf_counter()
                group_deadline = now + max(0.0, self.deadline - now) * shares[spec.name] / left
            twin = twins.get(_knob_shape(spec, self.graph))
            warm = warm_by_group[spec.name] + ([_translate(twin, spec)] if twin else [])
            if not self.search_group(gi, spec, warm, group_budget, group_deadline):
                unsearched.append(spec.name)
            if spec.name in self.context:
                twins[_knob_shape(spec, self.graph)] = (spec, self.context[spec.name])
        if unsearched:
            ran_out = "the time limit" if self.deadline and time.perf_counter() > self.deadline else "the budget"
            self.warnings.append(f"{len(unsearched)} of {len(groups)} groups were not searched ({ran_out} ran out "
                                 f"first): {', '.join(unsearched[:8])}{' ...' if len(unsearched) > 8 else ''} stay at "
                                 "their starting tiling; raise --budget or --seconds")
        if self.deadline and time.perf_counter() > self.deadline and self.evaluator.evaluations < self.budget:
            self.complete = False
        final = self.plan_of(self.context) if self.context else Plan()
        if not isinstance(final, str):
            self.record([self.evaluate_one(final, self.strategy)])

    def group_start(self, spec: GroupSpec) -> tuple[Evaluation | None, GroupScope | None]:
        """The plan the group starts from, on the whole module (cached unless a group before
        this one moved the context), and the extract to search the group on, if it has one."""
        ctx_plan = self.plan_of(self.context) if spec.name in self.context else None
        if ctx_plan is None or isinstance(ctx_plan, str):
            return None, None
        start = self.evaluate_one(ctx_plan, "context")
        if not start.cached:
            self.record([start])
        if len(spec.ops) == len(self.graph.ops):
            return start, None
        # The group alone on an extract of its ops: cheaper evaluations, same scores.
        found = self.evaluator.group_scope(spec.name, spec.ops, start)
        if isinstance(found, GroupScope):
            return start, found
        self.warnings.append(f"group {spec.name} searched on the whole module: {found}")
        return start, None

    def search_group(self, gi: int, spec: GroupSpec, warm: list[dict], budget: int, deadline: float | None) -> bool:
        """Search one group's knobs with the others held at the context; the context keeps the
        group's best. False when the budget or the time ran out before any candidate."""
        start, scope = self.group_start(spec)
        group_best: tuple[Evaluation, dict] | None = None
        if start is not None and start.latency_s is not None:
            # Coordinate descent never steps back: the group keeps its starting tiling unless its
            # search finds better.
            group_best = (_judged(start, spec), self.context[spec.name])
        if group_best is None or not group_best[0].feasible:
            # The start does not fit: the plan with the smallest footprint first. When any plan
            # fits, this one most likely does, and TPE then has a feasible region to learn from
            # (a ResNet block on a 256 KiB scratchpad: none of 600 otherwise).
            warm.append(spec.smallest_params())
        strat = make_strategy(self.strategy, spec.knobs(), self.seed + gi, warm, identity=spec.identity)
        group_start = len(self.trials)
        group_best = self.propose_and_evaluate(spec, strat, scope, budget, deadline, group_best)
        tried = [t for t in self.trials[group_start:] if t.source == self.strategy]
        if not tried:
            return False
        if group_best is None:
            rejected = Counter(t.reason for t in tried if t.stage != "cost" and t.reason)
            why = f" (most often: {rejected.most_common(1)[0][0]})" if rejected else ""
            self.warnings.append(f"group {spec.name}: none of its candidates could be applied{why}; it stays "
                                 + ("at its starting tiling" if spec.name in self.context else "untiled"))
        elif spec.name not in self.context or group_best[0].feasible or not any(t.feasible for t in self.trials):
            self.context[spec.name] = group_best[1]
        return True

    def propose_and_evaluate(self, spec: GroupSpec, strat: Strategy, scope: GroupScope | None, budget: int,
                             deadline: float | None, group_best: tuple[Evaluation, dict] | None
                             ) -> tuple[Evaluation, dict] | None:
        """The strategy's loop for one group: one batch in flight while the strategy proposes the
        next (Optuna's ask is not free); the ask/tell order is fixed, so the worker count does
        not change it. Returns the group's best (evaluation, knob values)."""
        evaluator = self.evaluator
        spent_at_start = evaluator.evaluations
        idle = proposed = 0
        exhausted = False
        pending = None
        while True:
            launched = None
            room = budget - (evaluator.evaluations - spent_at_start)
            if deadline and time.perf_counter() > deadline:
                self.complete = False
            elif not exhausted and room > 0 and (idle < _CONVERGED_AFTER or self.strategy == "exhaustive"):
                cands = []
                for _ in range(min(_batch_size(proposed), room)):
                    c = strat.suggest()
                    if c is None:
                        exhausted = True
                        break
                    cands.append(c)
                proposed += len(cands)
                if cands:
                    items = [(c, self.plan_of({**self.context, spec.name: c.params})) for c in cands]
                    before = evaluator.evaluations
                    launched = (cands, evaluator.submit(items, scope))
                    # Pruned and cached suggestions are cheap but not free (Optuna's ask): a
                    # strategy proposing nothing new for a while has converged.
                    idle = 0 if evaluator.evaluations > before else idle + len(cands)
            if pending is not None:
                cands, handle = pending
                evs = evaluator.collect(handle)
                for c, ev in zip(cands, evs):
                    seen = _judged(ev, spec)
                    strat.tell(c, seen)
                    if seen.latency_s is not None and (group_best is None or _better(group_best[0], seen)):
                        group_best = (seen, c.params)
                self.record(evs)
            pending = launched
            if pending is None:
                return group_best

    def result(self, baseline_ev: Evaluation, untiled_ev: Evaluation, search_s: float) -> TuneResult:
        best = self.best
        assert best is not None  # the untiled module always evaluates
        warnings = self.warnings
        tiled_by_plan = {u for g in (best.plan or {}).get("groups", []) for u in [g["anchor"], *g.get("fuse", [])]}
        for uid, reason in self.left_whole.items():
            if uid not in tiled_by_plan:
                warnings.append(f"op {uid} ({self.graph.op(uid).name}) does not fit memory but MLIR cannot tile it "
                                f"on its own ({reason}); it stays whole")
        if not best.feasible:
            warnings.append("no feasible plan found: every evaluated candidate breaks a hardware limit; the least bad "
                            "is returned (see predicted.reasons)")

        def brief(ev: Evaluation) -> dict:
            return {"plan": ev.plan, "latency_s": ev.latency_s, "feasible": ev.feasible, "bound_by": ev.bound_by,
                    "reason": ev.reason, "stage": ev.stage}

        return TuneResult(
            plan=best.plan or {"groups": []},
            plan_hash=best.plan_hash or "",
            predicted=best.cost or {"latency_s": best.latency_s, "feasible": best.feasible},
            feasible=best.feasible,
            baseline=brief(baseline_ev),
            untiled=brief(untiled_ev),
            strategy=self.strategy,
            seed=self.seed,
            budget=self.budget,
            seconds_limit=self.seconds,
            evaluations=self.evaluator.evaluations,
            evaluations_per_s=self.evaluator.evaluations / search_s,
            elapsed_s=time.perf_counter() - self.t_start,
            complete=self.complete,
            space_size=self.space.size(),
            groups=[_group_info(g) for g in self.space.groups],
            trials=self.trials,
            warnings=warnings,
            shape_hints=self.shape_hints,
        )


def tune(
    source_text: str,
    hardware: HardwareModel,
    *,
    budget: int = 300,
    seconds: float | None = None,
    strategy: str = "tpe",
    seed: int = 0,
    shape_hints: dict | list[str] | None = None,
    buckets: dict | list[str] | None = None,
    warm_start_plans: list[dict] | None = None,
    workers: int = 2,
    progress: ProgressFn | None = None,
    keep_pool: bool = False,
) -> TuneResult:
    """Search tile-and-fuse plans for `source_text` on `hardware`.

    budget: distinct plans to evaluate; seconds: wall-clock limit (complete=False when hit).
    workers: evaluation processes (MLIR can crash or hang on a plan: in a worker that costs the
    plan, not the search); 0 evaluates in this process, for callers that are isolated already.
    keep_pool: evaluate in this process's kept pool (started once) instead of a new one.
    With buckets, each bucket is searched with its share of the budget and the result carries
    per-bucket plans and a dispatch table (the top-level plan is the largest bucket's).
    """
    hints = parse_shape_hints(shape_hints)
    bucket_map = parse_buckets(buckets)
    # Checked before any search: a hint or bucket the module cannot use is the caller's mistake.
    analysis = analyze(source_text) if hints or bucket_map else None
    arguments = check_shapes(analysis.module, analysis.graph, hints, bucket_map) if analysis else []
    common = dict(strategy=strategy, seed=seed, warm_start_plans=warm_start_plans, workers=workers, progress=progress,
                  keep_pool=keep_pool)
    if analysis is None or not bucket_map:
        return _Search(source_text, hardware, budget=budget, seconds=seconds, shape_hints=hints, **common).run()
    (name, values), = bucket_map.items()
    graph = analysis.graph
    share_budget = max(10, budget // len(values))
    share_s = seconds / len(values) if seconds else None
    results: list[tuple[int, TuneResult]] = []
    for v in values:
        bh = bucket_hints(graph, arguments, name, v, hints)
        results.append((v, _Search(source_text, hardware, budget=share_budget, seconds=share_s, shape_hints=bh, **common).run()))
    bucket_results, dispatch = [], []
    low: int | None = None
    for i, (v, r) in enumerate(results):
        high = v if i < len(results) - 1 else None
        bucket_results.append(BucketResult(name=name, value=v, range=[low, high], shape_hints=r.shape_hints, plan=r.plan, predicted={"latency_s": r.predicted.get("latency_s"), "feasible": r.feasible}, baseline=r.baseline))
        dispatch.append({"dim": name, "min_exclusive": low, "max_inclusive": high, "bucket": v, "plan_hash": r.plan_hash})
        low = v
    top = results[-1][1]
    total_evals = sum(r.evaluations for _, r in results)
    total_s = sum(r.elapsed_s for _, r in results)
    warnings = sorted({w for _, r in results for w in r.warnings})
    overridden = [f"arg{b.index} dim {b.dim}" + (f" of @{b.func}" if several_functions(arguments) else "")
                  for b in bucketed_dims(graph, name) if hint_for(hints, b.func, b.index) is not None]
    if overridden:
        warnings.append(f"--bucket {name} sizes {', '.join(overridden)}, which a shape hint gave too: the bucket "
                        "values are used there")
    return top.model_copy(update={
        "evaluations": total_evals,
        "evaluations_per_s": total_evals / max(total_s, 1e-9),
        "elapsed_s": total_s,
        "complete": all(r.complete for _, r in results),
        "trials": [t for _, r in results for t in r.trials],
        "buckets": bucket_results,
        "dispatch": dispatch,
        "warnings": warnings,
        "budget": budget,
    })
