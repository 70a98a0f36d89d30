"""On-disk cache of measurements, so calibration and the fidelity benchmark share their runs.
One file per host (host_key): a timing is a fact about one CPU.

Keyed by what determines a timing: the module text, the forced plan (or none: IREE's default)
and the translation_info it is forced with, the IREE version and the benchmark settings. One
JSON object per line; appends only, the last entry for a key wins. Not a store of record:
deleting the file only costs re-measuring.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from service.hardware.profiles import read_cpuinfo, vector_width_from_flags

from .timing import BenchSettings, Measurement
from .tools import BENCH_DEVICE, benchmark_threads, host_translation_info, iree_version


def host_key(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """Which CPU a measurement was taken on, as a file-name-safe key: vendor, family/model,
    vector ISA and the benchmark's thread count. Two sessions on the same kind of CPU share it;
    a Zen 4 never reads a Xeon's timings."""
    vendor, flags, family_model = read_cpuinfo(cpuinfo)
    family, model = family_model if family_model else ("x", "x")
    isa = {64: "avx512", 32: "avx2", 16: "sse"}[vector_width_from_flags(flags)]
    return f"{vendor or 'unknown'}-f{family}-m{model}-{isa}-{benchmark_threads()}t"


def default_cache_path() -> Path:
    return Path("./var/measure") / f"{host_key()}.jsonl"


def _settings_key(settings: BenchSettings) -> dict:
    """The settings as keyed: the device only when it is not the default, and the dispatch
    repeat only when a call runs a dispatch more than once, so measurements cached before each
    setting existed (all on the default device, one run per call) keep their keys."""
    fields = asdict(settings)
    if fields.get("device") == BENCH_DEVICE:
        del fields["device"]
    if fields.get("dispatch_repeat") == 1:
        del fields["dispatch_repeat"]
    return fields


def measurement_key(module_text: str, plan: Any | None, settings: BenchSettings,
                    translation_info: str | None = None) -> str:
    """The cache key of one timing. `translation_info`: the pipeline options a forced plan was
    compiled with, default this host's (another host's, to read that host's measurements)."""
    if plan is not None and not isinstance(plan, dict):
        plan = plan.model_dump()
    body = json.dumps(
        {
            "module": module_text,
            "plan": plan,
            "iree": iree_version(),
            "settings": _settings_key(settings),
            # A forced plan is compiled with the pipeline options IREE uses on this host.
            "translation_info": None if plan is None else translation_info or host_translation_info(),
            "schema": 3,  # 2: measurements carry CPU time; 3: and forced plans the host's options
        },
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(body.encode()).hexdigest()


class MeasurementCache:
    """A JSON-lines file of {key, measurement}; `path=None` keeps it in memory only."""

    def __init__(self, path: Path | None):
        self.path = path
        self._entries: dict[str, Measurement] = {}
        if path is not None and path.exists():
            for line in path.read_text().splitlines():
                try:
                    row = json.loads(line)
                    self._entries[row["key"]] = Measurement.model_validate(row["measurement"])
                except (ValueError, KeyError):
                    continue  # a torn last line from an interrupted run

    @classmethod
    def for_this_host(cls) -> MeasurementCache:
        return cls(default_cache_path())

    def get(self, key: str) -> Measurement | None:
        return self._entries.get(key)

    def put(self, key: str, measurement: Measurement) -> None:
        self._entries[key] = measurement
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a") as f:
                f.write(json.dumps({"key": key, "measurement": measurement.model_dump()}) + "\n")
