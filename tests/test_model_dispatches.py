"""A whole model's dispatches as IREE forms them (real iree-compile), and the spec's pieces."""

from pathlib import Path

import numpy as np
import pytest

from _shared import SHARED, nchw_1x1_module, tuning_every_dispatch

from service.ir.analysis import analyze
from service.ir.dispatch import dispatches_of
from service.ir.errors import NotAModelError
from service.measure.tuning_spec import ContractionDims, ContractionMatcher, contraction_dims, tuning_spec
from service.measure.tools import ToolFailure
from service.measure.cache import host_key
from service.measure import whole_model
from service.measure.whole_model import (ELIDED_CONSTANT_ELEMENTS, entry_function, executable_sources, input_program,
                                         model_arguments)

MODELS = SHARED / "models"

RELU = """linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0, d1)>],
      iterator_types = ["parallel", "parallel"]} ins(%IN : tensor<16x64xf32>) outs(%e : tensor<16x64xf32>) {
  ^bb0(%in: f32, %out: f32):
    %m = arith.maximumf %in, %zero : f32
    linalg.yield %m : f32
  } -> tensor<16x64xf32>"""

# Two identical layers (matmul + relu): IREE forms one dispatch and runs it twice.
REPEATED_LAYER = f"""
func.func @main(%x: tensor<16x64xf32>, %w1: tensor<64x64xf32>, %w2: tensor<64x64xf32>) -> tensor<16x64xf32> {{
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<16x64xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<16x64xf32>) -> tensor<16x64xf32>
  %a = linalg.matmul ins(%x, %w1 : tensor<16x64xf32>, tensor<64x64xf32>) outs(%f : tensor<16x64xf32>) -> tensor<16x64xf32>
  %r = {RELU.replace('%IN', '%a')}
  %b = linalg.matmul ins(%r, %w2 : tensor<16x64xf32>, tensor<64x64xf32>) outs(%f : tensor<16x64xf32>) -> tensor<16x64xf32>
  %s = {RELU.replace('%IN', '%b')}
  return %s : tensor<16x64xf32>
}}"""

DYNAMIC = """
func.func @main(%x: tensor<?x64xf32>, %w: tensor<64x64xf32>) -> tensor<?x64xf32> {
  %zero = arith.constant 0.0 : f32
  %c0 = arith.constant 0 : index
  %d = tensor.dim %x, %c0 : tensor<?x64xf32>
  %e = tensor.empty(%d) : tensor<?x64xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<?x64xf32>) -> tensor<?x64xf32>
  %a = linalg.matmul ins(%x, %w : tensor<?x64xf32>, tensor<64x64xf32>) outs(%f : tensor<?x64xf32>) -> tensor<?x64xf32>
  return %a : tensor<?x64xf32>
}"""

MATMUL_MAPS = ("affine_map<(d0, d1, d2) -> (d0, d2)>", "affine_map<(d0, d1, d2) -> (d2, d1)>",
               "affine_map<(d0, d1, d2) -> (d0, d1)>")


def _dispatches(tmp_path: Path, text: str):
    model = tmp_path / "model.mlir"
    model.write_text(text)
    return dispatches_of(executable_sources(model, tmp_path / "sources.mlir"))


@pytest.mark.slow
def test_a_repeated_layer_is_one_dispatch_run_twice(tmp_path):
    (d,) = _dispatches(tmp_path, REPEATED_LAYER)
    assert d.weight == 2 and d.reason is None
    graph = analyze(d.module).graph
    assert sorted(op.kind for op in graph.ops.values()) == ["contraction", "elementwise", "fill"]
    assert "iree_tensor_ext" not in d.module and "hal." not in d.module


# A recurrent step: the matmul reads the loop's carried state, so it runs once a trip.
RECURRENT = """
func.func @main(%h0: tensor<1x256xf32>, %w: tensor<256x256xf32>) -> tensor<1x256xf32> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c12 = arith.constant 12 : index
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<1x256xf32>
  %h = scf.for %i = %c0 to %c12 step %c1 iter_args(%s = %h0) -> tensor<1x256xf32> {
    %f = linalg.fill ins(%z : f32) outs(%e : tensor<1x256xf32>) -> tensor<1x256xf32>
    %m = linalg.matmul ins(%s, %w : tensor<1x256xf32>, tensor<256x256xf32>) outs(%f : tensor<1x256xf32>) -> tensor<1x256xf32>
    scf.yield %m : tensor<1x256xf32>
  }
  return %h : tensor<1x256xf32>
}"""


