"""The measurement cache: one file per kind of CPU, appends survive a torn last line."""

from pathlib import Path

from service.measure.cache import MeasurementCache, host_key
from service.measure.timing import Measurement


def _cpuinfo(tmp_path: Path, name: str, vendor: str, family: int, model: int, flags: str) -> Path:
    path = tmp_path / name
    path.write_text(f"processor\t: 0\nvendor_id\t: {vendor}\ncpu family\t: {family}\nmodel\t\t: {model}\n"
                    f"flags\t\t: {flags}\n")
    return path


def test_host_key_tells_cpus_apart_and_is_stable_for_one(tmp_path):
    zen4 = _cpuinfo(tmp_path, "zen4", "AuthenticAMD", 25, 17, "fpu sse avx avx2 avx512f")
    zen3 = _cpuinfo(tmp_path, "zen3", "AuthenticAMD", 25, 1, "fpu sse avx avx2")
    xeon = _cpuinfo(tmp_path, "xeon", "GenuineIntel", 6, 106, "fpu sse avx avx2 avx512f")
    keys = {host_key(p) for p in (zen4, zen3, xeon)}
    assert len(keys) == 3
    assert host_key(zen4) == host_key(_cpuinfo(tmp_path, "zen4b", "AuthenticAMD", 25, 17, "avx512f avx2 sse"))
    assert "f25-m17" in host_key(zen4) and "avx512" in host_key(zen4) and "/" not in host_key(zen4)


def test_cache_round_trips_through_its_file_and_skips_a_torn_line(tmp_path):
    path = tmp_path / "host.jsonl"
    cache = MeasurementCache(path)
    m = Measurement(ok=True, median_s=0.5, samples_s=[0.5], cpu_median_s=1.0, cpu_samples_s=[1.0], iree_version="x")
    cache.put("k1", m)
    with path.open("a") as f:
        f.write('{"key": "k2", "measurement": {"ok": tr')  # interrupted mid-write
    again = MeasurementCache(path)
    assert again.get("k1") == m and again.get("k2") is None
    assert MeasurementCache(None).get("k1") is None  # memory only: nothing read or written


def test_the_benchmark_device_is_keyed_only_when_it_is_not_the_default():
    """Measurements committed before the device setting (all on local-task) keep their keys."""
    from dataclasses import asdict

    from service.measure.cache import _settings_key, measurement_key
    from service.measure.timing import BenchSettings

    default = BenchSettings()
    assert _settings_key(default) == {k: v for k, v in asdict(default).items() if k != "device"}
    plan = {"groups": []}
    assert measurement_key("m", plan, default) != measurement_key("m", plan, BenchSettings(device="local-sync"))


def test_a_module_is_timed_on_the_device_the_settings_name():
    from _shared import TINY_MATMUL
    from service.measure.timing import BenchSettings, measure_default

    quick = dict(repetitions=1, min_time_s=0.01)
    assert measure_default(TINY_MATMUL, settings=BenchSettings(**quick, device="local-sync")).ok
    failed = measure_default(TINY_MATMUL, settings=BenchSettings(**quick, device="no-such-device"))
    assert not failed.ok and "no-such-device" in (failed.error or "")
