"""Built-in hardware profiles, host detection, and JSON profiles from a directory.

JSON profiles (e.g. a calibrated profile written by `tilesearch calibrate --out`) live in
`$TILESEARCH_HARDWARE_DIR` (default `./var/hardware`), one `<name>.json` each, and override the
built-in of the same name.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path

from pydantic import ValidationError

from .model import Compute, HardwareModel, MemoryLevel

log = logging.getLogger(__name__)

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

HARDWARE_DIR_ENV = "TILESEARCH_HARDWARE_DIR"
DEFAULT_HARDWARE_DIR = "./var/hardware"
# The profile of the CPU this process runs on, read off it at start (detect_host_cpu).
HOST_CPU = "host-cpu"


class UnknownHardwareError(KeyError):
    """No profile with that name; the message lists the known ones."""

    def __init__(self, name: str, known: list[str]):
        self.name = name
        self.known = known
        shown = name if len(name) <= 80 else f"{name[:80]}... ({len(name)} characters)"
        super().__init__(f"unknown hardware {shown!r}; known: {', '.join(known)}")

    def __str__(self) -> str:  # KeyError would repr() the message
        return self.args[0]

    def __reduce__(self):
        # Raised in sandbox workers (e.g. `tilesearch cost`): rebuild from the fields, not the message.
        return (type(self), (self.name, self.known))


# --- host detection --------------------------------------------------------------------------

def _parse_size(text: str) -> int:
    """'48K' / '1024K' / '32M' (sysfs cache size) -> bytes."""
    text = text.strip().upper()
    units = {"K": KiB, "M": MiB, "G": GiB}
    if text and text[-1] in units:
        return int(text[:-1]) * units[text[-1]]
    return int(text)


def read_sys_caches(cpu_dir: Path = Path("/sys/devices/system/cpu/cpu0")) -> list[dict]:
    """Data/unified caches of one CPU from sysfs, outermost first:
    [{level, size_bytes, shared_cpus, ways, line_bytes}] (ways/line_bytes None when not given)."""
    caches = []
    for index in sorted((cpu_dir / "cache").glob("index*")):
        try:
            kind = (index / "type").read_text().strip()
            if kind == "Instruction":
                continue
            shared_list = (index / "shared_cpu_list").read_text().strip()
            caches.append(
                {
                    "level": int((index / "level").read_text()),
                    "size_bytes": _parse_size((index / "size").read_text()),
                    "shared_cpus": _count_cpu_list(shared_list),
                    "ways": _read_int(index / "ways_of_associativity"),
                    "line_bytes": _read_int(index / "coherency_line_size"),
                }
            )
        except (OSError, ValueError) as exc:  # a partial sysfs (containers) is not fatal
            log.warning("skipping %s: %s", index, exc)
    return sorted(caches, key=lambda c: -c["level"])


def _read_int(path: Path) -> int | None:
    """A positive integer sysfs attribute, or None when absent (containers) or 0 (unknown)."""
    try:
        return int(path.read_text().strip()) or None
    except (OSError, ValueError):
        return None


def _count_cpu_list(text: str) -> int:
    """'0-3,6' -> 5."""
    count = 0
    for part in text.split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        count += int(hi or lo) - int(lo) + 1
    return count


def read_cpuinfo(cpuinfo: Path = Path("/proc/cpuinfo")) -> tuple[str, set[str], tuple[int, int] | None]:
    """(vendor_id, flags, (cpu family, model)) of the first processor in /proc/cpuinfo;
    ('', set(), None) when unreadable (family and model None when not given)."""
    vendor, flags, family, model = "", set(), None, None
    try:
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "vendor_id" and not vendor:
                vendor = value.strip()
            elif key == "cpu family" and family is None:
                family = int(value)
            elif key == "model" and model is None:
                model = int(value)
            elif key == "flags":
                flags = set(value.split())
                break
    except (OSError, ValueError):
        pass
    return vendor, flags, (family, model) if family is not None and model is not None else None


def vector_width_from_flags(flags: set[str]) -> int:
    if "avx512f" in flags:
        return 64
    if "avx2" in flags or "avx" in flags:
        return 32
    return 16  # SSE / NEON


# Bandwidths per core (private levels) or per chip (shared levels), bytes/s. Rough figures for a
# current x86 server core; calibration fits efficiencies on top of them.
_HOST_BANDWIDTH = {1: 200e9, 2: 100e9, 3: 60e9}
_HOST_DRAM_BANDWIDTH = 25e9
# No row limit on register tiles: what makes tall tiles slow is L1 set conflicts among the rows
# of A (cost/registers.py), priced from the associativity read from sysfs below.
# Flops per cycle per core per f32 lane: FMA (2) x 2 FMA pipes; at an effective 2 GHz this gives
# 256 GFLOP/s for 2 AVX-512 cores, the ~257 GFLOP/s numpy reaches here on a 1024^3 matmul.
_HOST_EFFECTIVE_HZ = 2.0e9
_IREE_MAX_NATIVE_VECTORS = 512


# The cpuinfo flags the model reads (vector width); a host's facts keep only these.
_MODEL_FLAGS = ("avx", "avx2", "avx512f", "avx512fp16")


@dataclass(frozen=True)
class HostFacts:
    """What host detection reads off a machine, enough to rebuild its host-cpu profile on another
    one: the fidelity benchmark holds the model against every host's stored measurements."""

    vendor: str
    flags: tuple[str, ...]
    family_model: tuple[int, int] | None
    caches: tuple[dict, ...]  # read_sys_caches' entries
    cores: int
    dram_bytes: int

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> HostFacts:
        d = json.loads(text)
        fm = d.get("family_model")
        return cls(vendor=d["vendor"], flags=tuple(d["flags"]), family_model=tuple(fm) if fm else None,
                   caches=tuple(d["caches"]), cores=int(d["cores"]), dram_bytes=int(d["dram_bytes"]))


