"""The guard against IREE's own default (service.search.guard): a tuned config is answered only
when it beats the config IREE gives the op itself, predicted with the same cost model or measured.
For a whole model per dispatch, and for one module's decision (the REST API's, a job item's,
`tilesearch tune`'s)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fastapi.testclient import TestClient
from markupsafe import escape
from typer.testing import CliRunner

from _shared import (MATMUL_100, SHARED, THREE_REDUCTION_DIMS, TWO_STACKED_MATMULS, first_input_vectors_matmul, matmul_module,
                     needs_avx512, tuning_every_dispatch, workload)

from service.api.app import create_app
from service.cli import app
from service.config import Settings
from service.hardware.model import HardwareModel

from service.hardware.profiles import get_profile
from service.ir.analysis import analyze
from service.ir.plan import Plan
from service.measure.lowering import (
    LoweringConfig,
    levels_from_lowering_config,
    lowering_config_from_levels,
    lowering_config_of,
)
from service.model_tuning import tune_model
from service.search import guard
from service.model_tuning import tune as tune_module
from service.search import engine
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
        assert lowering_config_of(d.iree_default) is not None  # IREE may print other levels first (AVX2: cache_parallel)
    assert report.spec is None and not Path(tmp_path / "spec.mlir").exists() and report.searches == []


# --------------------------------------------------------------------------- one module's decision

# A square matmul the reference host's model prices IREE's default as good as anything a small
# search finds: its decision is IREE's own config.
MATMUL_1024 = workload("matmul_1024")


def test_irees_default_of_a_static_contraction_is_what_iree_compile_configures():
    source = matmul_module("nk", 16, 512, 256)
    default = guard.iree_default_of(source)
    graph = analyze(source).graph
    (root,) = [op for op in graph.ops.values() if op.kind == "contraction"]
    assert default.anchor == root.uid
    config = lowering_config_of(default.config)  # IREE's printed attribute, parsed back
    assert len(config.distribution) == 3 and config.vector_reduction[2] > 0  # m, n, k; k tiled in registers
    assert default.plan == guard.iree_default_plan(graph, root, default.config)


def test_irees_default_configured_in_process_is_the_tools(tmp_path, monkeypatch):
    """A sandbox worker configures with IREE's compiler API, not a tool per module: the same
    configs (on several shapes and types), the tool only where IREE fails, with the tool's error."""
    from service.measure import timing, tools

    sources = [matmul_module("nk", 16, 512, 256), matmul_module("kn", 100, 36, 100), MATMUL_100,
               matmul_module("kn", 64, 64, 64).replace("f32", "bf16")]
    started = []
    real_tool = tools.configure_module
    monkeypatch.setattr(timing, "configure_module", lambda *a: started.append(a) or real_tool(*a))
    monkeypatch.setattr(tools, "configure_module", lambda *a: started.append(a) or real_tool(*a))
    for source in sources:
        assert timing.iree_default_configs(source, 60, in_process=True) == timing.iree_default_configs(source, 60)
    assert len(started) == len(sources)  # the tool ran for the comparisons only
    broken = MATMUL_100.replace("linalg.matmul", "linalg.matmul {iree_codegen.lowering_config = 3 : i64}")
    with pytest.raises(tools.ToolFailure):
        timing.iree_default_configs(broken, 60, in_process=True)
    assert len(started) == len(sources) + 1  # IREE refused it in process: the tool says why


def test_there_is_no_irees_default_to_guard_against_without_one_static_contraction():
    dynamic = workload("dynamic_matmul")
    assert guard.iree_default_of(dynamic) is None  # no spec can match a dynamic dim
    assert guard.iree_default_of(workload("softmax")) is None  # no contraction
    two = TWO_STACKED_MATMULS
    assert sum(op.kind == "contraction" for op in analyze(two).graph.ops.values()) == 2
    assert guard.iree_default_of(two) is None  # which one's config the decision is judged by is unclear


def test_a_pick_not_predicted_faster_than_irees_default_leaves_the_module_to_iree(host, monkeypatch):
    monkeypatch.setattr(engine, "KEEP_START_MARGIN", 100.0)  # nothing the search finds is that much faster
    result = guard.tune_from_iree_default(MATMUL_100, host, budget=8, seed=0, workers=1)
    record = result.iree_default
    assert result.plan == {"groups": []} and record["kept"] is True
    assert record["reason"].startswith("IREE's default predicted as fast: ")
    assert record["reason"].endswith("; the best of 8 plans searched")
    assert result.predicted["latency_s"] == pytest.approx(record["predicted_s"])
    # IREE's default was one of the search's starts, priced by the same evaluator.
    default = guard.iree_default_of(MATMUL_100)
    (start,) = [t for t in result.trials if t.source == "warm_start" and t.plan == default.plan]
    assert start.latency_s == pytest.approx(record["predicted_s"])


