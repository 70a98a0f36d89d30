"""Run MLIR work in worker processes with a time limit.

MLIR's C++ can abort or loop on hostile input; in a worker that costs one task, not the caller.
Tasks are plain top-level functions taking and returning picklable data (MLIR text, pydantic
models): MLIR objects never cross a process boundary. pebble kills a worker that overruns its
time limit and replaces one that died.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any, TypeVar

from pebble import ProcessExpired, ProcessPool

from .errors import IRError

T = TypeVar("T")


@dataclass
class IRTimeoutError(IRError):
    seconds: float

    def __str__(self) -> str:
        return f"MLIR work took longer than {self.seconds:g} s and was stopped"


@dataclass
class IRCrashError(IRError):
    detail: str

    def __str__(self) -> str:
        return f"MLIR crashed on this input ({self.detail}); the module likely triggers a compiler bug"


_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _parent_watchdog(parent: int) -> None:
    while True:
        time.sleep(0.5)
        if os.getppid() != parent:
            os._exit(1)


def die_with_parent() -> None:
    """Make this worker process end when the process that started it ends, even by SIGKILL
    (which runs no clean-up): the kernel's parent-death signal on Linux, and a thread that
    watches the parent pid everywhere (and catches a parent that died before the prctl).
    Without this a killed server leaves its MLIR workers running, holding their memory."""
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the watchdog alone
        pass
    if parent == 1:
        os._exit(1)
    threading.Thread(target=_parent_watchdog, args=(parent,), name="parent-watchdog", daemon=True).start()


class Sandbox:
    """A pool of MLIR worker processes. Each worker keeps one MLIR context for its lifetime."""

    def __init__(self, workers: int = 2, *, start_method: str = "forkserver", max_tasks: int = 0) -> None:
        self._pool = ProcessPool(
            max_workers=workers,
            max_tasks=max_tasks,
            context=multiprocessing.get_context(start_method),
            initializer=die_with_parent,
        )
        self.workers = workers

    def submit(self, fn: Callable[..., T], *args: Any, timeout: float) -> Future[T]:
        """A future for fn(*args) run in a worker, stopped after `timeout` seconds."""
        return self._pool.schedule(fn, args=args, timeout=timeout)

    def run(self, fn: Callable[..., T], *args: Any, timeout: float) -> T:
        """fn(*args) in a worker; IRTimeoutError / IRCrashError instead of a hang or a crash."""
        return result_of(self.submit(fn, *args, timeout=timeout), timeout)

    def close(self) -> None:
        self._pool.stop()
        self._pool.join()

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def result_of(future: Future[T], timeout: float) -> T:
    """The future's result; IRTimeoutError past `timeout`, IRCrashError if its worker died.
    An exception the task raised is raised as it is (pebble pickles it across)."""
    try:
        return future.result()
    except FutureTimeout:
        raise IRTimeoutError(timeout) from None
    except ProcessExpired as exc:
        raise IRCrashError(f"worker exited with code {exc.exitcode}") from None
