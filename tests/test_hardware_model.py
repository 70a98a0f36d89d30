"""HardwareModel validation, profiles, host detection from sysfs."""

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from service.hardware.model import Compute, HardwareModel, MemoryLevel
from service.hardware.profiles import (
    HostFacts,
    UnknownHardwareError,
    detect_host_cpu,
    get_profile,
    host_cpu_model,
    list_profiles,
    read_host_facts,
    save_profile,
)
from _shared import write_cpu_sysfs


def _model(levels, cores=1):
    return HardwareModel(name="t", memory_levels=levels, compute=Compute(peak_flops_per_s={"f32": 1e11}, cores=cores))


DRAM = dict(name="DRAM", capacity_bytes=1 << 30, bandwidth_bytes_per_s=1e10, shared=True)
L1 = dict(name="L1", capacity_bytes=1 << 15, bandwidth_bytes_per_s=1e11)


def test_rejects_nonsense():
    with pytest.raises(ValidationError, match="bandwidth_bytes_per_s must be > 0"):
        MemoryLevel(**{**L1, "bandwidth_bytes_per_s": 0})
    with pytest.raises(ValidationError, match="capacity_bytes must be > 0"):
        MemoryLevel(**{**L1, "capacity_bytes": -1})
    with pytest.raises(ValidationError, match="capacities grow inward"):
        _model([MemoryLevel(**L1), MemoryLevel(**DRAM)])
    with pytest.raises(ValidationError, match="memory_levels is empty"):
        _model([])
    with pytest.raises(ValidationError, match="cores must be >= 1"):
        _model([MemoryLevel(**DRAM)], cores=0)


def test_hash_is_content_based():
    a = _model([MemoryLevel(**DRAM), MemoryLevel(**L1)])
    b = _model([MemoryLevel(**DRAM), MemoryLevel(**L1)])
    c = _model([MemoryLevel(**DRAM), MemoryLevel(**{**L1, "capacity_bytes": 1 << 14})])
    assert a.content_hash() == b.content_hash() != c.content_hash()
    assert len(a.content_hash()) == 16
    assert "memory_levels" in HardwareModel.model_json_schema()["properties"]


def test_builtin_profiles():
    assert {"host-cpu", "npu-sram-256k", "gpu-h100"} <= set(list_profiles())
    npu = get_profile("npu-sram-256k")
    assert npu.memory_levels[-1].capacity_bytes == 256 * 1024 and npu.memory_levels[-1].scratchpad
    h100 = get_profile("gpu-h100")
    assert h100.compute.cores == 132 and h100.compute.peak_flops_per_s["bf16"] > 10 * h100.compute.peak_flops_per_s["f32"]
    with pytest.raises(UnknownHardwareError, match="known: .*host-cpu") as err:
        get_profile("tpu-v9")
    assert isinstance(err.value, KeyError)


def test_host_detection_reads_sysfs(tmp_path):
    cpu_dir, cpuinfo = write_cpu_sysfs(
        tmp_path,
        [(1, "Data", "48K", "0", "12"), (1, "Instruction", "32K", "0", "8"), (2, "Unified", "1024K", "0", "16"), (3, "Unified", "32768K", "0-1", None)],
        "processor\t: 0\nflags\t\t: fpu sse avx2 avx512f\n",
    )
    hw = detect_host_cpu(cpu_dir, cpuinfo, cores=2)
    assert [lv.name for lv in hw.memory_levels] == ["DRAM", "L3", "L2", "L1"]
    assert [lv.capacity_bytes for lv in hw.memory_levels[1:]] == [32 << 20, 1 << 20, 48 << 10]
    assert hw.level("L3").shared and not hw.level("L1").shared
    assert hw.compute.vector_width_bytes == 64 and hw.compute.cores == 2
    assert hw.max_vector_tile_bytes == 32 * 1024
    assert [(lv.associativity, lv.line_bytes) for lv in hw.memory_levels[1:]] == [(None, 64), (16, 64), (12, 64)]
    assert hw.compute.register_tile_rows is None  # tall tiles are priced by L1 set conflicts instead


def test_a_hosts_facts_rebuild_its_profile_on_another_machine(tmp_path):
    """The fidelity benchmark holds the model against another host's measurements by rebuilding
    that host's profile from its stored facts: the rebuilt profile must be the detected one."""
    cpu_dir, cpuinfo = write_cpu_sysfs(
        tmp_path,
        [(1, "Data", "32K", "0", "8"), (2, "Unified", "1024K", "0", "8"), (3, "Unified", "32768K", "0-1", "16")],
        "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n"
        "flags\t\t: fpu sse avx avx2 fma avx512f avx512bw\n",
    )
    facts = read_host_facts(cpu_dir, cpuinfo, cores=2)
    assert facts.flags == ("avx", "avx2", "avx512f") and facts.family_model == (25, 17)
    stored = HostFacts.from_json(facts.to_json())
    assert stored == facts
    rebuilt, detected = host_cpu_model(stored).model_dump(), detect_host_cpu(cpu_dir, cpuinfo, cores=2).model_dump()
    rebuilt.pop("description"), detected.pop("description")
    assert rebuilt == detected
    assert host_cpu_model(stored).compute.fma_pipeline_depth == 4  # Zen 4's AVX-512 rule, from the stored family