def test_a_pick_predicted_faster_than_irees_default_is_answered_with_both_numbers(host):
    result = guard.tune_from_iree_default(MATMUL_100, host, budget=8, seed=0, workers=1)
    record = result.iree_default
    assert result.plan["groups"] and record["kept"] is False and record["reason"] is None
    assert result.predicted["latency_s"] * (1 + engine.KEEP_START_MARGIN) <= record["predicted_s"]
    assert lowering_config_of(record["config"]) is not None  # IREE may print other levels first (AVX2: cache_parallel)
    # The model prices the untiled loop nest faster still; but untiled, IREE compiles its own
    # config, so the untiled plan is no rival to IREE's default: the best tiled plan answers.
    (untiled,) = [t for t in result.trials if t.source == "untiled"]
    assert untiled.latency_s < result.predicted["latency_s"]


def test_a_contraction_vectorized_along_its_first_input_is_decided_by_prediction_over_one_channel_rows(host):
    """A 1x1 convolution over NCHW with its pixels collapsed (image first): the cost model prices
    IREE's outer products along the output channels (cost/registers.py), so a prediction decides
    it against IREE's default, and the search offers register tiles of one output channel only
    (single_row_dims), which ran 1.6-2.5x faster than eight on a Zen 4. Kept 4-D (two pixel dims),
    the form stays measured-only (test_model_tuning)."""
    module = first_input_vectors_matmul(256, 169, 128)
    result = guard.tune_from_iree_default(module, host, budget=16, seed=0, workers=1)
    record = result.iree_default
    assert record["predicted_s"] is not None
    assert "vectorized along its first input" not in (record["reason"] or "")
    # IREE's own config (8 rows) is the search's warm start; every plan it searched has one row.
    tiled = [t.plan for t in result.trials if t.stage == "cost" and t.plan and t.plan.get("groups")
             and t.source not in ("default", "warm_start") and len(t.plan["groups"][0]["levels"]) >= 2]
    assert tiled and all(plan["groups"][0]["levels"][1]["tile_sizes"][0] == 1 for plan in tiled)
    if not record["kept"]:
        assert result.plan["groups"][0]["levels"][1]["tile_sizes"][0] == 1


def test_the_engine_keeps_its_start_by_its_margin_unless_the_caller_judges(host):
    """The guard judges against IREE's default itself (5%); the engine's own keep-the-start
    margin (10%) in front of it made the guard compare IREE's default with itself."""
    kept = tune(MATMUL_100, host, budget=8, seed=0, workers=0)
    judged = tune(MATMUL_100, host, budget=8, seed=0, workers=0, keep_start_margin=0.0)
    starts = [t.latency_s for t in kept.trials if t.source in ("default", "warm_start") and t.feasible]
    best = min(t.latency_s for t in judged.trials if t.stage == "cost" and t.feasible)
    assert kept.predicted["latency_s"] == pytest.approx(min(starts))
    assert judged.predicted["latency_s"] == pytest.approx(best) and best < min(starts)


def test_measured_answers_and_other_targets_are_not_judged_by_prediction(host):
    measured = guard.tune_from_iree_default(MATMUL_1024, host, guard=False, budget=4, seed=0, workers=1)
    assert measured.plan["groups"] and "kept" not in measured.iree_default  # measurements judge it
    # its prediction is still recorded, as the dashboard shows it (a helper's trial: a measured
    # decision's page failed on the missing figure)
    start = next(t for t in measured.trials if t.plan_hash == measured.iree_default["plan_hash"])
    assert measured.iree_default["predicted_s"] == start.latency_s > 0
    other = HardwareModel.model_validate(host.model_dump() | {"name": "another-cpu"})
    elsewhere = guard.tune_from_iree_default(MATMUL_1024, other, budget=4, seed=0, workers=1)
    assert elsewhere.iree_default is None  # IREE's default on this machine says nothing of another


