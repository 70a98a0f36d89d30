"""ONNX models through IREE's own importer, into `model tune`, `model bench` and `job submit`."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

from _shared import needs_avx512

from service.cli import app
from service.hardware.profiles import get_profile
from service.measure.tools import first_error_line
from service.model_tuning import ModelInputError, bench_model, tune_model

pytestmark = pytest.mark.slow


def _onnx_mlp(path, tokens: int = 32, width: int = 256, hidden: int = 512):
    """x @ w1 -> relu -> @ w2, weights as initializers: two matmuls IREE dispatches apart."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((width, hidden)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((hidden, width)).astype(np.float32), "w2")
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [tokens, width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [tokens, width])],
                              initializer=[w1, w2])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


@needs_avx512  # real IREE on this CPU against the pinned AVX-512 profile's configs
def test_an_onnx_model_is_imported_tuned_and_its_spec_applied_by_iree(tmp_path):
    model = _onnx_mlp(tmp_path / "mlp.onnx")
    report = tune_model(model, get_profile("host-cpu"), tmp_path / "spec.mlir", budget=64)
    names = [d.name for d in report.dispatches]
    assert len(names) == 2 and all("matmul_32x" in n for n in names), names
    assert all(d.root_op == "linalg.matmul" for d in report.dispatches)
    if any(d.tuned for d in report.dispatches):  # a default predicted as fast is a valid verdict
        assert report.verified and (tmp_path / "spec.mlir").exists()


def test_a_file_that_is_not_onnx_is_a_clear_error_with_the_importers_reason(tmp_path):
    model = tmp_path / "broken.onnx"
    model.write_bytes(b"this is not a protobuf")
    with pytest.raises(ModelInputError, match=r"IREE cannot import broken.onnx: .*(DecodeError|parsing)"):
        tune_model(model, get_profile("host-cpu"), tmp_path / "spec.mlir", budget=8)
    assert not (tmp_path / "spec.mlir").exists()


@pytest.mark.parametrize("name, content, message", [
    ("broken.onnx", b"\x08\x07garbage", "IREE cannot import broken.onnx"),
    ("build.py", b"import onnx\n", "build.py: a model is MLIR"),
])
def test_job_submit_refuses_what_is_not_a_model_before_it_reaches_a_server(tmp_path, name, content, message):
    model = tmp_path / name
    model.write_bytes(content)
    result = CliRunner().invoke(app, ["job", "submit", str(model), "--hardware", "host-cpu",
                                      "--server", "http://127.0.0.1:9"])
    assert result.exit_code == 2
    assert message in result.output


def test_a_python_tools_error_line_is_its_exception_not_the_traceback_header():
    stderr = ('Traceback (most recent call last):\n  File "x.py", line 1, in <module>\n    f()\n'
              "google.protobuf.message.DecodeError: Error parsing message\n")
    assert first_error_line(stderr) == "google.protobuf.message.DecodeError: Error parsing message"
    assert first_error_line("note: a\nerror: b\n") == "error: b"


def test_a_binary_model_under_an_mlir_name_is_a_clear_error_not_a_crash(tmp_path):
    # iree-compile echoes the file's bytes in its diagnostics: they are not UTF-8.
    model = tmp_path / "weights.mlir"
    model.write_bytes(bytes(range(128, 256)) * 8)
    with pytest.raises(ModelInputError, match="IREE cannot compile weights.mlir"):
        tune_model(model, get_profile("host-cpu"), tmp_path / "spec.mlir", budget=8)


@pytest.mark.parametrize("name, content, message", [
    ("build.py", b"import onnx\n", r"build.py: a model is MLIR \(.mlir, .mlirbc\) or ONNX \(.onnx\)"),
    ("empty.onnx", b"", "empty.onnx is empty"),
])
def test_a_file_that_cannot_be_a_model_is_refused_before_iree_sees_it(tmp_path, name, content, message):
    model = tmp_path / name
    model.write_bytes(content)
    with pytest.raises(ModelInputError, match=message):
        tune_model(model, get_profile("host-cpu"), tmp_path / "spec.mlir", budget=8)


def test_bench_names_the_onnx_model_the_user_gave_not_the_imported_file(tmp_path):
    model = _onnx_mlp(tmp_path / "mlp.onnx")
    other = tmp_path / "other.mlir"  # a spec that matches nothing in the model
    other.write_text('module attributes {transform.with_named_sequence} {\n'
                     '  transform.named_sequence @__kernel_config(%arg0: !transform.any_op {transform.consumed}) '
                     '-> !transform.any_op attributes {iree_codegen.tuning_spec_entrypoint} {\n'
                     '    transform.yield %arg0 : !transform.any_op\n  }\n}\n')
    with pytest.raises(ModelInputError, match="none of mlp.onnx's 2 dispatches"):
        bench_model(model, other, rounds=1)
