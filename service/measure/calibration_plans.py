"""Calibration's workloads and plans: the measurable contraction workloads of a directory, and a
sample of plans per workload, spanning good and bad tilings, all inside IREE's limits."""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from service.hardware.model import HardwareModel
from service.ir.graph import build_graph, tag_tileable_ops
from service.ir.parse import parse_module

from .lowering import LoweringConfig, convolution_not_configured, lowering_config_from_levels

# IREE rejects vector tiles of 512 native vectors or more: 8192 f32 elements with AVX-512, the
# sampler's default bound; max_vector_elements(hardware) gives a host's own (4095 with AVX2).
MAX_VECTOR_ELEMENTS = 8192 - 1
DIST_SIZES = (16, 32, 64, 128, 256, 512)
VECTOR_SHAPES = ((1, 1), (1, 4), (2, 8), (4, 8), (4, 16), (8, 8), (8, 16), (8, 32), (16, 16),
                 (4, 32), (16, 32), (32, 16), (1, 64), (2, 32), (32, 32))
REDUCTION_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)
# Always measured: IREE's own default for matmuls and the DESIGN.md config that beats it.
ANCHOR_CONFIGS = (((64, 64), (8, 16), 16), ((256, 256), (8, 32), 16))


@dataclass
class ContractionWorkload:
    """A module with one contraction anchor, and the ops IREE would fuse into its dispatch."""

    name: str
    text: str
    anchor: int
    loop_ranges: list[int]
    iterator_types: list[str]
    fuse: list[int]


def dispatch_members(graph: Any, anchor: int) -> list[int]:
    """The ops IREE puts in the anchor's dispatch: fill producers, elementwise consumers and
    the broadcasts/fills feeding those consumers, plus any fuse group the anchor is in."""
    members: set[int] = {p for p in graph.op(anchor).producers if graph.op(p).kind == "fill"}
    upstream = graph.upstream(anchor)
    for c in graph.downstream(anchor):
        if graph.op(c).kind != "elementwise":
            continue
        members.add(c)
        for p in graph.op(c).producers:
            if p not in upstream and p != anchor and graph.op(p).kind in ("fill", "data_movement"):
                members.add(p)
    for group in graph.fuse_groups.values():
        if anchor in group:
            members.update(group)
    members.discard(anchor)
    return sorted(members)


def load_contraction_workloads(directory: Path) -> tuple[list[ContractionWorkload], dict[str, str]]:
    """Measurable contraction workloads in `directory`, and the skipped ones with the reason."""
    found: list[ContractionWorkload] = []
    skipped: dict[str, str] = {}
    for path in sorted(directory.glob("*.mlir")):
        text = path.read_text()
        graph = build_graph(tag_tileable_ops(parse_module(text)))
        kinds = {op.kind for op in graph.ops.values()}
        anchors = [u for u, op in graph.ops.items() if op.kind == "contraction"]
        if "convolution" in kinds:
            conv = next(op for op in graph.ops.values() if op.kind == "convolution")
            skipped[path.stem] = f"convolution: {convolution_not_configured(conv)}"
            continue
        if len(anchors) != 1:
            skipped[path.stem] = f"{len(anchors)} contractions (calibration wants exactly one)"
            continue
        op = graph.op(anchors[0])
        if op.dynamic_dims or any(r is None for r in op.loop_ranges):
            skipped[path.stem] = "dynamic dims: calibration samples static shapes (measure one at a shape with tilesearch measure --shape-hint)"
            continue
        found.append(_workload(path.stem, text, graph, anchors[0]))
    return found, skipped


def _workload(name: str, text: str, graph: Any, anchor: int) -> ContractionWorkload:
    op = graph.op(anchor)
    return ContractionWorkload(name, text, anchor, list(op.loop_ranges), list(op.iterator_types),
                               dispatch_members(graph, anchor))


def contraction_workload(name: str, text: str) -> ContractionWorkload:
    """The workload of a module with exactly one static contraction (ValueError otherwise)."""
    graph = build_graph(tag_tileable_ops(parse_module(text)))
    anchors = [u for u, op in graph.ops.items() if op.kind == "contraction"]
    if len(anchors) != 1 or any(r is None for r in graph.op(anchors[0]).loop_ranges):
        raise ValueError(f"{name}: wants one static contraction, found {len(anchors)}")
    return _workload(name, text, graph, anchors[0])


