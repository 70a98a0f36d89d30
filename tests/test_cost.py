"""Cost model over whole modules: which nests are costed, flops, notes, NestMemo
(service/hardware/cost/estimate.py and the nest walk, analyzer.py)."""


from service.hardware.cost import NestMemo, estimate_cost
from service.hardware.profiles import get_profile
from service.ir.analysis import analyze
from service.ir.errors import PlanError
from service.ir.graph import build_graph, tag_tileable_ops
from service.ir.mlir import context
from service.ir.parse import parse_module
from service.ir.plan import Plan
from service.ir.transform import apply_plan, tiled_clone

from _shared import CORPUS, HEAD_MERGE, WORKLOADS


def test_ops_without_indexing_maps_are_costed() -> None:
    """pack / unpack / pad implement TilingInterface without indexing maps (upstream corpus)."""
    costed = set()
    for path in sorted(CORPUS.glob("*pack*.mlir")) + sorted(CORPUS.glob("tile-and-fuse-consumer__*.mlir")):
        a = analyze(path.read_text())
        for op in a.graph.ops.values():
            if op.indexing_maps is not None or not op.loop_ranges or op.loop_ranges[0] in (None, 1):
                continue
            sizes = [1] + [0] * (len(op.loop_ranges) - 1)
            try:
                applied = apply_plan(a.tagged, Plan.model_validate({"groups": [{"anchor": op.uid, "levels": [{"tile_sizes": sizes, "loop": "for"}]}]}), a.graph)
            except PlanError:
                continue
            cost = estimate_cost(applied.module, get_profile("host-cpu"), original=a.tagged)
            assert cost.latency_s > 0
            costed.add(op.name)
    assert {"linalg.pack", "linalg.unpack"} <= costed


def test_function_declarations_are_skipped() -> None:
    """A module with an external func declaration (upstream transform-op-tile test) is costed."""
    a = analyze((CORPUS / "transform-op-tile__1.mlir").read_text())
    (matmul,) = [op for op in a.graph.ops.values() if op.name == "linalg.matmul"]
    plan = Plan.model_validate({"groups": [{"anchor": matmul.uid, "levels": [{"tile_sizes": [32, 32, 0], "loop": "forall"}]}]})
    cost = estimate_cost(apply_plan(a.tagged, plan, a.graph).module, get_profile("host-cpu"), original=a.tagged)
    assert cost.flops == 2 * 128**3


def test_dead_ops_cost_nothing_and_nested_uses_keep_producers_live() -> None:
    """A linalg op nobody uses is not a nest; one used only inside a later loop (an un-fused
    producer read by the loop's extract_slice) is."""
    text = """
func.func @f(%a: tensor<64x64xf32>, %b: tensor<64x64xf32>) -> tensor<64x64xf32> {
  %e = tensor.empty() : tensor<64x64xf32>
  %dead = linalg.map {arith.addf} ins(%a, %b : tensor<64x64xf32>, tensor<64x64xf32>) outs(%e : tensor<64x64xf32>)
  %p = linalg.map {arith.mulf} ins(%a, %b : tensor<64x64xf32>, tensor<64x64xf32>) outs(%e : tensor<64x64xf32>)
  %c = linalg.map {math.exp} ins(%p : tensor<64x64xf32>) outs(%e : tensor<64x64xf32>)
  return %c : tensor<64x64xf32>
}"""
    hw = get_profile("host-cpu")
    with context():
        tagged = tag_tileable_ops(parse_module(text))
        untiled = estimate_cost(tagged, hw)
        # Tile only the exp: the mul stays a top-level op read inside exp's loop.
        tiled = apply_plan(tagged, Plan.model_validate({"groups": [{"anchor": 2, "levels": [{"tile_sizes": [16, 16], "loop": "forall"}]}]})).module
        cost = estimate_cost(tiled, hw)
    assert [n.root_op for n in untiled.nests] == ["linalg.map", "linalg.map"]
    assert untiled.flops == 2 * 64 * 64
    assert [n.root_op for n in cost.nests] == ["linalg.map", "scf.forall"]
    assert cost.unfused_intermediate_bytes == 64 * 64 * 4


