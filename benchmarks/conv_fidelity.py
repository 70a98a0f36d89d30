"""How well does the cost model rank IREE's configs of batched convolutions? A corpus of its own.

The contraction corpus (model_fidelity.py) never held a convolution, and `model tune` ships a
convolution's config only when measured inside the model: the cost model picks which plans are
measured. This corpus says how far to trust that pick.

Shapes: the 3x3 and 7x7 convolutions of torchvision's ResNet-18/50 and VGG-16 definitions, NCHW
f32 as IREE's torch and ONNX importers give them, at batch 2 to 8 (IREE 3.13 drops a config on a
batch of 1), input pre-padded (a valid convolution). Per shape, a fixed grid, not plans the model
likes: IREE's own default, and 12 configs drawn (seeded by the shape's name) from IREE's
decomposable vector tiles (one output row and one filter tap; output channels 8, 16 or 32, a
divisor of the output row up to 32, an input-channel reduction tile of 1 to 32) under IREE's
default distribution tile. Measured on this CPU with iree-benchmark-module (forced configs and
IREE's default in alternating rounds, CPU time per worker thread), cached per host in
benchmarks/measurements/<host>.jsonl beside the contraction corpus. The held-out half is fixed by
a hash of the names.

    python benchmarks/conv_fidelity.py [--measure] [--details] [--host KEY]
"""

from __future__ import annotations

import argparse
import hashlib
import math
import random
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fidelity_measure import SETTINGS, host_cache, host_profile, read_time  # noqa: E402

from service.hardware.model import HardwareModel  # noqa: E402
from service.hardware.profiles import get_profile  # noqa: E402
from service.ir.analysis import analyze  # noqa: E402
from service.measure.cache import MeasurementCache, host_key, measurement_key  # noqa: E402
from service.measure.forcing import NotMeasurable  # noqa: E402
from service.measure.lowering import levels_from_lowering_config, lowering_config_of  # noqa: E402
from service.measure.timing import iree_default_configs, measure_plans_and_default  # noqa: E402
from service.search.evaluator import price_plans  # noqa: E402
from service.search.guard import PREDICTED_MARGIN  # noqa: E402
from service.measure.calibration_plans import dispatch_members  # noqa: E402

# (model, layer, in channels, out channels, output size, filter, stride, batch)
LAYERS = (
    ("resnet18", "stem", 3, 64, 112, 7, 2, 2),
    ("resnet18", "layer1", 64, 64, 56, 3, 1, 4),
    ("resnet18", "layer2.down", 64, 128, 28, 3, 2, 4),
    ("resnet18", "layer2", 128, 128, 28, 3, 1, 4),
    ("resnet18", "layer3.down", 128, 256, 14, 3, 2, 8),
    ("resnet18", "layer3", 256, 256, 14, 3, 1, 8),
    ("resnet18", "layer4.down", 256, 512, 7, 3, 2, 8),
    ("resnet18", "layer4", 512, 512, 7, 3, 1, 8),
    ("resnet50", "layer1.conv2", 64, 64, 56, 3, 1, 2),
    ("resnet50", "layer2.conv2", 128, 128, 28, 3, 1, 8),
    ("resnet50", "layer3.conv2", 256, 256, 14, 3, 1, 2),
    ("resnet50", "layer4.conv2", 512, 512, 7, 3, 1, 2),
    ("vgg16", "conv3_3", 256, 256, 56, 3, 1, 2),
    ("vgg16", "conv4_3", 512, 512, 28, 3, 1, 2),
    ("vgg16", "conv5_3", 512, 512, 14, 3, 1, 2),
)
GRID_SIZE = 12


@dataclass(frozen=True)
class ConvShape:
    name: str
    c_in: int
    c_out: int
    out: int
    kernel: int
    stride: int
    batch: int

    @property
    def size_in(self) -> int:
        return (self.out - 1) * self.stride + self.kernel

    @property
    def half(self) -> str:
        return HALVES[self.name]


def corpus() -> list[ConvShape]:
    return [ConvShape(f"{model}.{layer}.b{batch}", c_in, c_out, out, kernel, stride, batch)
            for model, layer, c_in, c_out, out, kernel, stride, batch in LAYERS]


def _halves() -> dict[str, str]:
    names = sorted((s.name for s in corpus()), key=lambda n: hashlib.sha256(n.encode()).hexdigest())
    return {n: "held-out" if i % 2 == 0 else "tune" for i, n in enumerate(names)}


HALVES = _halves()


