"""IREE's CPU lowering config of a plan, and the attribute text that forces it.

A plan's levels map onto IREE's CPU lowering config (DESIGN.md, Candidates):
level 0 -> `distribution`, level 1 -> `vector_common_parallel`, level 2 -> `vector_reduction`.
The mapping is pure; `lowering_config_of` reads a config IREE printed back with MLIR's parser.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, Field

from service.ir.graph import OpGraph, TileableOp
from service.ir.mlir import context, ir
from service.ir.plan import Plan

PARALLEL = "parallel"
REDUCTION = "reduction"
DEFAULT_PIPELINE = "DoubleTilingExpert"
# IREE's CPU pipeline for convolutions: tiled, then decomposed to 1-D convolutions and vectorised.
CONVOLUTION_PIPELINE = "ConvTileAndDecomposeExpert"

# Op kinds (service.ir.graph) whose tiling IREE's CPU backend can be told through compilation_info.
CONFIGURABLE_KINDS = ("contraction", "convolution")

_LOWERING_CONFIG_PREFIX = "#iree_cpu.lowering_config<"

# Why a convolution keeps IREE's config, checked on IREE 3.13 (docs/benchmarks.md, session 18):
# dispatch formation strips a unit batch dim, and InsertBatchDimForBatchlessConvPass, which runs
# after the tuning spec and compilation_info are applied, rebuilds the op without them. A conv
# with a batch dim keeps a forced config: whole-model tuning configures those when measured.
_BATCHLESS_CONVOLUTION = ("IREE 3.13 drops a config forced on a convolution without a batch dim (a unit batch is "
                          "stripped, and its InsertBatchDimForBatchlessConvPass rebuilds the op after the tuning spec "
                          "is applied)")
_BATCHED_CONVOLUTION = ("IREE takes a config on this convolution (it has a batch dim), but tilesearch ships a "
                        "convolution's config only when it was measured faster inside a whole model "
                        "(`tilesearch model tune --measure-top K`): its cost model is unchecked on convolutions")


def iree_configures_convolution(conv: TileableOp) -> bool:
    """Whether IREE 3.13 keeps a config given to this convolution: it has a batch dim (parallel,
    indexing the input and the output, not the filter) of extent other than 1 (a unit one is
    stripped like none)."""
    image, weights, out = conv.operand_dims[0], conv.operand_dims[1], conv.operand_dims[-1]
    return any(d is not None and conv.iterator_types[d] == "parallel" and d in out and d not in weights
               and conv.loop_ranges[d] != 1 for d in image)


# Checked on IREE 3.13 with --compile-to=executable-sources: NCHW and NHWC, batch 1 and 2, strides 1
# and 2, each 1x1 convolution reached its dispatch as a matmul-like linalg.generic.
_ONE_BY_ONE_CONVOLUTION = ("IREE rewrites a convolution with a 1x1 filter into a matmul-like linalg.generic before it "
                           "configures it, so a config given to the convolution reaches nothing; `tilesearch model "
                           "tune` on this module tunes the op IREE forms")


def _has_one_by_one_filter(conv: TileableOp) -> bool:
    """A convolution whose filter window is 1 in every dim: IREE computes it as a contraction."""
    dims = conv.convolution_dims()
    return (dims is not None and not dims.is_pooling and bool(dims.filter_loop)
            and all(conv.loop_ranges[d] == 1 for d in dims.filter_loop))


def convolution_not_configured(conv: TileableOp) -> str:
    """Why a convolution keeps IREE's config outside a whole model's measured tuning."""
    if _has_one_by_one_filter(conv):
        return _ONE_BY_ONE_CONVOLUTION
    return _BATCHED_CONVOLUTION if iree_configures_convolution(conv) else _BATCHLESS_CONVOLUTION


# IREE lowers its data-tiled matmuls with a pipeline of their own (Mmt4dTilingExpert), whose
# vector tile is the op's whole inner tile ([1, 1, 0, 8, 16, 0] on an AVX-512 f32 one); the
# DoubleTilingExpert config of a plan tiling the inner tile ran a linalg.mmt4d 3x slower than
# IREE's own (a new user's trial, session 32).
_OWN_PIPELINE_CONTRACTIONS = frozenset({"linalg.mmt4d", "linalg.batch_mmt4d"})


def iree_keeps_own_pipeline(op: TileableOp) -> str | None:
    """Why IREE's own config is kept for this contraction whatever the plan, or None."""
    if op.name not in _OWN_PIPELINE_CONTRACTIONS:
        return None
    return (f"{op.name} is IREE's data-tiled matmul, lowered by its own Mmt4dTilingExpert pipeline over whole inner "
            "tiles; tilesearch's configs are for plain contractions, so IREE's own config is kept")


# IREE's input pipeline demotes f64 to f32 by default (`--iree-input-demote-f64-to-f32`): the
# dispatches it configures, and the functions it exports, see f32.
_DEMOTED_BY_IREE = {"f64": "f32"}


def as_iree_compiles(element_type: str) -> str:
    """The element type IREE compiles a value of `element_type` to, under its default flags."""
    return _DEMOTED_BY_IREE.get(element_type, element_type)


class LoweringConfig(BaseModel):
    """IREE CPU lowering config of one op: tile sizes per IREE tiling level, over its loop dims."""

    distribution: list[int]
    vector_common_parallel: list[int]
    vector_reduction: list[int]
    anchor: str | None = Field(default=None, description="which op it is on, for reports")


def _level_sizes(level: Any) -> list[int]:
    sizes = level["tile_sizes"] if isinstance(level, Mapping) else level.tile_sizes
    return [int(s) for s in sizes]


