"""The broad fidelity corpus: contraction shapes from public model configurations, each with a
fixed grid of IREE CPU lowering configs (not plans the cost model likes), and a held-out half.

Shapes are generated from the layer dimensions of published configurations (below); nothing is
picked by how the model does on it. Per shape:
- the module: one f32 contraction (B stored [k, n], or [n, k] as torch.nn.Linear keeps weights,
  or batched as attention's Q·Kᵀ and P·V) feeding nothing else, so it is one IREE dispatch;
- the grid: 3 distribution tiles x 3 register tiles x 2 reduction tiles (18 forced configs,
  fewer where a small extent folds some together), plus IREE's own default, measured alongside;
- its class: M <= 32, batched, square-ish or tall-skinny (the issue's report classes);
- its half: "tune" or "held-out", stratified by class and decided by a hash of the name, so the
  held-out half is fixed before anyone looks at a figure.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

# name: (hidden, ffn, heads, head_dim, kv_heads, weight layout, token counts M)
# Layer sizes from the models' published configuration files (config.json on the Hugging Face
# hub, torchvision's model definitions). Layout "nk": nn.Linear's [out, in] weight (B
# contiguous along k); "kn": GPT-2's Conv1D [in, out].
TRANSFORMERS: dict[str, tuple[int, int, int, int, int, str, tuple[int, ...]]] = {
    "bert-base": (768, 3072, 12, 64, 12, "nk", (128, 4096)),
    "bert-large": (1024, 4096, 16, 64, 16, "nk", (384,)),
    "gpt2": (768, 3072, 12, 64, 12, "kn", (1, 64, 1024)),
    "llama2-7b": (4096, 11008, 32, 128, 32, "nk", (1, 16)),
    "llama3-8b": (4096, 14336, 32, 128, 8, "nk", (1, 8, 32)),
    "mistral-7b": (4096, 14336, 32, 128, 8, "nk", (4, 128)),
    "vit-b16": (768, 3072, 12, 64, 12, "nk", (197,)),
}
# Attention batch matmuls: (model, heads, head_dim, query length, key length).
ATTENTION = (
    ("bert-base", 12, 64, 128, 128),
    ("gpt2", 12, 64, 256, 256),
    ("vit-b16", 12, 64, 197, 197),
    ("llama2-7b-decode", 32, 128, 1, 512),
    ("llama3-8b-prefill", 8, 128, 64, 64),
)
# 1x1 convolutions as matmuls (NHWC): (model, spatial extent, in channels, out channels).
POINTWISE = (
    ("resnet50", 56, 64, 256), ("resnet50", 56, 256, 64), ("resnet50", 28, 128, 512),
    ("resnet50", 28, 512, 128), ("resnet50", 14, 256, 1024), ("resnet50", 14, 1024, 256),
    ("resnet50", 7, 512, 2048), ("resnet50", 7, 2048, 512),
    ("mobilenet_v2", 112, 32, 16), ("mobilenet_v2", 56, 24, 144), ("mobilenet_v2", 28, 32, 192),
    ("mobilenet_v2", 14, 64, 384), ("mobilenet_v2", 14, 96, 576), ("mobilenet_v2", 7, 160, 960),
    ("mobilenet_v2", 7, 320, 1280),
)
# Kept measurable in minutes on a 2-core VM: bad configs run ~10x slower than good ones.
MAX_FLOPS = 6e9


@dataclass(frozen=True)
class Shape:
    name: str
    batch: int
    m: int
    n: int
    k: int
    b_layout: str  # "kn" or "nk"

    @property
    def flops(self) -> float:
        return 2.0 * self.batch * self.m * self.n * self.k

    @property
    def shape_class(self) -> str:
        if self.batch > 1:
            return "batched"
        if self.m <= 32:
            return "M<=32"
        dims = (self.m, self.n, self.k)
        return "square-ish" if max(dims) <= 4 * min(dims) else "tall-skinny"

    @property
    def half(self) -> str:
        return HALVES[self.name]


def _transformer_shapes() -> list[Shape]:
    out = []
    for model, (hidden, ffn, heads, head_dim, kv_heads, layout, tokens) in TRANSFORMERS.items():
        kv = kv_heads * head_dim
        layers = {"q": (hidden, hidden), "kv": (kv, hidden), "up": (ffn, hidden), "down": (hidden, ffn)}
        if model == "gpt2":  # one fused c_attn projection
            layers = {"c_attn": (3 * hidden, hidden), "up": (ffn, hidden), "down": (hidden, ffn)}
        for m in tokens:
            for layer, (n, k) in layers.items():
                if layer == "kv" and kv == hidden:
                    continue  # same shape as q
                out.append(Shape(f"{model}.{layer}.m{m}", 1, m, n, k, layout))
    return out


def _attention_shapes() -> list[Shape]:
    out = []
    for model, heads, head_dim, q_len, k_len in ATTENTION:
        out.append(Shape(f"{model}.qk", heads, q_len, k_len, head_dim, "nk"))
        out.append(Shape(f"{model}.pv", heads, q_len, head_dim, k_len, "kn"))
    return out


def _pointwise_shapes() -> list[Shape]:
    return [Shape(f"{model}.1x1.{hw}x{hw}.{cin}to{cout}", 1, hw * hw, cout, cin, "kn")
            for model, hw, cin, cout in POINTWISE]


def corpus() -> list[Shape]:
    """Every shape of the corpus, deduplicated by (batch, m, n, k, layout), first name kept."""
    seen: set[tuple] = set()
    out = []
    for s in _transformer_shapes() + _attention_shapes() + _pointwise_shapes():
        key = (s.batch, s.m, s.n, s.k, s.b_layout)
        if key in seen or s.flops > MAX_FLOPS:
            continue
        seen.add(key)
        out.append(s)
    return out


def _halves(shapes: list[Shape]) -> dict[str, str]:
    """Within each class, shapes ordered by a hash of their name alternate between the halves."""
    halves: dict[str, str] = {}
    for cls in sorted({s.shape_class for s in shapes}):
        members = sorted((s for s in shapes if s.shape_class == cls),
                         key=lambda s: hashlib.sha256(s.name.encode()).hexdigest())
        for i, s in enumerate(members):
            halves[s.name] = "held-out" if i % 2 == 0 else "tune"
    return halves


HALVES = _halves(corpus())


def module_text(s: Shape) -> str:
    """One f32 contraction: C = A·B (B as stored per `b_layout`), zero-filled accumulator."""
    b_dims = (s.k, s.n) if s.b_layout == "kn" else (s.n, s.k)
    if s.batch == 1:
        a_t, b_t, c_t = (f"tensor<{s.m}x{s.k}xf32>", f"tensor<{b_dims[0]}x{b_dims[1]}xf32>",
                         f"tensor<{s.m}x{s.n}xf32>")
        maps = ("affine_map<(m, n, k) -> (m, k)>",
                "affine_map<(m, n, k) -> (k, n)>" if s.b_layout == "kn" else "affine_map<(m, n, k) -> (n, k)>",
                "affine_map<(m, n, k) -> (m, n)>")
        op = "linalg.matmul"
    else:
        a_t, b_t, c_t = (f"tensor<{s.batch}x{s.m}x{s.k}xf32>",
                         f"tensor<{s.batch}x{b_dims[0]}x{b_dims[1]}xf32>", f"tensor<{s.batch}x{s.m}x{s.n}xf32>")
        maps = ("affine_map<(b, m, n, k) -> (b, m, k)>",
                "affine_map<(b, m, n, k) -> (b, k, n)>" if s.b_layout == "kn"
                else "affine_map<(b, m, n, k) -> (b, n, k)>",
                "affine_map<(b, m, n, k) -> (b, m, n)>")
        op = "linalg.batch_matmul"
    return f"""func.func @main(%a: {a_t}, %b: {b_t}) -> {c_t} {{
  %zero = arith.constant 0.0 : f32
  %empty = tensor.empty() : {c_t}
  %acc = linalg.fill ins(%zero : f32) outs(%empty : {c_t}) -> {c_t}
  %c = {op} indexing_maps = [{", ".join(maps)}]
      ins(%a, %b : {a_t}, {b_t}) outs(%acc : {c_t}) -> {c_t}
  return %c : {c_t}
}}
"""


# The grid, before clipping to a shape's extents: (distribution m, n), (register m, n) as
# multiples of the f32 lanes for n, and the reduction tile.
GRID_DISTRIBUTION = ((16, 64), (64, 128), (256, 256))
GRID_REGISTER = ((1, 1), (8, 1), (4, 4))  # (rows, vectors of lanes)
GRID_REDUCTION = (1, 16)


def grid(s: Shape, lanes: int) -> list[tuple[tuple[int, int], tuple[int, int], int]]:
    """The shape's fixed configs: (distribution (m, n), register (m, n), reduction), each tile
    clipped to the extents and the register tile to its distribution tile; duplicates dropped."""
    out = []
    for dm, dn in GRID_DISTRIBUTION:
        dist = (min(dm, s.m), min(dn, s.n))
        for rows, vectors in GRID_REGISTER:
            reg = (min(rows, dist[0]), min(vectors * lanes, dist[1]))
            for red in GRID_REDUCTION:
                cfg = (dist, reg, min(red, s.k))
                if cfg not in out:
                    out.append(cfg)
    return out