@pytest.mark.slow
def test_a_dispatch_in_a_loop_weighs_its_trips(tmp_path):
    """IREE's host program lowers a model's loops to branches, where a GRU's per-step matmuls
    counted once (a new user's trial): the flow-level program of the same compile gives the trips."""
    model = tmp_path / "model.mlir"
    model.write_text(RECURRENT)
    sources = executable_sources(model, tmp_path / "sources.mlir", flow_out=tmp_path / "flow.mlir")
    (alone,) = dispatches_of(sources)
    assert alone.weight == 1  # one dispatch site
    (looped,) = dispatches_of(sources, (tmp_path / "flow.mlir").read_text())
    assert looped.weight == 12 and looped.entry == alone.entry and looped.reason is None
    assert not list(tmp_path.glob("*.phases"))  # IREE's other phases are not left behind
    # and a model's tuning weighs it so (its budget share, its summed prediction per model run)
    from service.hardware.profiles import get_profile
    from service.model_tuning import tune_model
    report = tune_model(model, get_profile("host-cpu"), tmp_path / "spec.mlir", budget=16, verify=False)
    assert [d.weight for d in report.dispatches] == [12]


@pytest.mark.slow
def test_a_shared_model_gives_every_dispatch_as_a_module_of_its_own(tmp_path):
    dispatches = dispatches_of(executable_sources(MODELS / "gpt2_block_s64.linalg.mlir", tmp_path / "s.mlir"))
    assert len(dispatches) == 14
    assert sum(d.weight for d in dispatches) == 17  # two LayerNorms and a head split run twice
    for d in dispatches:
        assert d.reason is None, d
        analyze(d.module)
    qkv = next(d for d in dispatches if d.entry.endswith("matmul_64x2304x768_f32"))
    (contraction,) = [op for op in analyze(qkv.module).graph.ops.values() if op.kind == "contraction"]
    assert contraction.loop_ranges == [64, 2304, 768]


@pytest.mark.slow
def test_a_dynamic_dispatch_says_why_it_is_not_searched(tmp_path):
    (d,) = _dispatches(tmp_path, DYNAMIC)
    assert d.reason is not None and d.reason.startswith("dynamic") and d.dynamic
    assert "--shape-hint" in d.reason  # what to give `model tune`


@pytest.mark.slow
def test_a_load_that_steps_over_elements_stays_a_strided_slice_of_the_whole_tensor(tmp_path):
    """The search must see that the projection's input is not contiguous (the cost model gathers
    its vectors, cost/registers.py): the dispatch reads the whole input through a stride-2 slice,
    not a dense 64x8x8 argument."""
    (d,) = _dispatches(tmp_path, nchw_1x1_module(64, 128, 16, stride=2))
    assert d.reason is None and "matmul_like" in d.entry
    graph = analyze(d.module).graph
    (projection,) = [op for op in graph.ops.values() if op.kind == "contraction"]
    x = next(i for i, shape in enumerate(projection.operand_shapes[:projection.num_inputs]) if shape == [64, 8, 8])
    assert projection.operand_steps[x] == 2
    assert "tensor<64x16x16xf32>" in d.module and "[1, 2, 2]" in d.module


def _with_weight(rows: int, cols: int, bias: int = 0, resource: bool = False) -> str:
    """A model whose weight is a constant in the IR, not an argument: inline (as ONNX
    initializers import) or, with `resource`, a resource blob (as iree-turbine exports); random
    values, so MLIR cannot fold it to a splat. `bias`: a constant of that many elements added to
    the product (IREE inlines one this small into the dispatch)."""
    weight = np.random.default_rng(0).standard_normal((rows, cols), dtype=np.float32)
    data = weight.tobytes().hex().upper()
    value = "dense_resource<w>" if resource else f'dense<"0x{data}">'
    # A blob starts with its alignment (4 bytes, little endian).
    resources = f'{{-# dialect_resources: {{ builtin: {{ w: "0x04000000{data}" }} }} #-}}' if resource else ""
    add = ""
    result = "%a"
    if bias:
        values = ", ".join(f"{v:.3f}" for v in np.random.default_rng(1).standard_normal(bias))
        add = f"""
  %b = arith.constant dense<[{values}]> : tensor<{bias}xf32>
  %s = linalg.generic {{indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d1)>,
                                         affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]}}
      ins(%a, %b : tensor<16x{cols}xf32>, tensor<{bias}xf32>) outs(%e : tensor<16x{cols}xf32>) {{
    ^bb0(%p: f32, %q: f32, %o: f32):
      %r = arith.addf %p, %q : f32
      linalg.yield %r : f32
  }} -> tensor<16x{cols}xf32>"""
        result = "%s"
    return f"""
func.func @main(%x: tensor<16x{rows}xf32>) -> tensor<16x{cols}xf32> {{
  %zero = arith.constant 0.0 : f32
  %w = arith.constant {value} : tensor<{rows}x{cols}xf32>
  %e = tensor.empty() : tensor<16x{cols}xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<16x{cols}xf32>) -> tensor<16x{cols}xf32>
  %a = linalg.matmul ins(%x, %w : tensor<16x{rows}xf32>, tensor<{rows}x{cols}xf32>) outs(%f : tensor<16x{cols}xf32>) -> tensor<16x{cols}xf32>{add}
  return {result} : tensor<16x{cols}xf32>
}}
{resources}"""


