"""Tune a whole model: every dispatch IREE forms, searched where the model's time is, merged into
one tuning spec that IREE is shown to apply.

1. IREE forms the dispatches (`service.measure.whole_model.executable_sources`); each becomes a
   plain module over tensors (`service.ir.dispatch`), weighted by how often the model runs it.
2. A dispatch is tuned when its root is a contraction, or a convolution with a batch dim (IREE's
   CPU backend takes a forced `compilation_info` on both); every other dispatch is left to IREE
   with the reason. A convolution's config ships only when measured (`measure_top`): the cost
   model ranks its candidates but was never checked against measured convolutions.
3. The search budget is spread by the gradient task scheduler (`service.search.task_scheduler`):
   each slice is one more `tune` of one dispatch, warm-started from its best plan so far.
   IREE's own default config of each root (from the model compiled once without a spec) is
   priced as a plan by the same evaluator, and a dispatch ships its tuned config only if it is
   predicted faster than that default by a margin (`service.search.guard`); with `measure_top`, measured
   faster inside the model (`in_model.py`), and the whole model with the spec too.
4. The best plan's root group becomes a `compilation_info`, and the dispatch's root a contraction
   or convolution matcher (`service.measure.tuning_spec`). Roots that two dispatches share get
   one matcher.
5. The model is compiled with the spec, and IREE's configuration dumps must show every tuned
   root with the spec's config and every other dispatch as IREE's default build had it.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, Field

from service.hardware.model import HardwareModel
from service.hardware.profiles import HOST_CPU
from service.ir.analysis import analyze
from service.ir.dispatch import Dispatch, dispatches_of
from service.ir.errors import IRError, NotAModelError
from service.ir.graph import OpGraph, TileableOp
from service.ir.plan import Plan
from service.measure.dispatch_profile import DispatchTime
from service.measure.forcing import write_inputs
from service.measure.lowering import convolution_not_configured, iree_configures_convolution, iree_keeps_own_pipeline
from service.measure.timing import Measurement
from service.measure.tools import ToolFailure, host_translation_info, iree_version
from service.measure.tuning_spec import RootMatcher, root_matcher, symbol_part, tuning_spec
from service.measure.whole_model import (
    DispatchConfig,
    canonical_attribute,
    compile_model,
    dispatch_configs,
    entry_function,
    executable_sources,
    input_program,
    model_arguments,
)
from service.search.engine import tune
from service.search.guard import (iree_default_plan, measured_only, measured_verdict, predicted_default_s, predicted_verdict,
                                  unmeasured_reason)
from service.search.refine import MeasuredPlan, Refinement, is_forceable, top_plans, with_measured_choice
from service.search.candidate import Evaluation
from service.search.results import TuneResult
from service.search.task_scheduler import TaskState, schedule

from .in_model import RootUnderTest, confirm_in_model, time_in_model, whole_build_choice, whole_model_shortfall
from .model_input import ModelInputError, check_model_file, importable_model, refused_as
from .static_shapes import (all_dynamic_message, copy_model, dynamic_inputs, input_labels, remove_model, sized_for, static_model,
                            static_model_name)

ProgressFn = Callable[[str, int, int], None]  # (dispatch name, slices done, slices in all)
_UNTIMED_MEASURED_ONLY = ("no plan of this dispatch could be timed inside the model, and its config ships only when "
                          "measured faster; IREE's own config is kept")
_SLICE = 32  # evaluations per scheduler slice


class SpecNotApplied(Exception):
    """IREE did not give a dispatch the config the spec carries: the spec must not ship."""


class DispatchReport(BaseModel):
    name: str = Field(description="IREE's function name of the dispatch (names its root: ..._matmul_64x768x768_f32)")
    fingerprint: str | None = Field(description="structural hash of the dispatch's ops")
    weight: int = Field(description="times one run of the model dispatches it")
    root_op: str | None
    tuned: bool
    reason: str | None = Field(description="why it was left to IREE, or a note on its tuning")
    predicted_s: float | None = Field(description="predicted seconds per call of the dispatch")
    config: str | None = Field(description="the compilation_info the spec gives its root")
    iree_default: str | None = Field(default=None, description="the lowering_config IREE's default gave its root")
    iree_default_predicted_s: float | None = Field(
        default=None, description="predicted seconds per call with IREE's default config (same cost model)")
    measured_s: float | None = Field(default=None, description="--measure-top: the fastest measured plan, wall seconds "
                                                                "per model run of the dispatches its root config "
                                                                "applies to, timed inside the model")
    iree_default_measured_s: float | None = Field(default=None, description="--measure-top: IREE's default, timed alike")
    evaluations: int = 0
    dynamic: bool = Field(default=False, exclude=True, description="left to IREE for its dynamic shapes")


class DispatchSearch(BaseModel):
    """A tuned dispatch's search, as the store keeps it (an ordinary decision of its module)."""

    name: str
    module: str
    result: TuneResult = Field(description="every slice's trials; the plan and prediction the spec carries")
    refinement: Refinement | None = None
    seconds: float
    complete: bool


