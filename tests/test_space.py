"""The candidate space: groups (fuse groups, multi-consumer producers), knobs and their values,
and the plans they make."""

from __future__ import annotations

import random

import pytest

from service.hardware.profiles import get_profile
from service.ir.analysis import analyze
from service.ir.errors import PlanError
from service.ir.plan import Plan
from service.ir.transform import check_plan
from service.search.engine import tune
from service.search.knobs import KnobName, fuse_knob, group_name, group_of, loop_knob, tile_knob
from service.search.space import build_space
from service.search.tile_sizes import is_dense_pixel_contraction, vectorizes_first_input

from _shared import first_input_vectors_matmul, matmul_module, nchw_1x1_generic, workload as source


def evaluated_plans(result) -> list[Plan]:
    return [Plan.model_validate(t.plan) for t in result.trials if t.plan is not None]


def test_fuse_groups_never_split(host):
    graph = analyze(source("fuse_group")).graph
    members = set(graph.fuse_groups[1])
    space = build_space(graph, host)
    assert any(set([g.anchor, *g.fixed]) >= members for g in space.groups)
    r = tune(source("fuse_group"), host, budget=20, strategy="tpe", seed=0, workers=0)
    for plan in evaluated_plans(r) + [Plan.model_validate(r.plan)]:
        for g in plan.groups:
            inside = members & set(g.members)
            assert not inside or inside == members, plan.canonical_json()
    assert r.feasible


def test_multi_consumer_producer_is_tiled_or_charged(host):
    graph = analyze(source("multi_consumer")).graph
    space = build_space(graph, host)
    grp = next(g for g in space.groups if 0 in g.optional)
    assert grp.outside_consumers[0] == [1]
    assert any("also feeds" in n for n in grp.notes)
    r = tune(source("multi_consumer"), host, budget=20, strategy="tpe", seed=0, workers=0)
    # (The engine's probes of one standalone tiling alone are not candidates.)
    costed = [t for t in r.trials if t.stage == "cost" and t.plan and t.plan["groups"] and t.source != "standalone"]
    assert costed
    for t in costed:
        owner = [g for g in t.plan["groups"] if 0 in [g["anchor"], *g["fuse"]]]
        # Never silently ignored: op 0 is in a group; fused next to an outside consumer its
        # full-size result is charged (recompute and/or un-fused bytes).
        assert owner, t.plan
        g = owner[0]
        if g["anchor"] != 0 and 1 not in [g["anchor"], *g["fuse"]]:
            assert t.cost["recompute_flops"] > 0 or t.cost["unfused_intermediate_bytes"] > 0


@pytest.mark.parametrize("name", ["matmul_1024", "conv_relu", "attention_scores"])
def test_knob_values_become_valid_plans(host, name):
    # Every knob combination (a seeded sample) makes a group IREE can compile: inner tiles
    # divide their outer tiles (but a contraction's rows: IREE peels the remaining rows) and the
    # vector tile stays under the limit. Valid values pass through unchanged.

    spec = build_space(analyze(source(name)).graph, host, {}).groups[0]
    knobs = spec.knobs()
    rng = random.Random(0)
    combos = [{k.name: rng.choice(k.choices) for k in knobs} for _ in range(300)]
    unchanged = six_rows = 0
    for params in combos:
        group = spec.to_group(params)
        assert not isinstance(group, str), group
        levels = [lv.tile_sizes for lv in group.levels] + [[0] * len(spec.ranges)] * (3 - len(group.levels))
        outer, inner, red = levels[:3]
        elems = 1
        for d, kind in enumerate(spec.iterator_types):
            span = outer[d] or spec.ranges[d]
            if inner[d]:
                assert inner[d] < span and (span % inner[d] == 0 or d in spec.peeled)
            elems *= (inner[d] or span) if kind == "parallel" else (red[d] or spec.ranges[d])
        assert elems * spec.elem_bytes < spec.vector_limit_bytes
        asked = [params[f"{spec.name}.inner.d{d}"] for d in spec.inner_choices]
        unchanged += asked == [inner[d] for d in spec.inner_choices]
        six_rows += any(inner[d] == 6 for d in spec.peeled)
    assert unchanged > 0
    assert (six_rows > 0) == (name != "conv_relu")  # contractions only