@pytest.mark.slow
@pytest.mark.parametrize("resource", [False, True], ids=["inline", "resource"])
def test_a_models_weights_are_not_read_back_with_its_structure(tmp_path, resource):
    """A weight held in the model (256x512: 512 KiB, 1 MiB as hex) is left out of the IR read
    back for its dispatches and its arguments: reading real models' weights with MLIR's Python
    bindings took minutes and tens of GB."""
    model = tmp_path / "model.mlir"
    model.write_text(_with_weight(256, 512, resource=resource))
    assert 256 * 512 > ELIDED_CONSTANT_ELEMENTS
    sources = executable_sources(model, tmp_path / "sources.mlir")
    assert len(sources) < 100_000
    (d,) = dispatches_of(sources)
    assert d.reason is None and "matmul_16x512x256" in d.entry
    program = input_program(model, tmp_path / "input.mlir")
    assert len(program) < 100_000
    assert [a.shape for a in model_arguments(program)] == [(16, 256)]


@pytest.mark.slow
def test_a_dispatch_holding_a_constant_elided_from_it_is_left_to_iree(tmp_path, monkeypatch):
    """IREE inlines a small constant (the bias) into the dispatch; were it elided too, the
    dispatch could not be compiled on its own: it is reported, not searched."""
    monkeypatch.setattr(whole_model, "_STRUCTURE_ONLY", ("--mlir-elide-elementsattrs-if-larger=4",))
    model = tmp_path / "model.mlir"
    model.write_text(_with_weight(64, 16, bias=16))
    (d,) = dispatches_of(executable_sources(model, tmp_path / "sources.mlir"))
    assert d.reason is not None and "elided" in d.reason
    monkeypatch.undo()
    (d,) = dispatches_of(executable_sources(model, tmp_path / "sources.mlir"))
    assert d.reason is None


def test_text_that_is_not_a_model_is_refused():
    with pytest.raises(NotAModelError, match="executable-sources"):
        dispatches_of("func.func @f() { return }")


@pytest.mark.slow
def test_model_arguments_read_through_ireees_abi(tmp_path):
    text = input_program(MODELS / "mlp_512_2048_b16.torch.mlir", tmp_path / "input.mlir")
    shapes = [a.shape for a in model_arguments(text)]
    assert shapes == [(16, 512), (2048, 512), (2048,), (512, 2048), (512,)]


def test_a_model_runs_by_its_one_public_function_whatever_its_name():
    hand_written = "util.func public @mlp2(%x: tensor<4xf32>) -> tensor<4xf32> { util.return %x : tensor<4xf32> }"
    assert entry_function(hand_written) == "mlp2"
    with_helper = ("func.func private @helper() { return }\n"
                   "func.func @forward(%x: tensor<4xf32>) -> tensor<4xf32> { return %x : tensor<4xf32> }")
    assert entry_function(with_helper) == "forward"
    two = "func.func @a() { return }\nfunc.func @b() { return }"
    with pytest.raises(ToolFailure, match=r"2 public functions \(@a, @b\): name the one to run \(--function\)"):
        entry_function(two)
    assert entry_function(two + "\nfunc.func @main() { return }") == "main"


