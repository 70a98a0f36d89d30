"""The typed contract between the tiling service and its sandbox workers: models in and out,
errors arriving as the types (and fields) the worker raised, the analysis cache, and the
relative group plans of warm starts. `host-cpu` is the reference host conftest pins."""

from __future__ import annotations

import pickle

import pytest

from _shared import MATMUL_100, workload
from service.hardware.profiles import UnknownHardwareError, get_profile
from service.ir.analysis import cached_analysis, source_key
from service.ir.errors import Diagnostic, MLIRSyntaxError, ModuleTooLargeError, PlanError
from service.ir.plan import Plan
from service.ir.sandbox import Sandbox
from service.ir.tasks import AppliedPlan, ModuleInspection, apply_plan_to_text, inspect_module
from service.search.errors import SearchInputError, ShapeHintError
from service.tiling.contract import ModuleAnalysis, RelativeGroupPlan, SearchOutcome, SearchTask, WarmStart
from service.tiling.warm_start import group_signature, relative_group_plan, translate_group_plan, warm_start_plans
from service.tiling.worker import analyse_request, check_search_shapes, search_and_realise

DYNAMIC_MATMUL = """
func.func @f(%a: tensor<?x512xf32>, %b: tensor<512x256xf32>) -> tensor<?x256xf32> {
  %c0 = arith.constant 0 : index
  %zero = arith.constant 0.0 : f32
  %m = tensor.dim %a, %c0 : tensor<?x512xf32>
  %e = tensor.empty(%m) : tensor<?x256xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%e : tensor<?x256xf32>) -> tensor<?x256xf32>
  %r = linalg.matmul ins(%a, %b : tensor<?x512xf32>, tensor<512x256xf32>) outs(%acc : tensor<?x256xf32>) -> tensor<?x256xf32>
  return %r : tensor<?x256xf32>
}"""


@pytest.fixture(scope="module")
def sandbox():
    with Sandbox(workers=1) as sb:
        yield sb


def _raise_plan_error() -> None:
    raise PlanError("fuse group 1 is split", group=2, diagnostics=[Diagnostic("bad slice", line=3, column=7)])


def _raise_search_input_error() -> None:
    raise SearchInputError("unknown strategy 'tp'")


def _raise_unknown_hardware() -> None:
    get_profile("tpu-v9")


def test_worker_tasks_answer_contract_models(sandbox) -> None:
    source = MATMUL_100
    analysis = sandbox.run(analyse_request, source, 5000, timeout=60)
    assert isinstance(analysis, ModuleAnalysis)
    assert len(analysis.fingerprint) == 64 and analysis.ops and analysis.groups
    assert {site.anchor for site in analysis.groups} == {op.uid for op in analysis.ops}
    task = SearchTask(hardware=get_profile("host-cpu"), budget=6, seconds=30, strategy="random", seed=1)
    outcome = sandbox.run(search_and_realise, source, task, timeout=120)
    assert isinstance(outcome, SearchOutcome)
    assert outcome.plan.groups and outcome.realised is not None and "scf.forall" in outcome.realised.tiled_module
    assert outcome.trials and all(t.plan_hash for t in outcome.trials)
    assert outcome.stats.evaluations > 0 and outcome.stats.strategy == "random"
    assert {best.signature for best in outcome.group_bests} <= {site.signature for site in analysis.groups}
    assert pickle.loads(pickle.dumps(outcome)) == outcome
    assert isinstance(sandbox.run(inspect_module, source, timeout=60), ModuleInspection)


def test_errors_cross_the_process_boundary_typed_with_their_fields(sandbox) -> None:
    with pytest.raises(PlanError) as plan_error:
        sandbox.run(_raise_plan_error, timeout=30)
    assert plan_error.value.group == 2 and plan_error.value.reason == "fuse group 1 is split"
    assert plan_error.value.diagnostics == [Diagnostic("bad slice", line=3, column=7)]

    with pytest.raises(MLIRSyntaxError) as syntax:
        sandbox.run(analyse_request, "func.func @f( {", None, timeout=30)
    assert syntax.value.diagnostics[0].line == 1

    with pytest.raises(ModuleTooLargeError) as too_large:
        sandbox.run(analyse_request, workload("mlp_chain"), 3, timeout=30)
    assert too_large.value.limit == 3 and too_large.value.ops > 3

    with pytest.raises(ShapeHintError, match="one bucketed dim per search"):
        sandbox.run(check_search_shapes, DYNAMIC_MATMUL, None, {"M": [1, 16], "arg0.0": [2, 4]}, timeout=30)

    with pytest.raises(SearchInputError, match="unknown strategy"):
        sandbox.run(_raise_search_input_error, timeout=30)

    with pytest.raises(UnknownHardwareError) as unknown:
        sandbox.run(_raise_unknown_hardware, timeout=30)
    assert unknown.value.name == "tpu-v9" and "host-cpu" in unknown.value.known

    applied = sandbox.run(apply_plan_to_text, workload("matmul_1024"),
                          {"groups": [{"anchor": 1, "levels": [{"tile_sizes": [64, 64, 0], "loop": "forall"}]}]}, timeout=30)
    assert isinstance(applied, AppliedPlan) and "scf.forall" in applied.tiled_module


def test_cached_analysis_is_shared_and_keeps_the_op_limit() -> None:
    source = workload("matmul_1024")
    first = cached_analysis(source)
    assert cached_analysis(source) is first
    assert cached_analysis(source.encode()) is not None and source_key(source) == source_key(source.encode())
    with pytest.raises(ModuleTooLargeError) as err:
        cached_analysis(source, max_ops=2)  # analysed above without a limit: the limit still holds
    assert err.value.limit == 2


def test_a_group_plan_relative_to_its_anchor_replays_on_a_renamed_module() -> None:
    source = workload("mlp_chain")
    graph = cached_analysis(source).graph
    plan = Plan.model_validate({"groups": [{"anchor": 1, "fuse": [0, 2, 3, 4], "levels": [{"tile_sizes": [64, 128, 0], "loop": "forall"}]}]})
    relative = relative_group_plan(graph, plan.groups[0])
    stored = RelativeGroupPlan.model_validate(relative.model_dump(mode="json"))  # as a group record holds it
    assert stored == relative

    renamed = cached_analysis(source.replace("%", "%x_")).graph
    replayed = translate_group_plan(stored, 1, renamed)
    # uid 2 feeds a consumer, neither up- nor downstream of the anchor: it is left out.
    assert [m.relation for m in stored.fuse] == ["producer", "producer", "consumer", "consumer"]
    assert [m.distance for m in stored.fuse] == [1, None, 1, 2]
    assert replayed is not None and sorted(replayed.groups[0].fuse) == [0, 3, 4]
    assert replayed.groups[0].levels == plan.groups[0].levels
    warm = WarmStart(signature=group_signature(renamed, 1), anchor=1, relative=stored)
    assert warm_start_plans(renamed, [warm]) == [replayed.model_dump()]
    assert translate_group_plan(stored, 0, renamed) is None  # another anchor's structure