def test_an_op_with_a_zero_sized_dim_is_not_tiled(host):
    """MLIR's tiling segfaults on a zero-sized loop; every candidate crashed a worker (25 s)."""
    src = """
func.func @zero(%x: tensor<0x512xf32>, %w: tensor<512x256xf32>, %acc: tensor<0x256xf32>) -> tensor<0x256xf32> {
  %m = linalg.matmul ins(%x, %w : tensor<0x512xf32>, tensor<512x256xf32>) outs(%acc : tensor<0x256xf32>) -> tensor<0x256xf32>
  return %m : tensor<0x256xf32>
}"""
    space = build_space(analyze(src).graph, host)
    assert not space.groups and any("zero-sized" in n for n in space.notes)

    with pytest.raises(PlanError, match="zero-sized"):
        check_plan(analyze(src).graph, Plan.model_validate(
            {"groups": [{"anchor": 0, "levels": [{"tile_sizes": [0, 64, 0], "loop": "forall"}]}]}))


def test_a_register_tile_spans_one_batch_of_a_batched_contraction(host):
    """Batches share no operand load: two in one register tile double the accumulators."""
    (spec,) = build_space(analyze(source("attention_scores")).graph, host, {}).groups
    assert spec.inner_choices[0] == [1]
    assert len(spec.inner_choices[1]) > 2 and len(spec.inner_choices[2]) > 2  # M and N keep theirs
    r = tune(source("attention_scores"), host, budget=40, strategy="random", seed=0, workers=0)
    inner_tiles = [t.plan["groups"][0]["levels"][1]["tile_sizes"] for t in r.trials
                   if t.source == "random" and t.plan and len(t.plan["groups"][0]["levels"]) > 1]
    assert inner_tiles and all(tiles[0] == 1 for tiles in inner_tiles)


def test_a_convolution_vector_tile_is_one_output_row_and_one_filter_tap(host):
    """IREE decomposes a convolution's vector tile to 1-D convolutions: one image, one output row,
    one filter tap per tile (its own configs: [1, 16, 1, 7] and filter tiles of 1); along the row,
    tiles that divide it."""
    from _shared import nchw_conv_module

    text = nchw_conv_module(2, c_in=32, c_out=64, size=28)
    (spec,) = build_space(analyze(text).graph, host, {}).groups
    assert spec.inner_choices[0] == spec.inner_choices[2] == [1]  # batch, output row
    assert spec.reduction_choices[5] == spec.reduction_choices[6] == [1]  # filter taps
    assert 7 in spec.inner_choices[3] and all(28 % t == 0 or t == 16 for t in spec.inner_choices[3])
    r = tune(text, host, budget=40, strategy="random", seed=0, workers=0)
    levels = [t.plan["groups"][0]["levels"] for t in r.trials if t.source == "random" and t.plan]
    assert levels and all(len(lv) == 3 for lv in levels)
    for outer, inner, red in ([lv["tile_sizes"] for lv in level] for level in levels):
        assert inner[2] == 1 and red[5] == red[6] == 1
        assert (outer[3] or 28) % (inner[3] or outer[3] or 28) == 0  # the row's tiles divide it


def test_a_depthwise_convolution_may_keep_its_filter_row_whole(host):
    """IREE's own depthwise config tiles one filter row and keeps the row's 3 taps ([0, 0, 0, 0,
    1, 3] over n, oh, ow, c, kh, kw); its channels take the vector choices."""
    from _shared import nhwc_depthwise_module

    text = nhwc_depthwise_module(4, size=56, channels=144)
    (spec,) = build_space(analyze(text).graph, host, {}).groups
    assert spec.inner_choices[0] == spec.inner_choices[1] == [1]  # batch, output row
    assert spec.reduction_choices[4] == [1] and spec.reduction_choices[5] == [0, 1]
    assert 16 in spec.inner_choices[3]