@pytest.mark.parametrize("maps, expected", [
    (MATMUL_MAPS, ContractionDims((), (0,), (1,), (2,))),
    (("(d0, d1, d2) -> (d0, d2)", "(d0, d1, d2) -> (d1, d2)", "(d0, d1, d2) -> (d0, d1)"), ContractionDims((), (0,), (1,), (2,))),
    (("(d0, d1, d2, d3) -> (d0, d1, d3)", "(d0, d1, d2, d3) -> (d0, d3, d2)", "(d0, d1, d2, d3) -> (d0, d1, d2)"),
     ContractionDims((0,), (1,), (2,), (3,))),
])
def test_contraction_dims_as_iree_infers_them(maps, expected):
    assert contraction_dims(list(maps), len(expected.batch + expected.m + expected.n + expected.k)) == expected


CONFIG = ("#iree_codegen.compilation_info<lowering_config = #iree_cpu.lowering_config<distribution = [16, 64, 0], "
          "vector_common_parallel = [8, 32, 0], vector_reduction = [0, 0, 16]>, translation_info = "
          "#iree_codegen.translation_info<pipeline = #iree_cpu.pipeline<DoubleTilingExpert>>>")


def _matcher(name: str, m: int) -> ContractionMatcher:
    return ContractionMatcher(name, "f32", "f32", "f32", MATMUL_MAPS, ContractionDims((), (m,), (64,), (64,)), CONFIG)


def test_a_spec_has_one_matcher_per_root_and_parses():
    spec = tuning_spec([_matcher("a", 16), _matcher("b", 32)])
    assert spec.count("transform.iree.match.contraction") == 2
    assert "@match_a -> @apply_op_config" in spec and "@match_b -> @apply_op_config" in spec
    assert "iree_codegen.tuning_spec_entrypoint" in spec
    assert "transform.iree.match.dims_equal %m_dims, [32]" in spec
    # It says how to build with it: single-threaded, or IREE 3.13 can deadlock on a model.
    first, second = spec.splitlines()[:2]
    assert first.startswith("// iree-compile") and "--iree-codegen-tuning-spec-path=" in first
    assert "--mlir-disable-threading" in first
    # ... for the CPU it was tuned on: the configs assume that target (a new user's trial).
    assert "--iree-llvmcpu-target-cpu=host" in first and second.startswith(f"// tuned on {host_key()}; ")
    assert "iree-import-onnx MODEL.onnx -o MODEL.mlir" in second  # the command takes MLIR (a new user's trial)


# IREE demotes f64 to f32 by default: a matcher naming f64 never matched (a new user's trial).
F64_MATMUL = """
func.func @d(%a: tensor<64x64xf64>, %b: tensor<64x64xf64>, %o: tensor<64x64xf64>) -> tensor<64x64xf64> {
  %r = linalg.matmul ins(%a, %b : tensor<64x64xf64>, tensor<64x64xf64>) outs(%o : tensor<64x64xf64>) -> tensor<64x64xf64>
  return %r : tensor<64x64xf64>
}"""


@pytest.mark.slow
@pytest.mark.parametrize("text", [REPEATED_LAYER, F64_MATMUL], ids=["f32", "f64"])
def test_the_spec_of_one_decision_is_applied_by_iree(tmp_path, text):
    from typer.testing import CliRunner

    from service.cli import app
    from service.measure.whole_model import compile_model, dispatch_configs

    module = tmp_path / "mm.mlir"
    module.write_text(text)
    spec = tmp_path / "spec.mlir"
    with tuning_every_dispatch():  # a spec to check, whether or not the guard would keep IREE's default
        result = CliRunner().invoke(app, ["tune", str(module), "--budget", "12", "--workers", "1", "--spec-out", str(spec)])
    assert result.exit_code == 0, result.output
    assert "chosen by prediction, not measured; `--measure-top 3`" in result.output  # a new user's trial
    compile_model(module, tmp_path / "m.vmfb", tmp_path / "configs", spec=spec)
    (configured,) = dispatch_configs(tmp_path / "configs").values()
    matmul_config = next(c for name, c in configured.ops if name == "linalg.matmul")
    assert matmul_config is not None and matmul_config in spec.read_text()


