"""Measure the broad fidelity corpus (fidelity_corpus.py) on this CPU, cached per host.

Per shape, the grid's forced configs and IREE's default are compiled and timed in alternating
rounds (service.measure.timing.measure_plans_and_default); both wall and CPU time are kept.
Two readings (TIMING):
- cpu (default): process CPU time per worker thread. It moves least with other processes'
  load, but hides idle threads: 3 workgroups on 2 cores read 1.3-1.5x faster than their wall
  time here, so it flatters unbalanced distributions.
- wall: each plan's wall time relative to IREE's default in the same round (median of the
  per-round ratios), put back in seconds with the default's fastest round. What a user sees,
  and what the model predicts, but only as good as the machine is quiet.
Results
go to benchmarks/measurements/<host_key>.jsonl, committed: a later session on the same kind of
CPU reuses them, a different CPU measures its own.

    python benchmarks/fidelity_measure.py [--only NAME_SUBSTRING] [--limit N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fidelity_corpus import Shape, corpus, grid, module_text  # noqa: E402

from service.hardware.model import HardwareModel  # noqa: E402
from service.hardware.profiles import HostFacts, get_profile, host_cpu_model, read_host_facts  # noqa: E402
from service.measure.cache import MeasurementCache, host_key, measurement_key  # noqa: E402
from service.measure.calibration_plans import ContractionWorkload, contraction_workload, plan_for  # noqa: E402
from service.measure.forcing import NotMeasurable  # noqa: E402
from service.measure.lowering import levels_from_lowering_config, translation_info_text  # noqa: E402
from service.measure.tools import host_translation_info  # noqa: E402
from service.measure.timing import BenchSettings, Measurement, cpu_per_core_s, measure_plans_and_default  # noqa: E402

# The grids were timed one dispatch a call (every host's cache holds them so).
SETTINGS = BenchSettings(repetitions=3, min_time_s=0.05, dispatch_repeat=1)
CACHE_DIR = Path(__file__).resolve().parent / "measurements"


def host_cache(key: str | None = None) -> MeasurementCache:
    """The measurements of host `key` (default: this one)."""
    return MeasurementCache(CACHE_DIR / f"{key or host_key()}.jsonl")


def host_facts_path(key: str) -> Path:
    """What host detection read off host `key` (profiles.HostFacts), beside its measurements, so
    the model can be held against them on any machine."""
    return CACHE_DIR / f"{key}.host.json"


def host_translation(key: str) -> str | None:
    """The translation_info IREE gave a matmul on host `key` (None: this host, read live), which
    keys its forced plans' measurements. Hosts stored before it was kept are AVX-512 ones, where
    IREE's DoubleTilingExpert takes no options."""
    if key == host_key():
        return None
    stored = json.loads(host_facts_path(key).read_text()).get("translation_info")
    return stored or translation_info_text()


def host_profile(key: str) -> HardwareModel:
    """The host-cpu profile of host `key` as this code builds it from that host's stored facts."""
    path = host_facts_path(key)
    if not path.exists():
        known = ", ".join(sorted(p.name.removesuffix(".host.json") for p in CACHE_DIR.glob("*.host.json")))
        raise SystemExit(f"no facts for host {key} ({path.name} is missing); measured hosts: {known}")
    return host_cpu_model(HostFacts.from_json(path.read_text()))


@dataclass
class ShapeMeasurements:
    shape: Shape
    workload: ContractionWorkload
    plans: list[dict]  # the grid's plans, then IREE's default as a plan (when it maps to one)
    measured_s: list[float | None]  # per TIMING; None: IREE rejected it
    default_s: float | None
    default_plan: dict | None
    error: str | None = None


def lanes() -> int:
    return get_profile("host-cpu").compute.vector_width_bytes // 4


TIMINGS = ("cpu", "wall")


def measure_shape(s: Shape, cache: MeasurementCache, measure: bool = True,
                  timing: str = "cpu", lanes_f32: int | None = None,
                  translation_info: str | None = None, dispatch_repeat: int = 1) -> ShapeMeasurements | None:
    """The shape's grid (for `lanes_f32`, default this host's) and IREE's default, from the
    cache or measured now (None: not cached and `measure` is off). `translation_info`: another
    host's (host_translation), to read its measurements. `dispatch_repeat`: runs of the dispatch
    back to back per call (BenchSettings; 1, the grids' setting: one dispatch a call)."""
    text = module_text(s)
    w = contraction_workload(s.name, text)
    plans = [plan_for(w, *cfg) for cfg in grid(s, lanes_f32 or lanes())]
    settings = replace(SETTINGS, dispatch_repeat=dispatch_repeat)
    key = measurement_key(text, {"grid": plans}, settings, translation_info)
    got = [cache.get(f"{key}:{i}") for i in range(len(plans))]
    default = cache.get(f"{key}:default")
    if default is None or any(g is None for g in got):
        if not measure:
            return None
        try:
            got, default = measure_plans_and_default(text, plans, settings=settings)
        except NotMeasurable as exc:
            return ShapeMeasurements(s, w, plans, [None] * len(plans), None, None, exc.reason)
        for i, m in enumerate(got):
            cache.put(f"{key}:{i}", m)
        cache.put(f"{key}:default", default)
    return ShapeMeasurements(s, w, plans, [read_time(m, default, timing) for m in got],
                             read_time(default, default, timing), _default_plan(w, default), default.error)


def read_time(m: Measurement, default: Measurement, timing: str) -> float | None:
    """A measurement's time per TIMING: CPU time per worker thread, or wall time paired with
    the IREE default timed in the same rounds."""
    return paired_wall_s(m, default) if timing == "wall" else cpu_per_core_s(m)


def paired_wall_s(m: Measurement, default: Measurement) -> float | None:
    """The plan's wall time as (median per-round ratio to IREE's default) x the default's fastest
    round; None when either did not run."""
    if not (m.ok and default.ok and m.samples_s and len(m.samples_s) == len(default.samples_s)):
        return None
    ratios = [a / b for a, b in zip(m.samples_s, default.samples_s)]
    return statistics.median(ratios) * min(default.samples_s)


def _default_plan(w: ContractionWorkload, default: Measurement) -> dict | None:
    """IREE's chosen config as a plan of ours, so the model can rank it too."""
    if not default.ok or len(default.config) != 1:
        return None
    return {"groups": [{"anchor": w.anchor, "fuse": list(w.fuse),
                        "levels": levels_from_lowering_config(default.config[0])}]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="", help="shapes whose name contains this")
    ap.add_argument("--limit", type=int, default=None)
    args = ap.parse_args()
    cache = host_cache()
    facts = host_facts_path(host_key())
    if not facts.exists():
        stored = json.loads(read_host_facts().to_json()) | {"translation_info": host_translation_info()}
        facts.write_text(json.dumps(stored, indent=2, sort_keys=True) + "\n")
    shapes = [s for s in corpus() if args.only in s.name][: args.limit]
    print(f"host {host_key()}: {len(shapes)} shapes -> {cache.path}", file=sys.stderr)
    for i, s in enumerate(shapes):
        t0 = time.monotonic()
        r = measure_shape(s, cache)
        ok = [t for t in r.measured_s if t]
        best = f"best {min(ok) * 1e3:.2f} ms" if ok else "none ran"
        dflt = f"default {r.default_s * 1e3:.2f} ms" if r.default_s else f"default failed: {r.error}"
        print(f"[{i + 1}/{len(shapes)}] {s.name}: {len(ok)}/{len(r.plans)} ran, {best}, {dflt} "
              f"({time.monotonic() - t0:.0f} s)", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
