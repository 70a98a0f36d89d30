"""Shape hints and buckets: checked against the module, with errors that say what to fix (CLI
exit code 2, API 422), and the hints each bucket of a bucketed search gets."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

import service.search.guard as guard
from _shared import WORKLOADS
from service.api.app import create_app
from service.cli import app
from service.config import Settings
from service.hardware.cost import cost_of_plan
from service.hardware.profiles import get_profile
from service.ir.analysis import analyze
from service.ir.mlir import context, ir
from service.measure.forcing import function_arguments as measured_arguments
from service.search.engine import tune
from service.search.shapes import (
    ShapeHintError,
    bucket_hints,
    check_shapes,
    function_arguments,
    parse_buckets,
    parse_shape_hints,
)
from service.search.space import build_space
from service.tiling.worker import check_search_shapes

DYNAMIC_MATMUL = (WORKLOADS / "dynamic_matmul.mlir").read_text()  # (%x: tensor<?x1024xf32>, %w: tensor<1024x1024xf32>)
MATMUL = (WORKLOADS / "matmul_1024.mlir").read_text()  # static
# Both dims dynamic, and a scalar argument.
SCALE = """
#id = affine_map<(d0, d1) -> (d0, d1)>
func.func @scale(%x: tensor<?x?xf32>, %s: f32) -> tensor<?x?xf32> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %m = tensor.dim %x, %c0 : tensor<?x?xf32>
  %n = tensor.dim %x, %c1 : tensor<?x?xf32>
  %e = tensor.empty(%m, %n) : tensor<?x?xf32>
  %r = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%x : tensor<?x?xf32>) outs(%e : tensor<?x?xf32>) {
  ^bb0(%a: f32, %o: f32):
    %y = arith.mulf %a, %s : f32
    linalg.yield %y : f32
  } -> tensor<?x?xf32>
  return %r : tensor<?x?xf32>
}
"""
# The result's static dim (16) differs from the dynamic argument's (8).
NARROW = """
func.func @narrow(%x: tensor<?x8xf32>, %w: tensor<8x16xf32>) -> tensor<?x16xf32> {
  %c0 = arith.constant 0 : index
  %zero = arith.constant 0.0 : f32
  %m = tensor.dim %x, %c0 : tensor<?x8xf32>
  %e = tensor.empty(%m) : tensor<?x16xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%e : tensor<?x16xf32>) -> tensor<?x16xf32>
  %r = linalg.matmul ins(%x, %w : tensor<?x8xf32>, tensor<8x16xf32>) outs(%acc : tensor<?x16xf32>) -> tensor<?x16xf32>
  return %r : tensor<?x16xf32>
}
"""


def check(source: str, hints=None, buckets=None) -> None:
    analysis = analyze(source)
    check_shapes(analysis.module, analysis.graph, parse_shape_hints(hints), parse_buckets(buckets))


@pytest.mark.parametrize("hints, message", [
    (["arg0=-4x1024"], "shape hint arg0=-4x1024: dim 0 is -4; every dim must be at least 1"),
    (["arg0=0x1024"], "dim 0 is 0; every dim must be at least 1"),
    (["arg0=64"], "shape hint arg0=64: arg0 has rank 2 (tensor<?x1024xf32>); give 2 dims, e.g. arg0=64x1024"),
    (["arg7=64x1024"], "the module has no arg7; its arguments: arg0 tensor<?x1024xf32>, arg1 tensor<1024x1024xf32>"),
    (["arg0=64x512"], "dim 1 of arg0 is 1024 (tensor<?x1024xf32>); keep its static dims, e.g. arg0=64x1024"),
    (["arg1=1024x1024"], "arg1 is static (tensor<1024x1024xf32>) and needs no hint; arguments with dynamic dims: arg0"),
    (["arg0=64xa"], "'a' is not a whole number"),
    (["arg0"], "shape hint 'arg0': write argN=AxB"),
    (["x=64x1024"], "name a function argument as argN"),
    (["arg0=64x1024", "arg0=8x1024"], "shape hint arg0 is given twice"),
    ({"arg0": []}, "no sizes given"),
])
def test_bad_shape_hints_say_what_to_fix(hints, message):
    with pytest.raises(ShapeHintError) as err:
        check(DYNAMIC_MATMUL, hints=hints)
    assert message in str(err.value)


@pytest.mark.parametrize("source, buckets, message", [
    (MATMUL, ["M=1,16"], "bucket M=1,16: the module has no dynamic dims (every shape is static)"),
    (DYNAMIC_MATMUL, ["M=0,16"], "bucket M=0,16: 0 is not a size; every value must be at least 1"),
    (DYNAMIC_MATMUL, {"M": []}, "bucket M=: no sizes given"),
    (DYNAMIC_MATMUL, ["M=a,b"], "bucket M=a,b: 'a' is not a whole number"),
    (DYNAMIC_MATMUL, ["M=16,1,16"], "16 listed more than once"),
    (DYNAMIC_MATMUL, ["arg1=1,16"], "arg1 (tensor<1024x1024xf32>) has no dynamic dim; dynamic dims: arg0.0 (tensor<?x1024xf32>)"),
    (DYNAMIC_MATMUL, ["arg0.1=1,16"], "dim 1 of arg0 (tensor<?x1024xf32>) is not dynamic"),
    (DYNAMIC_MATMUL, ["arg5.0=1,16"], "the module has no arg5"),
    (DYNAMIC_MATMUL, ["arg0.x=1,16"], "name an argument's dynamic dims as argN"),
    (SCALE, ["arg1=1,16"], "arg1 (f32) has no dynamic dim; dynamic dims: arg0.0 (tensor<?x?xf32>), arg0.1"),
])
def test_bad_buckets_say_what_to_fix(source, buckets, message):
    with pytest.raises(ShapeHintError) as err:
        check(source, buckets=buckets)
    assert message in str(err.value)


def test_good_hints_and_buckets_pass_in_every_spelling():
    assert parse_shape_hints(["arg0=64X1024"]) == parse_shape_hints({"arg0": "64x1024"}) == {"arg0": [64, 1024]}
    assert parse_buckets(["M=128, 1,16"]) == parse_buckets({"M": [16, 128, 1]}) == {"M": [1, 16, 128]}
    check(DYNAMIC_MATMUL, hints=["arg0=64x1024"], buckets=["arg0.0=1,16"])
    check(SCALE, hints={"arg0": [3, 5]}, buckets=["arg0=1,2"])
    with pytest.raises(ShapeHintError, match=r"arg1 is static \(f32\)"):
        check(SCALE, hints=["arg1=4"])


BATCH_MATMUL = """
func.func @bmm(%a: tensor<?x128x64xf32>, %b: tensor<?x64x128xf32>, %c: tensor<4x128x128xf32>) -> tensor<4x128x128xf32> {
  %r = linalg.batch_matmul ins(%a, %b : tensor<?x128x64xf32>, tensor<?x64x128xf32>)
      outs(%c : tensor<4x128x128xf32>) -> tensor<4x128x128xf32>
  return %r : tensor<4x128x128xf32>
}
"""


def test_hints_that_size_one_loop_two_ways_are_refused():
    check(BATCH_MATMUL, hints=["arg0=4x128x64", "arg1=4x64x128"])
    with pytest.raises(ShapeHintError, match=r"linalg.batch_matmul in @bmm reads dim 0 of arg0 \(4\) and dim 0 "
                                             r"of arg1 \(8\) as the same loop; give both the same size"):
        check(BATCH_MATMUL, hints=["arg0=4x128x64", "arg1=8x64x128"])
    with pytest.raises(ShapeHintError, match=r"dim 0 of arg0 \(2\) and dim 0 of arg2 \(4\)"):  # against a static dim
        check(BATCH_MATMUL, hints=["arg0=2x128x64", "arg1=2x64x128"])


def test_bucket_hints_keep_the_arguments_static_dims():
    """A bucket sizes the argument's dynamic dim; its static dims come from its type (the fill's
    result, tensor<?x16xf32>, was taken for arg0's shape)."""
    analysis = analyze(NARROW)
    args = function_arguments(analysis.module)
    assert bucket_hints(analysis.graph, args, "M", 32, {}) == {"arg0": [32, 8]}
    scale = analyze(SCALE)
    args = function_arguments(scale.module)
    assert bucket_hints(scale.graph, args, "arg0.1", 4, {}) == {"arg0": [128, 4]}
    assert bucket_hints(scale.graph, args, "N", 4, {"arg0": [2, 3]}) == {"arg0": [4, 4]}


