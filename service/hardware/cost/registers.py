"""Register-tile terms of a CPU contraction: how close its microkernel gets to FMA peak
(spills, FMA pipeline, loads per step, tall tiles, L1 set conflicts among the rows of A, rows
masked where a tile does not divide them), the accumulator share that spills, and IREE's
vector-tile size limit."""

from __future__ import annotations

import functools
import math
from collections import Counter

from ..model import HardwareModel
from .nest import Compute
from .results import kib


def plan_chose_vector_tile(c: Compute, level: int) -> bool:
    """Whether the plan, not IREE, chose this compute's vector tile: under two plan levels or
    more, IREE's vector tile is the plan's second level (service.measure.lowering's mapping).
    - In a loop carrying its accumulator under a distribution level, with no vector level
      between, the vector tile is the whole enclosing tile: a [32, 32] distribution tile with
      k = 2 is a 32x32 register tile.
    - Under a vector level with no reduction level, the reduction is not tiled: a [1, 4, 8]
      tile is a 4x8 register tile over the whole reduction.
    A single level (super tiling) tiles for memory only: the compiler picks the vector tile."""
    return level >= 2


def microkernel_efficiency(c: Compute, level: int, hw: HardwareModel, acc_trips: int) -> float:
    """Fraction of FMA peak a CPU register tile reaches (1.0 where the plan does not choose it).

    For a contraction whose vector tile the plan chose (plan_chose_vector_tile), per reduction
    step the tile [.., m, n] needs m*ceil(n/lanes) accumulator registers, ceil(n/lanes) for the
    row of B and one broadcast of A; it issues acc FMAs and m + ceil(n/lanes) loads.
    - spills: more registers than the file holds -> accumulators go through L1 each step, and
      each output tile pays _SPILL_STEPS_PER_REGISTER reduction steps per register past the
      file, on top of its own (the reduction tile x `acc_trips`, the trips of the loop that
      carries the accumulator);
    - pipeline: fewer independent accumulators than latency x ports leaves FMA units idle,
      unless the next register tiles' chains run beside them (_tiles_in_flight);
    - loads: more loads than FMAs per step makes the tile load-bound (as many ports of each);
    - rows: tiles taller than the hardware's register_tile_rows run proportionally slower;
    - set conflicts: rows of A that share an L1 set past its ways miss every step;
    - masked rows: rows a tile does not divide, where the compiler masks rather than peels,
      cost every register tile a masked load per row (k = 1) or a blend per FMA.
    """
    regs = hw.compute.vector_registers
    if regs is None or not plan_chose_vector_tile(c, level) or not c.reduction_tile or len(c.parallel_tile) < 1:
        return 1.0
    n_vecs = _vectors_per_row(c, hw)
    m = math.prod(c.parallel_tile[:-1]) if len(c.parallel_tile) > 1 else 1
    if m == 0 or n_vecs == 0:  # an empty tile: nothing to compute
        return 1.0
    acc = m * n_vecs
    needed = acc + n_vecs + 1
    spill = min(1.0, regs / needed)
    k = math.prod(c.reduction_tile)
    if needed > regs:
        steps = k * acc_trips
        spill *= steps / (steps + (needed - regs) * _SPILL_STEPS_PER_REGISTER)
    # The step's tile of B, [k, n], is read into registers beside the accumulators. Two rows of
    # B cost nothing more, whether or not the accumulators fit (measured on AVX2); more rows do
    # where they overflow the register file, or beside accumulators that spill already.
    b_overflows = k > 2 and (needed > regs or regs < acc + k * n_vecs + 1)
    b_tile = _B_TILE_OVERFLOW_EFFICIENCY if b_overflows else 1.0
    if c.rhs_k_contiguous:
        b_tile = _transposed_b_overflow(c, acc, n_vecs, k, hw)
    # A step lasts as long as its slowest resource, which overlap: the FMA units, the
    # accumulators' dependency chains, the load ports, and (B stored [n, k]) the shuffle unit.
    pipeline = min(1.0, acc * _tiles_in_flight(acc, m, n_vecs, k, acc_trips, hw) / hw.compute.fma_pipeline_depth)
    loads = min(1.0, acc / (m + n_vecs))
    issue = min(pipeline, loads, _transpose_efficiency(c, acc, n_vecs, k, hw) if c.rhs_k_contiguous else 1.0,
                _strided_b_efficiency(c, acc, k), _ragged_row_efficiency(c, m, acc, hw),
                _first_input_vectors_efficiency(c, acc, k, hw))
    rows = hw.compute.register_tile_rows
    tall = min(1.0, rows / m) if rows else 1.0
    return (spill * b_tile * issue * tall * _set_conflict_efficiency(c, hw) * _gathered_rows_efficiency(c, k, hw)
            * _masked_row_efficiency(c, m, acc, k, hw)
            * _narrow_accumulator_efficiency(c, k, hw))


