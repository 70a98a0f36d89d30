"""Measurement harness: plan levels -> IREE CPU config (pure), and real iree-compile runs."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from service.cli import app
from service.ir.graph import describe_op
from service.ir.mlir import context, ir
from service.measure import cache
from service.measure.forcing import NotMeasurable, find_anchor, force_plan
from service.measure.lowering import (
    LoweringConfig,
    compilation_info_text,
    lowering_config_from_levels,
    lowering_config_of,
    lowering_config_text,
    vector_tile_elements,
)
from service.measure.timing import BenchSettings, measure_plan, measure_plan_and_default
from service.measure.tools import chosen_lowering_configs, chosen_translation_infos, compile_module, host_translation_info

from _shared import TINY_MATMUL, WORKLOADS, nchw_conv_module

MATMUL_ITERS = ["parallel", "parallel", "reduction"]


FAST = BenchSettings(repetitions=3, min_time_s=0.02, compile_timeout_s=120, bench_timeout_s=60)


def matmul_plan(dist, vec, red, anchor=1):
    """A one-group plan on the matmul (uid 1: the fill is 0) with three levels."""
    return {
        "groups": [
            {
                "anchor": anchor,
                "fuse": [],
                "levels": [
                    {"tile_sizes": dist, "loop": "forall"},
                    {"tile_sizes": vec, "loop": "for"},
                    {"tile_sizes": red, "loop": "for"},
                ],
            }
        ]
    }


# ---- pure mapping ---------------------------------------------------------------------------


def test_levels_map_onto_iree_levels_by_iterator_type():
    levels = [{"tile_sizes": [256, 256, 64]}, {"tile_sizes": [8, 32, 16]}, {"tile_sizes": [4, 4, 16]}]
    config = lowering_config_from_levels(levels, MATMUL_ITERS)
    assert config.distribution == [256, 256, 0]  # IREE distributes parallel dims only
    assert config.vector_common_parallel == [8, 32, 0]  # reduction entry forced to 0
    assert config.vector_reduction == [0, 0, 16]  # only the reduction entry kept


def test_missing_levels_are_untiled_and_bad_levels_are_rejected():
    config = lowering_config_from_levels([{"tile_sizes": [64, 64, 0]}], MATMUL_ITERS)
    assert config.vector_common_parallel == [0, 0, 0] and config.vector_reduction == [0, 0, 0]
    with pytest.raises(ValueError, match="3 tile sizes|has 2 tile sizes"):
        lowering_config_from_levels([{"tile_sizes": [64, 64]}], MATMUL_ITERS)
    with pytest.raises(ValueError, match="3 tiling levels"):
        lowering_config_from_levels([{"tile_sizes": [1, 1, 1]}] * 4, MATMUL_ITERS)


def test_attribute_text_is_the_documented_one_and_parses_with_real_mlir():
    config = LoweringConfig(distribution=[256, 256, 0], vector_common_parallel=[8, 32, 0],
                            vector_reduction=[0, 0, 16])
    text = compilation_info_text(config)
    assert text == (
        "#iree_codegen.compilation_info<lowering_config = #iree_cpu.lowering_config<"
        "distribution = [256, 256, 0], vector_common_parallel = [8, 32, 0], "
        "vector_reduction = [0, 0, 16]>, translation_info = #iree_codegen.translation_info<"
        "pipeline = #iree_cpu.pipeline<DoubleTilingExpert>>>"
    )
    with context():
        attr = ir.Attribute.parse(text)
    assert "vector_reduction = [0, 0, 16]" in str(attr)
    assert vector_tile_elements(config) == 8 * 32 * 16


def test_a_config_iree_printed_is_read_back_with_the_mlir_parser():
    printed = ("#iree_cpu.lowering_config<distribution = [32, 0], vector_common_parallel = [8, 0], "
               "vector_reduction = [0, 16]>")
    assert lowering_config_of(printed, anchor="chosen by IREE") == LoweringConfig(
        distribution=[32, 0], vector_common_parallel=[8, 0], vector_reduction=[0, 16], anchor="chosen by IREE")
    assert lowering_config_of("#iree_cpu.lowering_config<vector_common_parallel = [8, 16]>") is None  # a fill's
    config = LoweringConfig(distribution=[256, 256, 0], vector_common_parallel=[8, 32, 0], vector_reduction=[0, 0, 16])
    assert lowering_config_of(lowering_config_text(config)) == config
    with pytest.raises(ValueError, match="not an #iree_cpu.lowering_config"):
        lowering_config_of("#iree_codegen.translation_info<pipeline = #iree_cpu.pipeline<DoubleTilingExpert>>")


def test_force_plan_sets_the_attribute_on_the_anchor_only():
    forced = force_plan(TINY_MATMUL, matmul_plan([32, 32, 0], [8, 16, 0], [0, 0, 16]))
    assert forced.function == "mm"
    assert "ts.uid" not in forced.text  # the IR core's tags do not reach iree-compile
    assert [a.shape for a in forced.arguments] == [(64, 64), (64, 64)]
    with context():
        module = ir.Module.parse(forced.text)
        matmul = find_anchor(module, ("linalg.matmul", 0))
        fill = find_anchor(module, ("linalg.fill", 0))
        assert "compilation_info" in matmul.attributes
        assert "compilation_info" not in fill.attributes
        assert describe_op(matmul, uid=-1).iterator_types == MATMUL_ITERS


def test_iterator_types_of_a_convolution():
    with context():
        module = ir.Module.parse((WORKLOADS / "conv_relu.mlir").read_text())
        conv = find_anchor(module, ("linalg.conv_2d_nhwc_hwcf", 0))
        # n, oh, ow, f parallel; kh, kw, c reduction
        assert describe_op(conv, uid=-1).iterator_types == ["parallel"] * 4 + ["reduction"] * 3


def test_forcing_a_plan_configures_its_contraction_and_leaves_other_anchors_to_iree():
    # mlp_chain's searched plan may tile the bias broadcast as a group of its own; IREE takes
    # tile sizes on the dispatch's root contraction only, so that group is not forced.
    text = (WORKLOADS / "mlp_chain.mlir").read_text()
    levels = [{"tile_sizes": [0, 256], "loop": "forall"}]
    plan = {"groups": [{"anchor": ("linalg.matmul", 0), "fuse": [],
                        "levels": [{"tile_sizes": [64, 128, 0]}, {"tile_sizes": [8, 16, 0]}, {"tile_sizes": [0, 0, 2]}]},
                       {"anchor": ("linalg.broadcast", 0), "fuse": [], "levels": levels}]}
    forced = force_plan(text, plan)
    assert len(forced.configs) == 1
    with context():
        module = ir.Module.parse(forced.text)
        assert "compilation_info" in find_anchor(module, ("linalg.matmul", 0)).attributes
        assert "compilation_info" not in find_anchor(module, ("linalg.broadcast", 0)).attributes
    with pytest.raises(NotMeasurable, match="no group of the plan anchors a contraction"):
        force_plan(text, {"groups": [plan["groups"][1]]})


def test_a_convolution_without_a_batch_dim_is_refused_not_faked():
    text = (WORKLOADS / "conv_relu.mlir").read_text()
    plan = {"groups": [{"anchor": ("linalg.conv_2d_nhwc_hwcf", 0), "fuse": [],
                        "levels": [{"tile_sizes": [1, 8, 8, 32, 0, 0, 0]}]}]}
    with pytest.raises(NotMeasurable, match="without a batch dim"):
        measure_plan(text, plan, settings=FAST)


@pytest.mark.slow
def test_a_batched_convolution_is_measured_under_its_forced_config():
    """IREE keeps a config forced on a batched convolution, with its convolution pipeline: the
    measurement is the plan's (the config IREE dumped is the forced one), not IREE's default."""
    levels = [[1, 16, 4, 8, 0, 0, 0], [1, 8, 1, 8, 0, 0, 0], [0, 0, 0, 0, 4, 1, 1]]
    plan = {"groups": [{"anchor": ("linalg.conv_2d_nchw_fchw", 0), "fuse": [],
                        "levels": [{"tile_sizes": t} for t in levels]}]}
    text = nchw_conv_module(2, c_in=16, c_out=32, size=16)
    assert "ConvTileAndDecomposeExpert" in force_plan(text, plan).text
    m = measure_plan(text, plan, settings=FAST)
    assert m.ok, m.error
    (config,) = m.config
    assert [config.distribution, config.vector_common_parallel, config.vector_reduction] == levels


@pytest.mark.parametrize("batch, kept", [(1, False), (2, True)])
def test_iree_drops_a_config_forced_on_a_convolution_only_without_its_unit_batch(tmp_path, batch, kept):
    """What convolution_not_configured tells users, checked against this IREE: a batch-1
    convolution loses its forced config; a batched one keeps it."""
    config = LoweringConfig(distribution=[0, 16, 4, 16, 0, 0, 0], vector_common_parallel=[1, 4, 1, 16, 0, 0, 0],
                            vector_reduction=[0, 0, 0, 0, 4, 1, 1])
    translation = "#iree_codegen.translation_info<pipeline = #iree_cpu.pipeline<ConvTileAndDecomposeExpert>>"
    (tmp_path / "conv.mlir").write_text(nchw_conv_module(batch, compilation_info=compilation_info_text(config, translation)))
    compile_module(tmp_path / "conv.mlir", tmp_path / "conv.vmfb", tmp_path / "configs", timeout_s=120)
    chosen = [lowering_config_of(c) for c in chosen_lowering_configs(tmp_path / "configs")]
    assert (config.model_copy(update={"anchor": None}) in chosen) is kept, chosen


def test_a_dynamic_dim_is_sized_by_its_shape_hint_or_refused():
    text = (WORKLOADS / "dynamic_matmul.mlir").read_text()
    plan = matmul_plan([64, 64, 0], [8, 32, 0], [0, 0, 4])
    with pytest.raises(NotMeasurable, match="dynamic dims"):
        force_plan(text, plan)
    forced = force_plan(text, plan, shape_hints={"arg0": [256, 1024]})
    assert [a.shape for a in forced.arguments] == [(256, 1024), (1024, 1024)]
    assert "tensor<?x1024xf32>" in forced.text  # the module stays dynamic; only the inputs are sized
    with pytest.raises(ValueError, match="does not fit"):
        force_plan(text, plan, shape_hints={"arg0": [256, 512]})


# ---- real iree-compile + iree-benchmark-module ---------------------------------------------


@pytest.mark.slow
def test_tiny_matmul_forced_and_default_are_measured():
    result = measure_plan_and_default(
        TINY_MATMUL, matmul_plan([32, 32, 0], [8, 16, 0], [0, 0, 16]), settings=FAST
    )
    for m in (result.forced, result.default):
        assert m.ok, m.error
        assert len(m.samples_s) == FAST.repetitions
        assert 0 < m.median_s < 0.1
        assert m.iree_version.startswith("iree-base-compiler==")
    assert result.forced.config[0].distribution == [32, 32, 0]
    # The default reports what IREE chose for the matmul (it has all three levels).
    assert result.default.config and result.default.config[0].distribution[2] == 0


@pytest.mark.slow
def test_an_f64_matmul_is_measured_as_iree_compiles_it_and_a_complex_one_is_refused():
    """IREE demotes f64 to f32, so its function takes f32 inputs (a new user's trial had every
    f64 candidate fail on an input type mismatch); complex inputs cannot be given on its command
    line at all."""
    f64 = TINY_MATMUL.replace("f32", "f64")
    m = measure_plan(f64, matmul_plan([32, 32, 0], [8, 16, 0], [0, 0, 16]), settings=FAST)
    assert m.ok, m.error
    complex_mm = """
