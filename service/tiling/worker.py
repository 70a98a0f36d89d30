"""The tiling tasks a sandbox worker runs: module text and contract models in, contract models
out (service.tiling.contract). Each worker parses a module once (`cached_analysis`) and reuses
it across the tasks of one request."""

from __future__ import annotations

import tempfile
from pathlib import Path

from service.hardware.model import HardwareModel
from service.hardware.profiles import HOST_CPU
from service.ir.analysis import cached_analysis
from service.ir.graph import OpGraph
from service.ir.plan import Plan
from service.ir.tasks import apply_plan_to_text
from service.measure.lowering import (
    CONFIGURABLE_KINDS,
    CONVOLUTION_PIPELINE,
    compilation_info_text,
    iree_configures_convolution,
    iree_keeps_own_pipeline,
    lowering_config_from_levels,
    translation_info_text,
)
from service.measure.tools import host_translation_info, interruptible
from service.measure.tuning_spec import plan_matchers, spec_for_plan, why_no_spec
from service.measure.whole_model import configs_not_applied
from service.search.candidate import Evaluation
from service.measure.cache import host_key
from service.measure.timing import Measurement, cpu_per_core_s
from service.search.guard import tune_from_iree_default
from service.search.refine import Refinement, measured_answer, refine
from service.search.results import TuneResult
from service.search.shapes import check_shapes, parse_buckets, parse_shape_hints

from .contract import (
    AnchorCompilationInfo,
    Buckets,
    GroupBest,
    GroupSite,
    ModuleAnalysis,
    OpSummary,
    PlanMeasurement,
    Realisation,
    SearchObserver,
    SearchOutcome,
    SearchStats,
    SearchTask,
    ShapeHints,
    TrialOutcome,
)
from .warm_start import group_signature, relative_group_plan, warm_start_plans


def analyse_request(source: str, max_ops: int | None) -> ModuleAnalysis:
    """Fingerprint, op summary and the group signature of every op (possible anchors)."""
    a = cached_analysis(source, max_ops=max_ops)
    g = a.graph
    return ModuleAnalysis(
        fingerprint=a.fingerprint,
        ops=[OpSummary(uid=op.uid, name=op.name, kind=op.kind, loop_ranges=op.loop_ranges) for op in g.ops.values()],
        groups=[GroupSite(anchor=uid, signature=group_signature(g, uid)) for uid in g.topological_order()],
    )


def check_search_shapes(source: str, shape_hints: ShapeHints | None, buckets: Buckets | None) -> None:
    """Raise ShapeHintError when the hints or buckets do not fit the module (before a search is
    claimed: a request with a misfit records no decision)."""
    hints, bucket_map = parse_shape_hints(shape_hints), parse_buckets(buckets)
    a = cached_analysis(source)
    check_shapes(a.module, a.graph, hints, bucket_map)


def compilation_infos(graph: OpGraph, plan: Plan, translation_info: str | None = None) -> dict[str, AnchorCompilationInfo]:
    """IREE `compilation_info` attribute text per contraction/convolution anchor of the plan,
    with `translation_info` (default: the pipeline without options); a convolution's with IREE's
    convolution pipeline, honoured when it has a batch dim (IREE 3.13 drops it otherwise)."""
    out = {}
    for group in plan.groups:
        op = graph.op(group.anchor)
        if op.kind not in CONFIGURABLE_KINDS or len(group.levels) > 3 or iree_keeps_own_pipeline(op):
            continue
        levels = [level.model_dump() for level in group.levels]
        config = lowering_config_from_levels(levels, op.iterator_types, anchor=op.name)
        convolution = op.kind == "convolution"
        out[str(op.uid)] = AnchorCompilationInfo(
            op=op.name,
            compilation_info=compilation_info_text(
                config, translation_info_text(CONVOLUTION_PIPELINE) if convolution else translation_info),
            honoured_by_iree=iree_configures_convolution(op) if convolution else True,
        )
    return out


def _translation_info_for(hardware: HardwareModel) -> str | None:
    """The pipeline options IREE uses on this machine when the plan is for it (host-cpu is the
    machine the service runs on): on AVX2 IREE peels remainders, and a compilation_info without
    `enable_loop_peeling` there compiles masked vectors, which run much slower."""
    if hardware.name != HOST_CPU:
        return None
    return host_translation_info()


def _trial(number: int, t: Evaluation) -> TrialOutcome:
    return TrialOutcome(number=number, plan=t.plan, plan_hash=t.plan_hash or "", feasible=t.feasible, cost=t.cost,
                        latency_s=t.latency_s, reason=t.reason)


def _trials(result: TuneResult, offset: int = 0) -> list[TrialOutcome]:
    return [_trial(offset + i, t) for i, t in enumerate(result.trials) if t.plan is not None]


