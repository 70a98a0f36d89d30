"""Models exported with dynamic dims, tuned for the sizes shape hints give them (`model tune
--shape-hint`): the inputs are sized before IREE forms the dispatches, and the spec ships with
the model so sized."""

import json
import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

from _shared import needs_avx512

from service.cli import app
from service.ir.mlir import context, ir
from service.ir.parse import parse_module
from service.model_tuning.static_shapes import by_input_name, onnx_arguments, static_mlir_text, static_model
from service.search.errors import ShapeHintError

# A batch left open: every size of the MLP's two matmuls but the rows is fixed.
DYNAMIC_MLP = """
func.func @main(%x: tensor<?x64xf32>, %w1: tensor<64x128xf32>, %w2: tensor<128x64xf32>) -> tensor<?x64xf32> {
  %c0 = arith.constant 0 : index
  %zero = arith.constant 0.0 : f32
  %rows = tensor.dim %x, %c0 : tensor<?x64xf32>
  %e1 = tensor.empty(%rows) : tensor<?x128xf32>
  %f1 = linalg.fill ins(%zero : f32) outs(%e1 : tensor<?x128xf32>) -> tensor<?x128xf32>
  %h = linalg.matmul ins(%x, %w1 : tensor<?x64xf32>, tensor<64x128xf32>) outs(%f1 : tensor<?x128xf32>) -> tensor<?x128xf32>
  %e2 = tensor.empty(%rows) : tensor<?x64xf32>
  %f2 = linalg.fill ins(%zero : f32) outs(%e2 : tensor<?x64xf32>) -> tensor<?x64xf32>
  %y = linalg.matmul ins(%h, %w2 : tensor<?x128xf32>, tensor<128x64xf32>) outs(%f2 : tensor<?x64xf32>) -> tensor<?x64xf32>
  %r = call @helper(%y) : (tensor<?x64xf32>) -> tensor<?x64xf32>
  return %r : tensor<?x64xf32>
}
func.func private @helper(%t: tensor<?x64xf32>) -> tensor<?x64xf32> {
  return %t : tensor<?x64xf32>
}
"""


def _argument_types(text: str) -> dict[str, list[str]]:
    with context():
        module = parse_module(text)
        return {ir.StringAttr(op.attributes["sym_name"]).value: [str(a.type) for a in op.regions[0].blocks[0].arguments]
                for op in module.body.operations if op.operation.name == "func.func"}


def test_a_hint_sizes_the_entry_functions_argument_and_leaves_its_body_and_private_functions_as_written():
    text, still_dynamic = static_mlir_text(DYNAMIC_MLP.encode(), "mlp.mlir", {"arg0": [16, 64]})
    assert still_dynamic == []
    types = _argument_types(text)
    assert types["main"][0] == "tensor<16x64xf32>"
    assert types["helper"] == ["tensor<?x64xf32>"]  # its caller still passes the dynamic type
    assert "tensor.cast %arg0 : tensor<16x64xf32> to tensor<?x64xf32>" in text  # the body reads what it read
    assert "func.func @main(%arg0: tensor<16x64xf32>" in text  # the function's type follows its argument


@pytest.mark.parametrize("hints, message", [
    ({"arg0": [16]}, "arg0 has rank 2 (tensor<?x64xf32>); give 2 dims, e.g. arg0=16x64"),
    ({"arg0": [16, 32]}, "dim 1 of arg0 is 64 (tensor<?x64xf32>); keep its static dims"),
    ({"arg1": [64, 128]}, "arg1 is static (tensor<64x128xf32>) and needs no hint"),
    ({"arg3": [1, 1]}, "the module has no arg3"),
])
def test_a_hint_that_does_not_fit_the_models_inputs_says_what_to_give(hints, message):
    with pytest.raises(ShapeHintError, match=re.escape(message)):
        static_mlir_text(DYNAMIC_MLP.encode(), "mlp.mlir", hints)


def test_a_torch_dialect_model_is_refused_with_what_to_give_instead():
    torch_model = """
func.func @main(%x: !torch.vtensor<[?,4],f32>) -> !torch.vtensor<[?,4],f32> {
  %0 = torch.aten.relu %x : !torch.vtensor<[?,4],f32> -> !torch.vtensor<[?,4],f32>
  return %0 : !torch.vtensor<[?,4],f32>
}"""
    with pytest.raises(ShapeHintError, match="torch dialect.*ONNX export"):
        static_mlir_text(torch_model.encode(), "m.mlir", {"arg0": [2, 4]})


