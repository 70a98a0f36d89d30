"""Plans applied to clones: multi-level tile-and-fuse, origin maps, script replay, rejections."""

from __future__ import annotations

import subprocess
import sys

import pytest

from _shared import CORPUS, workload
from service.ir.analysis import analyze
from service.ir.errors import MLIRSyntaxError, PlanError
from service.ir.graph import walk_ops, uid_of
from service.ir.mlir import context, ir, tool_path
from service.ir.plan import Plan
from service.ir.transform import apply_plan


def plan(anchor: int, fuse: list[int], *levels: tuple[list[int], str]) -> Plan:
    return Plan.model_validate(
        {"groups": [{"anchor": anchor, "fuse": fuse, "levels": [{"tile_sizes": s, "loop": k} for s, k in levels]}]}
    )


# One multi-level plan per workload: (anchor, fused ops, levels)
PLANS = {
    "matmul_1024": plan(1, [0], ([256, 256, 0], "forall"), ([8, 32, 0], "for"), ([0, 0, 16], "for")),
    "mlp_chain": plan(1, [0, 2, 3, 4], ([64, 128, 0], "forall"), ([8, 32, 0], "for"), ([0, 0, 16], "for")),
    "multi_consumer": plan(1, [0], ([256, 256], "forall"), ([8, 64], "for")),
    "softmax": plan(4, [2, 3, 5], ([32, 0], "forall"), ([8, 0], "for")),
    "dynamic_matmul": plan(1, [0], ([64, 64, 0], "forall"), ([8, 32, 0], "for"), ([0, 0, 16], "for")),
    "reshape_chain": plan(1, [0], ([8, 32, 0], "forall"), ([2, 8, 0], "for")),
    "attention_scores": plan(1, [0, 2], ([1, 64, 64, 0], "forall"), ([0, 8, 32, 0], "for"), ([0, 0, 0, 16], "for")),
    "conv_relu": plan(1, [0, 2], ([1, 8, 8, 32, 0, 0, 0], "forall"), ([0, 4, 4, 16, 0, 0, 0], "for"), ([0, 0, 0, 0, 1, 1, 16], "for")),
    "fuse_group": plan(1, [0, 2], ([64, 64, 0], "forall"), ([8, 32, 0], "for")),
}


@pytest.mark.parametrize("name", sorted(PLANS))
def test_multi_level_plan_applies_and_fuses(name: str) -> None:
    a = analyze(workload(name))
    before = str(a.tagged)
    applied = apply_plan(a.tagged, PLANS[name], a.graph)
    assert str(a.tagged) == before, "the original (tagged) module must not change"
    applied.module.operation.verify()
    group = PLANS[name].groups[0]
    # every member has a copy inside the level-0 loop, the anchor inside every level's loops
    for uid in group.members:
        copies = applied.origin.copies(uid)
        assert copies.inside, f"op {uid} was not fused into the loop nest"
        assert all(lp[0].startswith("g0.l0") for lp in copies.inside)
    anchor_loops = applied.origin.copies(group.anchor).inside[0]
    levels_used = {name.split(".")[1] for name in anchor_loops}
    assert levels_used == {f"l{i}" for i in range(len(group.levels))}
    # the tiled module holds scf loops and no un-tiled copy of the anchor
    names = {op.name for op in walk_ops(applied.module.operation)}
    assert {"scf.forall", "scf.for"} <= names
    assert not applied.origin.copies(group.anchor).outside