func.func @c(%a: tensor<16x16xcomplex<f32>>, %b: tensor<16x16xcomplex<f32>>, %o: tensor<16x16xcomplex<f32>>) -> tensor<16x16xcomplex<f32>> {
  %r = linalg.matmul ins(%a, %b : tensor<16x16xcomplex<f32>>, tensor<16x16xcomplex<f32>>) outs(%o : tensor<16x16xcomplex<f32>>) -> tensor<16x16xcomplex<f32>>
  return %r : tensor<16x16xcomplex<f32>>
}"""
    with pytest.raises(NotMeasurable, match="complex"):
        measure_plan(complex_mm, matmul_plan([16, 16, 0], [8, 16, 0], [0, 0, 16], anchor=0), settings=FAST)


def test_inputs_too_large_to_measure_are_refused_before_any_is_written(tmp_path):
    """A 10^9 x 10^9 matmul with measure_top was a MemoryError (6.9 EiB of inputs) reported as
    a tilesearch bug (a new user's trial)."""
    from service.measure.forcing import MAX_INPUT_BYTES, ArgumentSpec, write_inputs

    with pytest.raises(NotMeasurable, match="GiB"):
        write_inputs([ArgumentSpec((10**9, 10**9), "f32")] * 2, tmp_path)
    over = MAX_INPUT_BYTES // 4 + 1  # one f32 element past the limit
    with pytest.raises(NotMeasurable, match="GiB"):
        write_inputs([ArgumentSpec((over,), "f32")], tmp_path)
    assert not list(tmp_path.iterdir())
    assert len(write_inputs([ArgumentSpec((2, 2), "f32")], tmp_path)) == 1


def test_force_plan_sets_the_translation_info_it_is_given():
    options = "#iree_codegen.translation_info<pipeline = #iree_cpu.pipeline<DoubleTilingExpert>, {enable_loop_peeling}>"
    forced = force_plan(TINY_MATMUL, matmul_plan([32, 32, 0], [8, 16, 0], [0, 0, 16]), translation_info=options)
    with context():
        matmul = find_anchor(ir.Module.parse(forced.text), ("linalg.matmul", 0))
        assert "{enable_loop_peeling}" in str(matmul.attributes["compilation_info"])


@pytest.mark.slow
def test_a_forced_plan_uses_the_translation_info_of_irees_default_on_this_host(tmp_path):
    """Only the tile sizes may differ from IREE's default: on an AVX2 host IREE peels remainder
    iterations (enable_loop_peeling), and a forced config without it compiles masked vectors,
    far slower than the default at the default's own tile sizes (docs/benchmarks.md)."""
    result = measure_plan_and_default(TINY_MATMUL, matmul_plan([32, 32, 0], [8, 8, 0], [0, 0, 8]), settings=FAST,
                                      keep_dir=tmp_path)
    assert result.forced.ok and result.default.ok, (result.forced.error, result.default.error)
    default = chosen_translation_infos(tmp_path / "default_configs")
    assert default and set(chosen_translation_infos(tmp_path / "forced0_configs")) == {host_translation_info()} == {default[0]}


@pytest.mark.slow
def test_a_dynamic_module_is_measured_at_its_hinted_shape():
    text = (WORKLOADS / "dynamic_matmul.mlir").read_text()
    result = measure_plan_and_default(text, matmul_plan([32, 64, 0], [8, 32, 0], [0, 0, 4]), settings=FAST,
                                      shape_hints={"arg0": [64, 1024]})
    assert result.forced.ok and result.default.ok, (result.forced.error, result.default.error)
    assert result.forced.config[0].distribution == [32, 64, 0]


@pytest.mark.slow
def test_large_vector_tile_is_a_recorded_failure():
    # 16 x 64 x 16 = 16384 f32 elements >= 8192: IREE 3.13 refuses "large vector sizes".
    m = measure_plan(TINY_MATMUL, matmul_plan([64, 64, 0], [16, 64, 0], [0, 0, 16]), settings=FAST)
    assert not m.ok
    assert m.median_s is None
    assert "large vector sizes" in m.error


@pytest.mark.slow
def test_cli_measure_prints_forced_and_default_medians(tmp_path):
    module = tmp_path / "mm.mlir"
    module.write_text(TINY_MATMUL)
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(matmul_plan([32, 32, 0], [8, 16, 0], [0, 0, 16])))
    args = ["measure", str(module), "--plan", str(plan), "--repetitions", "2", "--min-time", "0.02"]
    result = CliRunner().invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    assert payload["forced"]["ok"] and payload["default"]["ok"]
    assert payload["speedup_over_default"] > 0


