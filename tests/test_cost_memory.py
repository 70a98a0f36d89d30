"""Cost model, memory terms: footprints per loop depth, traffic per level, un-fused
intermediates, halos, scratchpad overflow (service/hardware/cost/memory.py)."""

import pytest

from service.hardware.cost import estimate_cost
from service.hardware.profiles import get_profile
from service.ir.graph import tag_tileable_ops
from service.ir.mlir import context
from service.ir.parse import parse_module
from service.ir.plan import Plan
from service.ir.transform import apply_plan

from _cost_plans import GOOD_MATMUL, cost_of, matmul_plan
from _shared import HEAD_MERGE, WORKLOADS


def test_matmul_flops_and_l1_tile():
    c = cost_of("matmul_1024", 1, [0], GOOD_MATMUL)
    assert c.feasible and c.reasons == []
    assert c.flops == pytest.approx(2 * 1024**3)
    l1 = next(lv for lv in c.levels if lv.name == "L1")
    assert l1.footprint_bytes == (8 * 16 + 16 * 32 + 8 * 32) * 4  # A, B, C tiles of one k step
    dram = c.levels[0]
    assert dram.traffic_bytes >= 3 * 1024 * 1024 * 4  # at least A, B read and C written once
    assert c.latency_s > c.flops / get_profile("host-cpu").compute.peak_flops_per_s["f32"] * 0.99


def test_tile_overflowing_l1_is_slower():
    fits = cost_of("matmul_1024", 1, [0], GOOD_MATMUL)
    overflows = cost_of("matmul_1024", 1, [0], [([64, 64, 0], "forall"), ([8, 32, 0], "for")])  # 8x1024 + 1024x32
    assert any("L1 overflow" in n for n in overflows.notes)
    assert overflows.latency_s > 1.5 * fits.latency_s


def test_npu_infeasible_when_tile_exceeds_sram():
    small = cost_of("matmul_1024", 1, [0], GOOD_MATMUL, hw="npu-sram-256k")
    assert small.feasible
    big = cost_of("matmul_1024", 1, [0], [([256, 256, 0], "forall")], hw="npu-sram-256k")
    assert not big.feasible
    assert any(r.startswith("SRAM overflow") and "> 256 KiB" in r for r in big.reasons)


def test_fused_chain_footprint_is_live_set_not_max_op():
    # relu(add(matmul(fill), broadcast(bias))) fused into one forall over 64x128 output tiles.
    c = cost_of("mlp_chain", 4, [3, 2, 1, 0], [([64, 128], "forall")])
    forall = c.nests[0].loops[0]
    a, b, dest, bias = 64 * 512 * 4, 512 * 128 * 4, 64 * 128 * 4, 128 * 4
    max_single_op = a + b + dest  # the matmul's operands: a max over ops
    live_intermediates = 3 * dest  # at the add: matmul tile, broadcast tile and the add's own result
    assert forall["footprint_bytes"] == a + b + dest + bias + live_intermediates
    assert forall["footprint_bytes"] > max_single_op


def test_unfused_intermediate_goes_through_main_memory():
    fused = cost_of("mlp_chain", 4, [3, 2, 1, 0], [([64, 128], "forall")])
    unfused = cost_of("mlp_chain", 1, [0], [([64, 128, 0], "forall")])  # add/relu stay outside
    assert fused.unfused_intermediate_bytes == 0
    assert unfused.unfused_intermediate_bytes >= 256 * 2048 * 4
    assert unfused.levels[0].traffic_bytes > fused.levels[0].traffic_bytes + 2 * 256 * 2048 * 4
    assert len(unfused.nests) > len(fused.nests) == 1


def test_conv_halo_rereads_input_rows():
    # relu tiled over 4 output rows x 32 channels with the conv fused: each conv input tile has
    # 4 + 2 rows, so the image is fetched with halos (and once per channel tile).
    c = cost_of("conv_relu", 2, [1, 0], [([1, 4, 0, 32], "forall")], hw="npu-sram-256k")
    assert c.feasible, c.reasons
    tiles_h, tiles_c = 56 // 4, 64 // 32
    image_tile = 1 * (4 + 2) * 58 * 64 * 4
    image_bytes = 58 * 58 * 64 * 4
    assert c.levels[0].traffic_bytes >= tiles_h * tiles_c * image_tile
    assert tiles_h * image_tile > image_bytes  # the halo alone re-reads rows
    assert c.flops == pytest.approx(2 * 56 * 56 * 64 * 3 * 3 * 64 + 56 * 56 * 64)
    assert c.recompute_flops == 0  # the fused conv computes each output point once


