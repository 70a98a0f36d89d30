"""What keeps one tiling process within its means: the bounded queue in front of the MLIR
workers, caches bounded by bytes, and the heartbeat that keeps a running search's lease."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

from sqlalchemy.orm import Session, sessionmaker

from service.store import decisions
from service.store.db import session_scope

from .errors import PoolSaturated

log = logging.getLogger("tilesearch.tiling")

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

# Retry-After never says more than this: a client should look again within minutes.
_MAX_RETRY_AFTER_S = 300


class WorkQueue:
    """Admission to `workers` MLIR workers: a task runs at once when one is free, otherwise it
    waits in line (first come, first served) for at most `max_wait_s`; at most `depth` tasks
    wait. Past either bound the caller gets PoolSaturated with a Retry-After computed from the
    line ahead and the mean task time seen so far."""

    def __init__(self, workers: int, depth: int, max_wait_s: float) -> None:
        self.workers = workers
        self.depth = depth
        self.max_wait_s = max_wait_s
        self._cond = threading.Condition()
        self._running = 0
        self._waiting = 0
        self._mean_task_s = 1.0  # moving average; a guess until tasks have run

    @property
    def waiting(self) -> int:
        return self._waiting

    @property
    def running(self) -> int:
        return self._running

    def retry_after_s(self) -> int:
        """Seconds until the line ahead of a new task has likely drained."""
        ahead = self._waiting + self._running
        return max(1, min(_MAX_RETRY_AFTER_S, math.ceil(ahead / self.workers * self._mean_task_s)))

    @contextmanager
    def slot(self) -> Iterator[None]:
        with self._cond:
            if self._waiting or self._running >= self.workers:
                if self._waiting >= self.depth:
                    raise PoolSaturated(self.retry_after_s())
                self._waiting += 1
                try:
                    free = self._cond.wait_for(lambda: self._running < self.workers, timeout=self.max_wait_s)
                finally:
                    self._waiting -= 1
                if not free:
                    raise PoolSaturated(self.retry_after_s())
            self._running += 1
        started = time.monotonic()
        try:
            yield
        finally:
            with self._cond:
                self._running -= 1
                self._mean_task_s = 0.8 * self._mean_task_s + 0.2 * (time.monotonic() - started)
                self._cond.notify()


class ByteBoundedCache(Generic[K, V]):
    """A thread-safe LRU map holding at most `max_bytes` of values, as `size_of` measures them.
    A value larger than the whole bound is not kept."""

    def __init__(self, max_bytes: int, size_of: Callable[[V], int]) -> None:
        self.max_bytes = max_bytes
        self._size_of = size_of
        self._items: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: K) -> V | None:
        with self._lock:
            item = self._items.get(key)
            if item is None:
                return None
            self._items.move_to_end(key)
            return item[0]

    def put(self, key: K, value: V) -> None:
        size = self._size_of(value)
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            if size > self.max_bytes:
                return
            self._items[key] = (value, size)
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, (_, dropped) = self._items.popitem(last=False)
                self._bytes -= dropped


class LeaseHeartbeat:
    """Renews the caller's lease on a decision every `lease_s / 3` in a thread, for as long as
    the `with` block runs: the lease stays short, so a dead owner's key is free within about
    `lease_s`, while a live one keeps it however long its search takes."""

    def __init__(self, sessions: sessionmaker[Session], decision_id: int, owner: str, lease_s: float) -> None:
        self._sessions = sessions
        self._decision_id = decision_id
        self._owner = owner
        self._lease_s = lease_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"lease-{decision_id}", daemon=True)
        self.lost = False

    def _beat(self) -> None:
        while not self._stop.wait(self._lease_s / 3):
            try:
                with session_scope(self._sessions) as session:
                    if not decisions.renew_lease(session, self._decision_id, self._owner, self._lease_s):
                        self.lost = True
                        log.warning("lease on decision %s was lost", self._decision_id)
                        return
            except Exception:  # a database hiccup: the next beat tries again within the lease
                log.exception("renewing the lease on decision %s failed", self._decision_id)

    def __enter__(self) -> "LeaseHeartbeat":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