def test_the_vector_tile_limit_follows_the_vector_width(tmp_path):
    """IREE refuses vector ops of 512 native vectors or more: 32 KiB with AVX-512, 16 KiB with
    AVX2 (the 32 KiB of an AVX-512 host made every predicted-best plan fail to compile on an
    AVX2 EPYC)."""
    widths = {}
    for flags in ("avx2 avx512f", "avx2", "sse2"):
        cpuinfo = tmp_path / f"cpuinfo-{flags.replace(' ', '-')}"
        cpuinfo.write_text(f"processor\t: 0\nflags\t\t: fpu {flags}\n")
        hw = detect_host_cpu(tmp_path / "no-sysfs", cpuinfo, cores=2)
        widths[flags] = (hw.compute.vector_width_bytes, hw.max_vector_tile_bytes, hw.compute.masked_remainders)
    # IREE masks a tile's remainder with AVX-512 and peels it without (enable_loop_peeling).
    assert widths == {"avx2 avx512f": (64, 32 << 10, True), "avx2": (32, 16 << 10, False), "sse2": (16, 8 << 10, False)}


def test_narrow_floats_run_no_faster_than_f32_and_f16_far_slower_without_native_f16(tmp_path):
    """IREE's CPU code computes bf16 and f16 in f32 lanes; the profile priced both at twice the
    f32 peak, where an f16 matmul measured 5.8x slower than f32 on a Zen 5 (docs/benchmarks.md)."""
    peaks = {}
    for flags in ("avx2 avx512f", "avx2 avx512f avx512fp16"):
        cpuinfo = tmp_path / f"cpuinfo-{flags.replace(' ', '-')}"
        cpuinfo.write_text(f"processor\t: 0\nflags\t\t: fpu {flags}\n")
        peaks[flags] = detect_host_cpu(tmp_path / "no-sysfs", cpuinfo, cores=2).compute.peak_flops_per_s
    for p in peaks.values():
        assert p["bf16"] == p["f32"]
    assert peaks["avx2 avx512f avx512fp16"]["f16"] == peaks["avx2 avx512f"]["f32"]
    assert peaks["avx2 avx512f"]["f16"] < peaks["avx2 avx512f"]["f32"] / 4


def test_the_accumulators_a_register_tile_needs_follow_the_cpu(tmp_path):
    """Measured: 12 independent accumulators on an Intel Xeon and an AMD Zen 3, 8 on Zen 1
    (family 23, model 1: 128-bit FMA units; Hygon's cores are Zen 1), 4 zmm on Zen 4 (family
    25 with AVX-512: one 512-bit FMA a cycle; broad corpus, 1x16 tiles 3.5x slower than 8x16,
    8x16 as fast as 4x64). Unknown: 12."""
    depth = {}
    for vendor, family, model, flags in [
            ("GenuineIntel", 6, 143, "avx2 avx512f"), ("AuthenticAMD", 25, 1, "avx2"),
            ("AuthenticAMD", 25, 17, "avx2 avx512f"), ("AuthenticAMD", 23, 1, "avx2"),
            ("AuthenticAMD", 23, 49, "avx2"), ("HygonGenuine", 24, 0, "avx2"), ("CentaurHauls", 7, 91, "avx2"),
            ("AuthenticAMD", None, None, "avx2")]:
        cpuinfo = tmp_path / f"cpuinfo-{vendor}-{family}-{model}"
        family_lines = f"cpu family\t: {family}\nmodel\t\t: {model}\n" if family is not None else ""
        cpuinfo.write_text(f"processor\t: 0\nvendor_id\t: {vendor}\n{family_lines}flags\t\t: fpu {flags}\n")
        depth[vendor, family, model] = detect_host_cpu(tmp_path / "no-sysfs", cpuinfo, cores=2).compute.fma_pipeline_depth
    assert depth == {
        ("GenuineIntel", 6, 143): 12, ("AuthenticAMD", 25, 1): 12, ("AuthenticAMD", 25, 17): 4,
        ("AuthenticAMD", 23, 1): 8, ("AuthenticAMD", 23, 49): 12, ("HygonGenuine", 24, 0): 8,
        ("CentaurHauls", 7, 91): 12, ("AuthenticAMD", None, None): 12,
    }