@pytest.mark.parametrize("hardware", ["host-cpu", "npu-sram-256k"])
@pytest.mark.parametrize("name", ["attention_scores", "matmul_1024", "conv_relu", "softmax", "mlp_chain"])
def test_starting_knob_values_are_in_the_space(hardware, name):
    """A starting value outside a knob's choices cannot be proposed (a strategy drops it): the
    smallest plan once set a batch dim's register tile to 0 where 1 is the only choice."""
    space = build_space(analyze(source(name)).graph, get_profile(hardware), {})
    for spec in space.groups:
        choices = {k.name: k.choices for k in spec.knobs()}
        for params in (spec.default_params(), spec.smallest_params()):
            assert all(v in choices[k] for k, v in params.items()), params


@pytest.mark.parametrize("name, rows", [("matmul_1024", [8]), ("attention_scores", [1, 8])])
def test_a_contraction_starts_from_iree_own_config(host, name, rows):
    """IREE's CPU default for f32 matmuls (its dumped configs, fidelity corpus): 8 rows x one
    vector at k = one vector, distribution 64 x 64."""
    (spec,) = build_space(analyze(source(name)).graph, host, {}).groups
    group = spec.to_group(spec.default_params())
    vec = host.compute.vector_width_bytes // 4
    assert group.levels[0].tile_sizes[-3:-1] == [64, 64]
    assert group.levels[1].tile_sizes == [*rows, vec, 0]
    assert group.levels[2].tile_sizes == [0] * (len(rows) + 1) + [vec]


def test_a_dynamic_dim_is_always_tiled_at_the_outer_level(host):
    """Untiled, a dynamic dim leaves the vector tiles without a static bound."""
    graph = analyze(source("dynamic_matmul")).graph
    (spec,) = build_space(graph, host, {"arg0": [512, 1024]}).groups
    assert 0 not in spec.outer_choices[0] and 512 in spec.outer_choices[0]
    assert 0 in spec.outer_choices[1]  # N is static: untiled stays a choice
    r = tune(source("dynamic_matmul"), host, budget=24, strategy="random", seed=0, workers=0, shape_hints=["arg0=512x1024"])
    assert all(t.plan["groups"][0]["levels"][0]["tile_sizes"][0] > 0 for t in r.trials if t.source == "random" and t.plan and t.plan["groups"])


def test_knob_names_are_made_and_read_by_one_helper(host):
    spec = build_space(analyze(source("softmax")).graph, host, {}).groups[0]
    assert spec.optional  # fuse switches too
    for knob in spec.knobs():
        name = KnobName.parse(knob.name)
        assert str(name) == knob.name and name.group == group_of(knob.name) == spec.name == group_name(spec.anchor)
    assert (tile_knob("g7", "outer", 0), loop_knob("g7"), fuse_knob("g7", 9)) == ("g7.outer.d0", "g7.outer.loop", "g7.fuse.9")
    # A repeated layer's knobs play the same roles; fuse switches name different ops.
    assert KnobName.parse("g7.fuse.9").role == KnobName.parse("g8.fuse.12").role != KnobName.parse("g7.outer.d0").role
    assert KnobName.parse("g7.inner.d1").role == KnobName.parse("g8.inner.d1").role != KnobName.parse("g8.red.d1").role


def _matmul(b_layout: str) -> str:
    """64x256x512 matmul; B stored [k, n] ("kn") or [n, k] ("nk", as nn.Linear keeps weights)."""
    b_type, b_map = (("tensor<512x256xf32>", "affine_map<(d0, d1, d2) -> (d2, d1)>") if b_layout == "kn"
                     else ("tensor<256x512xf32>", "affine_map<(d0, d1, d2) -> (d1, d2)>"))
    return f"""
func.func @f(%a: tensor<64x512xf32>, %b: {b_type}) -> tensor<64x256xf32> {{
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<64x256xf32>
  %c = linalg.fill ins(%z : f32) outs(%e : tensor<64x256xf32>) -> tensor<64x256xf32>
  %r = linalg.matmul indexing_maps = [affine_map<(d0, d1, d2) -> (d0, d2)>, {b_map}, affine_map<(d0, d1, d2) -> (d0, d1)>]
       ins(%a, %b : tensor<64x512xf32>, {b_type}) outs(%c : tensor<64x256xf32>) -> tensor<64x256xf32>
  return %r : tensor<64x256xf32>
}}"""


