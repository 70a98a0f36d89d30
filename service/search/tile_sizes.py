"""The tile sizes the search space offers each dim of an anchor, level by level (space.py's
knob values): distribution (outer), register (inner) and reduction tiles, and the contraction
dims whose register tile stays 1."""

from __future__ import annotations

from service.ir.graph import TileableOp


# A distribution tile of whole vectors that does not divide the innermost dim is offered when
# the dim holds this many of it (its remainder tile then adds at most 1/8 to the work).
NARROW_SHARE = 8
# The innermost dim gets a register width under a vector (a divisor) when it is this many
# vectors long or shorter.
SHORT_VECTORS = 16


def _pow2_upto(limit: int, start: int = 1) -> list[int]:
    out, s = [], start
    while s < limit:
        out.append(s)
        s *= 2
    return out


def outer_sizes(extent: int, min_size: int = 32, max_choices: int = 6, dynamic: bool = False,
                vector_elems: int | None = None) -> list[int]:
    """0 (untiled) + powers of two and divisors of the extent below it, largest kept first.

    A dynamic dim (`extent` is its hint) is never left untiled: its tiles then get a static
    upper bound (affine.min), which vectorization needs for static vector sizes (IREE runs an
    untiled dynamic dim slower; docs/benchmarks.md). In its place, one tile of the whole hinted extent.

    On the innermost (vector) dim (`vector_elems` given), a tile that does not divide the extent
    leaves a remainder tile, which costs about a whole tile whatever its width (IREE masks it, or
    every tile once they are dynamic). So such a tile must leave a remainder of whole vectors, or
    be whole vectors and one of NARROW_SHARE tiles or more: MobileNet's 1x1 convolutions over 49
    pixels tiled by 12 or 48 ran 2.2-2.7x slower than 49 whole; an MLP's 3000 columns tiled by
    64 ran 1.25x faster than IREE's default, by 600 with 15-lane vectors 0.78x (timed inside the
    models; docs/benchmarks.md). A long dim with no such tile keeps its tiles (ViT's Q·Kᵀ over
    197 keys, tiled by 64, measured 8x faster than IREE's default)."""
    min_size = min(min_size, max(1, extent // 4))  # small dims still get a few choices
    sizes = {s for s in _pow2_upto(extent, min_size)}
    sizes |= {extent // q for q in range(2, 65) if extent % q == 0 and extent // q >= min_size}  # divisors, <= 64 tiles
    if vector_elems and not dynamic:
        whole = {s for s in sizes if extent % s == 0 or (s % vector_elems == 0 and (
            extent % s % vector_elems == 0 or extent // s >= NARROW_SHARE))}
        # A dim of a few vectors is tiled whole (IREE: 49); a longer one with no such tile (a
        # prime, ViT's 197 tokens) keeps its tiles: untiled, its vector tile could not be formed.
        sizes = whole if whole or extent <= 4 * vector_elems else sizes
    # The largest are kept; on the innermost dim, tiles of whole vectors first.
    keep = sorted(sizes, key=lambda s: (bool(vector_elems) and s % vector_elems != 0, -s))[:max_choices - 1]
    ordered = sorted(keep)
    if dynamic:
        return [*ordered, extent]
    return [0, *ordered] if ordered else [0]


def inner_sizes(extent: int, vector_elems: int, innermost: bool, many_dims: bool = False, batch: bool = False,
                rows: bool = False) -> list[int]:
    """Register-level tiles: multiples of the vector width on the innermost dim, small elsewhere
    (and 1 when the anchor has many parallel dims, e.g. convolutions, to fit a vector tile).
    A contraction's batch dim gets 1, as in IREE's default: a register tile spanning several
    batches multiplies the accumulators and shares no load between them.
    A contraction's rows (`rows`) may also be 6: 6 rows of 2 vectors are 12 accumulators, the
    FMA pipeline's depth, in 15 of 16 AVX2 registers with B's row and A's broadcast (BLIS's AVX2
    kernel); 8 spill and 4 leave the FMA units idle."""
    if batch:
        return [1]
    if innermost:
        cands = [vector_elems * m for m in (1, 2)]
        if extent % vector_elems and extent <= SHORT_VECTORS * vector_elems:
            # A short dim's remainder is a large share: IREE's choice there is the largest divisor
            # under a vector (7 of 49; 14 of 196 ran 1.6-2.4x faster than IREE's default inside
            # MobileNet). On a long dim whole vectors win (15 of 3000 ran 0.78x, 9 of 513 0.6-0.9x).
            divisor = max(d for d in range(1, min(vector_elems, extent)) if extent % d == 0)
            if divisor > 1:
                cands.append(divisor)
    else:
        cands = [1, 4, 8] if many_dims else [4, 6, 8, 16] if rows else [4, 8, 16]
        if rows and extent % 8:
            # Rows no tile divides are masked in every register tile on AVX-512 (cost/registers.py):
            # the largest divisor up to 8 (IREE's choice: 7 of 49) keeps them whole.
            cands += [d for d in range(8, 1, -1) if extent % d == 0][:1]
    return [0, *sorted({s for s in cands if s < extent})]


def reduction_sizes(extent: int, dividing: bool = False) -> list[int]:
    """Reduction tiles of the vector level: 1 (A broadcast straight from memory, which suits
    wide register tiles) up to 128. `dividing`: only tiles that divide the extent, where the
    compiler masks a remainder in every step rather than peeling it (IREE on AVX-512: K = 1000
    at k 32 ran 3.3x slower than at k 8 on a Zen 4, k 16 1.7x; K = 2040 at k 16 1.56x slower
    than K = 2048)."""
    return [0, *[s for s in _pow2_upto(extent, 1) if s <= 128 and not (dividing and extent % s)]]


# --------------------------------------------------------------------------- building the space


def _read_with_step(op: TileableOp, operand: int) -> bool:
    """The operand is read through a slice that steps over elements (a strided convolution's input)."""
    return bool(op.operand_steps) and op.operand_steps[operand] > 1


def _vector_input(op: TileableOp) -> int | None:
    """A contraction's vector operand: the first input the innermost parallel dim indexes."""
    if op.kind != "contraction" or not op.parallel_dims:
        return None
    return next((i for i, dims in enumerate(op.operand_dims[:op.num_inputs]) if op.parallel_dims[-1] in dims), None)


def is_dense_pixel_contraction(op: TileableOp) -> bool:
    """A contraction whose vector operand (the input the innermost parallel dim indexes) has two
    parallel dims or more of its own and is read densely: a 1x1 convolution over NCHW as IREE
    forms it, out[co, h, w] = W[co, ci] x X[ci, h, w]."""
    vector_input = _vector_input(op)
    if vector_input is None or _read_with_step(op, vector_input):
        return False
    dims = op.operand_dims[vector_input]
    return sum(1 for d in op.parallel_dims if d in dims and d not in op.batch_dims) >= 2


def vectorizes_first_input(op: TileableOp) -> bool:
    """A contraction whose first input, read densely, is the one the innermost parallel dim
    indexes and its second input is not: a 1x1 convolution over NCHW as IREE forms it, image
    first as `linalg.conv_2d_nchw_fchw` has it, out[co, p] = X[ci, p] x W[co, ci]. IREE's vector
    lowering makes outer products along the second input's free dim, so a register tile of
    several output channels runs one FMA per pixel on a vector of channels and rebuilds its
    accumulator element by element (read in the IR before LLVM; priced by the cost model,
    hardware/cost/registers.py). On a Zen 3 IREE's own config of such a matmul ran 2.1x slower
    than with the inputs the other way round (docs/benchmarks.md, sessions 24 and 25)."""
    if _vector_input(op) != 0 or op.num_inputs < 2 or _read_with_step(op, 0):
        return False
    return op.parallel_dims[-1] not in op.operand_dims[1]


def single_row_dims(op: TileableOp) -> list[int]:
    """A contraction's parallel dims that keep a register tile of 1, as in IREE's default: those
    of the broadcast operand when the vector operand (the input the innermost parallel dim
    indexes) has two parallel dims or more, e.g. a 1x1 convolution over NCHW,
    out[co, h, w] = W[co, ci] x X[ci, h, w]. Timed inside MobileNet (docs/benchmarks.md): beside 4
    rows of h, 4 rows of co ran 2.4-4.6x slower than 1, and the fastest tile of each of three such
    convolutions had one.
    The other way round where the vector operand is read with a step (a stride-2 convolution's
    input): its vectors are gathered element by element, and only rows of the broadcast operand
    share a gather, so the vector operand's own rows keep 1 (a stride-2 1x1 convolution on a
    Zen 5: 8 rows of co by 14 of w ran 6.6x faster than 1 by 14, and 14 rows of h by 14 no
    faster; docs/benchmarks.md).
    The same where the vector operand is the first input (vectorizes_first_input), pixels
    collapsed or not: IREE's outer products then run along the output channels, and on a Zen 4
    one row of them ran 1.6-2.5x faster than eight at every reduction tile from 8 to 32, but on
    7x7 images, where IREE's own 8 x 7 tile is best and the guard keeps it
    (benchmarks/pointwise_fidelity.py, docs/benchmarks.md, session 25)."""
    vector_input = _vector_input(op)
    if vector_input is None:
        return []
    vector_operand = op.operand_dims[vector_input]
    own = [d for d in op.parallel_dims if d in vector_operand and d not in op.batch_dims]
    if _read_with_step(op, vector_input):
        return own[:-1]
    if not (is_dense_pixel_contraction(op) or vectorizes_first_input(op)):
        return []
    return [d for d in op.parallel_dims if d not in vector_operand and d not in op.batch_dims]