@pytest.mark.parametrize("name", ["mlp_chain", "conv_relu", "reshape_chain"])
def test_script_replays_with_iree_opt(name: str, tmp_path) -> None:
    a = analyze(workload(name))
    applied = apply_plan(a.tagged, PLANS[name], a.graph)
    (tmp_path / "payload.mlir").write_text(str(a.tagged))
    (tmp_path / "script.mlir").write_text(applied.script)
    out = subprocess.run(
        [
            tool_path("iree-opt"),
            str(tmp_path / "payload.mlir"),
            f"--transform-preload-library=transform-library-paths={tmp_path / 'script.mlir'}",
            "--transform-interpreter",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    with context():
        replayed = ir.Module.parse(out.stdout)
    assert str(replayed) == str(applied.module)


def _slices_of_function_arg(module, arg_number: int) -> list[list[int]]:
    sizes = []
    for op in walk_ops(module.operation):
        if op.name != "tensor.extract_slice":
            continue
        src = op.operands[0]
        if isinstance(src, ir.BlockArgument) and src.arg_number == arg_number and src.owner.owner.operation.name == "func.func":
            sizes.append(list(ir.DenseI64ArrayAttr(op.attributes["static_sizes"])))
    return sizes


def test_conv_fused_tile_reads_a_halo() -> None:
    a = analyze(workload("conv_relu"))
    applied = apply_plan(a.tagged, plan(2, [0, 1], ([1, 8, 8, 32], "forall")), a.graph)
    # relu is the anchor and sink; the conv is fused in: its input tile is (8 + 2) x (8 + 2)
    (image_tile,) = _slices_of_function_arg(applied.module, 0)
    assert image_tile == [1, 10, 10, 64]
    (filter_tile,) = _slices_of_function_arg(applied.module, 1)
    assert filter_tile == [3, 3, 64, 32]


def test_multi_consumer_leaves_the_producer_for_the_unfused_consumer() -> None:
    a = analyze(workload("multi_consumer"))
    applied = apply_plan(a.tagged, plan(1, [0], ([64, 64], "for")), a.graph)
    exp = applied.origin.copies(0)
    assert exp.inside and exp.outside  # recomputed inside %b's loop AND still standing for %c
    assert not applied.origin.copies(3).inside  # %c is not tiled
    reduction = next(op for op in walk_ops(applied.module.operation) if uid_of(op) == 3)
    producer = reduction.operands[0].owner
    assert uid_of(producer) == 0 and producer.parent.name == "func.func"
    assert applied.origin.to_json()["0"]["outside"] is True


def test_multi_consumer_with_forall_materialises_the_shared_producer() -> None:
    a = analyze(workload("multi_consumer"))
    applied = apply_plan(a.tagged, plan(1, [0], ([64, 64], "forall")), a.graph)
    exp = applied.origin.copies(0)
    # MLIR yields the fused producer's tiles out of the scf.forall for %c instead of recomputing
    assert not exp.outside and exp.escapes == [True]


def test_fuse_group_split_is_rejected() -> None:
    a = analyze(workload("fuse_group"))
    with pytest.raises(PlanError) as err:
        apply_plan(a.tagged, plan(1, [0], ([64, 64, 0], "forall")), a.graph)
    assert err.value.group == 0
    assert "fuse group 1" in err.value.reason and "[2]" in err.value.reason


def test_reshape_producer_fusion_works_across_expand_shape() -> None:
    a = analyze(workload("reshape_chain"))
    applied = apply_plan(a.tagged, plan(1, [0], ([8, 32, 0], "forall")), a.graph)
    neg = applied.origin.copies(0)
    assert neg.inside and not neg.outside  # no full-size %neg left: fused through the reshape
    expands = [op for op in walk_ops(applied.module.operation) if op.name == "tensor.expand_shape"]
    assert expands and all(op.parent.name == "scf.forall" for op in expands)


def test_reshape_consumer_fusion_is_rejected_naming_the_reshape() -> None:
    a = analyze(workload("reshape_chain"))
    with pytest.raises(PlanError) as err:
        apply_plan(a.tagged, plan(0, [1], ([32, 1024], "forall")), a.graph)
    assert "tensor.expand_shape" in err.value.reason


def test_malformed_plans_are_typed_errors() -> None:
    a = analyze(workload("matmul_1024"))
    with pytest.raises(PlanError, match="3 loop dims"):
        apply_plan(a.tagged, plan(1, [0], ([64, 64], "forall")), a.graph)
    with pytest.raises(PlanError, match="unknown op uid"):
        apply_plan(a.tagged, plan(7, [], ([64, 64, 0], "forall")), a.graph)
    with pytest.raises(PlanError, match="tiles nothing"):
        apply_plan(a.tagged, plan(1, [], ([0, 0, 0], "forall")), a.graph)


def test_plan_mlir_cannot_apply_names_group_and_payload_location() -> None:
    text = (CORPUS / "tile-concat-using-interface__2.mlir").read_text()
    a = analyze(text)
    (concat,) = [op for op in a.graph.ops.values() if op.name == "tensor.concat"]
    with pytest.raises(PlanError) as err:
        apply_plan(a.tagged, plan(concat.uid, [], ([3] * len(concat.loop_ranges), "forall")), a.graph)
    assert err.value.group == 0
    assert "not thread safe" in err.value.reason
    assert any(d.line is not None and d.column is not None for d in err.value.diagnostics)


@pytest.mark.parametrize(
    "text, line, col, needle",
    [
        ("this is not mlir", 1, 1, "unknown"),
        ("func.func @f(%a: tensor<4xf32>) -> tensor<4xf32> {\n  %0 = linalg.exp ins(%a : tensor<4xf32>) outs(%a : tensor<4xf32>) -> tensor<4xf32>\n  return %0 : tensor<4xf32>\n}", 2, 8, "linalg.exp"),
        ("func.func @f(%a: tensor<4xf32>) -> tensor<8xf32> {\n  return %a : tensor<4xf32>\n}", 2, 3, "type"),
    ],
)
def test_bad_input_has_line_and_column(text: str, line: int, col: int, needle: str) -> None:
    with pytest.raises(MLIRSyntaxError) as err:
        analyze(text)
    (diag, *_) = err.value.diagnostics
    assert (diag.line, diag.column) == (line, col)
    assert needle in diag.message


def test_bytecode_input() -> None:
    import io

    a = analyze(workload("matmul_1024"))
    buf = io.BytesIO()
    with context():
        a.module.operation.write_bytecode(buf)
    b = analyze(buf.getvalue())
    assert b.fingerprint == a.fingerprint


def test_a_failed_script_reports_once_in_the_error_not_on_stderr(capfd):
    """Fusing a producer with a semi-affine map (rotary embeddings' rotate-half) yields IR that
    does not verify, and the interpreter also printed that, op dumps included, to stderr: up to
    20 KB a plan in the CLI's output and the server log during a search."""
    src = """
func.func @rot(%x: tensor<128x64xf32>) -> tensor<128x64xf32> {
  %e = tensor.empty() : tensor<128x64xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0, (d1 + 32) mod 64)>, affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]}
      ins(%x, %x : tensor<128x64xf32>, tensor<128x64xf32>) outs(%e : tensor<128x64xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %s = arith.subf %a, %b : f32
    linalg.yield %s : f32
  } -> tensor<128x64xf32>
  %y = linalg.map {math.exp} ins(%r : tensor<128x64xf32>) outs(%e : tensor<128x64xf32>)
  return %y : tensor<128x64xf32>
}"""
    plan = Plan.model_validate({"groups": [{"anchor": 1, "fuse": [0], "levels": [
        {"tile_sizes": [32, 64], "loop": "forall"}, {"tile_sizes": [0, 16], "loop": "for"}]}]})
    with pytest.raises(PlanError, match="does not verify"):
        with context():
            apply_plan(analyze(src).tagged, plan)
    assert capfd.readouterr().err == ""


_TRUSTING_PRINTER = """
import sys
sys.path[:0] = sys.argv[1:3]
from _shared import workload
from test_ir_transform import PLANS
from service.ir.analysis import analyze
from service.ir.mlir import trust_ir_when_printing
from service.ir.transform import apply_plan
a = analyze(workload("mlp_chain"))
before = str(apply_plan(a.tagged, PLANS["mlp_chain"], a.graph).module)
trust_ir_when_printing()
trust_ir_when_printing()  # a second call must not parse LLVM's options again (IREE aborts)
after = str(apply_plan(a.tagged, PLANS["mlp_chain"], a.graph).module)
print(before == after and "scf.forall" in after)
"""


def test_a_printer_trusting_the_ir_applies_and_prints_plans_the_same() -> None:
    # The evaluation workers' printer setting (service.ir.mlir.trust_ir_when_printing) is
    # process-wide, so it is tried in a process of its own.
    from pathlib import Path

    here = Path(__file__).resolve().parent
    out = subprocess.run([sys.executable, "-c", _TRUSTING_PRINTER, str(here), str(here.parent)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "True"