# Instructions of one reduction step of a register tile besides its FMAs, broadcasts and loads
# (the loop's increment, compare and branch), per reduction tile.
_LOOP_INSTRUCTIONS = 3


def _tiles_in_flight(acc: int, m: int, n_vecs: int, k: int, acc_trips: int, hw: HardwareModel) -> float:
    """Register tiles whose FMA chains the core runs at once. A tile's chain is its whole
    reduction (k x acc_trips steps of acc FMAs, m broadcasts and n_vecs loads each); where it fits
    in the core's reorder window, the out-of-order core issues the next tiles' independent chains
    beside it, as it would more accumulators. A 1x1 convolution over 16 input channels, one
    output channel a tile, runs its 16-step chains this way; a 768-step chain runs alone
    (docs/benchmarks.md, session 26)."""
    chain = acc_trips * (k * (acc + m + n_vecs) + _LOOP_INSTRUCTIONS)
    return max(1.0, hw.compute.reorder_window / chain)


# An op that accumulates in bf16 keeps its accumulators in f32 registers but rounds them to bf16
# and extends them back after every reduction tile, as the op's type asks (IREE's x86 code: about
# 11 integer vector instructions per accumulator register, issued on two vector ALU pipes beside
# the FMA pipes, so they overlap the FMAs and slow a tile only when they take longer).
# docs/benchmarks.md, "Narrow floats". f16 without native f16 rounds every operation instead,
# which the profile's f16 peak prices.
_BF16_ROUNDING_CYCLES = 11 / 2


def _narrow_accumulator_efficiency(c: Compute, k: int, hw: HardwareModel) -> float:
    if not (hw.is_cpu and c.element_type == "bf16" and c.carried_acc_bytes):
        return 1.0
    fma_cycles = k / _FMAS_PER_CYCLE  # per accumulator register and reduction tile
    return min(1.0, fma_cycles / _BF16_ROUNDING_CYCLES)


# x86 (AVX2 / AVX-512): a lanes x lanes f32 transpose is lanes * log2(lanes) shuffles (unpck,
# shuf), read off IREE's code for a B stored [n, k]; one shuffle issues per cycle beside two FMAs.
_SHUFFLES_PER_CYCLE = 1.0
_FMAS_PER_CYCLE = 2.0
# IREE lowers a B tile of lanes x lanes with its square-transpose patterns (8x8 on AVX2, 16x16
# on AVX-512); a longer reduction tile's [n, k] transpose goes through the generic shuffle
# lowering instead, about one shuffle per element (read off IREE's x86 code: 8x16 on AVX2, 142
# shuffles for 128 elements against 24 for 8x8; 32x16 on AVX2, 492 for 512; 16x32 on AVX-512,
# 447 for 512 against 64 for 16x16). docs/benchmarks.md, "Session 21".
_GENERIC_TRANSPOSE_SHUFFLES = 1.0
# A reduction tile shorter than a vector leaves no vector to load along k: each element of B's
# tile is loaded and inserted on its own (a scalar load and an insert per element).
_GATHER_CYCLES_PER_ELEMENT = 2.0


def _transpose_efficiency(c: Compute, acc: int, n_vecs: int, k: int, hw: HardwareModel) -> float:
    """B contiguous along k: per reduction tile, its [n, k] tile is transposed into k rows of n
    in registers (k = lanes: IREE's square transpose, log2(lanes) shuffles per vector of B;
    k > lanes: the generic lowering, _GENERIC_TRANSPOSE_SHUFFLES per element) or gathered
    element by element (k < lanes).
    - Shuffles share their issue port with an FMA unit (port 5 on Intel AVX-512; Zen 4 issues
      both from its FP pipes), so their cycles add to the FMAs'.
    - The gather's loads and inserts overlap the FMAs: they slow the step only when longer."""
    lanes = compute_lanes(c, hw)
    fma_cycles = acc * k / _FMAS_PER_CYCLE
    if k >= lanes:
        per_vector = math.log2(lanes) if k == lanes else lanes * _GENERIC_TRANSPOSE_SHUFFLES
        return fma_cycles / (fma_cycles + n_vecs * k * per_vector / _SHUFFLES_PER_CYCLE)
    gather_cycles = n_vecs * lanes * k * _GATHER_CYCLES_PER_ELEMENT
    return min(1.0, fma_cycles / gather_cycles) if gather_cycles else 1.0