def test_tune_rejects_bad_hints_before_searching():
    def fail(*_args):
        raise AssertionError("searched")

    with pytest.raises(ShapeHintError, match="no dynamic dims"):
        tune(MATMUL, get_profile("host-cpu"), budget=4, workers=0, buckets={"M": [1, 16]}, progress=fail)


def test_a_search_without_hints_warns_once_about_the_assumed_extent():
    r = tune(DYNAMIC_MATMUL, get_profile("host-cpu"), budget=4, strategy="random", workers=0)
    assert len([w for w in r.warnings if "assumed 128" in w]) == 1, r.warnings


def test_cli_bad_shape_hint_exits_2_with_the_message():
    result = CliRunner().invoke(app, ["tune", str(WORKLOADS / "dynamic_matmul.mlir"), "--shape-hint", "arg0=64",
                                      "--budget", "4", "--workers", "1", "--json"])
    assert result.exit_code == 2, result.output
    assert "error: shape hint arg0=64: arg0 has rank 2 (tensor<?x1024xf32>); give 2 dims, e.g. arg0=64x1024" in result.output


def test_cli_unknown_strategy_exits_2_with_the_choices():
    result = CliRunner().invoke(app, ["tune", str(WORKLOADS / "matmul_1024.mlir"), "--strategy", "annealing",
                                      "--budget", "4", "--workers", "1"])
    assert result.exit_code == 2 and "unknown strategy 'annealing'; choose one of tpe" in result.output


