"""Each dispatch's time inside a whole model, from IREE's own HAL profiler.

A dispatch compiled and timed on its own is not the dispatch inside the model: IREE configures
it differently alone (it collapses a 1x1 convolution's spatial dims), and its inputs stay hot in
cache across iterations. `iree-benchmark-module --device_profiling_mode=host-execution` records
every dispatch of the model's real runs on the local-task device (start to end of the dispatch,
and the sum of its workgroups' times), and `iree-profile dispatch --format=jsonl` aggregates them
per dispatch function: `host_dispatch_group` rows keyed by the function's name
(`main$async_dispatch_26_matmul_like_192x28x28x32_f32`, the names of the executable sources).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .tools import BENCH_DEVICE, ToolFailure, run_tool


@dataclass(frozen=True)
class DispatchTime:
    """One dispatch function over a profiled run: mean seconds per call."""

    calls: int
    wall_s: float  # start to end of the dispatch (what the model waits for)
    cpu_s: float  # its workgroups' times summed (all threads)


def profile_dispatches(vmfb: Path, function: str, input_flags: Sequence[str], *, iterations: int = 10,
                       timeout_s: float = 300.0) -> dict[str, DispatchTime]:
    """Run the model `iterations` times under IREE's host-execution profiler: per dispatch
    function, its mean time per call."""
    with tempfile.TemporaryDirectory(prefix="tilesearch-profile-") as tmp:
        bundle = Path(tmp) / "run.ireeprof"
        run_tool("iree-benchmark-module", [
            f"--module={vmfb}", f"--device={BENCH_DEVICE}", f"--function={function}", *input_flags,
            f"--benchmark_min_time={iterations}x", "--device_profiling_mode=host-execution",
            f"--device_profiling_output={bundle}",
        ], timeout_s)
        report = run_tool("iree-profile", ["dispatch", "--format=jsonl", str(bundle)], timeout_s)
    return dispatch_times(report)


def dispatch_times(jsonl: str) -> dict[str, DispatchTime]:
    """`iree-profile dispatch --format=jsonl`'s host-execution groups, by function name."""
    times: dict[str, DispatchTime] = {}
    for line in jsonl.splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            raise ToolFailure(f"iree-profile printed a line that is not JSON: {line[:80]}") from None
        if row.get("type") != "host_dispatch_group" or not row.get("valid"):
            continue
        calls = int(row["valid"])
        times[row["key"]] = DispatchTime(calls=calls, wall_s=row["total_ns"] * 1e-9 / calls,
                                         cpu_s=row["total_tile_duration_sum_ns"] * 1e-9 / calls)
    if not times:
        raise ToolFailure("IREE's profiler recorded no dispatch (is this IREE built with HAL profiling?)")
    return times