class MeasuredDispatch(BaseModel):
    """A dispatch whose plans were timed inside the model, as the store keeps the timings."""

    name: str
    module: str
    refinement: Refinement


class ModelTuneReport(BaseModel):
    model: str
    hardware: str
    dispatches: list[DispatchReport]
    spec: str | None = Field(description="path of the tuning spec written (None: nothing was tuned)")
    static_model: str | None = Field(default=None, description="--shape-hint: the model with its inputs sized as "
                                                               "hinted, written beside the spec: the spec matches "
                                                               "its dispatches, so compile it with the spec")
    dynamic_inputs: list[str] = Field(default_factory=list, description="--shape-hint: the model's inputs still "
                                                                         "dynamic after the hints")
    predicted_total_s: float = Field(description="sum over tuned dispatches of weight x predicted seconds")
    verified: bool = Field(description="IREE applied the spec's config to every tuned root and nothing else")
    iree_default_measured_model_s: float | None = Field(
        default=None, description="--measure-top: every dispatch's wall time per model run, IREE's default build")
    measured_model_s: float | None = Field(default=None, description="--measure-top: the same with the spec")
    measured_model_rounds: tuple[int, int] | None = Field(
        default=None, description="--measure-top: alternating rounds the spec's build was faster in, and rounds timed")
    elapsed_s: float
    searches: list[DispatchSearch] = Field(default_factory=list, exclude=True,
                                           description="the tuned dispatches' searches, for the store")
    measured_left: list[MeasuredDispatch] = Field(
        default_factory=list, exclude=True,
        description="dispatches measured inside the model and left to IREE: their timings, for the store")

    def summary(self) -> dict:
        return {"dispatches": [d.model_dump(include={"name", "fingerprint", "weight", "root_op", "tuned", "reason",
                                                     "predicted_s", "config", "iree_default", "iree_default_predicted_s",
                                                     "measured_s", "iree_default_measured_s", "evaluations"})
                               for d in self.dispatches],
                "spec": self.spec, "static_model": self.static_model, "dynamic_inputs": self.dynamic_inputs,
                "verified": self.verified,
                "predicted_total_s": self.predicted_total_s if any(d.tuned for d in self.dispatches) else None,
                "elapsed_s": self.elapsed_s,
                "iree_default_measured_model_s": self.iree_default_measured_model_s,
                "measured_model_s": self.measured_model_s, "measured_model_rounds": self.measured_model_rounds}


class _Candidate:
    """A dispatch the search takes: its module, graph and root (a contraction, or a convolution
    IREE takes a config on)."""

    def __init__(self, dispatch: Dispatch, graph: OpGraph, root: TileableOp, fingerprint: str) -> None:
        self.dispatch = dispatch
        self.graph = graph
        self.root = root
        self.fingerprint = fingerprint
        self.plan: dict | None = None
        self.predicted: dict | None = None  # the plan's cost
        self.latency_s: float | None = None
        self.evaluations = 0
        self.seconds = 0.0
        self.complete = True
        self.result: TuneResult | None = None  # the last slice's result, with every slice's trials
        self.default_plan: dict | None = None  # IREE's default config as a plan (service.search.guard)
        self.default_s: float | None = None
        self.refinement: Refinement | None = None
        self.measured_s: float | None = None
        self.default_measured_s: float | None = None
        self.left: str | None = None  # why the guard leaves it to IREE
        self.note: str | None = None  # what measuring decided, when it ships
        self.translation: str | None = None  # IREE's translation_info of the dispatch (its default build)


