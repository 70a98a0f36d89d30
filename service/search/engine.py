"""The search engine: strategies propose, the evaluator applies and scores, the engine keeps the best.

Groups are searched in turn (coordinate descent): while one group's knobs are searched, every
other group is held at its best so far, so each evaluation is a whole-module cost and all
evaluations are comparable. The engine drives a `PlanEvaluator` it is given (service.search.
evaluator: worker processes, in batches); results are told to the strategy in the order it
suggested, so a seed fixes the outcome. Where each group starts is service.search.start's.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Callable

from service.hardware.model import HardwareModel
from service.ir.analysis import analyze
from service.ir.errors import PlanError
from service.ir.graph import OpGraph
from service.ir.hints import hint_for
from service.ir.plan import Plan
from service.ir.transform import check_plan
from service.measure.lowering import leaves_no_vector_tile

from .candidate import Candidate, Evaluation, is_better
from .evaluator import Evaluator, GroupScope, PlanEvaluator
from .knobs import KnobName
from .results import BucketResult, TuneResult
from .shapes import (
    bucket_hints,
    bucketed_dims,
    check_fits_main_memory,
    check_shapes,
    parse_buckets,
    parse_shape_hints,
    several_functions,
)
from .space import DEFAULT_DYNAMIC_EXTENT, GroupSpec, build_space, complete_plan
from .start import score_warm_starts, start_context
from .strategies import Strategy, SuperTilingStrategy, check_strategy, make_strategy, supertiling_plan

__all__ = ["BucketResult", "ProgressFn", "TrialsFn", "TuneResult", "parse_buckets", "parse_shape_hints", "run_search", "tune"]

ProgressFn = Callable[[int, int, float | None], None]  # (evaluations, budget, best latency)
# Every evaluation as it is recorded, in order (a job item stores its trials as they come, so a
# worker that dies mid-search loses none; raising from it stops the search).
TrialsFn = Callable[[list[Evaluation]], None]
# Candidates per strategy round: a function of how many the group's search has proposed, never
# of the worker count, so a seed fixes the results. Small rounds while TPE is learning the
# space (it hears back after each round), then larger ones that keep the workers busy while
# the strategy proposes.
_BATCH_SMALL, _BATCH_LARGE, _BATCH_GROWS_AFTER = 8, 16, 64
_CONVERGED_AFTER = 200  # suggestions in a row without a new plan: the strategy has converged
# The search answers with its starting plan (IREE-like, or the warm start) unless it predicts a
# plan faster by more than this: about the cost model's median top-1 regret on the tune half of
# the broad fidelity corpus (docs/benchmarks.md).
KEEP_START_MARGIN = 0.10


def _batch_size(proposed: int) -> int:
    return _BATCH_SMALL if proposed < _BATCH_GROWS_AFTER else _BATCH_LARGE


def _knob_shape(spec: GroupSpec, graph: OpGraph) -> tuple:
    """Groups with the same anchor op and the same knobs (roles and choices, in order) are
    twins: the same layer repeated."""
    roles = tuple(KnobName.parse(k.name).role for k in spec.knobs())
    return (graph.op(spec.anchor).name, roles, tuple(tuple(k.choices) for k in spec.knobs()))


def _translate(twin: tuple[GroupSpec, dict], spec: GroupSpec) -> dict:
    """The twin's knob values under this group's knob names (same order)."""
    other, params = twin
    return {mine.name: params[theirs.name] for theirs, mine in zip(other.knobs(), spec.knobs()) if theirs.name in params}


def _group_info(spec: GroupSpec) -> dict:
    return {
        "anchor": spec.anchor,
        "fixed": spec.fixed,
        "optional": spec.optional,
        "stops": [{"uid": s.uid, "reason": s.reason} for s in spec.stops],
        "notes": spec.notes,
        "space_size": spec.size(),
    }


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

    def __init__(self, graph: OpGraph, hardware: HardwareModel, evaluator: PlanEvaluator, *, budget: int,
                 seconds: float | None, strategy: str, seed: int, shape_hints: dict[str, list[int]],
                 warm_start_plans: list[dict] | None, progress: ProgressFn | None, started: float,
                 on_trials: TrialsFn | None = None, keep_start_margin: float | None = None) -> None:
        self.t_start = started
        self.keep_start_margin = KEEP_START_MARGIN if keep_start_margin is None else keep_start_margin
        self.deadline = self.t_start + seconds if seconds else None
        self.hardware, self.budget, self.seconds = hardware, budget, seconds
        self.strategy, self.seed, self.shape_hints, self.progress = strategy, seed, shape_hints, progress
        self.on_trials = on_trials
        self.warm_start_plans = warm_start_plans or []
        self.graph = graph
        self.space = build_space(self.graph, hardware, shape_hints)
        self.warnings: list[str] = list(self.space.notes)
        if not self.graph.ops:
            self.warnings.append("nothing to tile: the module has no op implementing TilingInterface (linalg, tensor.pad, ...)")
        if self.space.shapes.defaulted:
            self.warnings.insert(0, f"dynamic dims without a shape hint: {', '.join(self.space.shapes.defaulted)}; each is "
                                    f"assumed {DEFAULT_DYNAMIC_EXTENT}; give their sizes (shape hints: argN=AxB) or "
                                    "buckets (NAME=v1,v2,...) for plans that match your shapes")
        self.evaluator = evaluator
        self.trials: list[Evaluation] = []
        self.best: Evaluation | None = None
        self.context: dict[str, dict] = {}  # group name -> its knob values in the plan so far
        self.left_whole: dict[int, str | None] = {}  # standalone tilings MLIR cannot apply: uid -> why
        self.layouts: dict = {}  # check_plan's memo for this graph
        self.complete = True

    # ----- bookkeeping (also what start-plan repair uses: service.search.start.SearchSteps)

    def record(self, evs: list[Evaluation], eligible: bool = True) -> None:
        """Keep the trials; `eligible`: they may become the answer."""
        for ev in evs:
            self.trials.append(ev)
            if eligible and is_better(self.best, ev):
                self.best = ev
        if self.on_trials:
            self.on_trials(evs)
        if self.progress:
            self.progress(self.evaluator.evaluations, self.budget, self.best.latency_s if self.best else None)

    def evaluate_one(self, plan: Plan | str, source: str, params: dict | None = None) -> Evaluation:
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
        baseline_ev, untiled_ev = self.score_baselines()
        warm_by_group = score_warm_starts(self, self.warm_start_plans)
        self.context = start_context(self, warm_by_group, repair=self.strategy != "supertiling")
        if self.strategy != "supertiling" and self.space.groups:
            self.search_groups(warm_by_group)
        search_s = max(time.perf_counter() - t_search, 1e-9)
        self.best = self.evaluator.rescore(self._kept_start(self.best))
        baseline_ev = self.evaluator.rescore(baseline_ev)
        return self.result(baseline_ev, untiled_ev, search_s)

    def _kept_start(self, best: Evaluation | None) -> Evaluation | None:
        """The starting plan (the space's start, IREE's own config for a contraction, or a warm
        start: the fastest of them) unless the best is predicted faster by more than
        KEEP_START_MARGIN (or the caller's keep_start_margin): within the model's error a move away
        from a known-good config is a coin toss that can lose. A warm start outside the space is scored but not searched
        from; it still counts here."""
        starts = [t for t in self.trials if t.source in ("default", "warm_start") and t.stage == "cost"
                  and t.feasible and t.latency_s is not None]
        start = min(starts, key=lambda t: t.latency_s) if starts else None
        if best is None or start is None or best.latency_s is None or not best.feasible:
            return best
        return start if best.latency_s * (1 + self.keep_start_margin) > start.latency_s else best

    def score_baselines(self) -> tuple[Evaluation, Evaluation]:
        """The super-tiling baseline and the untiled module: always scored, whatever the budget."""
        st_plan, st_notes = supertiling_plan(self.graph, self.hardware, self.space.shapes)
        self.warnings += st_notes
        st_cand = SuperTilingStrategy(st_plan).suggest()
        untiled_cand = Candidate(params={}, source="untiled", plan=Plan())
        baseline_ev, untiled_ev = self.evaluator.evaluate([(st_cand, st_plan), (untiled_cand, Plan())])
        # Both leave the register tile to the compiler, which the cost model prices as ideal: not an
        # answer where IREE's own is known slow (GroupSpec.needs_register_tile).
        ideal_register_tile_ok = not any(g.needs_register_tile for g in self.space.groups)
        # On a CPU the answer is IREE configs, in which the baseline's memory level alone is no
        # answer (leaves_no_vector_tile); untiled, IREE keeps its own configs.
        iree_takes_it = not (self.hardware.is_cpu and leaves_no_vector_tile(self.graph, st_plan))
        self.record([baseline_ev], eligible=ideal_register_tile_ok and iree_takes_it)
        self.record([untiled_ev], eligible=ideal_register_tile_ok)
        if baseline_ev.stage != "cost":
            self.warnings.append(f"the super-tiling baseline could not be applied: {baseline_ev.reason}")
        return baseline_ev, untiled_ev

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
            # The time left is shared out like the budget: with a time limit and a budget it
            # cannot reach, the first group would spend all of it and leave the others unsearched.
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
            # fits, this one most likely does, and TPE then has a feasible region to learn from.
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
        next (a suggestion is not free); the suggest/tell order is fixed, so the worker count does
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
                    # Pruned and cached suggestions are cheap but not free: a
                    # strategy proposing nothing new for a while has converged.
                    idle = 0 if evaluator.evaluations > before else idle + len(cands)
            if pending is not None:
                cands, handle = pending
                evs = evaluator.collect(handle)
                for c, ev in zip(cands, evs):
                    seen = _judged(ev, spec)
                    strat.tell(c, seen)
                    if seen.latency_s is not None and (group_best is None or is_better(group_best[0], seen)):
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


def run_search(graph: OpGraph, hardware: HardwareModel, evaluator: PlanEvaluator, *, budget: int,
               seconds: float | None = None, strategy: str = "tpe", seed: int = 0,
               shape_hints: dict[str, list[int]] | None = None, warm_start_plans: list[dict] | None = None,
               progress: ProgressFn | None = None, started: float | None = None,
               on_trials: TrialsFn | None = None, keep_start_margin: float | None = None) -> TuneResult:
    """Search the tile-and-fuse plans of `graph` on `hardware`, scoring with `evaluator` (which
    the caller owns and closes). `started`: when the search began (perf_counter), for the time
    limit and elapsed_s; now by default. keep_start_margin: how much faster than its start a
    plan must be predicted to be answered (KEEP_START_MARGIN by default; 0 when the caller
    judges the answer against the start itself)."""
    check_strategy(strategy)  # before any evaluation: a typo costs nothing
    started = time.perf_counter() if started is None else started
    return _Search(graph, hardware, evaluator, budget=budget, seconds=seconds, strategy=strategy, seed=seed,
                   shape_hints=shape_hints or {}, warm_start_plans=warm_start_plans, progress=progress,
                   started=started, on_trials=on_trials, keep_start_margin=keep_start_margin).run()


def _search_module(source: str, hardware: HardwareModel, *, budget: int, seconds: float | None, strategy: str,
                   seed: int, shape_hints: dict[str, list[int]], warm_start_plans: list[dict] | None, workers: int,
                   progress: ProgressFn | None, keep_pool: bool, on_trials: TrialsFn | None = None,
                   keep_start_margin: float | None = None) -> TuneResult:
    """One search of `source`, evaluated by this search's Evaluator (worker pool)."""
    check_strategy(strategy)  # before the pool starts: a typo costs nothing
    started = time.perf_counter()
    graph = analyze(source).graph
    check_fits_main_memory(graph, hardware, shape_hints)
    evaluator = Evaluator(source, hardware, shape_hints, workers, keep_pool)
    try:
        return run_search(graph, hardware, evaluator, budget=budget, seconds=seconds, strategy=strategy, seed=seed,
                          shape_hints=shape_hints, warm_start_plans=warm_start_plans, progress=progress,
                          started=started, on_trials=on_trials, keep_start_margin=keep_start_margin)
    finally:
        evaluator.close()


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
    on_trials: TrialsFn | None = None,
    keep_start_margin: float | None = None,
) -> TuneResult:
    """Search tile-and-fuse plans for `source_text` on `hardware`.

    budget: distinct plans to evaluate; seconds: wall-clock limit (complete=False when hit).
    workers: evaluation processes (MLIR can crash or hang on a plan: in a worker that costs the
    plan, not the search); 0 evaluates in this process, for callers that are isolated already.
    keep_pool: evaluate in this process's kept pool (started once) instead of a new one.
    on_trials: called with each batch of evaluations as they are recorded; raising stops the search.
    keep_start_margin: see run_search.
    With buckets, each bucket is searched with its share of the budget and the result carries
    per-bucket plans and a dispatch table (the top-level plan is the largest bucket's).
    """
    hints = parse_shape_hints(shape_hints)
    bucket_map = parse_buckets(buckets)
    # Checked before any search: a hint or bucket the module cannot use is the caller's mistake.
    analysis = analyze(source_text) if hints or bucket_map else None
    arguments = check_shapes(analysis.module, analysis.graph, hints, bucket_map) if analysis else []
    common = dict(strategy=strategy, seed=seed, warm_start_plans=warm_start_plans, workers=workers, progress=progress,
                  keep_pool=keep_pool, on_trials=on_trials, keep_start_margin=keep_start_margin)
    if analysis is None or not bucket_map:
        return _search_module(source_text, hardware, budget=budget, seconds=seconds, shape_hints=hints, **common)
    (name, values), = bucket_map.items()
    graph = analysis.graph
    share_budget = max(10, budget // len(values))
    share_s = seconds / len(values) if seconds else None
    results: list[tuple[int, TuneResult]] = []
    for v in values:
        bh = bucket_hints(graph, arguments, name, v, hints)
        results.append((v, _search_module(source_text, hardware, budget=share_budget, seconds=share_s, shape_hints=bh, **common)))
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
