"""Fingerprints ignore names, locations and attribute order, and see every structural change."""

from __future__ import annotations

from _shared import workload
from service.ir.analysis import analyze


def fp(text: str) -> str:
    return analyze(text).fingerprint


def test_invariant_to_ssa_and_func_names() -> None:
    base = workload("mlp_chain")
    renamed = (
        base.replace("%mm", "%product")
        .replace("%acc", "%accumulator")
        .replace("%x", "%input")
        .replace("@mlp_chain", "@dense_layer_7")
    )
    assert renamed != base
    assert fp(renamed) == fp(base)


def test_invariant_to_locations() -> None:
    base = workload("matmul_1024")
    located = base.replace(
        "-> tensor<1024x1024xf32>\n  return",
        '-> tensor<1024x1024xf32> loc("model.py":12:4)\n  return',
    ).replace("%zero = arith.constant 0.0 : f32", '%zero = arith.constant 0.0 : f32 loc(#loc1)')
    located = "#loc1 = loc(\"layer.cc\":3:9)\n" + located
    assert located.count("loc(") == 3
    assert fp(located) == fp(base)


def test_invariant_to_attribute_order() -> None:
    base = workload("matmul_1024").replace("linalg.matmul ins", "linalg.matmul {a.x = 1 : i64, b.y = 2 : i64} ins")
    swapped = workload("matmul_1024").replace("linalg.matmul ins", "linalg.matmul {b.y = 2 : i64, a.x = 1 : i64} ins")
    assert fp(base) == fp(swapped)


def test_sensitive_to_a_dim() -> None:
    base = workload("mlp_chain")
    assert fp(base.replace("2048", "1024")) != fp(base)


def test_sensitive_to_an_indexing_map() -> None:
    # the reduction's output map (d0, d1) -> (d0) becomes (d0, d1) -> (d1): same types, other map
    mc = workload("multi_consumer")
    assert fp(mc.replace("#row = affine_map<(d0, d1) -> (d0)>", "#row = affine_map<(d0, d1) -> (d1)>")) != fp(mc)


def test_sensitive_to_iterator_types_element_types_and_bodies() -> None:
    mc = workload("multi_consumer")
    assert fp(mc.replace("%s = arith.mulf %v, %v : f32", "%s = arith.addf %v, %v : f32")) != fp(mc)
    sm = workload("softmax")
    assert fp(sm.replace("f32", "f16").replace("0xFF800000", "0xFC00")) != fp(sm)
    ew = workload("attention_scores")
    assert fp(ew.replace("%m = arith.mulf %v, %scale : f32", "%m = arith.divf %v, %scale : f32")) != fp(ew)


def test_op_signatures_are_structural() -> None:
    graph = analyze(workload("softmax")).graph
    # the two 512-element fills differ only in the constant they write: same structure
    assert graph.op(0).signature == graph.op(3).signature
    assert graph.op(1).signature != graph.op(4).signature  # max vs sum bodies
    a = analyze(workload("matmul_1024")).graph.op(1).signature
    b = analyze(workload("matmul_1024").replace("@matmul_1024", "@other").replace("%a", "%lhs")).graph.op(1).signature
    assert a == b