def _classify(dispatch: Dispatch) -> tuple[_Candidate | None, DispatchReport]:
    report = DispatchReport(name=dispatch.entry, fingerprint=None, weight=dispatch.weight, root_op=None, tuned=False,
                            reason=dispatch.reason, predicted_s=None, config=None, dynamic=dispatch.dynamic)
    if dispatch.reason is not None or dispatch.module is None:
        return None, report
    try:
        analysis = analyze(dispatch.module)
    except IRError as err:
        report.reason = f"its ops do not parse on their own: {err}"
        return None, report
    graph = analysis.graph
    report.fingerprint = analysis.fingerprint
    kinds = {op.kind for op in graph.ops.values()}
    contractions = [op for op in graph.ops.values() if op.kind == "contraction"]
    if "convolution" in kinds:
        convolutions = [op for op in graph.ops.values() if op.kind == "convolution"]
        root = convolutions[0]
        report.root_op = root.name
        if not iree_configures_convolution(root):
            report.reason = f"convolution: {convolution_not_configured(root)}; IREE's own config is kept"
        elif (dims := root.convolution_dims()) is None or dims.is_pooling:
            report.reason = ("a pooling op (a window over each channel, no filter): tilesearch configures "
                             "convolutions only; IREE's own config is kept")
        elif len(convolutions) + len(contractions) > 1:
            report.reason = (f"{len(convolutions)} convolutions and {len(contractions)} contractions: tilesearch forces "
                             "configs on dispatches with one root")
    elif len(contractions) != 1:
        named = sorted(kinds) or ["no structured op"]
        report.reason = (f"{len(contractions)} contractions: tilesearch forces configs on single-contraction dispatches"
                         if contractions else f"no contraction root ({', '.join(named)}): tilesearch configures "
                         "contractions only; IREE's own config is kept")
    else:
        root = contractions[0]
        report.root_op = root.name
        report.reason = iree_keeps_own_pipeline(root)
    if report.reason is None and not graph.has_static_shapes():
        report.dynamic = True
        report.reason = ("dynamic shapes: give the model's dynamic inputs their sizes (`--shape-hint argN=AxB` on the "
                         'CLI, "shape_hints" in a job request); the spec then matches the model with those sizes')
    if report.reason is not None:
        return None, report
    return _Candidate(dispatch, graph, root, analysis.fingerprint), report


def classify_dispatches(model: Path, workdir: Path) -> tuple[list[Dispatch], list[DispatchReport]]:
    """IREE's dispatches of `model`: those a job tunes one by one (one static contraction root)
    and a report for each of the others saying why not. A job's items are decided alone, so a
    convolution, whose config ships only when measured inside the whole model, is left out.
    Raises ModelInputError when IREE cannot compile the model."""
    tunable, left = [], []
    for dispatch in _dispatches(model, workdir):
        candidate, report = _classify(dispatch)
        if candidate is not None and (why := measured_only(candidate.root)):
            report.reason = unmeasured_reason(f"{why}; a job decides its items alone",
                                              "inside the whole model (`tilesearch model tune --measure-top K`)")
            candidate = None
        if candidate is not None:
            tunable.append(dispatch)
        else:
            left.append(report)
    return tunable, left


def _dispatches(model: Path, workdir: Path) -> list[Dispatch]:
    """The dispatches IREE forms of `model`, weighted by runs per model run (the trips of loops
    around them included); ModelInputError when IREE cannot compile it or formed none."""
    with refused_as(f"IREE cannot compile {model.name}"):
        sources = executable_sources(model, workdir / "sources.mlir", flow_out=workdir / "flow.mlir")
    try:
        return dispatches_of(sources, (workdir / "flow.mlir").read_text())
    except NotAModelError:
        raise ModelInputError(f"IREE formed no dispatch from {model.name}: nothing in it runs as a kernel "
                              "(is it empty, or do its results not depend on its inputs?)") from None


def _root_key(candidate: _Candidate) -> tuple | None:
    """What a matcher of this dispatch's root would check (None: no matcher can match it)."""
    matcher = root_matcher(candidate.root, [], "root")
    return None if matcher is None else matcher.matched


