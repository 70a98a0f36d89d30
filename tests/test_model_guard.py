"""The whole-model guard: a dispatch ships a tuned config only when it beats IREE's own default
(service.model_tuning.guard), predicted with the same cost model or measured."""

from __future__ import annotations

from pathlib import Path

import pytest

from _shared import SHARED

from service.hardware.profiles import get_profile
from service.ir.analysis import analyze
from service.measure.lowering import LoweringConfig, levels_from_lowering_config, lowering_config_from_levels
from service.model_tuning import guard, tune_model
from service.model_tuning import tune as tune_module
from service.search.engine import tune

MLP = SHARED / "models" / "mlp_512_2048_b16.linalg.mlir"

# A dispatch as the search sees it: fill, matmul (the root), the bias add IREE fuses after it.
DISPATCH = """
func.func @d(%a: tensor<16x512xf32>, %b: tensor<512x256xf32>, %bias: tensor<256xf32>) -> tensor<16x256xf32> {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<16x256xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<16x256xf32>) -> tensor<16x256xf32>
  %m = linalg.matmul ins(%a, %b : tensor<16x512xf32>, tensor<512x256xf32>) outs(%f : tensor<16x256xf32>) -> tensor<16x256xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (j)>, affine_map<(i, j) -> (i, j)>],
                       iterator_types = ["parallel", "parallel"]}
      ins(%m, %bias : tensor<16x256xf32>, tensor<256xf32>) outs(%e : tensor<16x256xf32>) {
    ^bb0(%x: f32, %y: f32, %o: f32):
      %s = arith.addf %x, %y : f32
      linalg.yield %s : f32
  } -> tensor<16x256xf32>
  return %r : tensor<16x256xf32>
}"""
IREE_CONFIG = ("#iree_cpu.lowering_config<distribution = [16, 64, 0], vector_common_parallel = [8, 16, 0], "
               "vector_reduction = [0, 0, 16]>")


def test_a_plan_of_irees_levels_maps_back_to_the_same_config():
    config = LoweringConfig(distribution=[16, 64, 0], vector_common_parallel=[8, 16, 0], vector_reduction=[0, 0, 16])
    levels = levels_from_lowering_config(config)
    assert [lv["loop"] for lv in levels] == ["forall", "for", "for"]
    assert lowering_config_from_levels(levels, ["parallel", "parallel", "reduction"]) == config


def test_irees_default_becomes_the_roots_group_fusing_what_iree_fuses():
    graph = analyze(DISPATCH).graph
    (root,) = [op for op in graph.ops.values() if op.kind == "contraction"]
    plan = guard.iree_default_plan(graph, root, IREE_CONFIG)
    (group,) = plan["groups"]
    assert group["anchor"] == root.uid
    assert sorted(group["fuse"]) == sorted(u for u in graph.ops if u != root.uid)  # the fill and the bias add
    assert [lv["tile_sizes"] for lv in group["levels"]] == [[16, 64, 0], [8, 16, 0], [0, 0, 16]]
    # No plan where IREE gave the root nothing to map, or a config of another rank.
    assert guard.iree_default_plan(graph, root, None) is None
    assert guard.iree_default_plan(graph, root, "#iree_cpu.lowering_config<vector_common_parallel = [8, 16, 0]>") is None
    assert guard.iree_default_plan(graph, root, "#iree_cpu.lowering_config<distribution = [16, 64], "
                                                "vector_common_parallel = [8, 16], vector_reduction = [0, 0]>") is None


def test_irees_default_is_priced_as_the_search_prices_its_own_plans(host):
    graph = analyze(DISPATCH).graph
    (root,) = [op for op in graph.ops.values() if op.kind == "contraction"]
    plan = guard.iree_default_plan(graph, root, IREE_CONFIG)
    result = tune(DISPATCH, host, budget=8, seed=0, warm_start_plans=[plan], workers=1, keep_pool=True)
    (seeded,) = [t for t in result.trials if t.source == "warm_start"]
    assert guard.predicted_default_s(DISPATCH, host, plan) == pytest.approx(seeded.latency_s)


@pytest.mark.parametrize(("tuned", "default", "ships"), [
    (1.0, 1.2, True),
    (1.0, 1.05, True),     # exactly the margin
    (1.0, 1.04, False),    # faster, but within the margin
    (1.0, 0.9, False),     # IREE's default predicted faster
    (1.0, None, True),     # no default to compare with
])
def test_a_tuned_plan_ships_only_predicted_faster_than_irees_default_by_the_margin(tuned, default, ships):
    reason = guard.predicted_verdict(tuned * 1e-3, None if default is None else default * 1e-3)
    assert (reason is None) == ships
    if not ships:
        assert reason.startswith("IREE's default predicted as fast: ")


@pytest.mark.parametrize(("tuned", "default", "ships"), [
    (1.0, 1.2, True),
    (1.0, 1.04, False),    # faster, but within the margin
    (1.0, 0.9, False),     # IREE's default measured faster
    (1.0, None, False),    # nothing to compare with: IREE's config is kept
    (None, 1.0, False),
])
def test_a_plan_measured_inside_the_model_ships_only_faster_than_irees_default_by_the_margin(tuned, default, ships):
    reason = guard.measured_verdict(None if tuned is None else tuned * 1e-3, None if default is None else default * 1e-3)
    assert (reason is None) == ships


@pytest.mark.slow
def test_a_dispatch_predicted_slower_than_irees_default_is_left_to_iree(monkeypatch, tmp_path):
    """Only the prediction seam is replaced: IREE's default is priced faster than any plan."""
    monkeypatch.setattr(tune_module, "predicted_default_s", lambda module, hardware, plan: 1e-9)
    report = tune_model(MLP, get_profile("host-cpu"), tmp_path / "spec.mlir", budget=64)
    assert len(report.dispatches) == 2 and not any(d.tuned for d in report.dispatches)
    for d in report.dispatches:
        assert d.reason.startswith("IREE's default predicted as fast: 0.0000 ms vs ")
        assert d.iree_default.startswith("#iree_cpu.lowering_config<distribution = ")
    assert report.spec is None and not Path(tmp_path / "spec.mlir").exists() and report.searches == []