def module_text(s: ConvShape) -> str:
    x = f"tensor<{s.batch}x{s.c_in}x{s.size_in}x{s.size_in}xf32>"
    w = f"tensor<{s.c_out}x{s.c_in}x{s.kernel}x{s.kernel}xf32>"
    y = f"tensor<{s.batch}x{s.c_out}x{s.out}x{s.out}xf32>"
    return f"""func.func @conv(%x: {x}, %w: {w}) -> {y} {{
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : {y}
  %init = linalg.fill ins(%zero : f32) outs(%e : {y}) -> {y}
  %r = linalg.conv_2d_nchw_fchw {{dilations = dense<1> : tensor<2xi64>, strides = dense<{s.stride}> : tensor<2xi64>}}
       ins(%x, %w : {x}, {w}) outs(%init : {y}) -> {y}
  return %r : {y}
}}"""


def grid(s: ConvShape, default_distribution: list[int]) -> list[list[list[int]]]:
    """GRID_SIZE decomposable configs (levels over n, f, oh, ow, c, kh, kw) under IREE's own
    distribution tile, drawn with a seed of the shape's name."""
    rows = [d for d in range(1, min(s.out, 32) + 1) if s.out % d == 0 and d < s.out] or [s.out]
    choices = [(f, ow, c) for f in (8, 16, 32) for ow in rows for c in (1, 2, 4, 8, 16, 32)
               if f <= s.c_out and c <= s.c_in and s.c_in % c == 0]
    random.Random(s.name).shuffle(choices)
    out = []
    for f, ow, c in choices[:GRID_SIZE]:
        dist = list(default_distribution)
        if dist[1] and dist[1] % f:
            dist[1] = max(f, dist[1] // f * f)
        if dist[3] and dist[3] % ow:
            dist[3] = 0
        out.append([dist, [1, f, 1, ow, 0, 0, 0], [0, 0, 0, 0, c, 1, 1]])
    return out


@dataclass
class Measured:
    shape: ConvShape
    plans: list[dict]  # the grid's, then IREE's default
    measured_s: list[float | None]


def grid_plan(anchor: int, fuse: list[int], levels: list[list[int]]) -> dict:
    """A grid config as a plan: IREE's three levels, the first distributed over the cores as
    IREE's workgroups are (levels_from_lowering_config, which prices IREE's default)."""
    return {"groups": [{"anchor": anchor, "fuse": fuse, "levels": [
        {"tile_sizes": t, "loop": "forall" if i == 0 else "for"} for i, t in enumerate(levels)]}]}


def measure_shape(s: ConvShape, cache: MeasurementCache, measure: bool) -> Measured | None:
    text = module_text(s)
    key = measurement_key(text, {"conv_grid": s.name, "size": GRID_SIZE}, SETTINGS)
    return measure_grid(s, text, "convolution", key, cache, measure, lambda distribution: grid(s, distribution))


def measure_grid(shape, text: str, root_kind: str, key: str, cache: MeasurementCache, measure: bool,
                 grid_of: Callable[[list[int]], list[list[list[int]]]]) -> Measured | None:
    """One shape's grid (`grid_of` IREE's default distribution) and IREE's default, from the
    host's cache under `key` or measured (`measure`); None when neither."""
    graph = analyze(text).graph
    root = next(op for op in graph.ops.values() if op.kind == root_kind)
    default = cache.get(f"{key}:default")
    if default is None and not measure:
        return None
    if default is None:
        distribution = list(lowering_config_of(iree_default_configs(text, 120.0)[-1]).distribution)
    else:
        distribution = list(default.config[0].distribution)
    fuse = dispatch_members(graph, root.uid)  # the fill, as IREE's dispatch holds it
    plans = [grid_plan(root.uid, fuse, levels) for levels in grid_of(distribution)]
    got = [cache.get(f"{key}:{i}") for i in range(len(plans))]
    if default is None or any(g is None for g in got):
        try:
            got, default = measure_plans_and_default(text, plans, settings=SETTINGS)
        except NotMeasurable as exc:
            print(f"{shape.name}: {exc.reason}", file=sys.stderr)
            return None
        for i, m in enumerate(got):
            cache.put(f"{key}:{i}", m)
        cache.put(f"{key}:default", default)
    default_plan = {"groups": [{"anchor": root.uid, "fuse": fuse, "levels": levels_from_lowering_config(default.config[0])}]}
    times = [read_time(m, default, "cpu") for m in got] + [read_time(default, default, "cpu")]
    return Measured(shape, plans + [default_plan], times)


def rank(r: Measured, hardware: HardwareModel, text: str) -> dict:
    """The model's ranking of one shape's measured configs (`text`: the shape's module)."""
    pairs = [(p, t) for p, t in zip(r.plans, r.measured_s) if t and p]
    evaluations = price_plans(text, hardware, [p for p, _ in pairs])
    predicted = [e.latency_s if e.stage == "cost" else math.inf for e in evaluations]
    measured = [t for _, t in pairs]
    finite = [(p, m) for p, m in zip(predicted, measured) if math.isfinite(p)]
    rho = stats.spearmanr(*zip(*finite)).statistic if len(finite) >= 3 else math.nan
    pick = min(range(len(pairs)), key=lambda i: predicted[i])
    top3 = sorted(range(len(pairs)), key=lambda i: predicted[i])[:3]
    best = min(measured)
    # What a decision by prediction gives against IREE's default (the last config): the pick
    # ships only when predicted faster by the guard's margin, else IREE's default stays (1.0x).
    ships = predicted[pick] * (1 + PREDICTED_MARGIN) < predicted[-1]
    return {"rho": float(rho), "regret": measured[pick] / best - 1, "top3_regret": min(measured[i] for i in top3) / best - 1,
            "default_over_best": measured[-1] / best if r.plans[-1] else math.nan,
            "guarded_speedup": measured[-1] / measured[pick] if ships else 1.0,
            "predicted": predicted, "measured": measured, "plans": [p for p, _ in pairs]}


def main() -> None:
    corpus_main(__doc__, corpus(), lambda s, cache, measure, _hardware: measure_shape(s, cache, measure), module_text)


def corpus_main(doc: str, shapes: list, measure_one: Callable[..., Measured | None], text_of: Callable[..., str]) -> None:
    """A corpus benchmark's command line: `measure_one(shape, cache, measure, hardware)` per shape,
    ranked by the model of this host or of `--host`, then the report."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--measure", action="store_true", help="measure shapes missing from this host's cache")
    ap.add_argument("--details", action="store_true", help="every config of every shape")
    ap.add_argument("--host", default=None, help="another host's stored measurements")
    args = ap.parse_args()
    key = args.host or host_key()
    if args.measure and key != host_key():
        ap.error(f"--measure measures on this host ({host_key()}) only")
    hardware = get_profile("host-cpu") if key == host_key() else host_profile(key)
    cache = host_cache(key)
    rows = []
    for s in shapes:
        r = measure_one(s, cache, args.measure, hardware)
        if r is not None:
            rows.append((r, rank(r, hardware, text_of(s))))
            print(f"{s.name}: {len(rows[-1][1]['measured'])} configs", file=sys.stderr, flush=True)
    report(rows, key, len(shapes), args.details)


def report(rows: list, key: str, n_shapes: int, details: bool) -> None:
    """The markdown tables: per half, then per shape (`details`: every config)."""
    print(f"host {key}; {len(rows)} of {n_shapes} shapes measured (CPU time per worker thread)\n")
    print("| half | shapes | median rho | median top-1 regret | median best-of-top-3 regret | IREE default / grid's best (geomean) "
          "| pick by prediction vs IREE's default (geomean, min) |")
    print("|---|---|---|---|---|---|---|")
    for half in ("held-out", "tune"):
        xs = [x for r, x in rows if r.shape.half == half]
        if xs:
            geo = _geomean(x["default_over_best"] for x in xs)
            print(f"| {half} | {len(xs)} | {statistics.median(x['rho'] for x in xs):.2f} | "
                  f"{statistics.median(x['regret'] for x in xs):.0%} | {statistics.median(x['top3_regret'] for x in xs):.0%} | "
                  f"{geo:.2f}x | {_geomean(x['guarded_speedup'] for x in xs):.2f}x, {min(x['guarded_speedup'] for x in xs):.2f}x |")
    print("\n| shape | half | rho | regret | top-3 regret | IREE default / best | pick by prediction vs IREE's default |")
    print("|---|---|---|---|---|---|---|")
    for r, x in rows:
        print(f"| {r.shape.name} | {r.shape.half} | {x['rho']:.2f} | {x['regret']:.0%} | {x['top3_regret']:.0%} | "
              f"{x['default_over_best']:.2f}x | {x['guarded_speedup']:.2f}x |")
        if details:
            for p, pred, meas in zip(x["plans"], x["predicted"], x["measured"]):
                tiles = " / ".join(str(lv["tile_sizes"]) for lv in p["groups"][0]["levels"])
                print(f"|   {tiles} | | predicted {pred * 1e3:.3f} ms | measured {meas * 1e3:.3f} ms | | |")



def _geomean(xs) -> float:
    return math.exp(statistics.fmean(math.log(x) for x in xs))


if __name__ == "__main__":
    main()