def test_a_jobs_merged_spec_says_which_items_it_leaves_out():
    from service.ir.analysis import analyze
    from service.jobs.tasks import merged_spec

    static = REPEATED_LAYER
    dynamic = (SHARED / "workloads" / "dynamic_matmul.mlir").read_text()

    def plan(text: str) -> dict:
        (anchor,) = [u for u, op in analyze(text).graph.ops.items() if op.kind == "contraction"][:1]
        return {"groups": [{"anchor": anchor, "fuse": [], "levels": [
            {"tile_sizes": [16, 16, 0]}, {"tile_sizes": [8, 16, 0]}, {"tile_sizes": [0, 0, 16]}]}]}

    spec, left_out = merged_spec([("layer 1", static, plan(static), None), ("dyn", dynamic, plan(dynamic), None)],
                                 host_cpu=False)
    assert left_out == [left_out[0]] and left_out[0].startswith("item 'dyn': ") and "dynamic dims" in left_out[0]
    assert spec.startswith(f"// not in this spec: {left_out[0]}\n") and "@match_layer_1_0" in spec
    assert merged_spec([("dyn", dynamic, plan(dynamic), None)], host_cpu=False) == (None, left_out)
    # An item its decision left to IREE's own config says so, not that its plan tiles nothing.
    kept = "IREE's default predicted as fast: 1.0000 ms vs 1.0000 ms tuned"
    _, left_out = merged_spec([("layer 1", static, plan(static), None), ("kept", static, {"groups": []}, kept)],
                              host_cpu=False)
    assert left_out == [f"item 'kept': {kept}"]
    # A job over a model sized by shape hints: its spec says which sizes it matches.
    sized, _ = merged_spec([("layer 1", static, plan(static), None)], host_cpu=False, shape_hints={"arg0": [16, 64]})
    assert ("// matches the model with its inputs sized arg0=16x64 (`tilesearch model size MODEL --shape-hint "
            "arg0=16x64` writes it)\n") in sized
    named, _ = merged_spec([("layer 1", static, plan(static), None)], host_cpu=False, shape_hints={"arg0": [16, 64]},
                           sized_model="mlp.sized.onnx")
    assert "// matches the model with its inputs sized arg0=16x64: mlp.sized.onnx\n" in named
    left_open, _ = merged_spec([("layer 1", static, plan(static), None)], host_cpu=False, shape_hints={"arg0": [16, 64]},
                               sized_model="mlp.sized.mlir", still_dynamic=["arg2 (tensor<?x128xf32>)"])
    assert ("// matches the model with its inputs sized arg0=16x64: mlp.sized.mlir; still dynamic: arg2 "
            "(tensor<?x128xf32>) (size them too to run the model)\n") in left_open
    assert "// matches" not in spec


def test_matcher_names_must_be_unique():
    with pytest.raises(ValueError, match="unique"):
        tuning_spec([_matcher("a", 16), _matcher("a", 32)])


def test_a_spec_needs_a_matcher():
    # IREE requires the entry point to be one foreach_match and its yield.
    with pytest.raises(ValueError, match="no matcher"):
        tuning_spec([])


DYNAMIC_MATMUL = """
func.func @dyn(%a: tensor<?x64xf32>, %b: tensor<64x32xf32>) -> tensor<?x32xf32> {
  %zero = arith.constant 0.0 : f32
  %c0 = arith.constant 0 : index
  %d = tensor.dim %a, %c0 : tensor<?x64xf32>
  %e = tensor.empty(%d) : tensor<?x32xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<?x32xf32>) -> tensor<?x32xf32>
  %r = linalg.matmul ins(%a, %b : tensor<?x64xf32>, tensor<64x32xf32>) outs(%f : tensor<?x32xf32>) -> tensor<?x32xf32>
  return %r : tensor<?x32xf32>
}"""


def test_tune_without_a_spec_to_write_prints_its_answer_and_says_why(tmp_path):
    from typer.testing import CliRunner

    from service.cli import app

    module = tmp_path / "dyn.mlir"
    module.write_text(DYNAMIC_MATMUL)
    spec = tmp_path / "spec.mlir"
    spec.write_text("// an older run's spec: a build must not pick it up")
    result = CliRunner().invoke(app, ["tune", str(module), "--budget", "4", "--workers", "1", "--shape-hint", "arg0=8x64",
                                      "--spec-out", str(spec)])
    # IREE compiles the module with its own configs, as when the guard keeps them: not an error
    # that breaks `tune && iree-compile` on an ordinary op.
    assert result.exit_code == 0 and not spec.exists(), result.output
    assert "best plan" in result.output  # the search's answer is not thrown away
    assert "the plan cannot be given to IREE as a config" in result.output
    assert "linalg.matmul (uid 1) has dynamic dims" in result.output and "static shapes only" in result.output
    assert "tilesearch model size MODULE --shape-hint" in " ".join(result.output.split())  # how to get static shapes
    # A spec path tune cannot write is refused before the search, not with a traceback after it.
    for bad, why in ((tmp_path / "missing" / "spec.mlir", "does not exist"), (tmp_path, "is a directory")):
        result = CliRunner().invoke(app, ["tune", str(module), "--budget", "4", "--spec-out", str(bad)])
        assert result.exit_code == 2 and why in result.output and "best plan" not in result.output, result.output