def test_a_k_contiguous_b_is_searched_as_one_transpose_block(host):
    lanes = host.compute.vector_width_bytes // 4
    nk = analyze(_matmul("nk")).graph
    (op,) = [o for o in nk.ops.values() if o.kind == "contraction"]
    assert op.rhs_contiguous_reduction_dim() == 2
    (spec,) = build_space(nk, host).groups
    assert spec.inner_choices[1] == [lanes] and spec.reduction_choices[2] == [lanes]
    assert len(spec.inner_choices[0]) > 1  # the rows are still searched
    for params in (spec.default_params(), spec.smallest_params()):
        group = spec.to_group(params)
        assert not isinstance(group, str), group
        assert group.levels[1].tile_sizes[1] == lanes and group.levels[-1].tile_sizes[2] == lanes

    kn = analyze(_matmul("kn")).graph
    (op,) = [o for o in kn.ops.values() if o.kind == "contraction"]
    assert op.rhs_contiguous_reduction_dim() is None
    (spec,) = build_space(kn, host).groups
    assert len(spec.inner_choices[1]) > 1 and len(spec.reduction_choices[2]) > 1


# MobileNet's last 1x1 convolutions as IREE forms them from NCHW: C[160, 49] = W[160, 960] x X[960, 49],
# the 7x7 pixels the innermost (vector) dim.
PIXELS_INNERMOST = """
func.func @conv1x1(%w: tensor<160x960xf32>, %x: tensor<960x49xf32>) -> tensor<160x49xf32> {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<160x49xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<160x49xf32>) -> tensor<160x49xf32>
  %c = linalg.matmul ins(%w, %x : tensor<160x960xf32>, tensor<960x49xf32>) outs(%f : tensor<160x49xf32>) -> tensor<160x49xf32>
  return %c : tensor<160x49xf32>
}"""


def test_the_innermost_dims_tiles_divide_it_or_leave_whole_vectors(host):
    """Tiles of 12, 24 or 48 over 49 pixels leave a remainder of one: every tile then ran masked
    (2.2-2.7x slower, timed inside MobileNet). What stays: 49 whole at the outer level, and
    IREE's own register width there, 7 (the largest divisor under a vector)."""
    (spec,) = build_space(analyze(PIXELS_INNERMOST).graph, host, {}).groups
    vec = host.compute.vector_width_bytes // 4
    assert spec.outer_choices[1] == [0]
    assert 7 in spec.inner_choices[1] and all(s % vec == 0 or 49 % s == 0 for s in spec.inner_choices[1])
    assert 12 in spec.outer_choices[0] or 32 in spec.outer_choices[0]  # rows keep non-dividing tiles (IREE peels them)
    # A dim of whole vectors keeps its non-dividing tiles that leave whole vectors (3136 % 2048 = 68 x 16).
    (wide,) = build_space(analyze(PIXELS_INNERMOST.replace("x49x", "x3136x").replace("x49", "x3136")).graph,
                          host, {}).groups
    assert 2048 in wide.outer_choices[1] and all(3136 % s % vec == 0 for s in wide.outer_choices[1] if s)
    # A long prime dim (ViT's 197 keys) has no such tile and keeps its tiles (untiled, no vector tile forms).
    (prime,) = build_space(analyze(PIXELS_INNERMOST.replace("x49x", "x197x").replace("x49", "x197")).graph,
                           host, {}).groups
    assert 64 in prime.outer_choices[1]
    r = tune(PIXELS_INNERMOST, host, budget=48, strategy="random", seed=0, workers=0)
    widths = {t.plan["groups"][0]["levels"][0]["tile_sizes"][1] for t in r.trials
              if t.source == "random" and t.plan and t.plan["groups"]}
    assert widths == {0}