def test_values_passed_to_a_call_are_computed() -> None:
    """A call may do anything with its operands: the op producing them is live and costed."""
    text = """
func.func private @consume(tensor<64x64xf32>)
func.func @f(%a: tensor<64x64xf32>) {
  %e = tensor.empty() : tensor<64x64xf32>
  %x = linalg.map {math.exp} ins(%a : tensor<64x64xf32>) outs(%e : tensor<64x64xf32>)
  func.call @consume(%x) : (tensor<64x64xf32>) -> ()
  return
}"""
    with context():
        cost = estimate_cost(tag_tileable_ops(parse_module(text)), get_profile("host-cpu"))
    assert [n.root_op for n in cost.nests] == ["linalg.map"]
    assert cost.flops == 64 * 64


def test_a_defaulted_dynamic_dim_is_a_note_not_a_log_line_per_estimate(caplog) -> None:
    """A search estimates thousands of plans: the assumption is reported in Cost.notes (and once
    by the engine), not logged as a warning by every estimate in every worker."""
    with context():
        module = parse_module((WORKLOADS / "dynamic_matmul.mlir").read_text())
        with caplog.at_level("WARNING"):
            cost = estimate_cost(module, get_profile("host-cpu"))
    assert any("dynamic" in n and "assumed" in n for n in cost.notes)
    assert not [r for r in caplog.records if "assumed" in r.getMessage()]


def test_fusion_across_a_collapse_shape_is_costed() -> None:
    """Fusing a producer through tensor.collapse_shape leaves affine.delinearize_index offsets
    (no `map` attribute, several results): the cost model used to raise KeyError on them."""
    src = HEAD_MERGE
    plan = Plan.model_validate({"groups": [{"anchor": 2, "fuse": [0, 1], "levels": [
        {"tile_sizes": [64, 128, 0], "loop": "for"}, {"tile_sizes": [8, 32, 0], "loop": "for"},
        {"tile_sizes": [0, 0, 1], "loop": "for"}]}]})
    with context():
        tagged = tag_tileable_ops(parse_module(src))
        tiled = apply_plan(tagged, plan).module
        assert "affine.delinearize_index" in str(tiled)
        cost = estimate_cost(tiled, get_profile("host-cpu"))
    assert cost.feasible and cost.latency_s > 0
    assert sorted(u for n in cost.nests for u in n.uids) == [0, 1, 2]


def test_tensor_pad_and_concat_are_priced_as_data_movement() -> None:
    """They implement TilingInterface like linalg ops; the cost model skipped them (a 1 MiB
    concat on a 256 KiB scratchpad was called feasible)."""
    src = """
func.func @f(%a: tensor<256x384xf32>, %b: tensor<256x640xf32>) -> tensor<258x1024xf32> {
  %zero = arith.constant 0.0 : f32
  %cat = tensor.concat dim(1) %a, %b : (tensor<256x384xf32>, tensor<256x640xf32>) -> tensor<256x1024xf32>
  %p = tensor.pad %cat low[1, 0] high[1, 0] {
  ^bb0(%i: index, %j: index):
    tensor.yield %zero : f32
  } : tensor<256x1024xf32> to tensor<258x1024xf32>
  return %p : tensor<258x1024xf32>
}"""
    with context():
        module = parse_module(src)
        host = estimate_cost(module, get_profile("host-cpu"))
        npu = estimate_cost(module, get_profile("npu-sram-256k"))
    assert [n.root_op for n in host.nests] == ["tensor.concat", "tensor.pad"]
    assert host.flops == 0 and all(n.latency_s > 0 for n in host.nests)
    # Each reads and writes its tensors once: 1 MiB in + 1 MiB out for the concat.
    main = host.levels[0]
    assert main.traffic_bytes >= 4 * 256 * 1024 * 4
    assert not npu.feasible and any("tensor.concat" in r for r in npu.reasons)


