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


def test_one_dispatch_a_call_is_keyed_as_before_the_repeat_setting():
    """The grids every host cached were timed one dispatch a call, before the setting existed:
    their keys stand; a repeated dispatch is another measurement."""
    from service.measure.cache import _settings_key, measurement_key
    from service.measure.timing import BenchSettings

    one = BenchSettings(dispatch_repeat=1)
    assert "dispatch_repeat" not in _settings_key(one)
    plan = {"groups": []}
    assert measurement_key("m", plan, one) != measurement_key("m", plan, BenchSettings(dispatch_repeat=16))


def test_a_dispatch_run_back_to_back_is_timed_per_run():
    """Compiled to run its dispatch 8 times a call (the executor's workers then stay up, as in a
    model) and timed with a batch of 8, a module reads about its one-run time, not 8 runs' (the
    batch not divided) nor an eighth (the dispatch not repeated). One thread, a 16 MFLOP matmul:
    the call's own overhead is small beside it."""
    from _shared import matmul_module
    from service.measure.timing import BenchSettings, measure_default

    module = matmul_module("kn", 128, 256, 256)
    quick = dict(repetitions=3, min_time_s=0.02, device="local-sync")
    once = measure_default(module, settings=BenchSettings(**quick, dispatch_repeat=1))
    eight = measure_default(module, settings=BenchSettings(**quick, dispatch_repeat=8))
    assert once.ok and eight.ok, (once.error, eight.error)
    assert 0.4 < eight.median_s / once.median_s < 2.5