def _mn_dims(w: ContractionWorkload) -> tuple[int, int]:
    """The two innermost parallel dims (M, N); outer parallel dims (batch) are tiled by 1."""
    parallel = [i for i, t in enumerate(w.iterator_types) if t == "parallel"]
    return parallel[-2], parallel[-1]


def plan_for(w: ContractionWorkload, dist: tuple[int, int], vec: tuple[int, int], red: int) -> dict:
    """A three-level plan on the anchor: distribution, vector (parallel), reduction tiles."""
    m, n = _mn_dims(w)
    rank = len(w.iterator_types)
    level0, level1, level2 = [0] * rank, [0] * rank, [0] * rank
    for d, kind in enumerate(w.iterator_types):
        if kind == "parallel":
            level0[d] = level1[d] = 1  # batch dims: one at a time
        else:
            level2[d] = min(red, w.loop_ranges[d]) if d == w.iterator_types.index("reduction") else 1
    level0[m], level0[n] = dist
    level1[m], level1[n] = vec
    return {
        "groups": [
            {
                "anchor": w.anchor,
                "fuse": list(w.fuse),
                "levels": [
                    {"tile_sizes": level0, "loop": "forall"},
                    {"tile_sizes": level1, "loop": "for"},
                    {"tile_sizes": level2, "loop": "for"},
                ],
            }
        ]
    }


def iree_config_of(w: ContractionWorkload, plan: dict) -> LoweringConfig:
    return lowering_config_from_levels(plan["groups"][0]["levels"], w.iterator_types)


def max_vector_elements(hardware: HardwareModel) -> int:
    """The largest f32 vector tile IREE compiles for `hardware` (the calibration workloads are
    f32): 16 KiB on an AVX2 host, half the AVX-512 bound."""
    limit = hardware.max_vector_tile_bytes
    return MAX_VECTOR_ELEMENTS if limit is None else limit // 4 - 1


def sample_plans(w: ContractionWorkload, count: int, seed: int = 0,
                 max_elements: int = MAX_VECTOR_ELEMENTS) -> list[dict]:
    """`count` distinct plans IREE accepts (vector tiles of at most `max_elements`), from tiny
    vector tiles (slow) to large ones, always including IREE's default-like config and the
    DESIGN.md one where they fit."""
    m, n = _mn_dims(w)
    k = w.loop_ranges[w.iterator_types.index("reduction")]
    extent_m, extent_n = w.loop_ranges[m], w.loop_ranges[n]

    def valid(dist, vec, red) -> bool:
        return (dist[0] <= extent_m and dist[1] <= extent_n and extent_m % dist[0] == 0
                and extent_n % dist[1] == 0 and vec[0] <= dist[0] and vec[1] <= dist[1]
                and red <= k and vec[0] * vec[1] * red <= max_elements)

    space = [(d, v, r) for d in itertools.product(DIST_SIZES, DIST_SIZES)
             for v in VECTOR_SHAPES for r in REDUCTION_SIZES if valid(d, v, r)]
    rng = random.Random(f"{w.name}:{seed}")
    rng.shuffle(space)
    # Spread over vector tile sizes (the biggest lever): round-robin over log2-size buckets.
    # Tiny vector tiles (< 64 elements) are far off anything a search would pick and slow to
    # time, so only a few of them ride along as the clearly bad end.
    buckets: dict[int, list] = {}
    for cfg in space:
        buckets.setdefault(int(math.log2(cfg[1][0] * cfg[1][1] * cfg[2])), []).append(cfg)
    # The order does not depend on `count` (a longer sample extends a shorter one), so the
    # measurement cache serves calibration and the fidelity benchmark alike.
    chosen = [c for c in ANCHOR_CONFIGS if valid(*c)]
    tiny = [c for key in sorted(buckets) if key < 6 for c in buckets[key][:1]]
    chosen += [c for c in tiny[1::2] if c not in chosen][:2]
    realistic = {key: cfgs for key, cfgs in buckets.items() if key >= 6}
    while len(chosen) < count and any(realistic.values()):
        for key in sorted(realistic):
            if realistic[key] and len(chosen) < count:
                cfg = realistic[key].pop()
                if cfg not in chosen:
                    chosen.append(cfg)
    return [plan_for(w, *cfg) for cfg in chosen[:count]]