_PAD_CHAIN = """
#id4 = affine_map<(n, h, w, c) -> (n, h, w, c)>
func.func @pad_chain(%x: tensor<1x64x64x64xf32>, %w1: tensor<1x1x64x256xf32>, %w2: tensor<3x3x256x64xf32>) -> tensor<1x64x64x64xf32> {
  %zero = arith.constant 0.0 : f32
  %e1 = tensor.empty() : tensor<1x64x64x256xf32>
  %f1 = linalg.fill ins(%zero : f32) outs(%e1 : tensor<1x64x64x256xf32>) -> tensor<1x64x64x256xf32>
  %c1 = linalg.conv_2d_nhwc_hwcf {dilations = dense<1> : tensor<2xi64>, strides = dense<1> : tensor<2xi64>}
      ins(%x, %w1 : tensor<1x64x64x64xf32>, tensor<1x1x64x256xf32>) outs(%f1 : tensor<1x64x64x256xf32>) -> tensor<1x64x64x256xf32>
  %r1 = linalg.generic {indexing_maps = [#id4, #id4], iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%c1 : tensor<1x64x64x256xf32>) outs(%e1 : tensor<1x64x64x256xf32>) {
  ^bb0(%v: f32, %o: f32):
    %a = arith.maximumf %v, %zero : f32
    linalg.yield %a : f32
  } -> tensor<1x64x64x256xf32>
  %p = tensor.pad %r1 low[0, 1, 1, 0] high[0, 1, 1, 0] {
  ^bb0(%i0: index, %i1: index, %i2: index, %i3: index):
    tensor.yield %zero : f32
  } : tensor<1x64x64x256xf32> to tensor<1x66x66x256xf32>
  %e2 = tensor.empty() : tensor<1x64x64x64xf32>
  %f2 = linalg.fill ins(%zero : f32) outs(%e2 : tensor<1x64x64x64xf32>) -> tensor<1x64x64x64xf32>
  %c2 = linalg.conv_2d_nhwc_hwcf {dilations = dense<1> : tensor<2xi64>, strides = dense<1> : tensor<2xi64>}
      ins(%p, %w2 : tensor<1x66x66x256xf32>, tensor<3x3x256x64xf32>) outs(%f2 : tensor<1x64x64x64xf32>) -> tensor<1x64x64x64xf32>
  return %c2 : tensor<1x64x64x64xf32>
}"""


def test_producers_fused_through_a_pad_are_priced() -> None:
    """Tiling a tensor.pad guards each tile with scf.if; the ops fused into it (a 1x1 conv and
    its relu, MobileNet-style) were not costed: a searched block ran at 1.5x the CPU's peak."""
    def cost_of(fuse: list[int]):
        plan = Plan.model_validate({"groups": [{"anchor": 5, "fuse": fuse, "levels": [
            {"tile_sizes": [0, 8, 0, 0, 0, 0, 0], "loop": "for"}]}]})
        with context():
            tagged = tag_tileable_ops(parse_module(_PAD_CHAIN))
            tiled = apply_plan(tagged, plan).module
            assert "scf.if" in str(tiled) or fuse == [3, 4]
            return estimate_cost(tiled, get_profile("host-cpu"), original=tagged)

    fused, pad_only = cost_of([0, 1, 2, 3, 4]), cost_of([3, 4])
    assert sorted(u for n in fused.nests for u in n.uids) == [0, 1, 2, 3, 4, 5]
    # The fused 1x1 conv is computed per 8-row tile plus a halo row on each side: more flops.
    assert fused.flops > pad_only.flops and fused.recompute_flops > 0


