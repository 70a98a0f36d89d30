"""Op graph: tileable ops, iteration domains, DAG edges and fuse groups on the shared workloads."""

from __future__ import annotations

import pytest

from _shared import CORPUS, workload
from service.ir.analysis import analyze

# name -> [(op name, loop ranges, iterator types as p/r)] in program order
EXPECTED = {
    "matmul_1024": [("linalg.fill", [1024, 1024], "pp"), ("linalg.matmul", [1024, 1024, 1024], "ppr")],
    "mlp_chain": [
        ("linalg.fill", [256, 2048], "pp"),
        ("linalg.matmul", [256, 2048, 512], "ppr"),
        ("linalg.broadcast", [256, 2048], "pp"),
        ("linalg.map", [256, 2048], "pp"),
        ("linalg.generic", [256, 2048], "pp"),
    ],
    "multi_consumer": [
        ("linalg.generic", [2048, 2048], "pp"),
        ("linalg.generic", [2048, 2048], "pp"),
        ("linalg.fill", [2048], "p"),
        ("linalg.generic", [2048, 2048], "pr"),
    ],
    "softmax": [
        ("linalg.fill", [512], "p"),
        ("linalg.generic", [512, 4096], "pr"),
        ("linalg.generic", [512, 4096], "pp"),
        ("linalg.fill", [512], "p"),
        ("linalg.generic", [512, 4096], "pr"),
        ("linalg.generic", [512, 4096], "pp"),
    ],
    "dynamic_matmul": [("linalg.fill", [None, 1024], "pp"), ("linalg.matmul", [None, 1024, 1024], "ppr")],
    "reshape_chain": [("linalg.generic", [128, 4096], "pp"), ("linalg.generic", [32, 128, 128], "ppp")],
    "attention_scores": [
        ("linalg.fill", [8, 512, 512], "ppp"),
        ("linalg.batch_matmul", [8, 512, 512, 64], "pppr"),
        ("linalg.generic", [8, 512, 512], "ppp"),
    ],
    "conv_relu": [
        ("linalg.fill", [1, 56, 56, 64], "pppp"),
        ("linalg.conv_2d_nhwc_hwcf", [1, 56, 56, 64, 3, 3, 64], "pppprrr"),
        ("linalg.generic", [1, 56, 56, 64], "pppp"),
    ],
    "fuse_group": [
        ("linalg.fill", [512, 1024], "pp"),
        ("linalg.matmul", [512, 1024, 1024], "ppr"),
        ("linalg.generic", [512, 1024], "pp"),
    ],
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_workload_ops_and_ranges(name: str) -> None:
    graph = analyze(workload(name)).graph
    got = [
        (op.name, op.loop_ranges, "".join(t[0] for t in op.iterator_types))
        for op in (graph.op(u) for u in graph.topological_order())
    ]
    assert got == EXPECTED[name]
    assert sorted(graph.ops) == list(range(len(EXPECTED[name])))


def test_mlp_chain_edges_and_kinds() -> None:
    graph = analyze(workload("mlp_chain")).graph
    edges = {(e.producer, e.consumer, e.operand) for e in graph.edges}
    # fill -> matmul's init (operand 2), matmul -> add, broadcast -> add, add -> relu
    assert edges == {(0, 1, 2), (1, 3, 0), (2, 3, 1), (3, 4, 0)}
    assert [graph.op(u).kind for u in range(5)] == ["fill", "contraction", "data_movement", "elementwise", "elementwise"]
    assert graph.op(1).flops_per_point == 2  # mulf + addf
    assert graph.op(0).flops_per_point == 0
    assert graph.upstream(4) == {0, 1, 2, 3}
    assert graph.downstream(0) == {1, 3, 4}


def test_softmax_flops_and_reductions() -> None:
    graph = analyze(workload("softmax")).graph
    assert graph.op(2).flops_per_point == 2  # subf + exp
    assert graph.op(1).reduction_dims == [1]
    assert graph.op(1).kind == "reduction"


@pytest.mark.parametrize("name, uid, batch", [
    ("attention_scores", 1, [0]),  # batch_matmul: the head dim is read by Q, K^T and the scores
    ("matmul_1024", 1, []),  # M is not read by B, N not by A
    ("conv_relu", 1, []),  # the filter reads no image dim
    ("mlp_chain", 3, [0, 1]),  # an elementwise add: every dim
])
def test_batch_dims_are_the_parallel_dims_every_operand_reads(name: str, uid: int, batch: list[int]) -> None:
    assert analyze(workload(name)).graph.op(uid).batch_dims == batch


def test_conv_is_convolution() -> None:
    graph = analyze(workload("conv_relu")).graph
    assert graph.op(1).kind == "convolution"


def test_dynamic_dim_names_the_argument_that_sizes_it() -> None:
    graph = analyze(workload("dynamic_matmul")).graph
    for uid in (0, 1):
        dyn = graph.op(uid).dynamic_dims
        assert set(dyn) == {0}
        assert dyn[0].arg_index == 0 and dyn[0].dim == 0 and dyn[0].value == "%arg0"


def test_edge_through_reshape_is_listed() -> None:
    graph = analyze(workload("reshape_chain")).graph
    (edge,) = graph.edges
    assert (edge.producer, edge.consumer) == (0, 1)
    assert edge.via == ("tensor.expand_shape",)
    assert graph.non_tileable_on_edges == ["tensor.expand_shape"]


@pytest.mark.parametrize("attr", ["tilesearch.fuse_group", "torq-fuse-group"])
def test_fuse_groups_from_either_attribute(attr: str) -> None:
    text = workload("fuse_group").replace("tilesearch.fuse_group", f'"{attr}"')
    graph = analyze(text).graph
    assert graph.fuse_groups == {1: [0, 1, 2]}


def test_non_linalg_tileable_ops_come_from_the_interface() -> None:
    """linalg.pack / unpack / tensor.pad have no indexing maps but implement TilingInterface."""
    seen: dict[str, list] = {}
    for path in sorted(CORPUS.glob("*.mlir")):
        graph = analyze(path.read_text()).graph
        for op in graph.ops.values():
            seen.setdefault(op.name, op.loop_ranges)
    assert {"linalg.pack", "linalg.unpack", "tensor.pad"} <= set(seen)
    assert "tensor.expand_shape" not in seen and "tensor.empty" not in seen


_SHARED_FILL = """
func.func @shared(%a: tensor<64x32xf32>, %b: tensor<32x16xf32>, %c: tensor<64x32xf32>) -> (tensor<64x16xf32>, tensor<64x16xf32>, tensor<64x16xf32>) {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<64x16xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<64x16xf32>) -> tensor<64x16xf32>
  %m1 = linalg.matmul ins(%a, %b : tensor<64x32xf32>, tensor<32x16xf32>) outs(%f : tensor<64x16xf32>) -> tensor<64x16xf32>
  %m2 = linalg.matmul ins(%c, %b : tensor<64x32xf32>, tensor<32x16xf32>) outs(%f : tensor<64x16xf32>) -> tensor<64x16xf32>
  %s = linalg.map {arith.addf} ins(%f, %f : tensor<64x16xf32>, tensor<64x16xf32>) outs(%e : tensor<64x16xf32>)
  return %m1, %m2, %s : tensor<64x16xf32>, tensor<64x16xf32>, tensor<64x16xf32>
}
"""


def test_a_shared_fill_gets_a_copy_per_reader() -> None:
    """One fill read by three ops (two of its uses in one op): the first reader keeps it, the
    other two get a copy next to them, tagged with the original's uid; the input is untouched
    and the tagged module still verifies."""
    a = analyze(_SHARED_FILL)
    ops = sorted(a.graph.ops.values(), key=lambda op: op.uid)
    assert [(op.name, op.copy_of) for op in ops] == [
        ("linalg.fill", None), ("linalg.matmul", None),
        ("linalg.fill", 0), ("linalg.matmul", None),
        ("linalg.fill", 0), ("linalg.map", None),
    ]
    assert [op.producers for op in ops if op.name != "linalg.fill"] == [[0], [2], [4]]
    assert a.tagged.operation.verify()
    assert str(a.module).count("linalg.fill") == 1
    assert analyze(_SHARED_FILL).graph.to_json() == a.graph.to_json()  # deterministic