class _TrialStream:
    """The engine's evaluations, numbered as `_trials` numbers them, handed to an observer."""

    def __init__(self, observer: SearchObserver, offset: int) -> None:
        self.observer, self.seen = observer, offset

    def __call__(self, evaluations: list[Evaluation]) -> None:
        batch = [_trial(self.seen + i, t) for i, t in enumerate(evaluations) if t.plan is not None]
        self.seen += len(evaluations)
        self.observer.trials(batch)


def _group_bests(graph: OpGraph, plan: Plan, result: TuneResult) -> list[GroupBest]:
    latency = result.predicted.get("latency_s")
    if not result.feasible or latency is None:
        return []
    return [
        GroupBest(signature=group_signature(graph, group.anchor), plan=relative_group_plan(graph, group), latency_s=float(latency))
        for group in plan.groups
    ]


def _stats(result: TuneResult) -> SearchStats:
    measured = result.measured
    return SearchStats(
        chosen_by="measured" if measured is not None and measured["kept"] != "predicted" else "predicted",
        measured=measured,
        strategy=result.strategy,
        budget=result.budget,
        seed=result.seed,
        evaluations=result.evaluations,
        evaluations_per_s=result.evaluations_per_s,
        complete=result.complete,
        space_size=result.space_size,
        warnings=result.warnings,
        dispatch=result.dispatch,
        buckets=[b.model_dump() for b in result.buckets] if result.buckets else None,
        iree_default=result.iree_default,
    )


def plan_measurement(plan: dict, plan_hash: str, role: str, m: Measurement, default: Measurement | None,
                      host: str) -> PlanMeasurement:
    return PlanMeasurement(plan_hash=plan_hash, plan=plan, role=role, host_key=host, cpu_s=cpu_per_core_s(m),
                           default_cpu_s=cpu_per_core_s(default) if default is not None else None,
                           ok=m.ok, median_s=m.median_s, samples_s=m.samples_s,
                           cpu_median_s=m.cpu_median_s, cpu_samples_s=m.cpu_samples_s,
                           config=[c.model_dump(mode="json") for c in m.config], error=m.error,
                           iree_version=m.iree_version)


def refinement_measurements(refinement: Refinement) -> list[PlanMeasurement]:
    """Every timing a refinement took (its candidates, then IREE's default), on this host."""
    host, default = host_key(), refinement.default
    timings = [plan_measurement(c.plan, c.plan_hash, "candidate", c.measured, default, host)
               for c in refinement.candidates]
    if default is not None:
        timings.append(plan_measurement(Plan().model_dump(), Plan().plan_hash(), "default", default, default, host))
    return timings


def measured_choice(source: str, result: TuneResult, k: int) -> tuple[TuneResult, list[PlanMeasurement]]:
    """Time the k plans predicted fastest and IREE's default on this machine (the `tune
    --measure-top` refinement) and answer with the fastest measured (`measured_answer`). Also
    every timing taken."""
    refinement = refine(source, result, k)
    return measured_answer(result, refinement, k), refinement_measurements(refinement)


def search_and_realise(source: str, task: SearchTask, observer: SearchObserver | None = None) -> SearchOutcome:
    """Search (in this worker, one process), then realise the best plan: tiled IR, script,
    origin map, IREE compilation_info, trials and group records for the store. `observer` sees
    the trials as they are found and may stop the search (SearchStopped)."""
    graph = cached_analysis(source).graph
    warm = [plan.model_dump() for plan in task.warm_plans] + warm_start_plans(graph, task.warm_starts)
    if task.resume_plan is not None and task.resume_plan.groups:
        warm = [task.resume_plan.model_dump(), *warm]
    # Plans are evaluated in a worker this job process keeps (pebble's workers may start
    # processes): a plan that crashes MLIR costs that plan, as in the CLI, not the request.
    result = tune_from_iree_default(
        source,
        task.hardware,
        guard=not task.measure_top,  # measured, IREE's default is timed beside the top plans instead
        budget=task.budget,
        seconds=task.seconds,
        strategy=task.strategy,
        seed=task.seed,
        shape_hints=task.shape_hints,
        buckets=task.buckets,
        workers=1,
        keep_pool=True,
        warm_start_plans=warm or None,
        on_trials=_TrialStream(observer, task.trial_offset) if observer is not None else None,
        configure_in_process=True,  # this is a sandbox worker: no iree-compile to start per module
    )
    measurements: list[PlanMeasurement] = []
    if task.measure_top:
        with interruptible(observer.check if observer is not None else None):
            result, measurements = measured_choice(source, result, task.measure_top)
    return outcome_of(source, result, task.hardware, measurements, task.trial_offset)