# ---- the measurement cache ------------------------------------------------------------------


def test_a_cached_measurement_of_a_forced_plan_is_keyed_by_the_translation_info(monkeypatch):
    """A forced plan's timing depends on the pipeline options it is compiled with (peeling or
    masking): a cache filled under other options must not answer."""
    plan = matmul_plan([32, 32, 0], [8, 16, 0], [0, 0, 16])
    monkeypatch.setattr(cache, "host_translation_info", lambda: "masking")
    masked, default = cache.measurement_key(TINY_MATMUL, plan, FAST), cache.measurement_key(TINY_MATMUL, None, FAST)
    monkeypatch.setattr(cache, "host_translation_info", lambda: "peeling")
    assert cache.measurement_key(TINY_MATMUL, plan, FAST) != masked
    assert cache.measurement_key(TINY_MATMUL, None, FAST) == default


def test_iree_tools_run_as_the_wheels_native_binaries_not_their_python_launchers():
    """The console scripts start Python to run the binary (0.24 CPU seconds a call); every tool
    call goes to the binary itself, and the one tool that is Python (the ONNX importer) to its script."""
    from pathlib import Path

    from service.measure.tools import run_tool, tool_path

    for name in ("iree-compile", "iree-opt", "iree-benchmark-module", "iree-run-module", "iree-profile"):
        with open(tool_path(name), "rb") as binary:
            assert binary.read(4) == b"\x7fELF", (name, tool_path(name))
    assert Path(tool_path("iree-import-onnx")).read_text().startswith("#!")
    assert "IREE compiler version" in run_tool("iree-compile", ["--version"], 30)