def read_host_facts(
    cpu_dir: Path = Path("/sys/devices/system/cpu/cpu0"),
    cpuinfo: Path = Path("/proc/cpuinfo"),
    cores: int | None = None,
) -> HostFacts:
    """This machine's facts: sysfs caches, os.cpu_count() and /proc/cpuinfo."""
    vendor, flags, family_model = read_cpuinfo(cpuinfo)
    return HostFacts(vendor=vendor, flags=tuple(f for f in _MODEL_FLAGS if f in flags), family_model=family_model,
                     caches=tuple(read_sys_caches(cpu_dir)), cores=cores or os.cpu_count() or 1,
                     dram_bytes=_dram_bytes())


def detect_host_cpu(
    cpu_dir: Path = Path("/sys/devices/system/cpu/cpu0"),
    cpuinfo: Path = Path("/proc/cpuinfo"),
    cores: int | None = None,
) -> HardwareModel:
    """The machine this runs on, from sysfs caches, os.cpu_count() and /proc/cpuinfo flags."""
    return host_cpu_model(read_host_facts(cpu_dir, cpuinfo, cores), cache_dir=f"{cpu_dir}/cache")


# Vector instructions per f32 FMA's work when IREE computes an f16 op on a CPU without native f16
# arithmetic: each multiply and add is rounded back to f16 (convert in, multiply, convert out,
# add, convert out, read off IREE's x86 code). docs/benchmarks.md, "Narrow floats".
_F16_EMULATION_INSTRUCTIONS = 6.0


def _narrow_float_peaks(peak_f32: float, flags: set[str]) -> dict[str, float]:
    """Peak flops/s per element type. IREE's CPU code generator computes bf16 and f16 in f32
    lanes (no microkernels by default): no more than the f32 peak, and f16 far less without
    AVX512-FP16."""
    f16 = peak_f32 if "avx512fp16" in flags else peak_f32 / _F16_EMULATION_INSTRUCTIONS
    return {"f32": peak_f32, "bf16": peak_f32, "f16": f16}


