"""The tiling service: a request in, a stored decision out.

    analyse (sandbox) -> decision key -> claim (single-flight through the DB)
      hit:  the stored decision, no search
      miss: warm-start plans from group records -> search + realise (sandbox) -> store

Plain library code: the API, the CLI and workers call `TilingService.decide`.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, TypeVar

from pebble.common.types import RemoteTraceback
from pydantic import BaseModel, ConfigDict, Field, field_validator
from sqlalchemy.orm import Session, sessionmaker

from service.config import Settings
from service.hardware.cost import COST_MODEL_VERSION
from service.hardware.model import HardwareModel
from service.hardware.profiles import UnknownHardwareError
from service.ir.analysis import source_key
from service.ir.errors import IRError
from service.ir.mlir import provider_version
from service.ir.plan import Plan
from service.ir.sandbox import Sandbox, result_of
from service.search.errors import SearchInputError
from service.search.shapes import parse_shape_hints
from service.search.space import SPACE_VERSION
from service.store import catalog, decisions, searches
from service.store.db import session_scope
from service.store.models import Decision, DecisionStatus

from .contract import (
    Buckets,
    ModuleAnalysis,
    SearchObserver,
    SearchOutcome,
    SearchStopped,
    SearchTask,
    ShapeHints,
    Strategy,
    WarmStart,
)
from .errors import PoolSaturated, TilingFailed
from .hardware import HardwareCatalog
from .worker import analyse_request, check_search_shapes, search_and_realise

log = logging.getLogger("tilesearch.tiling")

CacheState = Literal["hit", "warm", "miss"]
T = TypeVar("T")

_DONE_CACHE_SIZE = 4096
_ANALYSES_KEPT = 256


class TilingRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    module: str = Field(description="MLIR module text")
    hardware: str | HardwareModel = Field(description="a hardware profile name or an inline model")
    budget: int = Field(default=64, ge=1, le=5000, description="distinct plans to evaluate")
    seconds: float | None = Field(default=None, gt=0, le=3600, description="search time limit")
    strategy: Strategy = "tpe"
    seed: int = Field(default=0, ge=0, le=2**31 - 1)
    shape_hints: ShapeHints | None = Field(
        default=None, description='every dim of a dynamic argument, e.g. {"arg0": [128, 1024]} or {"arg0": "128x1024"}; '
                                  '"f2.arg0" names the argument of function @f2 only')
    buckets: Buckets | None = Field(default=None, description='e.g. {"arg0.0": [1, 16, 128]}')
    reuse: bool = Field(default=True, description="serve a stored decision / warm-start from stored groups")
    objective: Literal["latency"] = "latency"

    @field_validator("shape_hints")
    @classmethod
    def _hints_as_lists(cls, hints: ShapeHints | None) -> ShapeHints | None:
        """Hints written "128x1024" become [128, 1024]: one spelling, so both forms share a decision."""
        return parse_shape_hints(hints) if hints else hints


@dataclass(frozen=True)
class LongSearch:
    """How a search that outlives a request runs (a job item): its own time limit, a lease its
    observer keeps renewing (so a dead worker's claim expires within `lease_s`), and an observer
    made for the claimed decision that sees the trials as they come and may stop the search.
    A decision left half done by someone else resumes: its kept trials stay, the new ones are
    numbered after them, the search starts from their best plan and spends what is left of the
    budget."""

    owner: str
    limit_s: float
    lease_s: float
    observer: Callable[[int], SearchObserver]  # decision id -> the observer for its search


@dataclass
class TilingOutcome:
    decision: Decision
    cache: CacheState
    timings: dict[str, float]


# What a request can get wrong (and a search stopped on purpose); any other exception out of a
# worker is a bug of ours.
_CALLER_ERRORS = (IRError, SearchInputError, UnknownHardwareError, PoolSaturated, SearchStopped)


def _shape_bucket(request: TilingRequest) -> str:
    return json.dumps({"hints": request.shape_hints or {}, "buckets": request.buckets or {}}, sort_keys=True)


class TilingService:
    """Decisions for requests, shared across threads of one process (the sandbox is its pool)."""

    def __init__(self, sessions: sessionmaker[Session], sandbox: Sandbox, settings: Settings) -> None:
        self.sessions = sessions
        self.sandbox = sandbox
        self.settings = settings
        self.hardware = HardwareCatalog(sessions)
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        # Queue at most one waiting task per worker; beyond that a client is told to retry.
        # A semaphore: requests run on many threads, and a plain counter races.
        self.capacity = sandbox.workers * 2
        self._slots = threading.BoundedSemaphore(self.capacity)
        # Sandbox analyses by module text: a repeated request (the cache-hit path) needs no
        # worker, and concurrent identical requests share one analysis instead of saturating
        # the pool. Values are the worker's answer, so nothing MLIR lives in this process.
        self._analyses: OrderedDict[tuple[str, int], ModuleAnalysis] = OrderedDict()
        self._analysing: dict[tuple[str, int], threading.Event] = {}
        self._analyses_lock = threading.Lock()
        # Done decisions by key: immutable once done.
        self._done: OrderedDict[str, Decision] = OrderedDict()
        self._cache_lock = threading.Lock()

    def decide(self, request: TilingRequest, long: LongSearch | None = None) -> TilingOutcome:
        """The decision for `request`: stored (hit) or searched now (warm / miss).

        Raises the caller's errors as they are (IRError with diagnostics, SearchInputError,
        UnknownHardwareError, PoolSaturated), TilingFailed for any other exception raised in a
        worker, and anything raised in this process (e.g. by the database) unchanged.
        """
        try:
            return self._decide(request, long)
        except _CALLER_ERRORS:
            raise
        except Exception as exc:
            if not isinstance(exc.__cause__, RemoteTraceback):  # pebble's mark of a worker's exception
                raise
            log.error("tiling task failed in a worker: %s: %s\n%s", type(exc).__name__, exc, exc.__cause__)
            raise TilingFailed(type(exc).__name__, str(exc)) from exc

    def _decide(self, request: TilingRequest, long: LongSearch | None) -> TilingOutcome:
        timings: dict[str, float] = {}
        t0 = time.perf_counter()
        hardware = self.hardware.resolve(request.hardware)
        limit = self.settings.request_timeout_s
        analysis = self._analyse(request.module, timeout=limit)
        if request.shape_hints or request.buckets:
            self._run(check_search_shapes, request.module, request.shape_hints, request.buckets, timeout=limit)
        timings["analyse_s"] = time.perf_counter() - t0
        parts = decisions.DecisionKeyParts(
            module_fingerprint=analysis.fingerprint,
            hardware_hash=hardware.content_hash(),
            search_space_version=SPACE_VERSION,
            cost_model_version=COST_MODEL_VERSION,
            objective=request.objective,
            shape_bucket=_shape_bucket(request),
            provider_version=provider_version(),
        )
        if not request.reuse:
            # A fresh search is asked for: key it apart so it never serves nor replaces the cache.
            parts = decisions.DecisionKeyParts(**{**parts.as_dict(), "objective": f"{request.objective}+fresh:{uuid.uuid4().hex}"})
        key = decisions.decision_key(parts)
        done = self._done.get(key)
        if done is not None:  # a done decision never changes: no database round trip
            timings["total_s"] = time.perf_counter() - t0
            return TilingOutcome(done, "hit", timings)
        owner = long.owner if long else self.owner
        search_limit = long.limit_s if long else limit
        lease_s = long.lease_s if long else limit * 2
        claim = decisions.claim_or_wait(self.sessions, parts, owner, lease_s=lease_s, timeout_s=max(lease_s, limit) * 2)
        if claim.outcome is decisions.ClaimOutcome.HIT:
            self._remember(key, claim.decision)
            timings["total_s"] = time.perf_counter() - t0
            return TilingOutcome(claim.decision, "hit", timings)
        if not claim.owned:
            raise PoolSaturated(retry_after_s=max(1, int(limit // 4)))

        decision_id = claim.decision.id
        try:
            warm = self._warm_starts(analysis, hardware) if request.reuse else []
            with session_scope(self.sessions) as session:
                kept = searches.kept_trials(session, decision_id) if long else None
            task = SearchTask(
                hardware=hardware,
                budget=max(1, request.budget - kept.count) if kept and kept.count else request.budget,
                seconds=min(request.seconds or search_limit * 0.8, search_limit * 0.8),
                strategy=request.strategy,
                seed=request.seed,
                shape_hints=request.shape_hints,
                buckets=request.buckets,
                warm_starts=warm,
                trial_offset=kept.next_number if kept else 0,
                resume_plan=Plan.model_validate(kept.best_plan) if kept and kept.best_plan else None,
            )
            t1 = time.perf_counter()
            observer = long.observer(decision_id) if long else None
            outcome = self._run(search_and_realise, request.module, task, observer, timeout=search_limit)
            timings["search_s"] = time.perf_counter() - t1
        except BaseException as exc:
            with session_scope(self.sessions) as session:
                decisions.fail_decision(session, decision_id, owner, f"{type(exc).__name__}: {exc}")
            raise
        cache: CacheState = "warm" if warm else "miss"
        timings["total_s"] = time.perf_counter() - t0
        decision = self._store(request, analysis, hardware, decision_id, outcome, cache, warm, timings, key, owner)
        return TilingOutcome(decision, cache, timings)

    def _store(self, request: TilingRequest, analysis: ModuleAnalysis, hardware: HardwareModel, decision_id: int,
               outcome: SearchOutcome, cache: CacheState, warm: list[WarmStart], timings: dict[str, float],
               key: str, owner: str) -> Decision | None:
        """Complete the claimed decision with the search's outcome, its trials and group records."""
        realised = outcome.realised
        stats = outcome.stats.model_dump() | {"cache": cache, "warm_start_groups": [w.signature for w in warm]}
        with session_scope(self.sessions) as session:
            catalog.upsert_module(session, analysis.fingerprint, request.module,
                                  {"ops": [op.model_dump() for op in analysis.ops]})
            catalog.upsert_hardware(session, hardware.content_hash(), hardware.name, hardware.model_dump(mode="json"))
            decision = decisions.complete_decision(
                session,
                decision_id,
                owner,
                decisions.DecisionResult(
                    plan=outcome.plan.model_dump(),
                    predicted_cost=outcome.predicted,
                    baseline=outcome.baseline,
                    transform_script=realised.transform_script if realised else None,
                    tiled_module=realised.tiled_module if realised else None,
                    compilation_info={uid: info.model_dump() for uid, info in outcome.compilation_info.items()},
                    tuning_spec=outcome.tuning_spec,
                    origin_map=realised.origin if realised else None,
                    search_stats=stats,
                    timings=timings,
                ),
            )
            if decision is None:  # lease lost to another owner: serve theirs
                decision = decisions.get_decision(session, decision_id)
            if decision is not None and decision.status == DecisionStatus.DONE and request.reuse:
                self._remember(key, decision)
            searches.save_trials(session, decision_id, [searches.TrialRecord(**t.model_dump()) for t in outcome.trials])
            for best in outcome.group_bests:
                searches.record_group_best(session, signature=best.signature, hardware_hash=hardware.content_hash(),
                                           plan=best.plan.model_dump(mode="json"), latency_s=best.latency_s,
                                           decision_id=decision_id)
        return decision

    def _remember(self, key: str, decision: Decision) -> None:
        with self._cache_lock:
            self._done[key] = decision
            self._done.move_to_end(key)
            if len(self._done) > _DONE_CACHE_SIZE:
                self._done.popitem(last=False)

    def _run(self, fn: Callable[..., T], *args: object, timeout: float) -> T:
        """fn(*args) in a sandbox worker, with back-pressure: PoolSaturated when every slot is taken."""
        if not self._slots.acquire(blocking=False):
            raise PoolSaturated(retry_after_s=max(1, int(timeout // 4)))
        try:
            return result_of(self.sandbox.submit(fn, *args, timeout=timeout), timeout)
        finally:
            self._slots.release()

    def _analyse(self, module: str, *, timeout: float) -> ModuleAnalysis:
        """`analyse_request` in the sandbox, once per module text at a time (errors are not kept)."""
        key = (source_key(module), self.settings.max_ops)
        while True:
            with self._analyses_lock:
                if key in self._analyses:
                    self._analyses.move_to_end(key)
                    return self._analyses[key]
                running = self._analysing.get(key)
                if running is None:
                    running = self._analysing[key] = threading.Event()
                    break
            running.wait(timeout)  # then look again: done, or failed and ours to retry
        try:
            analysis = self._run(analyse_request, module, self.settings.max_ops, timeout=timeout)
            with self._analyses_lock:
                self._analyses[key] = analysis
                if len(self._analyses) > _ANALYSES_KEPT:
                    self._analyses.popitem(last=False)
            return analysis
        finally:
            with self._analyses_lock:
                del self._analysing[key]
            running.set()

    def _warm_starts(self, analysis: ModuleAnalysis, hardware: HardwareModel) -> list[WarmStart]:
        """Stored best plans of groups seen before; the worker translates them to this module."""
        anchors = {site.signature: site.anchor for site in analysis.groups}
        with session_scope(self.sessions) as session:
            known = searches.best_group_plans(session, anchors, hardware.content_hash())
            return [WarmStart(signature=sig, anchor=anchors[sig], relative=record.plan) for sig, record in known.items()]