def _plan_matcher(c: _Candidate, plan: dict, name: str, translation_info: str | None) -> RootMatcher | None:
    """The matcher of the dispatch's root with the config `plan` gives it (None: the plan leaves
    the root untiled). A convolution keeps the pipeline IREE chose for its dispatch."""
    group = next((g for g in plan.get("groups", []) if g["anchor"] == c.root.uid), None)
    translation = c.translation if c.root.kind == "convolution" else translation_info
    return None if group is None else root_matcher(c.root, group["levels"], name, translation)


def _structured_index(candidate: _Candidate) -> int:
    """The root's position among the dispatch function's linalg ops (the dumps list them so)."""
    return sum(1 for op in candidate.graph.ops.values() if op.uid < candidate.root.uid and op.name.startswith("linalg."))


def _search(candidates: list[_Candidate], hardware: HardwareModel, budget: int, seconds: float | None,
            seed: int, progress: ProgressFn | None) -> None:
    tasks = [TaskState(c.dispatch.entry, float(c.dispatch.weight)) for c in candidates]
    slices = max(len(candidates), budget // _SLICE)
    deadline = time.monotonic() + seconds if seconds else None

    def run_slice(i: int, n: int) -> float | None:
        c = candidates[i]
        # The first slice starts at IREE's own config (scored like any plan), so what the search
        # returns is never predicted slower than the default the guard compares it with.
        start = c.plan if c.plan and c.plan.get("groups") else c.default_plan
        warm = [start] if start else None
        left = None if deadline is None else max(0.5, deadline - time.monotonic())
        result = tune(c.dispatch.module, hardware, budget=_SLICE, seconds=left, seed=seed + n,
                      warm_start_plans=warm, workers=1, keep_pool=True)
        c.evaluations += result.evaluations
        c.seconds += result.elapsed_s
        c.complete = c.complete and result.complete
        trials = (c.result.trials if c.result is not None else []) + result.trials
        c.result = result.model_copy(update={"trials": trials})
        best = _best_configuring_root(result, c.root.uid)
        if best is not None and (c.latency_s is None or best.latency_s < c.latency_s):
            c.latency_s, c.plan = best.latency_s, best.plan
            c.predicted = best.cost if best.cost is not None else result.predicted
        if progress is not None:
            progress(c.dispatch.entry, sum(t.slices for t in tasks) + 1, slices)
        return c.latency_s

    stop = (lambda: time.monotonic() > deadline) if deadline else (lambda: False)
    schedule(tasks, slices, run_slice, stop)


def _best_configuring_root(result: TuneResult, root_uid: int) -> Evaluation | None:
    """The best plan the search found that IREE can be forced to (refine.is_forceable) and that
    gives the root a config. Inside a model, a plan that leaves the root untiled runs IREE's own
    config (the guard's baseline), not the untiled op the cost model prices."""
    configuring = [t for t in result.trials
                   if is_forceable(t) and any(g["anchor"] == root_uid for g in t.plan["groups"])]
    return min(configuring, key=lambda t: t.rank, default=None)


def _default_build(model: Path, candidates: list[_Candidate], workdir: Path) -> dict[str, DispatchConfig]:
    """Compile the model without a spec once: what IREE gives every dispatch by default (the
    guard's baseline and the proof's reference). Each candidate gets IREE's root config as a plan."""
    compile_model(model, workdir / "default.vmfb", workdir / "default_configs")
    default = dispatch_configs(workdir / "default_configs")
    for c in candidates:
        got, index = default.get(c.dispatch.entry), _structured_index(c)
        text = got.ops[index][1] if got is not None and index < len(got.ops) else None
        c.default_plan = iree_default_plan(c.graph, c.root, text)
        c.translation = got.translation_info if got is not None else None
    return default


def _verify(model: Path, spec_path: Path, tuned: dict[str, tuple[_Candidate, str]], reports: list[DispatchReport],
            default: dict[str, DispatchConfig], workdir: Path) -> list[str]:
    """Compile with the spec; the problems found against the default build (empty: the spec did
    what it says)."""
    compile_model(model, workdir / "tuned.vmfb", workdir / "tuned_configs", spec=spec_path)
    with_spec = dispatch_configs(workdir / "tuned_configs")
    problems = []
    for report in reports:
        got = with_spec.get(report.name)
        before = default.get(report.name)
        if report.name in tuned:
            candidate, wanted = tuned[report.name]
            index = _structured_index(candidate)
            if got is None or index >= len(got.ops) or got.ops[index][1] != canonical_attribute(wanted):
                shown = got.ops[index][1] if got is not None and index < len(got.ops) else "nothing"
                problems.append(f"{report.name}: IREE gave its root {shown}, the spec says {wanted}")
        elif got != before:
            problems.append(f"{report.name}: left to IREE, yet the spec changed its configuration")
    return problems


def _judge(c: _Candidate, hardware: HardwareModel) -> None:
    """The guard by prediction (service.search.guard): the tuned plan ships only if it is predicted faster
    than IREE's default; `c.left` says why not. A candidate measured inside the model was
    decided by its measurement (`_measure_in_model`)."""
    c.default_s = predicted_default_s(c.dispatch.module or "", hardware, c.default_plan)
    if c.refinement is None:
        c.left = _UNTIMED_MEASURED_ONLY if measured_only(c.root) else predicted_verdict(c.latency_s, c.default_s)


def _in_model_measurement(per_call: list[DispatchTime], error: str | None) -> Measurement:
    """A plan's (or IREE's default's) time per call of the root's heaviest dispatch, inside the model."""
    if not per_call:
        return Measurement(ok=False, error=error or "not timed inside the model", iree_version=iree_version())
    return Measurement(ok=True, median_s=statistics.median(t.wall_s for t in per_call),
                       samples_s=[t.wall_s for t in per_call], cpu_median_s=statistics.median(t.cpu_s for t in per_call),
                       cpu_samples_s=[t.cpu_s for t in per_call], iree_version=iree_version())


def _model_inputs(model: Path, workdir: Path) -> tuple[str, list[str]]:
    """The model's entry function and `--input` flags of random data for it."""
    program = input_program(model, workdir / "input.mlir")
    function = entry_function(program)
    with refused_as(f"cannot time {model.name}"):
        return function, write_inputs(model_arguments(program, function), workdir)


def _measure_in_model(model: Path, ranked: list[_Candidate], k: int, translation: str | None, function: str,
                      flags: list[str], calls: dict[str, int], workdir: Path) -> None:
    """`--measure-top K`: the K best predicted plans of each root, timed inside the model beside
    IREE's default build (in_model.py); the heaviest dispatch of each root (`ranked` is heaviest
    first) ships the fastest only if it beats IREE's default by the guard's margin, unless one
    round build, measured whole, beats those picks (`whole_build_choice`)."""
    groups: dict[tuple, list[_Candidate]] = {}
    for c in ranked:
        key = _root_key(c)
        if key is not None and c.result is not None and c.plan:
            groups.setdefault(key, []).append(c)
    leads, roots, tops = [], [], []
    for i, members in enumerate(groups.values()):
        lead = members[0]
        top = [(plan, h, lat, m) for j, (plan, h, lat) in enumerate(top_plans(lead.result, k))
               if (m := _plan_matcher(lead, plan, f"root{i}_plan{j}", translation)) is not None]
        if not top:
            continue
        leads.append(lead)
        tops.append(top)
        roots.append(RootUnderTest(dispatches={m.dispatch.entry: m.dispatch.weight for m in members},
                                   root_index=_structured_index(lead), matchers=[m for *_, m in top]))
    measured = time_in_model(model, roots, workdir / "default.vmfb", function, flags, workdir / "in_model", calls)
    picks: dict[int, int] = {}
    for r, (lead, top, times) in enumerate(zip(leads, tops, measured.roots)):
        candidates = [MeasuredPlan(plan=plan, plan_hash=h, predicted_latency_s=lat,
                                   measured=_in_model_measurement(times.per_call[j], times.errors[j]))
                      for j, (plan, h, lat, _) in enumerate(top)]
        medians = [statistics.median(s) if s else None for s in times.plans_s]
        timed = [(m, j) for j, m in enumerate(medians) if m is not None]
        chosen = min(timed)[1] if timed else None
        lead.refinement = Refinement(candidates=candidates, chosen=chosen,
                                     default=_in_model_measurement(times.default_per_call, None))
        lead.measured_s = medians[chosen] if chosen is not None else None
        lead.default_measured_s = statistics.median(times.default_s) if times.default_s else None
        lead.left = measured_verdict(lead.measured_s, lead.default_measured_s)
        if lead.left is None and chosen is not None:
            picks[r] = chosen
    whole = whole_build_choice(measured, picks)
    if whole is not None:
        members, seconds = whole
        picks = {r: p for r, p in members if measured.roots[r].plans_s[p]}
        default_s = statistics.median(measured.default_s)
        for r, lead in enumerate(leads):
            if r not in picks:
                lead.left = (f"left to IREE: a whole-model build without it measured faster ({seconds * 1e3:.3f} ms "
                             f"against IREE's default {default_s * 1e3:.3f} ms per run, all dispatches)")
                continue
            lead.refinement = lead.refinement.model_copy(update={"chosen": picks[r]})
            lead.measured_s = statistics.median(measured.roots[r].plans_s[picks[r]])
            lead.left = None
    for r, lead in enumerate(leads):
        if r not in picks or lead.left is not None:
            continue
        picked = with_measured_choice(lead.result, lead.refinement)
        lead.plan, lead.predicted = picked.plan, picked.predicted
        lead.latency_s = picked.predicted.get("latency_s")
        lead.note = (f"measured inside the model: {lead.measured_s * 1e3:.4f} ms against IREE's default "
                     f"{lead.default_measured_s * 1e3:.4f} ms per model run "
                     f"({lead.default_measured_s / lead.measured_s:.2f}x)"
                     + (", shipped with the whole-model build that measured fastest" if whole is not None else ""))


def _with_default_root_note(reason: str | None, lowering_config: str, iree_default: str | None) -> str | None:
    """A shipped root config equal to IREE's own default says so: the build still differs from
    IREE's (given the root's config, IREE configures the dispatch's fused ops otherwise), and that
    is what was measured faster (a helper's trial read a 1.35x on an unchanged root config)."""
    if iree_default is None or canonical_attribute(lowering_config) != iree_default:
        return reason
    return (f"{reason or 'tuned'}; the root's config is IREE's own default: what differs is the rest of the dispatch, "
            "whose fused ops IREE configures otherwise once the root's config is given")


def _leads_first(ranked: list[_Candidate]) -> list[_Candidate]:
    """`ranked` (heaviest first) with the dispatch that decides for its root first among those
    sharing the root (one matcher matches them all). Measured, the heaviest decides (its
    measurement covered all of them). By prediction, the one whose plan gains most over IREE's
    default, weighted by its calls (the same root: its plan is as good for the others), and the
    guard weighs the group's summed prediction, not the lead's alone. A root shipped only
    measured (`measured_only`) is never decided by prediction: its group keeps the verdict
    `_judge` gave it."""
    groups: dict[object, list[_Candidate]] = {}
    for c in ranked:
        groups.setdefault(_root_key(c) or id(c), []).append(c)
    out: list[_Candidate] = []
    for members in groups.values():
        predicted = [m for m in members if m.latency_s is not None and m.default_s is not None
                     and not measured_only(m.root)]
        if len(members) > 1 and len(predicted) == len(members) and all(m.refinement is None for m in members):
            best = max(members, key=lambda m: m.dispatch.weight * (m.default_s - m.latency_s))
            members = [best, *(m for m in members if m is not best)]
            verdict = predicted_verdict(sum(m.dispatch.weight for m in members) * best.latency_s,
                                        sum(m.dispatch.weight * m.default_s for m in members))
            best.left = verdict and f"{verdict}; summed over the {len(members)} dispatches of this root, per model run"
        out += members
    return out


def _search_record(c: _Candidate, measure_top: int) -> DispatchSearch:
    assert c.result is not None and c.plan is not None
    result = c.result.model_copy(update={
        "plan": c.plan, "plan_hash": Plan.model_validate(c.plan).plan_hash(), "predicted": c.predicted or {},
        "feasible": bool((c.predicted or {}).get("feasible", True)), "budget": c.evaluations,
        "evaluations": c.evaluations, "elapsed_s": c.seconds, "complete": c.complete,
        "measured": None})
    if c.refinement is not None and c.measured_s is not None:
        result = result.model_copy(update={"measured": c.refinement.summary() | {"top": measure_top, "kept": "candidate"}})
    return DispatchSearch(name=c.dispatch.entry, module=c.dispatch.module or "", result=result,
                          refinement=c.refinement, seconds=c.seconds, complete=c.complete)


def tune_model(model: Path, hardware: HardwareModel, spec_out: Path, *, budget: int | None = None,
               seconds: float | None = None, seed: int = 0, measure_top: int = 0, verify: bool = True,
               progress: ProgressFn | None = None, shape_hints: dict[str, list[int]] | None = None) -> ModelTuneReport:
    """Tune every dispatch of `model` IREE forms for this CPU and write one tuning spec.
    A dispatch ships its tuned config only when it beats IREE's default by the guard's margin
    (predicted; with measure_top K, measured: its K best predicted plans timed beside IREE's
    default). shape_hints size a model's dynamic inputs (static_shapes): the spec matches the
    model with those sizes, which is written beside the spec."""
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tilesearch-model-") as tmp:
        workdir = Path(tmp)
        check_model_file(model)
        source = model
        if spec_out.resolve() == model.resolve():
            raise ModelInputError(f"--spec-out {spec_out} is the model itself: name the spec otherwise")
        static_out = spec_out.with_name(static_model_name(spec_out, model)) if shape_hints else None
        if static_out is not None and static_out.resolve() == model.resolve():
            raise ModelInputError(f"the model sized by the hints is written to {static_out.name}, the model itself: "
                                  "name the spec otherwise")
        static, still_dynamic = static_model(model, shape_hints, workdir) if shape_hints else (None, None)
        model = importable_model(static or model, workdir)
        dispatches = _dispatches(model, workdir)
        classified = [_classify(d) for d in dispatches]
        for c, report in classified:
            if c is not None and not measure_top and (why := measured_only(c.root)):
                report.reason = unmeasured_reason(why, "inside the model (--measure-top K)")  # not searched: nothing would ship
        candidates = [c for c, r in classified if c is not None and r.reason is None]
        reports = [r for _, r in classified]
        dynamic = [r.name for r in reports if r.dynamic]
        if dynamic and not candidates:
            inputs = still_dynamic if shape_hints else dynamic_inputs(source)
            raise ModelInputError(all_dynamic_message(source.name, dynamic, len(reports), inputs, bool(shape_hints)))
        default = _default_build(model, candidates, workdir) if candidates else {}
        total = budget if budget is not None else 64 * max(1, len(candidates))
        if candidates:
            _search(candidates, hardware, total, seconds, seed, progress)
        translation = host_translation_info() if hardware.name == HOST_CPU else None
        ranked = sorted(candidates, key=lambda c: -(c.dispatch.weight * (c.latency_s or 0.0)))
        if measure_top and candidates:
            with refused_as(f"cannot run {model.name} to measure it"):
                function, flags = _model_inputs(model, workdir)
                calls = {d.entry: d.weight for d in dispatches}
                _measure_in_model(model, ranked, measure_top, translation, function, flags, calls, workdir)
        for c in candidates:
            _judge(c, hardware)
        lead: dict[tuple, str] = {}  # by root: the dispatch that decides for it
        matchers: dict[tuple, RootMatcher] = {}
        decided: dict[tuple | None, RootMatcher | str] = {}  # by root: its matcher, or why left
        tuned: dict[str, tuple[_Candidate, str]] = {}
        searches: list[DispatchSearch] = []
        by_name = {r.name: r for r in reports}
        for c in _leads_first(ranked):
            report = by_name[c.dispatch.entry]
            report.evaluations, report.predicted_s = c.evaluations, c.latency_s
            report.iree_default_predicted_s = c.default_s
            report.measured_s, report.iree_default_measured_s = c.measured_s, c.default_measured_s
            before = default.get(c.dispatch.entry)
            index = _structured_index(c)
            if before is not None and index < len(before.ops):
                report.iree_default = before.ops[index][1]
            # A matcher cannot tell two dispatches with the same root apart: one decides for all
            # of them, tuned or left to IREE (_leads_first).
            key = _root_key(c)
            heavier = decided.get(key) if key is not None else None
            if key is not None:
                lead.setdefault(key, c.dispatch.entry)
            if isinstance(heavier, str):
                report.reason = f"same root as {lead[key]}, which decides for both: left to IREE ({heavier})"
                continue
            if heavier is None and c.left is not None:
                report.reason = c.left
                decided[key] = c.left
                continue
            matcher = heavier or _plan_matcher(c, c.plan or {}, symbol_part(c.dispatch.entry), translation)
            if matcher is None:
                # IREE's config runs, so the dispatch's prediction is that config's.
                untiled = f" (predicted {c.latency_s * 1e3:.4f} ms)" if c.latency_s is not None else ""
                report.reason = f"the best plan found leaves the root untiled{untiled}: IREE's own config is kept"
                report.predicted_s = c.default_s if c.default_s is not None else report.predicted_s
                decided[key] = report.reason
                continue
            if heavier is not None:
                report.reason = f"same root as {lead[key]}, which decides for both: gets its config"
            else:
                matchers[matcher.matched] = decided[key] = matcher
            report.tuned, report.config = True, matcher.compilation_info
            if c.note and report.reason is None:
                report.reason = c.note
            report.reason = _with_default_root_note(report.reason, matcher.lowering_config, report.iree_default)
            tuned[c.dispatch.entry] = (c, matcher.lowering_config)
            searches.append(_search_record(c, measure_top))
        if matchers:
            for_model = (sized_for(shape_hints, static_out.name, input_labels(still_dynamic or []))
                         if static_out and shape_hints else None)
            spec_out.write_text(tuning_spec(list(matchers.values()), for_model=for_model))
        else:  # an older spec (and the model sized for it) left at the path would be taken for this run's
            spec_out.unlink(missing_ok=True)
            if static_out is not None:
                remove_model(static_out)
        try:
            problems = _verify(model, spec_out, tuned, reports, default, workdir) if verify and tuned else []
        except ToolFailure as failure:
            problems = [f"IREE cannot compile the model with it: {failure.line}"]
        if problems:
            spec_out.unlink(missing_ok=True)
            raise SpecNotApplied("the tuning spec was not applied as written (not written out):\n  "
                                 + "\n  ".join(problems))
        measured_model = None
        if measure_top and tuned and verify:
            with refused_as(f"cannot run {model.name} with the spec to measure it"):
                measured_model = confirm_in_model(workdir / "default.vmfb", workdir / "tuned.vmfb", function, flags)
            shortfall = whole_model_shortfall(
                measured_model, sum(r.iree_default_measured_s or 0.0 for r in reports if r.tuned), len(reports) > 1)
            if shortfall is not None:
                _withdraw(reports, searches, matchers, spec_out, shortfall)
                tuned = {}
        if static is not None and static_out is not None and matchers:
            copy_model(static, static_out)
    predicted = sum(r.weight * (r.predicted_s or 0.0) for r in reports if r.tuned)
    stored = {x.name for x in searches}
    return ModelTuneReport(model=str(model), hardware=hardware.name, dispatches=reports,
                           spec=str(spec_out) if matchers else None,
                           static_model=str(static_out) if static_out is not None and matchers else None,
                           dynamic_inputs=input_labels(still_dynamic or []),
                           predicted_total_s=predicted, verified=verify and bool(tuned) and not problems,
                           iree_default_measured_model_s=measured_model.default_median_s if measured_model else None,
                           measured_model_s=measured_model.tuned_median_s if measured_model else None,
                           measured_model_rounds=((measured_model.tuned_faster_rounds, len(measured_model.rounds))
                                                  if measured_model else None),
                           elapsed_s=time.perf_counter() - t0, searches=searches,
                           measured_left=[MeasuredDispatch(name=c.dispatch.entry, module=c.dispatch.module or "",
                                                           refinement=c.refinement)
                                          for c in candidates if c.refinement is not None
                                          and c.dispatch.entry not in stored])


def _withdraw(reports: list[DispatchReport], searches: list[DispatchSearch], matchers: dict, spec_out: Path,
              reason: str) -> None:
    """The whole model, measured, did not show the spec's gain: nothing ships (every tuned
    dispatch is left to IREE, the spec is removed)."""
    for report in reports:
        if report.tuned:
            report.tuned, report.config, report.reason = False, None, reason
    searches.clear()
    matchers.clear()
    spec_out.unlink(missing_ok=True)