def test_the_fma_rate_and_reorder_window_follow_the_cpu(tmp_path):
    """One 512-bit FMA a cycle on Zen 4 (256-bit halves) and one 256-bit on Zen 1, two elsewhere;
    the reorder buffer per core from the vendors' manuals, 224 where the model is not known."""
    facts = {}
    for vendor, family, model, flags in [
            ("AuthenticAMD", 25, 17, "avx2 avx512f"), ("AuthenticAMD", 25, 1, "avx2"), ("AuthenticAMD", 26, 2, "avx2 avx512f"),
            ("AuthenticAMD", 23, 1, "avx2"), ("AuthenticAMD", 23, 49, "avx2"), ("HygonGenuine", 24, 0, "avx2"),
            ("GenuineIntel", 6, 207, "avx2 avx512f"), ("GenuineIntel", 6, 167, "avx2 avx512f"),
            ("GenuineIntel", 6, 85, "avx2 avx512f"), ("AuthenticAMD", None, None, "avx2")]:
        cpuinfo = tmp_path / f"cpuinfo-{vendor}-{family}-{model}"
        family_lines = f"cpu family\t: {family}\nmodel\t\t: {model}\n" if family is not None else ""
        cpuinfo.write_text(f"processor\t: 0\nvendor_id\t: {vendor}\n{family_lines}flags\t\t: fpu {flags}\n")
        c = detect_host_cpu(tmp_path / "no-sysfs", cpuinfo, cores=2).compute
        facts[vendor, family, model] = (c.vector_fmas_per_cycle, c.reorder_window)
    assert facts == {
        ("AuthenticAMD", 25, 17): (1.0, 320), ("AuthenticAMD", 25, 1): (2.0, 256), ("AuthenticAMD", 26, 2): (2.0, 448),
        ("AuthenticAMD", 23, 1): (1.0, 192), ("AuthenticAMD", 23, 49): (2.0, 224), ("HygonGenuine", 24, 0): (1.0, 192),
        ("GenuineIntel", 6, 207): (2.0, 512), ("GenuineIntel", 6, 167): (2.0, 352), ("GenuineIntel", 6, 85): (2.0, 224),
        ("AuthenticAMD", None, None): (2.0, 224),
    }


def test_a_cpu_without_cache_sysfs_still_gets_a_profile(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu avx2 avx512f\n")
    hw = detect_host_cpu(tmp_path / "no-sysfs", cpuinfo, cores=2)
    assert "AuthenticAMD" in hw.description and hw.compute.vector_width_bytes == 64
    assert hw.memory_levels[-1].associativity is None  # unknown: no set-conflict term


def test_real_host_profile_has_this_machines_l1():
    hw = detect_host_cpu()  # the tests' `host-cpu` is the pinned reference host (conftest)
    assert hw.level("L1").capacity_bytes == int(open("/sys/devices/system/cpu/cpu0/cache/index0/size").read().strip()[:-1]) * 1024


def test_json_profile_overrides_builtin(tmp_path, monkeypatch):
    monkeypatch.setenv("TILESEARCH_HARDWARE_DIR", str(tmp_path))
    npu = get_profile("npu-sram-256k")
    calibrated = npu.model_copy(update={"loop_overhead_s": 1e-6})
    save_profile(calibrated)
    assert get_profile("npu-sram-256k").loop_overhead_s == 1e-6
    (tmp_path / "custom.json").write_text(json.dumps({**npu.model_dump(mode="json"), "name": "custom"}))
    assert "custom" in list_profiles()


def test_content_hash_follows_the_fields_through_copies():
    # The hash is cached on the (frozen) model: a copy with other fields must not inherit it.
    npu = get_profile("npu-sram-256k")
    before = npu.content_hash()
    changed = npu.model_copy(update={"loop_overhead_s": 1e-6})
    assert changed.content_hash() != before
    assert changed.content_hash() == HardwareModel.model_validate_json(changed.canonical_json()).content_hash()
    assert npu.model_copy().content_hash() == before == npu.content_hash()


def test_every_measured_host_keeps_the_facts_that_rebuild_its_profile():
    """benchmarks/model_fidelity.py --host all holds the model against every CPU measured so
    far; a host's measurements without its facts could only be read on that CPU again."""
    measurements = Path(__file__).resolve().parents[1] / "benchmarks" / "measurements"
    hosts = sorted(p.stem for p in measurements.glob("*.jsonl"))
    assert hosts
    for key in hosts:
        facts = HostFacts.from_json((measurements / f"{key}.host.json").read_text())
        vendor, family, model = key.split("-")[:3]
        assert (facts.vendor, f"f{facts.family_model[0]}", f"m{facts.family_model[1]}") == (vendor, family, model)
        assert host_cpu_model(facts).memory_levels[-1].name == "L1"


def test_every_measured_hosts_measurements_are_found_from_this_machine():
    """A forced plan's measurement is keyed by the pipeline options IREE gave its host (loop
    peeling on AVX2, none with AVX-512); read with this machine's options, another ISA's
    measurements were all missing, and --host all reported no shapes for them."""
    import sys

    benchmarks = Path(__file__).resolve().parents[1] / "benchmarks"
    sys.path.insert(0, str(benchmarks))
    try:
        from fidelity_corpus import corpus
        from fidelity_measure import CACHE_DIR, host_cache, host_profile, host_translation, measure_shape
    finally:
        sys.path.remove(str(benchmarks))
    shape = corpus()[0]
    for path in sorted(CACHE_DIR.glob("*.host.json")):
        key = path.name.removesuffix(".host.json")
        lanes = host_profile(key).compute.vector_width_bytes // 4
        found = measure_shape(shape, host_cache(key), measure=False, lanes_f32=lanes, translation_info=host_translation(key))
        assert found is not None and found.default_s, key