def test_mlir_hints_that_give_one_loop_two_sizes_are_refused():
    batched = """
func.func @main(%a: tensor<?x8x16xf32>, %b: tensor<?x16x8xf32>, %c: tensor<?x8x8xf32>) -> tensor<?x8x8xf32> {
  %0 = linalg.batch_matmul ins(%a, %b : tensor<?x8x16xf32>, tensor<?x16x8xf32>) outs(%c : tensor<?x8x8xf32>) -> tensor<?x8x8xf32>
  return %0 : tensor<?x8x8xf32>
}"""
    with pytest.raises(ShapeHintError, match="shape hints disagree"):
        static_mlir_text(batched.encode(), "bmm.mlir", {"arg0": [4, 8, 16], "arg1": [2, 16, 8], "arg2": [4, 8, 8]})
    text, still_dynamic = static_mlir_text(batched.encode(), "bmm.mlir", {"arg0": [4, 8, 16]})
    assert [a.name for a in still_dynamic] == ["arg1", "arg2"]  # what a partial hint leaves open is said


def _dynamic_onnx_mlp(path, width: int = 64, hidden: int = 128):
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((width, hidden)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((hidden, width)).astype(np.float32), "w2")
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["y"])]
    h_info = helper.make_tensor_value_info("h", TensorProto.FLOAT, ["batch", hidden])  # as an exporter records it
    graph = helper.make_graph(nodes, "main_graph", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", width])],
                              initializer=[w1, w2], value_info=[h_info])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def test_an_onnx_models_inputs_are_its_arguments_and_a_hint_sizes_them(tmp_path):
    model = _dynamic_onnx_mlp(tmp_path / "mlp.onnx")
    (x,) = onnx_arguments(onnx.load(str(model)).graph)  # the weights are initializers, not arguments
    assert (x.name, x.shape, x.type) == ("arg0", (None, 64), "x: FLOAT[batch,64]")
    path, still_dynamic = static_model(model, {"arg0": [8, 64]}, tmp_path)
    static = onnx.load(str(path))
    assert still_dynamic == []
    assert [d.dim_value for d in static.graph.input[0].type.tensor_type.shape.dim] == [8, 64]
    assert not static.graph.value_info  # the open shapes an exporter recorded are inferred again on import
    with pytest.raises(ShapeHintError, match=r"dim 1 of arg0 is 64 \(x: FLOAT\[batch,64\]\)"):
        static_model(model, {"arg0": [8, 32]}, tmp_path)