def test_cli_a_search_bug_is_not_reported_as_bad_input(monkeypatch):
    """An internal ValueError (once: Optuna refusing a starting value outside a knob) is ours:
    not exit 2 with an "error:" line that reads as the input's fault."""
    def broken(*args, **kwargs):
        raise ValueError("'0' not in (1,).")

    monkeypatch.setattr(guard, "tune", broken)  # the search the CLI's decision runs
    result = CliRunner().invoke(app, ["tune", str(WORKLOADS / "matmul_1024.mlir"), "--budget", "4", "--workers", "1"])
    assert result.exit_code != 2 and isinstance(result.exception, ValueError)


def test_cli_cost_takes_hints_in_the_same_form_and_rejects_bad_ones(tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text('{"groups": [{"anchor": 1, "fuse": [0], "levels": [{"tile_sizes": [64, 64, 0], "loop": "forall"}]}]}')
    args = ["cost", str(WORKLOADS / "dynamic_matmul.mlir"), "--plan", str(plan), "--json", "--shape-hint"]
    bad = CliRunner().invoke(app, [*args, "arg0=0x1024"])
    assert bad.exit_code == 2 and "every dim must be at least 1" in bad.output
    good = CliRunner().invoke(app, [*args, "arg0=512x1024"])
    assert good.exit_code == 0, good.output
    assert not any("assumed" in n for n in json.loads(good.output)["notes"])


def test_api_takes_both_hint_forms_and_rejects_misfits_with_422(migrated_url, tmp_path, monkeypatch):
    monkeypatch.setenv("TILESEARCH_HARDWARE_DIR", str(tmp_path / "hardware"))
    settings = Settings(database_url=migrated_url, request_timeout_s=60, pool_workers=2)
    with TestClient(create_app(settings)) as client:
        def tile(**extra):
            body = {"module": DYNAMIC_MATMUL, "hardware": "host-cpu", "budget": 4, **extra}
            return client.post("/v1/tilings", json=body)

        as_text = tile(shape_hints={"arg0": "64x1024"})
        assert as_text.status_code == 200, as_text.text
        as_list = tile(shape_hints={"arg0": [64, 1024]}).json()
        assert (as_list["cache"], as_list["id"]) == ("hit", as_text.json()["id"])

        rank = tile(shape_hints={"arg0": [64]})
        assert rank.status_code == 422
        assert rank.json()["detail"]["error"] == "InvalidSearchParameters"
        assert "arg0 has rank 2 (tensor<?x1024xf32>); give 2 dims, e.g. arg0=64x1024" in rank.json()["detail"]["message"]
        empty = tile(buckets={"M": []})
        assert empty.status_code == 422 and "bucket M=: no sizes given" in empty.json()["detail"]["message"]
        zero = tile(shape_hints={"arg0": "0x1024"})
        assert zero.status_code == 422 and "dim 0 is 0; every dim must be at least 1" in zero.text
        static = tile(shape_hints={"arg1": [1024, 1024]})
        assert static.status_code == 422 and "arg1 is static" in static.json()["detail"]["message"]
        # Checked before a search is claimed: the misfits left no (failed) decision behind.
        decisions = client.get("/v1/tilings").json()["items"]
        assert [d["id"] for d in decisions] == [as_text.json()["id"]]


def test_one_bucketed_dim_per_search():
    with pytest.raises(ShapeHintError, match="one bucketed dim per search"):
        check_search_shapes(DYNAMIC_MATMUL, None, {"M": [1, 16], "arg0.0": [2, 4]})
    with pytest.raises(ShapeHintError, match="one bucketed dim per search"):
        tune(DYNAMIC_MATMUL, get_profile("host-cpu"), budget=4, workers=0, buckets=["M=1,16", "arg0.0=2,4"])


def test_a_bucket_over_a_hinted_dim_says_it_wins():
    """`--bucket M=... --shape-hint arg0=...` on the same dim: the bucket values are used, and
    the answer says so (it did silently)."""
    src = (WORKLOADS / "dynamic_matmul.mlir").read_text()
    host = get_profile("host-cpu")
    both = tune(src, host, budget=8, strategy="random", workers=0, shape_hints=["arg0=64x1024"], buckets=["M=1,16"])
    assert any("--bucket M sizes arg0 dim 0, which a shape hint gave too" in w for w in both.warnings), both.warnings
    assert [b.shape_hints["arg0"][0] for b in both.buckets] == [1, 16]
    alone = tune(src, host, budget=8, strategy="random", workers=0, buckets=["M=1,16"])
    assert not any("shape hint gave too" in w for w in alone.warnings)


# Two functions whose arg0 differ in rank: one module-wide `arg0` hint cannot fit both.
TWO_FUNCTIONS = """
func.func @rows(%x: tensor<?x64xf32>, %w: tensor<64x32xf32>) -> tensor<?x32xf32> {
  %c0 = arith.constant 0 : index
  %zero = arith.constant 0.0 : f32
  %m = tensor.dim %x, %c0 : tensor<?x64xf32>
  %e = tensor.empty(%m) : tensor<?x32xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%e : tensor<?x32xf32>) -> tensor<?x32xf32>
  %r = linalg.matmul ins(%x, %w : tensor<?x64xf32>, tensor<64x32xf32>) outs(%acc : tensor<?x32xf32>) -> tensor<?x32xf32>
  return %r : tensor<?x32xf32>
}
func.func @heads(%x: tensor<?x8x16xf32>) -> tensor<?x8x16xf32> {
  %c0 = arith.constant 0 : index
  %n = tensor.dim %x, %c0 : tensor<?x8x16xf32>
  %e = tensor.empty(%n) : tensor<?x8x16xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2) -> (d0, d1, d2)>, affine_map<(d0, d1, d2) -> (d0, d1, d2)>],
                       iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%x : tensor<?x8x16xf32>) outs(%e : tensor<?x8x16xf32>) {
  ^bb0(%a: f32, %o: f32):
    %y = math.exp %a : f32
    linalg.yield %y : f32
  } -> tensor<?x8x16xf32>
  return %r : tensor<?x8x16xf32>
}
"""


@pytest.mark.parametrize("hints, message", [
    (["arg0=32x64"], "shape hint arg0=32x64: arg0 of @heads has rank 3 (tensor<?x8x16xf32>); give 3 dims, "
                     "e.g. arg0=32x8x16; or give each function its own, e.g. heads.arg0=..."),
    (["nope.arg0=4x8x16"], "shape hint nope.arg0=4x8x16: the module has no function @nope; its functions: @heads, @rows"),
    (["heads.arg1=4"], "shape hint heads.arg1=4: @heads has no arg1; its arguments: arg0 tensor<?x8x16xf32>"),
    (["rows.arg0=32x64", "heads.arg0=4x8x16", "arg0=2x64"], "every function's arg0 has a hint of its own "
                                                             "(rows.arg0, heads.arg0); drop arg0"),
    (["heads.arg0=4x8x16", "@heads.arg0=2x8x16"], "shape hint heads.arg0 is given twice"),
    (["rows.arg1=64x32"], "rows.arg1 is static (tensor<64x32xf32>) and needs no hint"),
])
def test_hints_for_one_function_are_checked_against_that_function(hints, message):
    with pytest.raises(ShapeHintError) as err:
        check(TWO_FUNCTIONS, hints=hints)
    assert message in str(err.value)


def test_a_function_qualified_hint_sizes_only_its_function_and_wins_there():
    analysis = analyze(TWO_FUNCTIONS)
    hints = parse_shape_hints(["arg0=32x64", "@heads.arg0=4x8x16"])
    assert hints == {"arg0": [32, 64], "heads.arg0": [4, 8, 16]}
    check_shapes(analysis.module, analysis.graph, hints, {})
    space = build_space(analysis.graph, get_profile("host-cpu"), hints)
    ranges = {op.name: space.shapes.loop_ranges(op) for op in analysis.graph.ops.values()}
    assert ranges["linalg.matmul"] == [32, 32, 64]
    assert ranges["linalg.generic"] == [4, 8, 16]
    assert not space.shapes.defaulted
    # The cost model and the measurement harness read the same names.
    r = tune(TWO_FUNCTIONS, get_profile("host-cpu"), budget=4, strategy="random", workers=0, shape_hints=hints)
    assert not any("shape hint" in w for w in r.warnings), r.warnings
    with_default = tune(TWO_FUNCTIONS, get_profile("host-cpu"), budget=4, strategy="random", workers=0,
                        shape_hints={"rows.arg0": [32, 64]})
    assert any("arg0 dim 0 of @heads" in w for w in with_default.warnings), with_default.warnings
    plan = {"groups": [{"anchor": 1, "fuse": [0], "levels": [{"tile_sizes": [16, 0, 0], "loop": "forall"}]}]}
    hinted = cost_of_plan(TWO_FUNCTIONS, plan, "host-cpu", hints)
    assert hinted["flops"] == 2 * 32 * 32 * 64 + 4 * 8 * 16 and not hinted["notes"], hinted["notes"]
    defaulted = cost_of_plan(TWO_FUNCTIONS, plan, "host-cpu", {"rows.arg0": [32, 64]})
    assert defaulted["flops"] == 2 * 32 * 32 * 64 + 128 * 8 * 16
    assert "arg0 dim 0 of @heads is dynamic and has no shape hint: assumed 128" in defaulted["notes"]
    with context():
        module = ir.Module.parse(TWO_FUNCTIONS)
        funcs = {ir.StringAttr(op.attributes["sym_name"]).value: op for op in module.body.operations}
        assert measured_arguments(funcs["heads"], hints)[0].shape == (4, 8, 16)
        assert measured_arguments(funcs["rows"], hints)[0].shape == (32, 64)


def test_buckets_over_one_function_size_only_that_function():
    analysis = analyze(TWO_FUNCTIONS)
    args = function_arguments(analysis.module)
    check(TWO_FUNCTIONS, buckets=["heads.arg0.0=1,4"])
    assert bucket_hints(analysis.graph, args, "heads.arg0.0", 4, {}) == {"heads.arg0": [4, 8, 16]}
    # A label sizes every dynamic dim; arg0 means different things in the two functions, so each
    # gets its own name, and a module-wide hint still fills the rest of the shape.
    assert bucket_hints(analysis.graph, args, "M", 2, {}) == {"rows.arg0": [2, 64], "heads.arg0": [2, 8, 16]}
    with pytest.raises(ShapeHintError, match="the module has no function @nope; its functions: @heads, @rows"):
        check(TWO_FUNCTIONS, buckets=["nope.arg0=1,4"])
    with pytest.raises(ShapeHintError, match=r"dim 1 of arg0 of @heads \(tensor<\?x8x16xf32>\) is not dynamic; "
                                             r"dynamic dims: heads.arg0.0 \(tensor<\?x8x16xf32>\), rows.arg0.0"):
        check(TWO_FUNCTIONS, buckets=["heads.arg0.1=1,4"])
    r = tune(TWO_FUNCTIONS, get_profile("host-cpu"), budget=8, strategy="random", workers=0,
             buckets=["heads.arg0.0=1,4"], shape_hints=["rows.arg0=16x64"])
    assert [b.shape_hints for b in r.buckets] == [{"rows.arg0": [16, 64], "heads.arg0": [v, 8, 16]} for v in (1, 4)]