def host_cpu_model(facts: HostFacts, cache_dir: str = "sysfs") -> HardwareModel:
    """The host-cpu profile of a machine with these facts."""
    cores, vendor, flags = facts.cores, facts.vendor, set(facts.flags)
    vector_width = vector_width_from_flags(flags)
    levels = [
        MemoryLevel(name="DRAM", capacity_bytes=facts.dram_bytes, bandwidth_bytes_per_s=_HOST_DRAM_BANDWIDTH, shared=True)
    ]
    caches = list(facts.caches)
    if not caches:  # no sysfs: assume a small generic hierarchy
        caches = [{"level": 2, "size_bytes": 1 * MiB, "shared_cpus": 1}, {"level": 1, "size_bytes": 32 * KiB, "shared_cpus": 1}]
    for c in caches:
        shared = c["shared_cpus"] > 1
        bw = _HOST_BANDWIDTH.get(c["level"], 50e9)
        levels.append(
            MemoryLevel(name=f"L{c['level']}", capacity_bytes=c["size_bytes"], bandwidth_bytes_per_s=bw * (cores if shared else 1), shared=shared,
                        associativity=c.get("ways"), line_bytes=c.get("line_bytes"))
        )
    lanes_f32 = vector_width // 4
    peak_f32 = cores * lanes_f32 * 2 * 2 * _HOST_EFFECTIVE_HZ
    return HardwareModel(
        name=HOST_CPU,
        description=f"this machine: {vendor or 'unknown vendor'}, {cores} cores, {vector_width * 8}-bit vectors, caches from {cache_dir}",
        memory_levels=levels,
        compute=Compute(
            peak_flops_per_s=_narrow_float_peaks(peak_f32, flags),
            vector_width_bytes=vector_width,
            cores=cores,
            # x86: 32 zmm registers with AVX-512, 16 ymm without.
            vector_registers=32 if vector_width >= 64 else 16,
            fma_pipeline_depth=_fma_pipeline_depth(vendor, facts.family_model, avx512="avx512f" in flags),
            vector_fmas_per_cycle=_vector_fmas_per_cycle(vendor, facts.family_model, avx512="avx512f" in flags),
            reorder_window=_reorder_window(vendor, facts.family_model, avx512="avx512f" in flags),
            # IREE's CPU config turns on loop peeling on x86 without AVX-512 only (its
            # translation_info, read by service.measure.tools.host_translation_info).
            masked_remainders="avx512f" in flags,
        ),
        loop_overhead_s=2e-9,
        # The out-of-order core hides most of an innermost loop's bookkeeping, not all: about
        # 1/8 of loop_overhead_s per step (fitted to k = 1 vs k = 2-4 register tiles).
        innermost_loop_overhead_fraction=0.125,
        # IREE's CPU backend refuses a vector op of nativeVectorSize x 512 bytes or more
        # (LLVMCPUVerifyVectorSizeLegality, iree-llvmcpu-max-allowed-number-of-native-vectors):
        # 32 KiB with AVX-512, 16 KiB with AVX2.
        max_vector_tile_bytes=_IREE_MAX_NATIVE_VECTORS * vector_width,
    )


def _fma_pipeline_depth(vendor: str, family_model: tuple[int, int] | None = None, avx512: bool = False) -> int:
    """Independent accumulators a register tile needs to keep the FMA units busy. Two FMA ports
    of latency 4 need 8 in theory; 12 in practice (8-accumulator tiles run measurably slower
    than 16-accumulator ones on current x86 cores). AMD before Zen 2 (family 23, models below
    0x30; Hygon's cores are these) has 128-bit FMA units, one ymm FMA a cycle: 8. Zen 4 (family
    25 with AVX-512) runs a 512-bit FMA as two halves on its two 256-bit pipes, one zmm FMA a
    cycle: 4 zmm accumulators cover the latency. Unknown vendors and models get 12."""
    if vendor == "HygonGenuine":
        return 8
    if vendor == "AuthenticAMD" and family_model is not None and family_model[0] == 23 and family_model[1] < 0x30:
        return 8
    if vendor == "AuthenticAMD" and family_model is not None and family_model[0] == 25 and avx512:
        return 4
    return 12


def _vector_fmas_per_cycle(vendor: str, family_model: tuple[int, int] | None, avx512: bool) -> float:
    """Two FMA pipes at the full vector width, but where a core splits the vector: Zen 1 runs a
    256-bit FMA on its two 128-bit pipes, Zen 4 a 512-bit FMA on its two 256-bit pipes."""
    if vendor == "HygonGenuine" or _amd(vendor, family_model, 23) and family_model[1] < 0x30:
        return 1.0
    if _amd(vendor, family_model, 25) and avx512:
        return 1.0
    return 2.0


# Reorder buffer entries per core, from the vendors' optimization manuals.
_AMD_REORDER_WINDOW = {23: 224, 25: 256, 26: 448}  # Zen 2, Zen 3, Zen 5
_ZEN1_REORDER_WINDOW = 192  # Zen 1 and Zen+ (family 23 below model 0x30), Hygon
_ZEN4_REORDER_WINDOW = 320
# Intel family 6 models: Ice Lake and Tiger Lake server and client, Rocket Lake (352); Sapphire
# and Emerald Rapids, Alder Lake, Raptor Lake, Granite Rapids (512). Skylake-SP and older: 224.
_INTEL_REORDER_WINDOW = {106: 352, 108: 352, 125: 352, 126: 352, 140: 352, 141: 352, 167: 352,
                         143: 512, 207: 512, 151: 512, 154: 512, 183: 512, 186: 512, 191: 512, 173: 512, 174: 512}
_DEFAULT_REORDER_WINDOW = 224


