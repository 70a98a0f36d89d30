"""`HardwareModel`: what the cost model knows about a machine.

Memory levels are listed outermost (main memory) to innermost (closest to the compute units).
Efficiency factors default to 1.0 (the nominal figures); calibration fits them to measurements.
"""

from __future__ import annotations

import hashlib
import json
from typing import Self

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator


class MemoryLevel(BaseModel):
    """One level of the memory hierarchy."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, description="Level name, e.g. DRAM, L3, L2, L1, SRAM.")
    capacity_bytes: int = Field(description="Capacity in bytes (per core unless `shared`).")
    bandwidth_bytes_per_s: float = Field(
        description="Bandwidth into the next inner level, bytes/s (whole chip if `shared`, else per core)."
    )
    shared: bool = Field(default=False, description="Shared by all cores (True) or private per core.")
    scratchpad: bool = Field(
        default=False,
        description="Software-managed memory (SRAM, GPU shared memory): a tile that does not fit is "
        "infeasible. A cache that overflows only costs traffic.",
    )
    # Set-associative caches (CPU L1): rows of a register tile a power-of-two pitch apart fall
    # into the same few sets, and past `associativity` rows per set they evict each other.
    associativity: int | None = Field(default=None, ge=1, description="Ways per set of a cache (None: unknown; no set-conflict term).")
    line_bytes: int | None = Field(default=None, ge=1, description="Cache line size in bytes (used with associativity).")

    @field_validator("capacity_bytes")
    @classmethod
    def _positive_capacity(cls, v: int) -> int:
        if v <= 0:
            raise ValueError(f"capacity_bytes must be > 0, got {v}")
        return v

    @field_validator("bandwidth_bytes_per_s")
    @classmethod
    def _positive_bandwidth(cls, v: float) -> float:
        if not v > 0:
            raise ValueError(f"bandwidth_bytes_per_s must be > 0, got {v}")
        return v


class Compute(BaseModel):
    """Compute resources of the whole chip."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    peak_flops_per_s: dict[str, float] = Field(
        description="Peak flops/s of the whole chip per element type, e.g. {'f32': 2.5e11}."
    )
    vector_width_bytes: int = Field(default=32, description="SIMD register width in bytes.")
    cores: int = Field(default=1, description="Cores (CPU cores, SMs, NPU engines).")
    # CPU register-tile model (None: not a CPU, no microkernel term). A contraction's vector
    # tile keeps its accumulator in vector registers: past the register file it spills, and
    # too few independent accumulators leave the FMA pipelines idle.
    vector_registers: int | None = Field(default=None, ge=1, description="Architectural SIMD registers per core (CPU only).")
    fma_pipeline_depth: int = Field(default=8, ge=1, description="Independent FMAs in flight to saturate a core (latency x ports).")
    vector_fmas_per_cycle: float = Field(
        default=2.0, gt=0,
        description="Vector FMAs a core issues per cycle at vector_width_bytes (x86: two FMA pipes; Zen 4 runs a "
                    "512-bit FMA as two halves, one a cycle). Element-wise work beside the FMAs (extracts, "
                    "broadcasts, inserts) is priced in cycles against it (CPU only).",
    )
    reorder_window: int = Field(
        default=224, ge=1,
        description="Instructions a core keeps in flight (its reorder buffer): where one register tile's whole "
                    "reduction fits in it, the FMA chains of the next tiles run beside its own (CPU only).",
    )
    masked_remainders: bool = Field(
        default=False,
        description="The compiler vectorizes a tile with a dynamic extent under masks rather than peeling its "
                    "remainder (IREE's CPU pipeline with AVX-512; AVX2 peels): a register tile whose rows do not "
                    "divide the rows they tile gathers each row of A element by element (CPU only).",
    )
    register_tile_rows: int | None = Field(
        default=None, ge=1,
        description="Rows of a register tile the compiler's contraction lowering handles at full speed; "
                    "taller tiles run proportionally slower (CPU only; None = no limit). The host profile "
                    "leaves it None: the L1 set-conflict term explains the measured row limits.",
    )

    @field_validator("peak_flops_per_s")
    @classmethod
    def _positive_peaks(cls, v: dict[str, float]) -> dict[str, float]:
        if not v:
            raise ValueError("peak_flops_per_s needs at least one element type, e.g. {'f32': 1e11}")
        bad = {k: p for k, p in v.items() if not p > 0}
        if bad:
            raise ValueError(f"peak_flops_per_s must be > 0 for every element type, got {bad}")
        return v

    @field_validator("vector_width_bytes")
    @classmethod
    def _positive_vector(cls, v: int) -> int:
        if v <= 0:
            raise ValueError(f"vector_width_bytes must be > 0, got {v}")
        return v

    @field_validator("cores")
    @classmethod
    def _at_least_one_core(cls, v: int) -> int:
        if v < 1:
            raise ValueError(f"cores must be >= 1, got {v}")
        return v

    def peak_for(self, element_type: str) -> float:
        """Peak flops/s for an element type; unknown types fall back to f32, then the slowest."""
        if element_type in self.peak_flops_per_s:
            return self.peak_flops_per_s[element_type]
        if "f32" in self.peak_flops_per_s:
            return self.peak_flops_per_s["f32"]
        return min(self.peak_flops_per_s.values())


