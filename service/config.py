"""Runtime settings, read from the environment (prefix ``TILESEARCH_``).

``DATABASE_URL`` is also read without the prefix: it is the name deployments and
PaaS platforms already use. ``TILESEARCH_DATABASE_URL`` wins when both are set.
"""

from __future__ import annotations

from functools import lru_cache

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_DATABASE_URL = "sqlite:///var/tilesearch.db"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TILESEARCH_", extra="ignore")

    # A relative SQLite path is relative to the working directory; the store creates the
    # parent directory when it opens the file (see service.store.db.make_engine).
    database_url: str = Field(
        default=DEFAULT_DATABASE_URL,
        validation_alias=AliasChoices("TILESEARCH_DATABASE_URL", "DATABASE_URL"),
    )
    # When set, every request under /v1 and the dashboard must carry it (reads too); the
    # probes (/healthz, /readyz, /metrics) and the API docs stay open.
    api_token: str | None = None
    max_body_bytes: int = Field(default=8 * 1024 * 1024, gt=0)
    max_ops: int = Field(default=5000, gt=0)
    # Wall-clock limit for one request's MLIR work in the worker pool.
    request_timeout_s: float = Field(default=60.0, gt=0)
    pool_workers: int = Field(default=2, gt=0)
    # MLIR tasks waiting for a worker beyond the running ones; past it a request gets 503 with a
    # Retry-After computed from the queue. A queued task waits at most `queue_wait_s`.
    queue_depth: int = Field(default=64, ge=0)
    queue_wait_s: float = Field(default=120.0, gt=0)
    # Threads that run tiling requests (most of them wait: on the queue or on another owner's
    # search). A pool of their own, so probes and reads never wait behind them.
    tiling_threads: int = Field(default=128, gt=0)
    # The single-flight lease of a running search: renewed every lease_s / 3 by a heartbeat while
    # the search runs, so a dead owner's key is taken over within about lease_s.
    lease_s: float = Field(default=6.0, gt=0)
    # In-process caches, bounded by the bytes of what they hold.
    decision_cache_bytes: int = Field(default=64 * 1024 * 1024, ge=0)
    analysis_cache_bytes: int = Field(default=16 * 1024 * 1024, ge=0)
    # Batch jobs: one item's search may run this long; a worker's claim on an item's decision
    # lasts `job_lease_s` past its last trial, so a dead worker's item is free again that soon;
    # a procrastinate worker with no heartbeat for `job_stalled_after_s` has its items re-queued.
    job_item_timeout_s: float = Field(default=1800.0, gt=0)
    job_lease_s: float = Field(default=30.0, gt=0)
    job_heartbeat_s: float = Field(default=5.0, gt=0)
    job_stalled_after_s: float = Field(default=20.0, gt=0)
    # SIGTERM: a worker finishes its items for this long, then releases them to the queue.
    job_shutdown_grace_s: float = Field(default=30.0, ge=0)
    # Learning from measurements (service.tiling.learning): after a measuring request, once this
    # host has `learn_min_measurements` timed plans over `learn_min_modules` modules, a process
    # of its own fits a calibrated profile in the background; it is used only when it predicts
    # held-out modules better. `learn_max_evals` / `learn_register_tiles`: how hard each fit tries.
    learn_auto: bool = True
    learn_min_measurements: int = Field(default=24, ge=1)
    learn_min_modules: int = Field(default=3, ge=2)
    learn_max_evals: int = Field(default=300, ge=10)
    learn_register_tiles: bool = True
    learn_fit_timeout_s: float = Field(default=3600.0, gt=0)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings; tests call ``get_settings.cache_clear()`` after changing env."""
    return Settings()