def _convolution(module: str):
    return next(op for op in analyze(module).graph.ops.values() if op.kind == "convolution")


CONV_LEVELS = [{"tile_sizes": [1, 16, 4, 8, 0, 0, 0]}, {"tile_sizes": [1, 8, 1, 8, 0, 0, 0]},
               {"tile_sizes": [0, 0, 0, 0, 4, 1, 1]}]


def test_a_convolution_matcher_checks_every_dim_group_as_iree_infers_them():
    from _shared import nchw_conv_module

    from service.ir.graph import ConvolutionDims
    from service.measure.tuning_spec import convolution_matcher

    conv = _convolution(nchw_conv_module(2, c_in=16, c_out=32, size=16))
    m = convolution_matcher(conv, CONV_LEVELS, "conv")
    assert m.sizes == ConvolutionDims(batch=(2,), output_image=(16, 16), output_channel=(32,), filter_loop=(3, 3),
                                      input_channel=(16,), depth=(), strides=(1, 1), dilations=(1, 1))
    assert "ConvTileAndDecomposeExpert" in m.compilation_info  # IREE's convolution pipeline, not the matmuls'
    spec = tuning_spec([m])  # parsed back with MLIR
    assert "transform.iree.match.convolution %arg0, lhs_type = f32, rhs_type = f32, output_type = f32" in spec
    assert "transform.iree.match.dims_equal %filter_dims, [3, 3]" in spec
    strided = _convolution(nchw_conv_module(2, c_in=16, c_out=32, size=16).replace(
        "strides = dense<1>", "strides = dense<2>").replace("tensor<2x32x16x16xf32>", "tensor<2x32x8x8xf32>"))
    assert convolution_matcher(strided, CONV_LEVELS, "s").sizes.strides == (2, 2)


def test_no_convolution_matcher_for_one_iree_drops_a_config_on_or_a_pooling_one():
    from _shared import nchw_conv_module, nchw_max_pool_module, nhwc_depthwise_module

    from service.measure.tuning_spec import convolution_matcher, root_matcher

    assert convolution_matcher(_convolution(nchw_conv_module(1)), CONV_LEVELS, "c") is None  # unit batch: stripped
    depthwise = nhwc_depthwise_module(2)
    levels = [{"tile_sizes": [1, 8, 16, 32, 0, 0]}, {"tile_sizes": [1, 1, 8, 16, 0, 0]}, {"tile_sizes": [0, 0, 0, 0, 1, 3]}]
    m = root_matcher(_convolution(depthwise), levels, "d")
    assert m.sizes.depth == (32,) and m.sizes.output_channel == () and m.sizes.filter_loop == (3, 3)
    pooling = nchw_max_pool_module(2)
    assert root_matcher(_convolution(pooling), CONV_LEVELS[:2], "p") is None


@pytest.mark.parametrize("batch, honoured", [(1, False), (2, True)])
def test_a_convolution_anchor_gets_irees_convolution_pipeline_and_says_whether_iree_keeps_it(batch, honoured):
    """A decision's compilation_info for a convolution: IREE's convolution pipeline (not the
    matmuls' DoubleTilingExpert), honoured by IREE 3.13 only with a batch dim."""
    from _shared import nchw_conv_module

    from service.ir.plan import Plan
    from service.tiling.worker import compilation_infos

    graph = analyze(nchw_conv_module(batch)).graph
    conv = next(op for op in graph.ops.values() if op.kind == "convolution")
    plan = Plan.model_validate({"groups": [{"anchor": conv.uid, "fuse": [], "levels": CONV_LEVELS}]})
    (info,) = compilation_infos(graph, plan, "#iree_codegen.translation_info<pipeline = #iree_cpu.pipeline<DoubleTilingExpert>>").values()
    assert "ConvTileAndDecomposeExpert" in info.compilation_info and "DoubleTilingExpert" not in info.compilation_info
    assert info.honoured_by_iree is honoured
