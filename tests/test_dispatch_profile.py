"""Reading IREE's HAL profiler: one figure per dispatch function from its individual calls."""

from __future__ import annotations

import json

import pytest

from service.measure.dispatch_profile import dispatch_times
from service.measure.tools import ToolFailure


def _event(key: str, ns: int, tiles_ns: int, valid: bool = True) -> str:
    return json.dumps({"type": "host_dispatch_event", "key": key, "duration_ns": ns,
                       "tile_duration_sum_ns": tiles_ns, "valid": valid})


def test_a_dispatch_is_its_fastest_call_after_the_warm_up_runs():
    rows = [json.dumps({"type": "dispatch_summary", "valid_host_dispatches": 9})]
    # Two calls per run over four runs; the first run is cold, one call of the third was preempted.
    rows += [_event("d0", 900_000, 1_700_000), _event("d0", 150_000, 300_000)]  # warm-up (a lucky fast call)
    rows += [_event("d0", ns, 2 * ns) for ns in (210_000, 200_000, 2_000_000, 205_000, 220_000, 230_000)]
    rows += [_event("d0", 1, 1, valid=False), _event("d1", 50_000, 90_000)]
    times = dispatch_times("\n".join(rows), skip=1 / 4)
    assert set(times) == {"d0", "d1"}
    assert times["d0"].calls == 6  # the warm-up run's two calls and the invalid event left out
    assert times["d0"].wall_s == pytest.approx(200e-6) and times["d0"].cpu_s == pytest.approx(400e-6)
    assert times["d1"].wall_s == pytest.approx(50e-6) and times["d1"].cpu_s == pytest.approx(90e-6)
    assert dispatch_times("\n".join(rows))["d0"].wall_s == pytest.approx(150e-6)  # nothing skipped


def test_a_profile_without_dispatch_events_or_with_garbage_is_a_tool_failure():
    with pytest.raises(ToolFailure, match="recorded no dispatch"):
        dispatch_times(json.dumps({"type": "dispatch_summary"}))
    with pytest.raises(ToolFailure, match="not JSON"):
        dispatch_times("{oops")