def test_a_tensor_read_whole_inside_a_loop_counts_in_its_footprint() -> None:
    """After fusion through a collapse_shape (N untiled) the matmul reads the whole 2.25 MiB
    weight inside the loop, with no extract_slice: the scratchpad check left it out."""
    plan = Plan.model_validate({"groups": [{"anchor": 2, "fuse": [0, 1], "levels": [{"tile_sizes": [16, 0, 0], "loop": "for"}]}]})
    with context():
        tiled = apply_plan(tag_tileable_ops(parse_module(HEAD_MERGE)), plan).module
        cost = estimate_cost(tiled, get_profile("npu-sram-256k"))
    loop = next(n for n in cost.nests if n.root_op == "scf.for")
    assert max(lp["footprint_bytes"] for lp in loop.loops) >= 768 * 768 * 4
    assert not cost.feasible and loop.reasons


def test_a_loop_nests_output_is_written_once() -> None:
    """A nest's result is the tiles it inserts into its destination; it was also counted as a
    whole write of the result, doubling the output in the footprint and the traffic (attention
    scores: 18 MiB from main memory for 1 + 1 MiB in and 8 MiB out, and with the footprint over
    the L3 share every tile's re-reads charged to DRAM, which made small tiles look slow)."""
    hw = get_profile("host-cpu")
    with context():
        tagged = tag_tileable_ops(parse_module((WORKLOADS / "attention_scores.mlir").read_text()))
        for dist, vec in (([2, 0, 0, 0], [0, 8, 16, 0]), ([1, 64, 64, 0], [1, 8, 16, 0])):
            plan = Plan.model_validate({"groups": [{"anchor": 1, "fuse": [0, 2], "levels": [
                {"tile_sizes": dist, "loop": "forall"}, {"tile_sizes": vec, "loop": "for"},
                {"tile_sizes": [0, 0, 0, 16], "loop": "for"}]}]})
            (nest,) = estimate_cost(apply_plan(tagged, plan).module, hw).nests
            dram = nest.levels[0]
            assert dram.footprint_bytes == pytest.approx((1 + 1 + 8) << 20, rel=1e-3)
            assert dram.traffic_bytes == pytest.approx((1 + 1 + 8) << 20, rel=1e-3)


def test_a_loop_that_computes_its_result_whole_still_writes_it() -> None:
    """Counting a nest's output at its insert_slices must not lose the output of a loop that
    has none (a pre-tiled input carrying a whole tensor through iter_args)."""
    text = """
#id = affine_map<(d0, d1) -> (d0, d1)>
func.func @f(%x: tensor<1024x1024xf32>) -> tensor<1024x1024xf32> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c4 = arith.constant 4 : index
  %r = scf.for %i = %c0 to %c4 step %c1 iter_args(%acc = %x) -> (tensor<1024x1024xf32>) {
    %e = tensor.empty() : tensor<1024x1024xf32>
    %y = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
        ins(%acc : tensor<1024x1024xf32>) outs(%e : tensor<1024x1024xf32>) {
    ^bb0(%v: f32, %o: f32):
      %n = arith.negf %v : f32
      linalg.yield %n : f32
    } -> tensor<1024x1024xf32>
    scf.yield %y : tensor<1024x1024xf32>
  }
  return %r : tensor<1024x1024xf32>
}"""
    with context():
        (nest,) = estimate_cost(parse_module(text), get_profile("host-cpu")).nests
    assert nest.levels[0].footprint_bytes >= 4 << 20


def _with_l3(mib: int):
    hw = get_profile("host-cpu")
    levels = [lv.model_copy(update={"capacity_bytes": mib << 20, "shared": True}) if lv.name == "L3" else lv
              for lv in hw.memory_levels]
    assert any(lv.name == "L3" for lv in levels), "the host profile has an L3"
    return hw.model_copy(update={"memory_levels": levels, "compute": hw.compute.model_copy(update={"cores": 2})})


