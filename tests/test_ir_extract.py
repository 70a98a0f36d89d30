"""Extracts: one group's ops alone in a module, with the rest of the function cut away."""

from __future__ import annotations

import pytest

from service.ir.analysis import analyze
from service.ir.extract import NotExtractable, extract_ops
from service.ir.graph import build_graph, uid_of, walk_ops
from service.ir.mlir import context

from _shared import HEAD_MERGE, WORKLOADS


def body_ops(module) -> list:
    func = next(op for op in module.regions[0].blocks[0].operations if op.operation.name == "func.func" and op.regions[0].blocks)
    return list(func.regions[0].blocks[0].operations)


def test_extract_keeps_the_group_and_reads_its_results_where_outside_ops_did():
    a = analyze((WORKLOADS / "softmax.mlir").read_text())
    # uids: 0 fill, 1 max, 2 exp, 3 fill, 4 sum, 5 divide. The sum group reads exp's result and
    # its result is read by the divide, after it.
    extract = extract_ops(a.tagged, {3, 4})
    with context():
        tagged = sorted(u for op in walk_ops(extract.operation) if (u := uid_of(op)) is not None)
        names = [op.operation.name for op in body_ops(extract)]
        text = str(extract)
    assert tagged == [3, 4]
    assert build_graph(extract).topological_order() == [3, 4]
    # exp's result enters as a new argument; the divide's read of sum becomes a call after sum.
    assert names[-2:] == ["func.call", "func.return"]
    assert names.index("linalg.generic") < names.index("func.call")
    assert "func.func private @__tilesearch_outside_use_" in text
    # The original module is untouched.
    assert sorted(a.graph.ops) == [0, 1, 2, 3, 4, 5]


def test_dynamic_tensors_entering_the_group_cannot_be_extracted():
    a = analyze("""
func.func @f(%x: tensor<?x64xf32>) -> tensor<?x64xf32> {
  %c0 = arith.constant 0 : index
  %n = tensor.dim %x, %c0 : tensor<?x64xf32>
  %e = tensor.empty(%n) : tensor<?x64xf32>
  %a = linalg.map {math.exp} ins(%x : tensor<?x64xf32>) outs(%e : tensor<?x64xf32>)
  %b = linalg.map {math.absf} ins(%a : tensor<?x64xf32>) outs(%e : tensor<?x64xf32>)
  return %b : tensor<?x64xf32>
}""")
    with pytest.raises(NotExtractable, match="dynamically shaped"):
        extract_ops(a.tagged, {1})


# A group op reading two tensors from outside ops, one of which (the transpose) is located after
# the other's use was rewritten: attention's Q x K^T. Rewriting an operand changes the op's hash
# in these bindings, so a lookup after the first rewrite missed the second use and left it
# pointing at an erased op: the process segfaulted.
_TWO_OUTSIDE_INPUTS = """
func.func @scores(%x: tensor<64x32xf32>, %w: tensor<32x32xf32>) -> tensor<64x64xf32> {
  %zero = arith.constant 0.0 : f32
  %e0 = tensor.empty() : tensor<64x32xf32>
  %f0 = linalg.fill ins(%zero : f32) outs(%e0 : tensor<64x32xf32>) -> tensor<64x32xf32>
  %q = linalg.matmul ins(%x, %w : tensor<64x32xf32>, tensor<32x32xf32>) outs(%f0 : tensor<64x32xf32>) -> tensor<64x32xf32>
  %et = tensor.empty() : tensor<32x64xf32>
  %kt = linalg.transpose ins(%q : tensor<64x32xf32>) outs(%et : tensor<32x64xf32>) permutation = [1, 0]
  %e1 = tensor.empty() : tensor<64x64xf32>
  %f1 = linalg.fill ins(%zero : f32) outs(%e1 : tensor<64x64xf32>) -> tensor<64x64xf32>
  %s = linalg.matmul ins(%q, %kt : tensor<64x32xf32>, tensor<32x64xf32>) outs(%f1 : tensor<64x64xf32>) -> tensor<64x64xf32>
  return %s : tensor<64x64xf32>
}"""


def _extract_text(source: str, uids: list[int]) -> str:
    with context():
        return str(extract_ops(analyze(source).tagged, set(uids)))