def _two_input_onnx(path):
    """Token ids and an attention mask, both [batch, seq]: one hint sizes both."""
    nodes = [helper.make_node("Cast", ["mask"], ["m"], to=TensorProto.FLOAT),
             helper.make_node("Cast", ["ids"], ["i"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["i", "m"], ["y"])]
    inputs = [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"]),
              helper.make_tensor_value_info("mask", TensorProto.INT64, ["batch", "seq"])]
    graph = helper.make_graph(nodes, "main_graph", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq"])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_one_hint_sizes_every_onnx_input_dim_of_the_same_name_and_two_sizes_for_one_name_are_refused(tmp_path):
    model = _two_input_onnx(tmp_path / "ids.onnx")
    path, still_dynamic = static_model(model, {"arg0": [2, 16]}, tmp_path)
    sized = [[d.dim_value for d in v.type.tensor_type.shape.dim] for v in onnx.load(str(path)).graph.input]
    assert sized == [[2, 16], [2, 16]] and still_dynamic == []
    with pytest.raises(ShapeHintError, match=r"dim 0 of arg0 and dim 0 of arg1 are both 'batch' in the model, given 2 and 4"):
        static_model(model, {"arg0": [2, 16], "arg1": [4, 16]}, tmp_path)


def test_an_onnx_input_is_hinted_by_its_own_name_too(tmp_path):
    model = _two_input_onnx(tmp_path / "ids.onnx")
    assert by_input_name(model, ["mask=2x16", "arg0=2x16", "nope"]) == ["arg1=2x16", "arg0=2x16", "nope"]
    assert by_input_name(tmp_path / "m.mlir", ["mask=2x16"]) == ["mask=2x16"]  # MLIR arguments have no names
    # A name the graph does not have is refused with the names it has (it read "name a function argument").
    names = [i.name for i in onnx.load(str(model)).graph.input]
    with pytest.raises(ShapeHintError, match=rf"ids.onnx has no input 'input_ids'; its inputs: {names[0]} \(arg0\), "):
        by_input_name(model, ["input_ids=2x16"])


def test_model_size_writes_the_model_a_server_sized_job_compiled_and_refuses_what_does_not_fit(tmp_path, monkeypatch):
    """A REST model job sizes the model text on the server; `model size` writes the same model
    where the client is (the spec's header says so), an ONNX graph's input also by its name."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mlp.mlir").write_text(DYNAMIC_MLP)
    run = lambda *args: CliRunner().invoke(app, ["model", "size", *args])  # noqa: E731
    done = run("mlp.mlir", "--shape-hint", "arg0=16x64")
    assert done.exit_code == 0 and "wrote mlp.sized.mlir" in done.output, done.output
    server_sized, _ = static_mlir_text(DYNAMIC_MLP.encode(), "the model", {"arg0": [16, 64]})
    assert (tmp_path / "mlp.sized.mlir").read_text() == server_sized
    assert _argument_types(server_sized)["main"][0] == "tensor<16x64xf32>"
    for args, says in ((["--shape-hint", "arg0=16"], "give 2 dims"),
                       (["--shape-hint", "arg0=16x64", "-o", "mlp.mlir"], "is the model itself"),
                       (["--shape-hint", "arg0=16x64", "-o", "mlp.sized.onnx"], "name it *.mlir"),
                       (["--shape-hint", "arg0=16777217x64"], "out of range"),  # bounded as a request's hints
                       (["--shape-hint", "arg0=16x64", "-o", "mlp.mlir/x.mlir"], "mlp.mlir is not a directory"),
                       (["--shape-hint", "arg0=16x64", "-o", "/proc/tilesearch-sized.mlir"], "cannot write it")):
        refused = run("mlp.mlir", *args)
        assert refused.exit_code == 2 and says in refused.output, (args, refused.output)
    _two_input_onnx(tmp_path / "ids.onnx")
    named = run("ids.onnx", "--shape-hint", "mask=2x16", "-o", "ids2x16.onnx")
    assert named.exit_code == 0, named.output
    assert "its inputs: arg0 (ids: INT64[2,16]), arg1 (mask: INT64[2,16])" in named.output, named.output
    sized = [[d.dim_value for d in v.type.tensor_type.shape.dim] for v in onnx.load("ids2x16.onnx").graph.input]
    assert sized == [[2, 16], [2, 16]]  # the mask by its name, the ids through the dims they share


@pytest.mark.slow
def test_a_spec_out_that_is_the_model_itself_is_refused_and_the_model_kept(tmp_path):
    model = tmp_path / "mlp.mlir"
    model.write_text(DYNAMIC_MLP)
    for command in (["model", "tune", str(model), "--no-store"], ["tune", str(model), "--budget", "4"]):
        result = CliRunner().invoke(app, [*command, "--spec-out", str(model)])
        assert result.exit_code == 2 and "is the input itself" in result.output, result.output
        unwritable = CliRunner().invoke(app, [*command, "--spec-out", "/proc/tilesearch-spec.mlir"])
        assert unwritable.exit_code == 2 and "cannot write it" in unwritable.output, unwritable.output
        assert model.read_text() == DYNAMIC_MLP


@pytest.mark.slow
def test_a_dynamic_model_names_the_hint_and_with_it_is_tuned_static(tmp_path):
    model = tmp_path / "mlp.mlir"
    model.write_text(DYNAMIC_MLP)
    spec = tmp_path / "spec.mlir"
    plain = CliRunner().invoke(app, ["model", "tune", str(model), "--spec-out", str(spec), "--no-store", "--json"])
    # Every dispatch dynamic, nothing tunable without sizes: an error naming the inputs to size.
    assert plain.exit_code == 2 and "every dispatch IREE formed from mlp.mlir has dynamic shapes" in plain.output, plain.output
    assert "arg0 (tensor<?x64xf32>); give them sizes, e.g. --shape-hint arg0=1x64" in plain.output
    assert not spec.exists()
    hinted = CliRunner().invoke(app, ["model", "tune", str(model), "--spec-out", str(spec), "--no-store", "--json",
                                      "--shape-hint", "arg0=16x64", "--budget", "64"])
    assert hinted.exit_code == 0, hinted.output
    dispatches = json.loads(hinted.output)["dispatches"]
    names = sorted(d["name"].rsplit("_", 2)[-2] for d in dispatches)
    assert names == ["16x128x64", "16x64x128"], names  # IREE formed static dispatches of the sized rows
    assert not any((d["reason"] or "").startswith("dynamic") for d in dispatches), dispatches
    bad = CliRunner().invoke(app, ["model", "tune", str(model), "--spec-out", str(spec), "--no-store",
                                   "--shape-hint", "arg0=16"])
    assert bad.exit_code == 2 and "give 2 dims" in bad.output, bad.output



def test_a_dynamic_dispatchs_reason_says_how_to_size_it_in_a_job_request_as_on_the_cli(tmp_path):
    """A model job reports its dynamic dispatches with the same reasons as `model tune`: each says
    both spellings, so a REST client is not sent to a CLI flag it cannot pass."""
    from service.jobs.tasks import model_file_items

    model = tmp_path / "mlp.mlir"
    model.write_text(DYNAMIC_MLP)
    found = model_file_items(model, tmp_path)
    assert not found.tunable and found.left_to_iree and all(d.dynamic for d in found.left_to_iree)
    for d in found.left_to_iree:
        assert "--shape-hint argN=AxB" in d.reason and '"shape_hints" in a job request' in d.reason, d.reason

@pytest.mark.slow
@needs_avx512  # the spec's configs are checked by real IREE on this CPU against the pinned profile
def test_the_spec_of_a_hinted_model_ships_with_the_model_so_sized_and_iree_applies_it(tmp_path):
    model = _dynamic_onnx_mlp(tmp_path / "mlp.onnx", width=256, hidden=1024)
    spec = tmp_path / "spec.mlir"
    result = CliRunner().invoke(app, ["model", "tune", str(model), "--spec-out", str(spec), "--no-store",
                                      "--shape-hint", "arg0=32x256", "--budget", "128"])
    assert result.exit_code == 0, result.output
    static = tmp_path / "spec.model.onnx"  # named after the spec it ships with
    if not spec.exists():  # a default predicted as fast is a valid verdict: then nothing ships, nor the model
        assert not static.exists() and "no spec written" in result.output, result.output
    else:
        assert static.exists() and "IREE applied it to every tuned dispatch" in result.output
        assert "// matches the model with its inputs sized arg0=32x256: spec.model.onnx" in spec.read_text()
        bench = CliRunner().invoke(app, ["model", "bench", str(static), "--spec", str(spec), "--rounds", "1",
                                         "--function", "@main_graph"])
        assert bench.exit_code == 0 and "the spec changed" in bench.output, bench.output


def test_a_dynamic_models_inputs_cannot_be_made_and_the_error_names_model_size():
    """`model bench` makes a model's inputs; an open dim says how to size the model."""
    from service.measure.tools import ToolFailure
    from service.measure.whole_model import model_arguments

    with pytest.raises(ToolFailure, match=r"argument 0 of @main is tensor<\?x64xf32>, not a static tensor.*"
                                          r"tilesearch model size MODEL --shape-hint arg0="):
        model_arguments(DYNAMIC_MLP)
    sized, _ = static_mlir_text(DYNAMIC_MLP.encode(), "the model", {"arg0": [16, 64]})
    assert [a.shape for a in model_arguments(sized)] == [(16, 64), (64, 128), (128, 64)]


def test_the_example_hint_for_an_input_left_open_agrees_with_the_sizes_given():
    """The batch a hint gives the LHS is the RHS's too (one loop): the example says so, where it
    said 1 and the next try failed with "shape hints disagree"."""
    from service.model_tuning.static_shapes import hint_example

    bmm = """
func.func @main(%a: tensor<?x?x64xf32>, %b: tensor<?x64x?xf32>) -> tensor<?x?x?xf32> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %zero = arith.constant 0.0 : f32
  %n = tensor.dim %a, %c0 : tensor<?x?x64xf32>
  %m = tensor.dim %a, %c1 : tensor<?x?x64xf32>
  %k = tensor.dim %b, %c2 : tensor<?x64x?xf32>
  %e = tensor.empty(%n, %m, %k) : tensor<?x?x?xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<?x?x?xf32>) -> tensor<?x?x?xf32>
  %r = linalg.batch_matmul ins(%a, %b : tensor<?x?x64xf32>, tensor<?x64x?xf32>) outs(%f : tensor<?x?x?xf32>) -> tensor<?x?x?xf32>
  return %r : tensor<?x?x?xf32>
}
"""
    _, still = static_mlir_text(bmm.encode(), "bmm.mlir", {"arg0": [2, 16, 64]})
    assert [a.name for a in still] == ["arg1"]
    assert hint_example(still) == "--shape-hint arg1=2x64x1"
    _, both = static_mlir_text(bmm.encode(), "bmm.mlir", {"arg0": [2, 16, 64], "arg1": [2, 64, 8]})
    assert both == []