@needs_avx512  # IREE's default on this CPU, priced on the pinned AVX-512 profile
def test_the_api_answers_irees_own_config_with_the_reason_and_keeps_it(migrated_url):
    body = {"module": MATMUL_1024, "hardware": "host-cpu", "budget": 4}
    with TestClient(create_app(Settings(database_url=migrated_url, pool_workers=1))) as client:
        miss = client.post("/v1/tilings", json=body).json()
        assert miss["plan"] == {"groups": []} and miss["tuning_spec"] is None
        assert miss["no_tuning_spec"].startswith("IREE's default predicted as fast: ")
        assert miss["search_stats"]["iree_default"]["kept"] is True
        hit = client.post("/v1/tilings", json=body).json()
        assert hit["cache"] == "hit" and hit["no_tuning_spec"] == miss["no_tuning_spec"]
        assert client.get(f"/v1/tilings/{miss['id']}").json()["no_tuning_spec"] == miss["no_tuning_spec"]
        page = client.get(f"/decisions/{miss['id']}").text  # the dashboard says the same, with IREE's config
        assert "The plan tiles nothing: IREE's own config\nanswers, IREE&#39;s default predicted as fast: " in page
        assert str(escape(miss["search_stats"]["iree_default"]["config"])) in page


def test_a_job_item_left_to_iree_says_why_on_the_jobs_page():
    from service.api.dashboard.job_views import ItemRow

    row = dict(id=1, position=0, name="mm", state="done", weight=1, trials=8, attempts=1, decision_id=3,
               predicted_s=1e-3, weighted_s=1e-3, measured=None, cache="miss", error=None)
    assert ItemRow(**row).why == "tuned (cache miss)"
    kept = ItemRow(**row, no_spec="IREE's default predicted as fast: 1.0000 ms vs 1.0000 ms tuned")
    assert kept.why == "not in the spec: IREE's default predicted as fast: 1.0000 ms vs 1.0000 ms tuned (cache miss)"


@needs_avx512  # IREE's default on this CPU, priced on the pinned AVX-512 profile
def test_tune_writes_no_spec_when_irees_default_is_kept_and_says_why(tmp_path):
    module, spec = tmp_path / "mm.mlir", tmp_path / "spec.mlir"
    module.write_text(MATMUL_1024)
    spec.write_text("// an older answer")
    result = CliRunner().invoke(app, ["tune", str(module), "--budget", "4", "--spec-out", str(spec)])
    assert result.exit_code == 0, result.output
    assert not spec.exists()
    assert "kept IREE's default: IREE's default predicted as fast" in result.output
    assert "no tuning spec written" in result.output and "(IREE's default predicted as fast" in result.output
    assert f"removed the older {spec}" in result.output  # it was there before: say it is gone (a new user's trial)
    # --json says it too: a build script must learn there is no spec, and why, from the JSON alone
    as_json = CliRunner().invoke(app, ["tune", str(module), "--budget", "4", "--spec-out", str(spec), "--json"])
    answer = json.loads(as_json.output)
    assert answer["tuning_spec"] is None and answer["no_tuning_spec"].startswith("IREE's default predicted as fast")
    with tuning_every_dispatch():
        tuned = json.loads(CliRunner().invoke(app, ["tune", str(module), "--budget", "4", "--spec-out", str(spec),
                                                    "--json"]).output)
    assert tuned["tuning_spec"] == str(spec) and tuned["no_tuning_spec"] is None and spec.exists()


def test_tune_sends_an_onnx_model_to_model_tune(tmp_path):
    """An ONNX file given to `tune` was read as MLIR text ("not valid UTF-8 ... byte 0xbe")."""
    model = tmp_path / "net.onnx"
    model.write_bytes(b"\x08\x07\x12\x07pytorch\xbe")
    result = CliRunner().invoke(app, ["tune", str(model), "--budget", "4"])
    assert result.exit_code == 2 and "is an ONNX model" in result.output
    assert f"tilesearch model tune {model}" in result.output


def test_tune_refuses_a_spec_for_a_profile_that_is_not_a_cpu(tmp_path):
    """A tuning spec is an IREE llvm-cpu config: `tune --hardware gpu-h100 --spec-out` wrote one."""
    module, spec = tmp_path / "mm.mlir", tmp_path / "spec.mlir"
    module.write_text(MATMUL_1024)
    result = CliRunner().invoke(app, ["tune", str(module), "--hardware", "gpu-h100", "--budget", "4",
                                      "--spec-out", str(spec)])
    assert result.exit_code == 2 and "gpu-h100 is not a CPU profile" in result.output
    assert not spec.exists()
    plan_only = CliRunner().invoke(app, ["tune", str(module), "--hardware", "gpu-h100", "--budget", "4", "--json"])
    assert plan_only.exit_code == 0 and json.loads(plan_only.output)["plan"]["groups"]