# A 1x1 convolution over NCHW as IREE forms it: out[co, h, w] = W[co, ci] x X[ci, h, w].
CONV1X1_NCHW = nchw_1x1_generic(16, 96, 56)


def test_a_1x1_convolutions_output_channels_keep_register_tiles_of_one(host):
    """Two pixel dims on the vector operand's side: IREE's default and the fastest timed inside
    MobileNet keep one output channel per register tile (4 of them ran 2.4-4.6x slower)."""
    (spec,) = build_space(analyze(CONV1X1_NCHW).graph, host, {}).groups
    assert spec.inner_choices[0] == [1]
    assert len(spec.inner_choices[1]) > 2 and 14 in spec.inner_choices[2]  # h: rows; w: 14 of 56
    assert 0 not in spec.peeled
    (plain,) = build_space(analyze(PIXELS_INNERMOST).graph, host, {}).groups  # one pixel dim: channels are rows
    assert len(plain.inner_choices[0]) > 2
    r = tune(CONV1X1_NCHW, host, budget=32, strategy="random", seed=0, workers=0)
    tiles = [t.plan["groups"][0]["levels"][1]["tile_sizes"] for t in r.trials
             if t.source == "random" and t.plan and len(t.plan["groups"][0]["levels"]) > 1]
    assert tiles and all(t[0] == 1 for t in tiles)


# The same with stride 2, as service.ir.dispatch writes ResNet's downsample: X is a strided slice.
CONV1X1_NCHW_STRIDED = nchw_1x1_generic(16, 96, 56, stride=2)


def test_a_strided_1x1_convolution_gives_rows_to_output_channels_not_pixels(host):
    """Read with a step, the pixels are gathered one by one: output channels share each gather
    (8 of them ran 6.6x faster than 1 on a Zen 5), rows of h do not (no faster), so the rule of
    the dense convolution above turns round."""
    (spec,) = build_space(analyze(CONV1X1_NCHW_STRIDED).graph, host, {}).groups
    assert spec.inner_choices[1] == [1]
    kinds = {name: [op for op in analyze(text).graph.ops.values() if op.kind == "contraction"][0]
             for name, text in (("dense", CONV1X1_NCHW), ("strided", CONV1X1_NCHW_STRIDED), ("pixels last", PIXELS_INNERMOST))}
    assert is_dense_pixel_contraction(kinds["dense"])
    assert not is_dense_pixel_contraction(kinds["strided"]) and not is_dense_pixel_contraction(kinds["pixels last"])
    # model tune ships the dense one only measured; the strided one's gathers are priced
    assert vectorizes_first_input(kinds["dense"]) and not vectorizes_first_input(kinds["strided"])
    assert not vectorizes_first_input(kinds["pixels last"])
    assert {4, 8} <= set(spec.inner_choices[0]) and 14 in spec.inner_choices[2]


def test_a_contraction_is_told_apart_by_which_input_is_vectorized():
    """IREE lowers a contraction to outer products along its second input's free dim: with the
    image first (a 1x1 convolution over NCHW, pixels collapsed or not) the vectors run along the
    first input, and each reduction step transposes the accumulator."""
    def root(text):
        (op,) = [op for op in analyze(text).graph.ops.values() if op.kind == "contraction"]
        return op
    assert vectorizes_first_input(root(first_input_vectors_matmul(1000, 169, 512)))
    assert not vectorizes_first_input(root(first_input_vectors_matmul(1000, 169, 512, image_first=False)))
    assert not vectorizes_first_input(root(PIXELS_INNERMOST))  # linalg.matmul: weight first