def test_a_kept_nest_cost_is_what_walking_the_nest_gives_in_another_plan():
    """NestMemo: a group tiling one op and fusing nothing makes the same nest in every plan, so
    the search keeps its cost from one plan for the next. Each plan's cost must still be the full
    walk's (nests, reasons, the unfused bytes the relu reads from the untiled add), and the second
    plan must take the relu's nest from the memo."""
    hw = get_profile("npu-sram-256k")  # the relu's tiles do not fit: its reasons must come with it
    relu_alone = {"anchor": 4, "fuse": [], "levels": [{"tile_sizes": [128, 1024], "loop": "forall"}]}
    plans = [
        [{"anchor": 1, "fuse": [0], "levels": [{"tile_sizes": [64, 64, 0], "loop": "forall"}]}, relu_alone],
        [{"anchor": 1, "fuse": [0], "levels": [{"tile_sizes": [128, 32, 0], "loop": "forall"},
                                               {"tile_sizes": [8, 16, 0], "loop": "for"}]},
         {"anchor": 3, "fuse": [2], "levels": [{"tile_sizes": [64, 512], "loop": "forall"}]}, relu_alone],
    ]
    entries: dict = {}
    with context():
        tagged = tag_tileable_ops(parse_module((WORKLOADS / "mlp_chain.mlir").read_text()))
        graph = build_graph(tagged)
        for groups in plans:
            clone, _, layouts = tiled_clone(tagged, Plan.model_validate({"groups": groups}), graph)
            memo = NestMemo(keys={lay.index: lay.group.anchor for lay in layouts if not lay.group.fuse}, entries=entries)
            kept_before = dict(entries)
            with_memo = estimate_cost(clone, hw, memo=memo)
            walked = estimate_cost(clone, hw)
            assert with_memo == walked
            clone.operation.erase()
        assert list(entries) == [4]
        assert any(n is kept_before[4][0] for n in with_memo.nests)  # the second plan's relu nest was kept
        assert walked.unfused_intermediate_bytes > 0
        assert kept_before[4][0].reasons and set(kept_before[4][0].reasons) <= set(walked.reasons)


_COMPLEX_PRODUCT = """
#id = affine_map<(d0) -> (d0)>
func.func @f(%a: tensor<64xcomplex<f32>>, %b: tensor<64xcomplex<f32>>) -> tensor<64xcomplex<f32>> {
  %e = tensor.empty() : tensor<64xcomplex<f32>>
  %r = linalg.generic {indexing_maps = [#id, #id, #id], iterator_types = ["parallel"]}
      ins(%a, %b : tensor<64xcomplex<f32>>, tensor<64xcomplex<f32>>) outs(%e : tensor<64xcomplex<f32>>) {
  ^bb0(%x: complex<f32>, %y: complex<f32>, %o: complex<f32>):
    %m = complex.mul %x, %y : complex<f32>
    %s = complex.add %m, %x : complex<f32>
    linalg.yield %s : complex<f32>
  } -> tensor<64xcomplex<f32>>
  return %r : tensor<64xcomplex<f32>>
}"""


def test_the_op_graph_and_the_cost_model_count_the_same_flops() -> None:
    """Flops per iteration point have one rule (service.ir.graph.flops_per_point): complex ops
    count, for the graph (op kinds, the search space) and for the cost model alike."""
    with context():
        tagged = tag_tileable_ops(parse_module(_COMPLEX_PRODUCT))
        (op,) = build_graph(tagged).ops.values()
        cost = estimate_cost(tagged, get_profile("host-cpu"))
    assert op.flops_per_point == 2 and op.kind == "elementwise"
    assert cost.flops == 64 * op.flops_per_point


def test_a_tile_larger_than_its_dim_costs_the_dim() -> None:
    """affine.min(64 - iv, 1000) bounds a 1000 tile of a 64 dim: one 64-row tile, not 1000 rows."""
    text = """
func.func @mm(%a: tensor<64x256xf32>, %b: tensor<256x512xf32>) -> tensor<64x512xf32> {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<64x512xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<64x512xf32>) -> tensor<64x512xf32>
  %r = linalg.matmul ins(%a, %b : tensor<64x256xf32>, tensor<256x512xf32>) outs(%f : tensor<64x512xf32>) -> tensor<64x512xf32>
  return %r : tensor<64x512xf32>
}"""
    a = analyze(text)
    costs = []
    for m_tile in (64, 1000):
        plan = Plan.model_validate({"groups": [{"anchor": 1, "fuse": [0], "levels": [{"tile_sizes": [m_tile, 64, 0], "loop": "forall"}]}]})
        costs.append(estimate_cost(apply_plan(a.tagged, plan, a.graph).module, get_profile("host-cpu"), original=a.tagged))
    assert costs[1].flops == costs[0].flops == 2 * 64 * 256 * 512
    assert costs[1].latency_s == costs[0].latency_s