def test_a_plan_iree_cannot_take_as_a_config_is_never_the_answer(tmp_path):
    """A prime-sized matmul, where IREE's own register tile is 1x1 and the super-tiling baseline's
    one memory level was predicted 17x faster: given to IREE, its zero vector tiles made a
    97x26x103 tile one vector, and iree-compile refused the spec (a new user's trial). On a CPU
    the baseline is a yardstick, not an answer; the answer's spec compiles."""
    from service.measure.lowering import leaves_no_vector_tile
    from service.measure.whole_model import compile_model
    from service.search.space import ShapeContext
    from service.search.strategies import supertiling_plan
    from service.tiling.worker import iree_configs

    module = tmp_path / "prime.mlir"
    module.write_text(matmul_module("kn", m=97, n=101, k=103))
    graph = analyze(module.read_text()).graph
    baseline, _ = supertiling_plan(graph, get_profile("host-cpu"), ShapeContext(hints={}))
    assert leaves_no_vector_tile(graph, baseline)  # what made the broken spec
    result = guard.tune_from_iree_default(module.read_text(), get_profile("host-cpu"), budget=64, seed=0, workers=0)
    assert result.baseline["latency_s"] < result.predicted["latency_s"]  # the model still prices it fastest
    answer = Plan.model_validate(result.plan)
    assert not leaves_no_vector_tile(graph, answer)
    spec = iree_configs(graph, answer, get_profile("host-cpu"))["tuning_spec"]
    if spec is not None:  # a tiled answer: IREE compiles the module with it
        (tmp_path / "spec.mlir").write_text(spec)
        compile_model(module, tmp_path / "m.vmfb", tmp_path / "configs", spec=tmp_path / "spec.mlir")


MMT4D = """
func.func @main(%a: tensor<8x32x8x1xf32>, %b: tensor<16x32x16x1xf32>, %c: tensor<8x16x8x16xf32>) -> tensor<8x16x8x16xf32> {
  %r = linalg.mmt4d ins(%a, %b : tensor<8x32x8x1xf32>, tensor<16x32x16x1xf32>) outs(%c : tensor<8x16x8x16xf32>) -> tensor<8x16x8x16xf32>
  return %r : tensor<8x16x8x16xf32>
}"""


def test_irees_data_tiled_matmul_keeps_irees_own_pipeline(tmp_path):
    """linalg.mmt4d is lowered by IREE's Mmt4dTilingExpert over whole inner tiles: a
    DoubleTilingExpert config from a plan that tiles them ran 3x slower (a new user's trial).
    No spec, no forced measurement, and the reason says so."""
    from service.measure.forcing import NotMeasurable, force_plan
    from service.measure.tuning_spec import spec_for_plan, why_no_spec

    graph = analyze(MMT4D).graph
    (root,) = [op for op in graph.ops.values() if op.kind == "contraction"]
    plan = Plan.model_validate({"groups": [{"anchor": root.uid, "fuse": [], "levels": [
        {"loop": "forall", "tile_sizes": [4, 4, 0, 0, 0, 0]}, {"loop": "for", "tile_sizes": [1, 8, 0, 1, 0, 0]}]}]})
    assert spec_for_plan(graph, plan) is None and "Mmt4dTilingExpert" in why_no_spec(graph, plan)
    with pytest.raises(NotMeasurable, match="data-tiled matmul"):
        force_plan(MMT4D, plan.model_dump())
    module, spec = tmp_path / "mmt4d.mlir", tmp_path / "spec.mlir"
    module.write_text(MMT4D)
    result = CliRunner().invoke(app, ["tune", str(module), "--budget", "16", "--spec-out", str(spec)])
    assert result.exit_code == 0, result.output
    assert not spec.exists() and "no tuning spec written" in result.output and "linalg.mmt4d" in result.output


def test_tune_writes_no_spec_that_iree_would_not_apply(tmp_path):
    """`tune --spec-out` proves its spec as `model tune` does: IREE configures the module with it.
    A spec whose matcher matches nothing once IREE collapsed the op's dims was written silently,
    and only `model bench` found it changed nothing (a new user's trial)."""
    module, spec = tmp_path / "three_k.mlir", tmp_path / "spec.mlir"
    module.write_text(THREE_REDUCTION_DIMS)
    with tuning_every_dispatch():
        result = CliRunner().invoke(app, ["tune", str(module), "--budget", "32", "--spec-out", str(spec)])
    assert result.exit_code == 0, result.output
    assert not spec.exists() and "its matcher matches nothing as IREE forms the op" in result.output
    plain = tmp_path / "mm.mlir"
    plain.write_text(matmul_module("kn", m=64, n=256, k=512))
    with tuning_every_dispatch():
        written = CliRunner().invoke(app, ["tune", str(plain), "--budget", "32", "--spec-out", str(spec)])
    assert written.exit_code == 0 and spec.exists(), written.output