def test_a_long_odd_vector_dim_gets_whole_vectors_and_a_short_one_a_divisor_width():
    """Timed inside models (docs/benchmarks.md): 3000 columns tiled by 64 with 16-lane vectors ran
    1.25x faster than IREE's default, 15-lane vectors 0.78x; 196 pixels in 14-lane vectors
    1.6-2.4x faster. LLM widths (multiples of the vector) keep the choices they had."""
    from service.search.tile_sizes import inner_sizes, outer_sizes

    assert {32, 64, 128, 256} <= set(outer_sizes(3000, vector_elems=16))
    assert 15 not in inner_sizes(3000, 16, True) and 9 not in inner_sizes(513, 16, True)
    assert 14 in inner_sizes(196, 16, True) and 1 not in inner_sizes(197, 16, True)
    for width in (768, 3072, 4096, 11008):
        assert outer_sizes(width, vector_elems=16) == outer_sizes(width)


def test_rows_that_8_does_not_divide_are_offered_their_largest_divisor_up_to_8():
    """49 rows (a 7x7 feature map) tiled by 4, 6, 8 or 16 leave a remainder, which AVX-512 builds
    mask in every register tile (measured 4.2x slower than 48 rows at 8x16); IREE picks 7."""
    from service.search.tile_sizes import inner_sizes

    assert 7 in inner_sizes(49, 16, False, rows=True) and 7 in inner_sizes(196, 16, False, rows=True)
    assert inner_sizes(64, 16, False, rows=True) == [0, 4, 6, 8, 16]  # 8 divides: nothing added
    assert inner_sizes(197, 16, False, rows=True) == [0, 4, 6, 8, 16]  # a prime: no divisor to add
    assert 7 not in inner_sizes(49, 16, False)  # not a contraction's rows


def test_where_remainders_are_masked_a_reduction_tile_divides_the_reduction():
    """K = 1000 (a 7x1000x512 matmul a new user wrote): k 32 ran 3.3x slower than k 8 on a Zen 4,
    the reduction's remainder masked in every step. Where IREE peels it (AVX2), any tile stays."""
    from service.search.tile_sizes import reduction_sizes

    assert reduction_sizes(1000, dividing=True) == [0, 1, 2, 4, 8]
    assert reduction_sizes(1000) == [0, 1, 2, 4, 8, 16, 32, 64, 128]
    assert reduction_sizes(3072, dividing=True) == reduction_sizes(3072)

    module = matmul_module("kn", m=7, n=512, k=1000)
    host = get_profile("host-cpu")
    peeling = host.model_copy(update={"compute": host.compute.model_copy(update={"masked_remainders": False})})
    graph = analyze(module).graph
    for hw, expected in ((host, [0, 1, 2, 4, 8]), (peeling, reduction_sizes(1000))):
        (group,) = build_space(graph, hw).groups
        assert list(group.reduction_choices.values()) == [expected]


def test_an_image_first_contractions_pixel_tile_need_not_divide_its_distribution_tile(host):
    """One output channel by 32 pixels under a 49-pixel tile (MobileNetV2's 96x196x576 1x1
    convolution, image first): IREE masks the last vector; measured on a Zen 5 2.7x faster than
    IREE's default, where the divisor rule left only 14-pixel tiles, 1.1x. Weight first, the
    pixels keep tiles that divide."""
    def inner_pixels(image_first: bool) -> int:
        (spec,) = build_space(analyze(first_input_vectors_matmul(96, 196, 576, image_first)).graph, host, {}).groups
        params = {tile_knob(spec.name, "outer", 0): 32, tile_knob(spec.name, "outer", 1): 49, loop_knob(spec.name): "forall",
                  tile_knob(spec.name, "inner", 1): 32, tile_knob(spec.name, "red", 2): 8}
        params |= {tile_knob(spec.name, "inner", 0): 1} if image_first else {tile_knob(spec.name, "inner", 0): 8}
        group = spec.to_group(params)
        assert not isinstance(group, str), group
        return group.levels[1].tile_sizes[1]

    assert inner_pixels(True) == 32
    assert inner_pixels(False) != 32  # weight first: only tiles that divide the 49 pixels
