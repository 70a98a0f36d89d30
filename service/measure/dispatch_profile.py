"""Each dispatch's time inside a whole model, from IREE's own HAL profiler.

A dispatch compiled and timed on its own is not the dispatch inside the model: IREE configures
it differently alone (it collapses a 1x1 convolution's spatial dims), and its inputs stay hot in
cache across iterations. `iree-benchmark-module --device_profiling_mode=host-execution` records
every dispatch of the model's real runs on the local-task device (start to end of the dispatch,
and the sum of its workgroups' times), and `iree-profile dispatch --format=jsonl` aggregates them
per dispatch function: with `--dispatch_events`, one `host_dispatch_event` row per call, keyed
by the function's name (`main$async_dispatch_26_matmul_like_192x28x28x32_f32`, the names of the
executable sources).

A dispatch's figure is its fastest call after WARMUP_RUNS runs: the first runs are cold, and
other work on the machine only ever adds time to a call, in bursts that move a mean or a median
far more than the minimum from one profile of the same build to the next
(`benchmarks/in_model_noise.py`; docs/benchmarks.md, "In-model timing noise").
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
    """One dispatch function over a profiled run: its fastest call, in seconds."""

    calls: int  # the calls it was the fastest of (after the warm-up)
    wall_s: float  # start to end of the dispatch (what the model waits for)
    cpu_s: float  # its workgroups' times summed (all threads)


WARMUP_RUNS = 3


def profile_dispatches(vmfb: Path, function: str, input_flags: Sequence[str], *, iterations: int = 10,
                       timeout_s: float = 300.0) -> dict[str, DispatchTime]:
    """Run the model WARMUP_RUNS + `iterations` times under IREE's host-execution profiler: per
    dispatch function, its fastest call of the last `iterations` runs."""
    runs = WARMUP_RUNS + iterations
    return dispatch_times(profile_events(vmfb, function, input_flags, iterations=runs, timeout_s=timeout_s),
                          skip=WARMUP_RUNS / runs)


def profile_events(vmfb: Path, function: str, input_flags: Sequence[str], *, iterations: int = 10,
                   timeout_s: float = 300.0) -> str:
    """The profiler's JSONL: one `host_dispatch_event` row per dispatch call of `iterations` runs."""
    with tempfile.TemporaryDirectory(prefix="tilesearch-profile-") as tmp:
        bundle = Path(tmp) / "run.ireeprof"
        run_tool("iree-benchmark-module", [
            f"--module={vmfb}", f"--device={BENCH_DEVICE}", f"--function={function}", *input_flags,
            f"--benchmark_min_time={iterations}x", "--device_profiling_mode=host-execution",
            f"--device_profiling_output={bundle}",
        ], timeout_s)
        return run_tool("iree-profile", ["dispatch", "--format=jsonl", "--dispatch_events", str(bundle)], timeout_s)


def dispatch_calls(jsonl: str, skip: float = 0.0) -> dict[str, list[tuple[int, int]]]:
    """`iree-profile dispatch --format=jsonl --dispatch_events`'s valid host-execution events, by
    function name, in call order: (wall ns, workgroups' summed ns) per call, after leaving out
    the first `skip` share of each function's calls (the warm-up runs: a function is called as
    often in every run)."""
    calls: dict[str, list[tuple[int, int]]] = {}
    for line in jsonl.splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            raise ToolFailure(f"iree-profile printed a line that is not JSON: {line[:80]}") from None
        if row.get("type") == "host_dispatch_event" and row.get("valid"):
            calls.setdefault(row["key"], []).append((row["duration_ns"], row["tile_duration_sum_ns"]))
    if not calls:
        raise ToolFailure("IREE's profiler recorded no dispatch (is this IREE built with HAL profiling?)")
    return {key: events[int(len(events) * skip):] for key, events in calls.items()}


def dispatch_times(jsonl: str, skip: float = 0.0) -> dict[str, DispatchTime]:
    """Per function, its fastest call (`dispatch_calls`, the warm-up's `skip` share left out)."""
    times = {}
    for key, kept in dispatch_calls(jsonl, skip).items():
        wall_ns, cpu_ns = min(kept)
        times[key] = DispatchTime(calls=len(kept), wall_s=wall_ns * 1e-9, cpu_s=cpu_ns * 1e-9)
    return times