def _strided_b_efficiency(c: Compute, acc: int, k: int) -> float:
    """B read through a slice that steps over elements along the output row
    (`Compute.strided_rhs_elements`, a stride-2 convolution's input): no vector load reads its
    tile, so each of its elements is loaded and inserted on its own every reduction step, as a
    gathered B tile's are. The gather overlaps the FMAs and slows the step only when longer;
    rows of the tile that B does not index (output channels) share it."""
    if not c.strided_rhs_elements:
        return 1.0
    fma_cycles = acc * k / _FMAS_PER_CYCLE
    return min(1.0, fma_cycles / (c.strided_rhs_elements * k * _GATHER_CYCLES_PER_ELEMENT))


# A contraction vectorized along its first input (`Compute.second_input_rows`: a 1x1 convolution
# over NCHW, out[co, p] = X[ci, p] x W[co, ci]) with more than one row of the second input's
# (output channels): IREE lowers its vector.contract to outer products along the second input's
# free dim, read in the IR before LLVM (docs/benchmarks.md, session 25). Per reduction step it
# issues one FMA per pixel on a vector of the tile's output channels, each pixel's element of X
# extracted and broadcast on its own; per register tile the accumulator, held along pixels, is
# taken apart and rebuilt element by element. A pixel tile that does not divide the pixels adds a
# select and an element-wise rebuild of each FMA's operand. One output channel (IREE folds the
# unit dim) is an ordinary broadcast-and-FMA tile along pixels.
# Cycles of element work, against the core's own FMA issue rate (Compute.vector_fmas_per_cycle):
# fitted on a Zen 4, which issues one 512-bit FMA a cycle.
_BROADCAST_CYCLES = 0.5  # per reduction step and pixel
_ACCUMULATOR_CYCLES = 1.0  # per accumulator element and register tile
_MASKED_FACTOR = 2.0


def _first_input_vectors_efficiency(c: Compute, acc: int, k: int, hw: HardwareModel) -> float:
    rows = c.second_input_rows
    if rows <= 1:
        return 1.0
    lanes = compute_lanes(c, hw)
    pixels = math.prod(c.parallel_tile) // rows  # the tile's points of the first input's own dims
    fma_rate = hw.compute.vector_fmas_per_cycle
    fma_cycles = acc * k / fma_rate
    fmas = k * pixels * math.ceil(rows / lanes) / fma_rate
    elementwise = (k * pixels * _BROADCAST_CYCLES + rows * pixels * _ACCUMULATOR_CYCLES) * (
        _MASKED_FACTOR if c.masked_first_input else 1.0)
    return min(1.0, fma_cycles / (fmas + elementwise))


# A register tile row longer than a vector and not a whole number of vectors (24 or 49 f32
# with 16 lanes) is not vectorized as vectors plus a tail: IREE's code builds the tile element
# by element (vinsertps), about two elements a cycle. Measured on a Zen 4, 160x49x576: an 8x24
# tile 8.3x slower than 8x16, 8x49 6.7x; 8x7 (one partial vector) only loses its idle lanes.
_RAGGED_ELEMENTS_PER_CYCLE = 2.0


def _ragged_row_efficiency(c: Compute, m: int, acc: int, hw: HardwareModel) -> float:
    lanes = compute_lanes(c, hw)
    row = c.parallel_tile[-1] if c.parallel_tile else 1
    if row <= lanes or row % lanes == 0:
        return 1.0
    return min(1.0, (acc / _FMAS_PER_CYCLE) / (m * row / _RAGGED_ELEMENTS_PER_CYCLE))


# A register tile whose rows are dynamic (a tile at or above it does not divide the rows it
# tiles) is compiled under a row mask, in every tile, full or not (read off IREE's x86 code):
# - reduction tile 1: per step, a loop over the tile's rows tests each row's mask bit and loads
#   its element of A on its own, before the (masked) FMAs;
# - longer reduction tiles: each FMA's result is blended under the mask and A's elements are
#   broadcast by shuffles (8x16 at k = 16: 98 blends and 161 shuffles per 128 FMAs).
# Cycles of the model's 2 GHz clock, measured on a Zen 4 (f25 m17), [16, 64] distribution tiles,
# 8x16 register tiles, B 2048 x 512: 1025 rows against 1024 ran 3.0x slower at k = 1 (1.7 cycles
# more per row and step), 1.9x at k = 16 (0.7 cycles more per FMA); a 1x16 tile is never masked.
# A dynamic n or k costs little beside it (B's loads and C's stores take a mask register).
_MASKED_ROW_CYCLES = 2.0
_MASKED_FMA_CYCLES = 0.7