def outcome_of(source: str, result: TuneResult, hardware: HardwareModel, measurements: list[PlanMeasurement],
               trial_offset: int = 0) -> SearchOutcome:
    """A finished search of `source` as the store keeps it: its plan realised (tiled IR, script,
    origin map, IREE compilation_info and tuning spec), trials, group records and timings."""
    graph = cached_analysis(source).graph
    plan = Plan.model_validate(result.plan)
    configs = iree_configs(graph, plan, hardware, _left_to_iree(result))
    if configs["tuning_spec"] is not None and hardware.name == HOST_CPU:  # proved once, kept with the decision
        if why := spec_not_applied(source, plan, configs["tuning_spec"], hardware):
            configs |= {"tuning_spec": None, "no_tuning_spec": why}
    return SearchOutcome(
        plan=plan,
        predicted=result.predicted,
        baseline=result.baseline,
        realised=apply_plan_to_text(source, plan) if plan.groups else None,
        **configs,
        trials=_trials(result, trial_offset),
        group_bests=_group_bests(graph, plan, result),
        stats=_stats(result),
        measurements=measurements,
    )


def _left_to_iree(result: TuneResult) -> str | None:
    """Why the answer leaves the module to IREE's own config, when IREE's default won."""
    if result.iree_default and result.iree_default.get("kept"):
        return result.iree_default["reason"]
    if result.measured and result.measured.get("kept") == "iree_default":
        return f"{result.measured['reason']} (measured on this machine)"
    return None


def iree_configs(graph: OpGraph, plan: Plan, hardware: HardwareModel, left_to_iree: str | None = None) -> dict:
    """The plan's compilation_info per anchor and its tuning spec, or why it has none. They are
    IREE llvm-cpu configs: a profile that is not a CPU gets neither."""
    if not hardware.is_cpu:
        return {"compilation_info": {}, "tuning_spec": None,
                "no_tuning_spec": f"{hardware.name} is not a CPU profile: tilesearch writes IREE configs for its llvm-cpu "
                                  "backend only, so the answer is the plan and its tiled IR"}
    translation_info = _translation_info_for(hardware=hardware)
    spec = spec_for_plan(graph, plan, translation_info)
    return {"compilation_info": compilation_infos(graph, plan, translation_info), "tuning_spec": spec,
            "no_tuning_spec": None if spec else left_to_iree or why_no_spec(graph, plan)}


def spec_not_applied(source: str | bytes, plan: Plan, spec: str, hardware: HardwareModel) -> str | None:
    """Why IREE, configuring the module with the plan's spec, did not give every matched op the
    spec's config (None: it did). The matchers check each op as IREE forms it: a linalg.generic
    whose contiguous reduction dims IREE collapses matches nothing (a new user's trial)."""
    matchers = plan_matchers(cached_analysis(source).graph, plan, _translation_info_for(hardware=hardware))
    with tempfile.TemporaryDirectory(prefix="tilesearch-spec-") as tmp:
        workdir = Path(tmp)
        module = workdir / ("module.mlirbc" if isinstance(source, bytes) else "module.mlir")
        module.write_bytes(source) if isinstance(source, bytes) else module.write_text(source)
        (workdir / "spec.mlir").write_text(spec)
        missed = configs_not_applied(module, workdir / "spec.mlir", [m.lowering_config for m in matchers], workdir)
    if not missed:
        return None
    return (f"IREE, configuring the module with the spec, gave no op {missed[0]}: its matcher matches nothing as IREE "
            "forms the op (it collapses or reorders a contraction's dims), so the spec would change nothing")


def realise_plan(source: str, plan: Plan, hardware: HardwareModel) -> Realisation:
    """A stored plan applied to this module text (same structure, its own names and constants):
    a hit answers in the requester's IR. Milliseconds; no search."""
    graph = cached_analysis(source).graph
    return Realisation(
        realised=apply_plan_to_text(source, plan) if plan.groups else None,
        **iree_configs(graph, plan, hardware),
    )


_WARM_UP_MODULE = """
func.func @warm_up(%a: tensor<16x16xf32>, %b: tensor<16x16xf32>, %c: tensor<16x16xf32>) -> tensor<16x16xf32> {
  %r = linalg.matmul ins(%a, %b : tensor<16x16xf32>, tensor<16x16xf32>) outs(%c : tensor<16x16xf32>) -> tensor<16x16xf32>
  return %r : tensor<16x16xf32>
}
"""


def warm_up(hardware: HardwareModel) -> None:
    """What a sandbox worker's first search would otherwise pay for: the imports of the search
    and of the realisation, its kept evaluation process, and (host-cpu) IREE's pipeline options
    probed with a compile."""
    analyse_request(_WARM_UP_MODULE, None)
    search_and_realise(_WARM_UP_MODULE, SearchTask(hardware=hardware, budget=2, seconds=60, strategy="tpe", seed=0))
