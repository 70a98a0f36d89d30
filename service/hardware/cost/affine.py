"""Affine maps evaluated on known index values (offsets and tile-size bounds of tiled loops)."""

from __future__ import annotations

from service.ir.mlir import ir

# Affine maps as plain tuples, by attribute (uniqued per context, so each distinct map is read
# through the bindings once per worker instead of once per use: the search costs thousands of
# clones with the same few maps). An expression is ("c", value) | ("d", pos) | ("s", pos) |
# (op, lhs, rhs) with op one of + * floordiv ceildiv mod | None (not evaluable).
_COMPILED_MAPS: dict = {}
_MAX_COMPILED_MAPS = 4096


def compiled_map(attr) -> tuple[int, tuple]:
    got = _COMPILED_MAPS.get(attr)
    if got is None:
        amap = ir.AffineMapAttr(attr).value
        got = (amap.n_dims, tuple(_compile_affine(e) for e in amap.results))
        if len(_COMPILED_MAPS) >= _MAX_COMPILED_MAPS:
            _COMPILED_MAPS.clear()
        _COMPILED_MAPS[attr] = got
    return got


def _compile_affine(e) -> tuple | None:
    if isinstance(e, ir.AffineConstantExpr):
        return ("c", e.value)
    if isinstance(e, ir.AffineDimExpr):
        return ("d", e.position)
    if isinstance(e, ir.AffineSymbolExpr):
        return ("s", e.position)
    if isinstance(e, ir.AffineBinaryExpr):
        for kind, op in ((ir.AffineAddExpr, "+"), (ir.AffineMulExpr, "*"), (ir.AffineFloorDivExpr, "floordiv"),
                         (ir.AffineCeilDivExpr, "ceildiv"), (ir.AffineModExpr, "mod")):
            if isinstance(e, kind):
                return (op, _compile_affine(e.lhs), _compile_affine(e.rhs))
    return None


def eval_affine(e: tuple | None, args: list[int | None], n_dims: int) -> int | None:
    if e is None:
        return None
    kind = e[0]
    if kind == "c":
        return e[1]
    if kind == "d":
        return args[e[1]]
    if kind == "s":
        return args[n_dims + e[1]]
    a, b = eval_affine(e[1], args, n_dims), eval_affine(e[2], args, n_dims)
    if a is None or b is None:
        return None
    if kind == "+":
        return a + b
    if kind == "*":
        return a * b
    if kind == "floordiv":
        return a // b
    if kind == "ceildiv":
        return -(-a // b)
    return a % b