def _masked_row_efficiency(c: Compute, m: int, acc: int, k: int, hw: HardwareModel) -> float:
    if not (c.dynamic_rows and hw.compute.masked_remainders) or m <= 1:
        return 1.0
    fma_cycles = acc / _FMAS_PER_CYCLE
    extra = m * _MASKED_ROW_CYCLES if k == 1 else acc * _MASKED_FMA_CYCLES
    return fma_cycles / (fma_cycles + extra)


def _transposed_b_overflow(c: Compute, acc: int, n_vecs: int, k: int, hw: HardwareModel) -> float:
    """B contiguous along k: the transposed tile, n_vecs x min(k, lanes) vectors, is live beside
    the accumulators; the share that does not fit the register file goes through the stack
    twice (store, reload) per step."""
    regs = hw.compute.vector_registers or 0
    b_regs = n_vecs * min(k, compute_lanes(c, hw))
    free = max(1, regs - acc - 1)
    return min(1.0, free / b_regs) if b_regs else 1.0


# What a spilling register tile pays per output tile, in reduction steps per register past the
# file: a per-step charge alone cannot make a spilling tile win on a deep reduction and lose on
# a shallow one, as measured (fitted to a 64-deep matmul on AVX2).
_SPILL_STEPS_PER_REGISTER = 16

# Speed left when the accumulators fit the register file and the reduction step's tile of B does
# not: about 1.2x slower on AVX-512, not growing with the overflow (the excess is re-read from
# L1 rather than spilled).
_B_TILE_OVERFLOW_EFFICIENCY = 1 / 1.2


def _set_conflict_efficiency(c: Compute, hw: HardwareModel) -> float:
    """Fraction of speed left when the register tile's rows of A evict each other in L1.

    Each reduction step reads one element from every row of A. Rows a power-of-two pitch apart
    map to the same few sets of a set-associative L1; with more rows per set than ways, every
    step misses. The model: ways / (most rows in one set), from the innermost level's
    associativity."""
    return _rows_in_l1_sets_efficiency(c.lhs_rows, hw)