def test_a_shared_cache_holds_what_all_cores_touch_together():
    """1024x2304x768 (A 3 MiB, B 6.75 MiB, C 9 MiB: 19 MiB in all). In a 32 MiB L3 shared by two
    cores everything stays after its first touch, whatever the workgroup tile: small tiles re-read
    A and B from L3, not DRAM (measured on a Zen 4: [16, 64] as fast as [256, 256], broad corpus).
    In an 8 MiB L3 they do go back to DRAM."""
    text = """
func.func @f(%a: tensor<1024x768xf32>, %b: tensor<768x2304xf32>) -> tensor<1024x2304xf32> {
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<1024x2304xf32>
  %c = linalg.fill ins(%z : f32) outs(%e : tensor<1024x2304xf32>) -> tensor<1024x2304xf32>
  %r = linalg.matmul ins(%a, %b : tensor<1024x768xf32>, tensor<768x2304xf32>) outs(%c : tensor<1024x2304xf32>) -> tensor<1024x2304xf32>
  return %r : tensor<1024x2304xf32>
}"""
    def dram(dist: list[int], l3_mib: int) -> int:
        with context():
            tagged = tag_tileable_ops(parse_module(text))
            cost = estimate_cost(apply_plan(tagged, matmul_plan(dist, [8, 16], 16)).module, _with_l3(l3_mib))
        return cost.levels[0].traffic_bytes

    assert dram([16, 64], 32) < 1.2 * dram([256, 256], 32)
    assert dram([16, 64], 8) > 3 * dram([256, 256], 8)


def test_a_nest_on_one_core_draws_only_its_share_of_a_shared_level():
    """One workgroup (an untiled distribution) runs on one core, which keeps only its share of
    misses in flight: a DRAM-bound GEMV is not as fast on one core as on two (the search picked
    a single-workgroup plan for gpt2's c_attn at one token, measured 5x slower than IREE's)."""
    text = """
func.func @f(%a: tensor<1x4096xf32>, %b: tensor<4096x4096xf32>) -> tensor<1x4096xf32> {
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<1x4096xf32>
  %c = linalg.fill ins(%z : f32) outs(%e : tensor<1x4096xf32>) -> tensor<1x4096xf32>
  %r = linalg.matmul ins(%a, %b : tensor<1x4096xf32>, tensor<4096x4096xf32>) outs(%c : tensor<1x4096xf32>) -> tensor<1x4096xf32>
  return %r : tensor<1x4096xf32>
}"""
    hw = _with_l3(32)

    def dram_s(dist: list[int]) -> float:
        with context():
            tagged = tag_tileable_ops(parse_module(text))
            cost = estimate_cost(apply_plan(tagged, matmul_plan(dist, [1, 16], 16)).module, hw)
        return cost.levels[0].time_s

    assert dram_s([0, 0]) > 1.8 * dram_s([0, 256])


def test_a_register_tile_reading_a_line_of_each_row_of_b_loses_the_next_line_to_l1_sets(monkeypatch):
    """A 1 x 16 f32 register tile over B stored [k, n] reads one cache line of each of B's rows a
    step, walking all K rows for it; the next tile needs the next line of every row, in L1 only if
    it survived the walk. Rows a whole number of lines apart fall in sets / gcd(pitch, sets) of
    L1's sets: one core reading a matrix so (benchmarks/probes/row_runs.c, Intel Xeon f6 m167, 768
    rows) got 0.33-0.41 of the bandwidth of 64 floats a row visit at pitches of 144, 172 and 176
    lines, and all of it at 169, 171 and 173. GPT-2's c_attn at one token (pitch 2304 floats, 144
    lines) ran 1.5-2.5x slower with IREE's 1 x 16 than with 1 x 64 on all five CPUs measured."""
    from service.hardware.cost import registers
    from _shared import matmul_module, reference_host

    hw = reference_host()  # L1 48 KiB, 12 ways: 64 sets

    def latency(layout: str, n: int, vec: list[int], k: int = 768) -> float:
        with context():
            tagged = tag_tileable_ops(parse_module(matmul_module(layout, m=1, n=n, k=k)))
            return estimate_cost(apply_plan(tagged, matmul_plan([1, 64], vec, 16)).module, hw).latency_s

    narrow, wide = latency("kn", 2304, [1, 16]), latency("kn", 2304, [1, 64])
    assert narrow > 1.5 * wide  # 768 rows in 4 sets of 12 ways
    assert latency("kn", 2320, [1, 16]) < 1.1 * latency("kn", 2320, [1, 64])  # 145 lines: every set
    assert latency("kn", 2304, [1, 16], k=32) < 1.1 * latency("kn", 2304, [1, 64], k=32)  # 32 rows fit 4 sets
    nk = latency("nk", 2304, [1, 16])
    monkeypatch.setattr(registers, "_NARROW_WALK_EFFICIENCY", 1.0)  # the term off
    assert latency("kn", 2304, [1, 16]) < 1.1 * wide  # it alone told the two apart
    assert latency("nk", 2304, [1, 16]) == pytest.approx(nk)  # B read along k: never applies