def _reorder_window(vendor: str, family_model: tuple[int, int] | None, avx512: bool) -> int:
    if family_model is None:
        return _DEFAULT_REORDER_WINDOW
    family, model = family_model
    if vendor == "HygonGenuine" or vendor == "AuthenticAMD" and family == 23 and model < 0x30:
        return _ZEN1_REORDER_WINDOW
    if vendor == "AuthenticAMD":
        if family == 25 and avx512:
            return _ZEN4_REORDER_WINDOW
        return _AMD_REORDER_WINDOW.get(family, _DEFAULT_REORDER_WINDOW)
    if vendor == "GenuineIntel" and family == 6:
        return _INTEL_REORDER_WINDOW.get(model, _DEFAULT_REORDER_WINDOW)
    return _DEFAULT_REORDER_WINDOW


def _amd(vendor: str, family_model: tuple[int, int] | None, family: int) -> bool:
    return vendor == "AuthenticAMD" and family_model is not None and family_model[0] == family


def _dram_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 16 * GiB


# --- fixed profiles ----------------------------------------------------------------------------

def npu_sram_256k() -> HardwareModel:
    """Small-scratchpad accelerator (an NPU like super tiling's target): every tile must fit 256 KiB SRAM; DMA-bound."""
    return HardwareModel(
        name="npu-sram-256k",
        description="DRAM + 256 KiB software-managed SRAM; tiles move by DMA",
        memory_levels=[
            MemoryLevel(name="DRAM", capacity_bytes=4 * GiB, bandwidth_bytes_per_s=16e9, shared=True),
            MemoryLevel(name="SRAM", capacity_bytes=256 * KiB, bandwidth_bytes_per_s=512e9, shared=True, scratchpad=True),
        ],
        compute=Compute(peak_flops_per_s={"f32": 256e9, "bf16": 1e12, "i8": 4e12}, vector_width_bytes=64, cores=1),
        loop_overhead_s=50e-9,  # a DMA descriptor per tile
        innermost_loop_overhead_fraction=1.0,  # every tile's descriptor, the innermost ones too
    )


def gpu_h100() -> HardwareModel:
    """NVIDIA H100 SXM, public figures (dense peaks)."""
    return HardwareModel(
        name="gpu-h100",
        description="H100 SXM: 80 GB HBM3 3.35 TB/s, 50 MB L2, 228 KB shared memory per SM, 132 SMs",
        memory_levels=[
            MemoryLevel(name="HBM", capacity_bytes=80 * 10**9, bandwidth_bytes_per_s=3.35e12, shared=True),
            MemoryLevel(name="L2", capacity_bytes=50 * MiB, bandwidth_bytes_per_s=12e12, shared=True),
            MemoryLevel(name="SMEM", capacity_bytes=228 * KiB, bandwidth_bytes_per_s=250e9, shared=False, scratchpad=True),
        ],
        compute=Compute(peak_flops_per_s={"f32": 67e12, "bf16": 990e12, "f16": 990e12}, vector_width_bytes=128, cores=132),
        loop_overhead_s=5e-9,
    )


_BUILTINS = {HOST_CPU: detect_host_cpu, "npu-sram-256k": npu_sram_256k, "gpu-h100": gpu_h100}


@cache
def _builtin(name: str) -> HardwareModel:
    return _BUILTINS[name]()


def hardware_dir() -> Path:
    return Path(os.environ.get(HARDWARE_DIR_ENV, DEFAULT_HARDWARE_DIR))


def _json_profiles() -> dict[str, Path]:
    directory = hardware_dir()
    if not directory.is_dir():
        return {}
    return {p.stem: p for p in sorted(directory.glob("*.json"))}


def list_profiles() -> list[str]:
    return sorted(set(_BUILTINS) | set(_json_profiles()))


def get_profile(name: str) -> HardwareModel:
    """A profile by name: a JSON file in the hardware dir first, then the built-ins."""
    path = _json_profiles().get(name)
    if path is not None:
        try:
            return HardwareModel.model_validate_json(path.read_text())
        except ValidationError as exc:
            raise ValueError(f"hardware profile {path} is invalid: {exc}") from exc
    if name in _BUILTINS:
        return _builtin(name)
    raise UnknownHardwareError(name, list_profiles())


def save_profile(model: HardwareModel, directory: Path | None = None) -> Path:
    """Write a profile as `<dir>/<name>.json` (used by calibration); returns the path."""
    directory = directory or hardware_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{model.name}.json"
    path.write_text(model.model_dump_json(indent=2))
    return path