class Calibration(BaseModel):
    """Free parameters that calibration fits to measurements (1.0 = nominal figures)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    compute_efficiency: float = Field(default=1.0, gt=0, le=10, description="Fraction of peak flops reached.")
    bandwidth_efficiency: dict[str, float] = Field(
        default_factory=dict,
        description="Fraction of nominal bandwidth reached, per level name (missing = 1.0).",
    )
    loop_overhead_scale: float = Field(default=1.0, gt=0, description="Multiplier on loop_overhead_s.")
    fitted_on: list[str] = Field(default_factory=list, description="Workloads the fit used (provenance).")

    @field_validator("bandwidth_efficiency")
    @classmethod
    def _positive_efficiencies(cls, v: dict[str, float]) -> dict[str, float]:
        bad = {k: e for k, e in v.items() if not e > 0}
        if bad:
            raise ValueError(f"bandwidth_efficiency must be > 0 per level, got {bad}")
        return v


class HardwareModel(BaseModel):
    """A machine as the cost model sees it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    description: str = ""
    memory_levels: list[MemoryLevel] = Field(
        description="Outermost (main memory) first, innermost last: e.g. DRAM, L3, L2, L1."
    )
    compute: Compute
    loop_overhead_s: float = Field(default=2e-9, ge=0, description="Cost of one loop iteration, seconds.")
    innermost_loop_overhead_fraction: float = Field(
        default=0.0, ge=0, le=1,
        description="Share of loop_overhead_s an iteration of an innermost loop costs. An out-of-order "
                    "core issues that loop's bookkeeping beside the vector work it wraps (0); an "
                    "in-order or DMA-driven engine pays all of it (1).",
    )
    overlap_exponent: float = Field(
        default=3.0, ge=1, le=64,
        description="How compute and the memory levels' transfers overlap within a loop nest: "
                    "latency = (sum of t**p) ** (1/p) over them. Large p approaches the plain roofline "
                    "max (perfect overlap), 1 is their sum (none). 3 fits the host CPU's IREE "
                    "measurements (docs/benchmarks.md: cost model fidelity).",
    )
    # Largest vector tile (bytes) the compiler accepts; None = no limit. On host-cpu IREE fails
    # with "large vector sizes" at 512 native vectors (32 KiB with AVX-512, 16 KiB with AVX2).
    max_vector_tile_bytes: int | None = Field(default=None, gt=0)
    calibration: Calibration = Field(default_factory=Calibration)
    # The model is frozen, so its hash is computed once (every cost estimate carries it).
    _content_hash: str | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _hierarchy_is_sane(self) -> Self:
        levels = self.memory_levels
        if not levels:
            raise ValueError("memory_levels is empty: give at least main memory, outermost first")
        names = [lv.name for lv in levels]
        if len(set(names)) != len(names):
            raise ValueError(f"memory level names must be unique, got {names}")
        for outer, inner in zip(levels, levels[1:]):
            if inner.capacity_bytes > outer.capacity_bytes:
                raise ValueError(
                    f"capacities grow inward: {inner.name} ({inner.capacity_bytes} B) is larger than "
                    f"{outer.name} ({outer.capacity_bytes} B); list levels outermost first"
                )
        unknown = set(self.calibration.bandwidth_efficiency) - set(names)
        if unknown:
            raise ValueError(f"calibration.bandwidth_efficiency names unknown levels {sorted(unknown)}")
        return self

    @property
    def is_cpu(self) -> bool:
        """A CPU (its register file is known: the register-tile model applies). IREE's llvm-cpu
        backend compiles for it, and the compilation_info and tuning specs tilesearch writes are
        that backend's: a GPU or NPU profile gets plans and tiled IR, never a CPU config."""
        return self.compute.vector_registers is not None

    @property
    def main_memory(self) -> MemoryLevel:
        return self.memory_levels[0]

    def level(self, name: str) -> MemoryLevel:
        for lv in self.memory_levels:
            if lv.name == name:
                return lv
        raise KeyError(f"no memory level {name!r} in {self.name}: {[lv.name for lv in self.memory_levels]}")

    def effective_bandwidth(self, level: MemoryLevel) -> float:
        """Bandwidth of a level for the whole chip, after calibration."""
        eff = self.calibration.bandwidth_efficiency.get(level.name, 1.0)
        per_chip = level.bandwidth_bytes_per_s if level.shared else level.bandwidth_bytes_per_s * self.compute.cores
        return per_chip * eff

    def effective_peak(self, element_type: str) -> float:
        return self.compute.peak_for(element_type) * self.calibration.compute_efficiency

    def effective_loop_overhead_s(self) -> float:
        return self.loop_overhead_s * self.calibration.loop_overhead_scale

    def canonical_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))

    def content_hash(self) -> str:
        """First 16 hex chars of sha256 over the canonical JSON: part of every decision key."""
        if self._content_hash is None:
            self._content_hash = hashlib.sha256(self.canonical_json().encode()).hexdigest()[:16]
        return self._content_hash

    def model_copy(self, *, update: dict | None = None, deep: bool = False) -> Self:
        copy = super().model_copy(update=update, deep=deep)
        copy._content_hash = None  # the copy's fields may differ
        return copy
