"""IREE's tools stop when their caller is stopped or out of time: the tool's process is killed
(not left running), and the caller gets the stop or a ToolFailure at once.

The tool is a real `iree-compile` reading a FIFO nobody writes: it waits for ever, as a long
compile or benchmark would, without loading the machine."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from service.measure.tools import ToolFailure, interruptible, run_tool


class Stopped(Exception):
    pass


def _iree_children() -> list[int]:
    """This process's live children that are IREE tools."""
    pids = []
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        for pid in (task / "children").read_text().split():
            try:
                comm = Path(f"/proc/{pid}/comm").read_text().strip()
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except FileNotFoundError:
                continue
            if comm.startswith("iree-") and state != "Z":
                pids.append(int(pid))
    return pids


@pytest.fixture
def endless_input(tmp_path: Path) -> Path:
    fifo = tmp_path / "never.mlir"
    os.mkfifo(fifo)
    return fifo


def test_a_stop_from_the_check_kills_the_running_tool_within_a_second_or_two(endless_input: Path,
                                                                            tmp_path: Path) -> None:
    t0 = time.monotonic()
    seen: list[list[int]] = []

    def check() -> None:
        seen.append(_iree_children())
        if time.monotonic() - t0 > 1.5:
            raise Stopped("cancelled")

    with pytest.raises(Stopped), interruptible(check):
        run_tool("iree-compile", [str(endless_input), "-o", str(tmp_path / "x.vmfb")], timeout_s=60)
    elapsed = time.monotonic() - t0
    assert elapsed < 4, elapsed
    assert any(seen), "the check was asked while the tool ran"
    assert _iree_children() == []  # killed and reaped


def test_a_check_that_stops_before_the_tool_starts_runs_nothing(tmp_path: Path) -> None:
    def check() -> None:
        raise Stopped("cancelled")

    with pytest.raises(Stopped), interruptible(check):
        run_tool("iree-compile", ["--version"], timeout_s=60)
    with interruptible(None):  # nothing to ask: runs as before
        assert "IREE" in run_tool("iree-compile", ["--version"], timeout_s=60)


def test_a_tool_out_of_time_is_killed_and_a_tool_failure(endless_input: Path, tmp_path: Path) -> None:
    t0 = time.monotonic()
    with pytest.raises(ToolFailure, match="timed out after 1.5 s"):
        run_tool("iree-compile", [str(endless_input), "-o", str(tmp_path / "x.vmfb")], timeout_s=1.5)
    assert time.monotonic() - t0 < 4
    assert _iree_children() == []