def _rows_in_l1_sets_efficiency(rows: tuple[tuple[int, int], ...], hw: HardwareModel) -> float:
    """ways / (most of these rows, (extent, byte stride) per row dim, in one L1 set), at most 1."""
    l1 = hw.memory_levels[-1]
    if not rows or l1.associativity is None or l1.line_bytes is None:
        return 1.0
    sets = max(1, l1.capacity_bytes // (l1.associativity * l1.line_bytes))
    return min(1.0, l1.associativity / _rows_per_set(rows, l1.line_bytes, sets))


def _gathered_rows_efficiency(c: Compute, k: int, hw: HardwareModel) -> float:
    """B stored [n, k] under a reduction tile shorter than a vector: each step reads one element
    of every row of the tile's B, whose line serves the next steps only if it stays in L1. Rows a
    power-of-two pitch apart fall in few sets; past the ways, they evict each other, as A's rows
    do (_set_conflict_efficiency), and the same rule prices it. benchmarks/probes/gathered_rows.c
    on a Zen 4 (8 ways): 16 and 64 rows in one set read 2.9x and 7x slower than at a pitch that
    spreads them over every set (the rule: 2x and 8x); LLaMA-3's k/v projection at one token
    (B [1024, 4096]) with 1 x 16 and 1 x 64 tiles at k = 1 measured the same per element."""
    return 1.0 if k >= compute_lanes(c, hw) else _rows_in_l1_sets_efficiency(c.rhs_rows, hw)


# What a core's reads of B get of a shared level's bandwidth when a register tile reads one cache
# line of each of B's rows a step and the next line of each row, which the L1 prefetcher brought
# in, is evicted before the next register tile reads it: one core reading a [K, N] f32 matrix in
# column panels (benchmarks/probes/row_runs.c), 16 floats of a row a visit against 64: 0.33-0.41
# from L3 on an Intel Xeon f6 m167, 0.58 on an AMD Zen 4 (docs/benchmarks.md, sessions 29-30).
_NARROW_WALK_EFFICIENCY = 0.4


def narrow_walk_efficiency(c: Compute, hw: HardwareModel) -> float:
    """Fraction of a shared level's bandwidth a core's reads of B get (1.0: no loss).

    A register tile one cache line wide over B stored [k, n] walks all of B's reduction rows for
    that line of each; the next register tile reads the next line of every row, in L1 only if
    the L1's next-line prefetch brought it and it survived the walk. Rows a pitch apart fall in
    sets / gcd(pitch in lines, sets) sets, and with more rows per set than ways they evict each
    other. The probe, 768 rows from L3: pitches of 169, 171, 173 lines (every set) lose nothing,
    170 and 174 (half the sets, 2 rows a way) 0.57-0.76, 172 (4 a way) 0.41, 176 (4 sets) 0.33;
    at 192 rows the same with 4x fewer rows. Survival: (ways / rows per set) ** 2. Two lines a
    visit lost less (0.68-0.92) and are not priced: pricing them moved GPT-2's projections to
    tiles that ran its block 1.36-1.49x faster than IREE's default instead of 1.67-1.90x."""
    l1 = hw.memory_levels[-1]
    if (not c.rhs_walk_rows or l1.associativity is None or l1.line_bytes is None
            or c.rhs_run_bytes > l1.line_bytes):
        return 1.0
    survived = _rows_in_l1_sets_efficiency(c.rhs_walk_rows, hw) ** 2
    return _NARROW_WALK_EFFICIENCY + (1.0 - _NARROW_WALK_EFFICIENCY) * survived


@functools.lru_cache(maxsize=4096)
def _rows_per_set(rows: tuple[tuple[int, int], ...], line_bytes: int, sets: int) -> int:
    """Most rows (extent, stride per row dim) whose first line falls in one cache set."""
    if len(rows) == 1 and rows[0][1] % line_bytes == 0:
        # One row dim a whole number of lines apart: its rows cycle through sets / gcd sets.
        extent, stride = rows[0]
        return -(-extent // (sets // math.gcd(stride // line_bytes, sets)))
    offsets = [0]
    for extent, stride in rows:
        offsets = [o + i * stride for o in offsets for i in range(extent)]
        if len(offsets) > 1 << 16:  # rows past this many spread over every set
            return 1
    return max(Counter((o // line_bytes) % sets for o in offsets).values())


# IREE's CPU code extends these to f32 to compute them (docs/benchmarks.md, "Narrow floats").
_COMPUTED_AS_F32 = frozenset({"bf16", "f16"})


def compute_lanes(c: Compute, hw: HardwareModel) -> int:
    """Elements of the compute's type in one vector register as the code computes them: a CPU's
    register holds bf16 and f16 as f32 lanes, so an 8x64 bf16 tile takes 32 accumulators, not 16."""
    element_bytes = 4 if hw.is_cpu and c.element_type in _COMPUTED_AS_F32 else c.element_bytes
    return max(1, hw.compute.vector_width_bytes // element_bytes)


def _vectors_per_row(c: Compute, hw: HardwareModel) -> int:
    """Vector registers one row of the register tile spans (its innermost parallel extent)."""
    lanes = compute_lanes(c, hw)
    return math.ceil((c.parallel_tile[-1] if c.parallel_tile else 1) / lanes)


def spilled_fraction(c: Compute, hw: HardwareModel) -> float:
    """Fraction of an accumulator tile that does not fit the vector register file beside one
    row of B and a broadcast of A (all of it when the register file is unknown)."""
    regs = hw.compute.vector_registers
    if regs is None:
        return 1.0
    acc_regs = math.ceil(c.carried_acc_bytes / 2 / c.element_bytes / compute_lanes(c, hw))  # init + result: one tile
    spare = regs - _vectors_per_row(c, hw) - 1
    return max(0.0, 1.0 - max(0, spare) / acc_regs) if acc_regs else 0.0


def check_vector_tile(c: Compute, level: int, hw: HardwareModel, reasons: list[str]) -> None:
    """IREE's CPU backend rejects vector tiles (parallel product x reduction tile) of
    hw.max_vector_tile_bytes or more (512 native vectors: 32 KiB with AVX-512, 16 KiB with AVX2).
    Only where the plan chose the vector tile (plan_chose_vector_tile)."""
    if hw.max_vector_tile_bytes is None or not plan_chose_vector_tile(c, level) or not c.reduction_tile:
        return
    size = c.points * c.element_bytes
    if size >= hw.max_vector_tile_bytes:
        dims = "x".join(str(d) for d in c.parallel_tile + c.reduction_tile)
        reasons.append(
            f"vector tile too large: {c.name} (uid {c.uid}) tile {dims} = {c.points} {c.element_type} elements "
            f"({kib(size)}) >= {kib(hw.max_vector_tile_bytes)} limit"
        )
