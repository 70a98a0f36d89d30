"""The evaluator: plans in, evaluations out, in worker processes (MLIR holds the GIL).

Worker side (`evaluate_plans`): apply each plan to a clone of the parsed module and score it with
the cost model; each worker parses a module once and reuses it (caches keyed by the text's hash).
Search side (`Evaluator`): a cache by plan hash in front of a pool of workers; batches are
submitted and collected in the order given, so the pool's completion order never shows. The
engine drives any `PlanEvaluator` (tests drive it with a fake one).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Any, Protocol, TypedDict

from service.hardware.cost import NestMemo, estimate_cost
from service.hardware.model import HardwareModel
from service.ir.analysis import cached_analysis, source_key
from service.ir.errors import PlanError
from service.ir.extract import NotExtractable, extract_ops
from service.ir.graph import build_graph
from service.ir.mlir import context, trust_ir_when_printing
from service.ir.plan import Plan
from service.ir.sandbox import Sandbox
from service.ir.transform import tiled_clone

from .candidate import Candidate, Evaluation

log = logging.getLogger(__name__)

_TASK_TIMEOUT_S = 60.0
_PLANS_PER_TASK = 2
# Workers yield to the search process: the strategy's suggest is the serial part, and when
# it waits for a core behind the workers they soon wait for it. They are the search's own
# helpers; under outside load they also yield to it, as a background autotuner should.
_WORKER_NICENESS = 15


class PlanScore(TypedDict, total=False):
    """What a worker says about one plan: the fields of an Evaluation it knows."""

    stage: str  # "cost" | "rejected"
    reason: str | None
    failed_group: int | None  # PlanError.group, on a rejection
    seconds: float
    feasible: bool
    latency_s: float
    bound_by: str
    peak_footprint_bytes: int
    cost: dict


# --------------------------------------------------------------------------- worker side

_extracts: OrderedDict[tuple, Any] = OrderedDict()  # (source hash, scope) -> (module, graph) | reason
_hardware: dict[str, HardwareModel] = {}
# Nest costs kept across plans (service.hardware.cost.NestMemo), per (source hash, scope,
# hardware, shape hints).
_nest_costs: OrderedDict[tuple, dict] = OrderedDict()


def _hardware_of(hardware_json: str) -> HardwareModel:
    if hardware_json not in _hardware:
        _hardware[hardware_json] = HardwareModel.model_validate_json(hardware_json)
    return _hardware[hardware_json]


def _extract(source: str, scope: tuple[int, ...]):
    """(tagged extract, its graph) of the scope's ops, cached per worker; raises NotExtractable."""
    key = (source_key(source), scope)
    if key not in _extracts:
        try:
            module = extract_ops(cached_analysis(source).tagged, set(scope))
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
    key = (source_key(source), tuple(scope or ()), hardware_json, json.dumps(shape_hints or {}, sort_keys=True))
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
                   scope: list[int] | None = None) -> list[PlanScore]:
    """Apply each plan to a clone and score it. Runs in a worker; text and JSON in and out.

    exact=False skips the cost model's pass over the untiled original, which only refines the
    recompute_flops breakdown (latency and feasibility are the same) and doubles the cost.
    With `scope` (op uids), each plan's groups anchored in it are applied to the extract of
    those ops (service.ir.extract) and only its nests are costed."""
    if scope is None:
        a = cached_analysis(source)
        payload, graph = a.tagged, a.graph
    else:
        payload, graph = _extract(source, tuple(scope))
    hw = _hardware_of(hardware_json)
    kept = _kept_nest_costs(source, scope, hardware_json, shape_hints, graph)
    out: list[PlanScore] = []
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
            out.append({"stage": "rejected", "reason": str(err), "failed_group": err.group,
                        "seconds": time.perf_counter() - t0})
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
                        scope: list[int] | None = None) -> list[PlanScore]:
    """evaluate_plans at a lower priority than the search (_WORKER_NICENESS)."""
    os.setpriority(os.PRIO_PROCESS, 0, _WORKER_NICENESS)
    trust_ir_when_printing()
    return evaluate_plans(source, hardware_json, shape_hints, plans, exact, scope)


def _warm_up(source: str, hardware_json: str) -> bool:
    trust_ir_when_printing()
    cached_analysis(source)
    _hardware_of(hardware_json)
    return True


# --------------------------------------------------------------------------- search side


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

    def to_module(self, r: PlanScore) -> PlanScore:
        """A worker's extract result as the whole module's."""
        if r.get("stage") != "cost":
            return r
        reasons = [*self.rest_reasons, *r["cost"]["reasons"]]
        latency = r["latency_s"] + self.rest_latency_s
        feasible = r["feasible"] and not self.rest_reasons
        scope = {"group": self.group, "ops": list(self.ops), "group_latency_s": r["latency_s"], "rest_latency_s": self.rest_latency_s}
        cost = {**r["cost"], "latency_s": latency, "feasible": feasible, "reasons": reasons, "scope": scope}
        return {**r, "latency_s": latency, "feasible": feasible, "reason": "; ".join(reasons) or None, "cost": cost}


Item = tuple[Candidate, Plan | str]  # a candidate and its plan, or why its knobs make none


class PlanEvaluator(Protocol):
    """What the engine needs of an evaluator."""

    evaluations: int  # distinct plans submitted so far

    def submit(self, items: list[Item], scope: GroupScope | None = None) -> Any:
        """Start a batch; the handle for `collect`."""

    def collect(self, pending: Any) -> list[Evaluation]:
        """The batch's evaluations, one per item, in order."""

    def evaluate(self, items: list[Item]) -> list[Evaluation]:
        """submit + collect."""

    def rescore(self, ev: Evaluation) -> Evaluation:
        """The full breakdown of a plan worth reporting."""

    def group_scope(self, group: str, ops: list[int], context: Evaluation) -> GroupScope | str:
        """The extract to search `ops` on around the context plan, or why there is none."""


# Evaluation pools kept for the life of this process, by worker count, for callers that search
# again and again (the API's job workers): starting a pool takes seconds.
_KEPT_POOLS: dict[int, Sandbox] = {}


def _kept_pool(workers: int, *, replace: bool = False) -> Sandbox:
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
        self.sandbox: Sandbox | None = None
        self.owns_pool = not keep_pool
        if workers >= 1:
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
    def _gather(dispatched: list) -> list[PlanScore]:
        out: list[PlanScore] = []
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

    def submit(self, items: list[Item], scope: GroupScope | None = None) -> tuple:
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

    def evaluate(self, items: list[Item]) -> list[Evaluation]:
        return self.collect(self.submit(items))


def price_plans(source: str, hardware: HardwareModel, plans: list[dict], shape_hints: dict | None = None) -> list[Evaluation]:
    """Whole-module evaluations of plans made elsewhere (IREE's own config, as a plan), by the
    search's evaluator in the process's kept pool: priced exactly as a search prices its own."""
    evaluator = Evaluator(source, hardware, shape_hints or {}, workers=1, keep_pool=True)
    try:
        items: list[Item] = []
        for p in plans:
            plan = Plan.model_validate(p)
            items.append((Candidate(params={}, source="given", plan=plan), plan))
        return evaluator.evaluate(items)
    finally:
        evaluator.close()
