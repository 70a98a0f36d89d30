"""How well does the cost model rank IREE's configs of 1x1 convolutions over NCHW, as IREE forms
them? A corpus of its own.

IREE turns every 1x1 convolution of an NCHW model (torchvision's, through ONNX or torch) into a
contraction with the image first, as `linalg.conv_2d_nchw_fchw` orders its inputs:
out[co, p] = X[ci, p] x W[co, ci] over the image's p = h x w pixels. The contraction corpus
(model_fidelity.py) holds the same products with the weight first only, and IREE's vector lowering
treats the two orders differently (docs/benchmarks.md, sessions 24 and 25).

Shapes: the 1x1 convolutions of torchvision's MobileNetV2, SqueezeNet 1.0, GoogLeNet, ResNet-50
and EfficientNet-B0 definitions at batch 1 and 224x224, as collapsed generics. Per shape, a fixed
grid, not plans the model likes: IREE's own default, and register tiles of 1 and 8 output
channels by 1 and 2 vectors of pixels (and by IREE's divisor of a short pixel row), at reduction
tiles 1, 8 and 32, under IREE's default distribution tile. Measured on this CPU with
iree-benchmark-module (forced configs and IREE's default in alternating rounds, CPU time per
worker thread), cached per host in benchmarks/measurements/<host>.jsonl beside the other corpora.
The held-out half is fixed by a hash of the names.

    python benchmarks/pointwise_fidelity.py [--measure] [--details] [--host KEY]
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from conv_fidelity import Measured, corpus_main, measure_grid  # noqa: E402
from fidelity_measure import SETTINGS  # noqa: E402

from service.measure.cache import MeasurementCache, measurement_key  # noqa: E402

# (model, layer, in channels, out channels, output size): the layers' sizes in torchvision's
# model definitions at a 224x224 input.
LAYERS = (
    ("mobilenet_v2", "features.1.project", 32, 16, 112),
    ("mobilenet_v2", "features.2.expand", 16, 96, 112),
    ("mobilenet_v2", "features.3.expand", 24, 144, 56),
    ("mobilenet_v2", "features.3.project", 144, 24, 56),
    ("mobilenet_v2", "features.5.expand", 32, 192, 28),
    ("mobilenet_v2", "features.5.project", 192, 32, 28),
    ("mobilenet_v2", "features.9.expand", 64, 384, 14),
    ("mobilenet_v2", "features.12.project", 576, 96, 14),
    ("mobilenet_v2", "features.15.expand", 160, 960, 7),
    ("mobilenet_v2", "features.17.project", 960, 320, 7),
    ("mobilenet_v2", "features.18", 320, 1280, 7),
    ("squeezenet1_0", "features.3.squeeze", 96, 16, 54),
    ("squeezenet1_0", "features.3.expand1x1", 16, 64, 54),
    ("squeezenet1_0", "features.8.squeeze", 256, 32, 27),
    ("squeezenet1_0", "features.10.expand1x1", 48, 192, 13),
    ("squeezenet1_0", "classifier.1", 512, 1000, 13),
    ("googlenet", "conv2", 64, 64, 56),
    ("googlenet", "inception3a.branch1", 192, 64, 28),
    ("googlenet", "inception4a.branch2", 480, 96, 14),
    ("googlenet", "inception5b.branch1", 832, 384, 7),
    ("resnet50", "layer1.0.conv3", 64, 256, 56),
    ("resnet50", "layer2.1.conv1", 512, 128, 28),
    ("resnet50", "layer3.1.conv3", 256, 1024, 14),
    ("resnet50", "layer4.1.conv1", 2048, 512, 7),
    ("efficientnet_b0", "features.2.0.expand", 16, 96, 112),
    ("efficientnet_b0", "features.4.0.project", 240, 80, 14),
    ("efficientnet_b0", "features.6.1.expand", 192, 1152, 7),
    ("efficientnet_b0", "features.8", 320, 1280, 7),
)
ROWS = (1, 8)  # output channels per register tile
VECTORS = (1, 2)  # vectors of pixels per register tile row
REDUCTIONS = (1, 8, 32)


@dataclass(frozen=True)
class PointwiseShape:
    name: str
    c_in: int
    c_out: int
    pixels: int

    @property
    def half(self) -> str:
        return HALVES[self.name]


def corpus() -> list[PointwiseShape]:
    return [PointwiseShape(f"{model}.{layer}", c_in, c_out, out * out) for model, layer, c_in, c_out, out in LAYERS]


def _halves() -> dict[str, str]:
    names = sorted((s.name for s in corpus()), key=lambda n: hashlib.sha256(n.encode()).hexdigest())
    return {n: "held-out" if i % 2 == 0 else "tune" for i, n in enumerate(names)}


HALVES = _halves()


def module_text(s: PointwiseShape) -> str:
    """The convolution as IREE's dispatch holds it: a generic over (co, p, ci), image first."""
    x, w, y = f"tensor<{s.c_in}x{s.pixels}xf32>", f"tensor<{s.c_out}x{s.c_in}xf32>", f"tensor<{s.c_out}x{s.pixels}xf32>"
    return f"""func.func @pointwise(%x: {x}, %w: {w}) -> {y} {{
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : {y}
  %init = linalg.fill ins(%zero : f32) outs(%e : {y}) -> {y}
  %r = linalg.generic {{indexing_maps = [affine_map<(co, p, ci) -> (ci, p)>, affine_map<(co, p, ci) -> (co, ci)>,
                                        affine_map<(co, p, ci) -> (co, p)>],
                       iterator_types = ["parallel", "parallel", "reduction"]}}
       ins(%x, %w : {x}, {w}) outs(%init : {y}) {{
  ^bb0(%a: f32, %b: f32, %c: f32):
    %m = arith.mulf %a, %b : f32
    %s = arith.addf %c, %m : f32
    linalg.yield %s : f32
  }} -> {y}
  return %r : {y}
}}"""


def grid(s: PointwiseShape, distribution: list[int], lanes: int) -> list[list[list[int]]]:
    """Levels over (co, p, ci): register tiles of ROWS x VECTORS (and IREE's divisor of a short
    pixel row under a vector, as its default takes 7 of 49) at REDUCTIONS, clipped to the extents
    and to IREE's distribution tile."""
    dist_co = distribution[0] or s.c_out
    dist_p = distribution[1] or s.pixels
    widths = [v * lanes for v in VECTORS]
    if s.pixels % lanes and s.pixels <= 16 * lanes:
        widths.append(max(d for d in range(1, lanes) if s.pixels % d == 0))
    out = []
    for rows in ROWS:
        for width in widths:
            for k in REDUCTIONS:
                levels = [list(distribution), [min(rows, dist_co), min(width, dist_p), 0], [0, 0, min(k, s.c_in)]]
                if levels not in out:
                    out.append(levels)
    return out


def measure_shape(s: PointwiseShape, cache: MeasurementCache, measure: bool, lanes: int) -> Measured | None:
    text = module_text(s)
    key = measurement_key(text, {"pointwise_grid": s.name, "rows": ROWS, "vectors": VECTORS, "reductions": REDUCTIONS,
                                 "lanes": lanes}, SETTINGS)
    return measure_grid(s, text, "contraction", key, cache, measure, lambda distribution: grid(s, distribution, lanes))


def main() -> None:
    corpus_main(__doc__, corpus(), lambda s, cache, measure, hardware: measure_shape(
        s, cache, measure, hardware.compute.vector_width_bytes // 4), module_text)


if __name__ == "__main__":
    main()