def leaves_no_vector_tile(graph: OpGraph, plan: Plan) -> bool:
    """Whether the plan, given to IREE as CPU configs, leaves an op IREE takes a config on
    without a vector tile (one memory level, or both vector levels untiled). A lowering_config has
    no "the compiler chooses": zero vector tiles make the whole distribution tile one vector, which
    IREE refuses past its size limit (a 97x26x103 one) or runs element-wise slow below it. The
    cost model prices such a plan's register tile as ideal (the super-tiling view), so it is a
    yardstick there, never an answer."""
    return any(graph.op(group.anchor).kind in CONFIGURABLE_KINDS
               and not any(any(_level_sizes(level)) for level in group.levels[1:3])
               for group in plan.groups)


def lowering_config_from_levels(
    levels: Sequence[Any], iterator_types: Sequence[str], *, anchor: str | None = None
) -> LoweringConfig:
    """Map a group's tiling levels (outermost first) onto IREE's three CPU tiling levels.

    level 0 -> distribution over parallel dims (IREE rejects reduction entries there),
    level 1 -> vector_common_parallel (reduction entries 0),
    level 2 -> vector_reduction (parallel entries 0). A missing level is all zeros (untiled).
    Loop kinds are not mapped: IREE always distributes level 0 over workgroups.
    """
    if len(levels) > 3:
        raise ValueError(f"IREE's CPU config has 3 tiling levels, the plan has {len(levels)}")
    rank = len(iterator_types)
    for kind in iterator_types:
        if kind not in (PARALLEL, REDUCTION):
            raise ValueError(f"unknown iterator type {kind!r}")
    sized = [_level_sizes(level) for level in levels] + [[0] * rank] * (3 - len(levels))
    for i, sizes in enumerate(sized):
        if len(sizes) != rank:
            raise ValueError(f"level {i} has {len(sizes)} tile sizes, the anchor has {rank} loops")
        if any(s < 0 for s in sizes):
            raise ValueError(f"level {i} has a negative tile size: {sizes}")
    is_par = [kind == PARALLEL for kind in iterator_types]
    return LoweringConfig(
        distribution=[s if p else 0 for s, p in zip(sized[0], is_par)],
        vector_common_parallel=[s if p else 0 for s, p in zip(sized[1], is_par)],
        vector_reduction=[0 if p else s for s, p in zip(sized[2], is_par)],
        anchor=anchor,
    )


def levels_from_lowering_config(config: LoweringConfig) -> list[dict[str, Any]]:
    """The inverse of `lowering_config_from_levels`: IREE's three CPU tiling levels as a plan's
    levels (distribution as a forall, the vector levels as for loops), so that the cost model
    can price IREE's own choice beside the search's. Other levels IREE may add are not modelled."""
    return [
        {"tile_sizes": list(config.distribution), "loop": "forall"},
        {"tile_sizes": list(config.vector_common_parallel), "loop": "for"},
        {"tile_sizes": list(config.vector_reduction), "loop": "for"},
    ]


def lowering_config_text(config: LoweringConfig) -> str:
    return (
        "#iree_cpu.lowering_config<"
        f"distribution = {config.distribution}, "
        f"vector_common_parallel = {config.vector_common_parallel}, "
        f"vector_reduction = {config.vector_reduction}>"
    )


def translation_info_text(pipeline: str = DEFAULT_PIPELINE) -> str:
    """A translation_info with the pipeline alone (no pipeline options)."""
    return f"#iree_codegen.translation_info<pipeline = #iree_cpu.pipeline<{pipeline}>>"


def compilation_info_text(config: LoweringConfig, translation_info: str | None = None) -> str:
    """The `compilation_info` attribute text that forces `config` on an op (DESIGN.md syntax),
    with `translation_info` (default: DoubleTilingExpert without options)."""
    return (
        "#iree_codegen.compilation_info<"
        f"lowering_config = {lowering_config_text(config)}, "
        f"translation_info = {translation_info or translation_info_text()}>"
    )


def vector_tile_elements(config: LoweringConfig) -> int:
    """Elements of the innermost vector tile: product of non-zero vector_common_parallel sizes
    times the non-zero reduction sizes. IREE fails at 512 native vectors or more (8192 f32 with
    AVX-512, 4096 with AVX2: the host profile's max_vector_tile_bytes)."""
    n = 1
    for s in config.vector_common_parallel + config.vector_reduction:
        if s:
            n *= s
    return n


def _tile_sizes(value: ir.Attribute) -> list[int]:
    return [ir.IntegerAttr(size).value for size in ir.ArrayAttr(value)]


def lowering_config_of(text: str, *, anchor: str | None = None) -> LoweringConfig | None:
    """The tile sizes of an `#iree_cpu.lowering_config` attribute as MLIR prints it, or None for
    a config without a distribution level (IREE gives helper ops such as the fill vector-only
    configs). Other levels IREE may add (e.g. `vector_inner_parallel`) are not reported.

    The bindings have no accessor for this attribute's entries. IREE prints it as its dictionary
    of entries between the angle brackets (`key = [sizes], ...`), which is the builtin
    dictionary syntax, so MLIR's parser reads that body back as a DictAttr."""
    with context():
        printed = str(ir.Attribute.parse(text))
        if not (printed.startswith(_LOWERING_CONFIG_PREFIX) and printed.endswith(">")):
            raise ValueError(f"not an #iree_cpu.lowering_config: {printed}")
        entries = ir.DictAttr(ir.Attribute.parse("{" + printed[len(_LOWERING_CONFIG_PREFIX):-1] + "}"))
        if "distribution" not in entries:
            return None
        sizes = {level: _tile_sizes(entries[level]) if level in entries else []
                 for level in ("distribution", "vector_common_parallel", "vector_reduction")}
    return LoweringConfig(**sizes, anchor=anchor)
