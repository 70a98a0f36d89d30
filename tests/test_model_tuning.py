"""Whole-model tuning end to end with the real iree-compile and iree-run-module."""

from pathlib import Path

import numpy as np
import pytest

from _shared import SHARED, tuning_every_dispatch

from service.hardware.profiles import get_profile
from service.measure.whole_model import compile_model, input_program, model_arguments, run_outputs, write_inputs
from service.model_tuning import ModelInputError, tune_model

MLP = SHARED / "models" / "mlp_512_2048_b16.linalg.mlir"

SOFTMAX_MODEL = """
func.func @main(%x: tensor<8x128xf32>) -> tensor<8x128xf32> {
  %e = tensor.empty() : tensor<8x128xf32>
  %s = linalg.softmax dimension(1) ins(%x : tensor<8x128xf32>) outs(%e : tensor<8x128xf32>) -> tensor<8x128xf32>
  return %s : tensor<8x128xf32>
}"""

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tuned_mlp(tmp_path_factory):
    out = tmp_path_factory.mktemp("mlp")
    with tuning_every_dispatch():
        report = tune_model(MLP, get_profile("host-cpu"), out / "spec.mlir", budget=256)
    return report, out


def test_every_matmul_dispatch_is_tuned_or_left_to_a_faster_default_and_iree_applies_the_spec(tuned_mlp):
    report, _ = tuned_mlp
    tuned = [d for d in report.dispatches if d.tuned]
    assert len(report.dispatches) == 2 and tuned
    assert report.verified  # both builds' configuration dumps were read back
    for d in report.dispatches:  # IREE's own config of every root, priced by the same cost model
        assert d.iree_default.startswith("#iree_cpu.lowering_config<distribution = ")
        assert d.iree_default_predicted_s > 0 and d.predicted_s > 0
        if d.tuned:
            assert d.config.startswith("#iree_codegen.compilation_info<")
        else:
            assert d.reason.startswith("IREE's default predicted as fast") and d.config is None
    assert report.predicted_total_s == pytest.approx(sum(d.weight * d.predicted_s for d in tuned))
    assert Path(report.spec).read_text().count("transform.iree.match.contraction") == len(tuned)
    assert [s.name for s in report.searches] == [d.name for d in tuned]


def test_the_tuned_model_computes_what_the_default_build_does(tuned_mlp, tmp_path):
    report, _ = tuned_mlp
    arguments = model_arguments(input_program(MLP, tmp_path / "input.mlir"))
    flags = write_inputs(arguments, tmp_path, seed=3)
    compile_model(MLP, tmp_path / "default.vmfb", tmp_path / "d_configs")
    compile_model(MLP, tmp_path / "tuned.vmfb", tmp_path / "t_configs", spec=Path(report.spec))
    (default,) = run_outputs(tmp_path / "default.vmfb", flags, tmp_path / "default_out", 1)
    (tuned,) = run_outputs(tmp_path / "tuned.vmfb", flags, tmp_path / "tuned_out", 1)
    a, b = np.load(default), np.load(tuned)
    assert a.shape == b.shape == (16, 512)
    np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-4 * float(np.abs(a).max()))


def test_a_dispatch_without_a_contraction_is_left_to_iree_with_its_reason(tmp_path):
    model = tmp_path / "softmax.mlir"
    model.write_text(SOFTMAX_MODEL)
    report = tune_model(model, get_profile("host-cpu"), tmp_path / "spec.mlir", budget=8)
    assert report.dispatches and not any(d.tuned for d in report.dispatches)
    assert all("no contraction root" in d.reason for d in report.dispatches)
    assert report.spec is None and not (tmp_path / "spec.mlir").exists()


def test_input_iree_cannot_compile_is_a_clear_error(tmp_path):
    model = tmp_path / "broken.mlir"
    model.write_text("func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> { return %y : tensor<4xf32> }")
    with pytest.raises(ModelInputError, match="IREE cannot compile broken.mlir: .*undeclared SSA value"):
        tune_model(model, get_profile("host-cpu"), tmp_path / "spec.mlir", budget=8)