def test_every_outside_input_of_a_group_op_becomes_an_argument():
    from service.ir.sandbox import Sandbox

    # uids: 0 fill, 1 matmul (q), 2 transpose, 3 fill, 4 matmul (scores)
    with Sandbox(workers=1) as sandbox:
        text = sandbox.run(_extract_text, _TWO_OUTSIDE_INPUTS, [3, 4], timeout=60)
    extract = analyze(text)
    assert sorted(extract.graph.ops) == [0, 1]  # fill + matmul, re-tagged
    with context():
        func = next(op for op in extract.tagged.regions[0].blocks[0].operations if op.operation.name == "func.func")
        matmul = next(op for op in walk_ops(extract.tagged.operation) if op.name == "linalg.matmul")
        ins = list(matmul.operands)[:2]
        # q and q^T both arrive as arguments (after the original two).
        args = list(func.regions[0].blocks[0].arguments)
        assert len(args) == 4 and all(v in args[2:] for v in ins)


def test_a_group_fused_through_a_reshape_is_not_extracted():
    """Fusion through a collapse_shape uses rewrite patterns applied to the whole function, which
    also rewrite the other groups' nests: the rest of the module would not stay constant."""
    a = analyze(HEAD_MERGE)
    with pytest.raises(NotExtractable, match="fused through tensor.collapse_shape"):
        extract_ops(a.tagged, {0, 1, 2})
    assert extract_ops(a.tagged, {1, 2}) is not None  # the matmul alone is fine


_TWO_FUNCTIONS = """
#id = affine_map<(d0, d1) -> (d0, d1)>
func.func private @dense(%x: tensor<256x512xf32>, %w: tensor<512x512xf32>) -> tensor<256x512xf32> {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<256x512xf32>
  %a = linalg.fill ins(%zero : f32) outs(%e : tensor<256x512xf32>) -> tensor<256x512xf32>
  %m = linalg.matmul ins(%x, %w : tensor<256x512xf32>, tensor<512x512xf32>) outs(%a : tensor<256x512xf32>) -> tensor<256x512xf32>
  return %m : tensor<256x512xf32>
}
func.func @model(%x: tensor<256x512xf32>, %w1: tensor<512x512xf32>, %w2: tensor<512x512xf32>) -> tensor<256x512xf32> {
  %h = func.call @dense(%x, %w1) : (tensor<256x512xf32>, tensor<512x512xf32>) -> tensor<256x512xf32>
  %e = tensor.empty() : tensor<256x512xf32>
  %sq = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%h : tensor<256x512xf32>) outs(%e : tensor<256x512xf32>) {
  ^bb0(%v: f32, %o: f32):
    %s = arith.mulf %v, %v : f32
    linalg.yield %s : f32
  } -> tensor<256x512xf32>
  %y = func.call @dense(%sq, %w2) : (tensor<256x512xf32>, tensor<512x512xf32>) -> tensor<256x512xf32>
  return %y : tensor<256x512xf32>
}"""


def test_the_other_functions_of_an_extract_are_declarations():
    """Their ops belong to the rest of the module: left in the extract, they were priced (and
    their scratchpad overflows counted) with every candidate of the group."""
    a = analyze(_TWO_FUNCTIONS)  # uids: 0 fill, 1 matmul (@dense), 2 generic (@model)
    for uids, kept in (({0, 1}, "dense"), ({2}, "model")):
        extract = extract_ops(a.tagged, uids)
        with context():
            funcs = {str(op.attributes["sym_name"]).strip('"'): bool(op.regions[0].blocks)
                     for op in extract.regions[0].blocks[0].operations if op.operation.name == "func.func"}
            tagged = sorted(u for op in walk_ops(extract.operation) if (u := uid_of(op)) is not None)
        assert tagged == sorted(uids)
        assert {name for name, has_body in funcs.items() if has_body} == {kept}
        assert {"dense", "model"} <= set(funcs)  # calls to the other function still resolve


def test_ops_nested_in_loops_are_not_extracted_and_the_reason_says_so():
    a = analyze("""
func.func @f(%x: tensor<64x64xf32>) -> tensor<64x64xf32> {
  %c0 = arith.constant 0 : index
  %c64 = arith.constant 64 : index
  %c8 = arith.constant 8 : index
  %r = scf.for %i = %c0 to %c64 step %c8 iter_args(%acc = %x) -> (tensor<64x64xf32>) {
    %s = tensor.extract_slice %acc[%i, 0] [8, 64] [1, 1] : tensor<64x64xf32> to tensor<8x64xf32>
    %e = linalg.map {math.exp} ins(%s : tensor<8x64xf32>) outs(%s : tensor<8x64xf32>)
    %u = tensor.insert_slice %e into %acc[%i, 0] [8, 64] [1, 1] : tensor<8x64xf32> into tensor<64x64xf32>
    scf.yield %u : tensor<64x64xf32>
  }
  return %r : tensor<64x64xf32>
}""")
    with pytest.raises(NotExtractable, match="nested in loops or other regions"):
        extract_ops(a.tagged, {0})
