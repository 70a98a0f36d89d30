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


def _process_gone(pid: int) -> bool:
    """Whether `pid` has exited (a zombie waiting for its parent counts as exited)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True
    except OSError:  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False


def _owner_watchdog(owner: int) -> None:
    while True:
        time.sleep(0.5)
        if _process_gone(owner):
            os._exit(1)


def die_with_owner(owner: int) -> None:
    """Make this worker end when `owner`, the process that made its pool, ends, even by SIGKILL
    (which runs no clean-up). A worker's parent is the forkserver, not the owner, and the
    forkserver only exits once every worker has (each holds its "alive" pipe): so a thread
    watches the owner itself. The kernel's parent-death signal covers the `fork` start method.
    Without this a killed server leaves its MLIR workers running, holding their memory."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the watchdog alone
        pass
    if _process_gone(owner):
        os._exit(1)
    threading.Thread(target=_owner_watchdog, args=(owner,), name="owner-watchdog", daemon=True).start()


class Sandbox:
    """A pool of MLIR worker processes. Each worker keeps one MLIR context for its lifetime."""

    def __init__(self, workers: int = 2, *, start_method: str = "forkserver", max_tasks: int = 0) -> None:
        self._pool = ProcessPool(
            max_workers=workers,
            max_tasks=max_tasks,
            context=multiprocessing.get_context(start_method),
            initializer=die_with_owner,
            initargs=(os.getpid(),),
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
