"""The tiling use case: MLIR module + hardware in, a stored decision out.

    analyse (sandbox) -> decision key -> claim (single-flight through the DB)
      hit:  the stored decision, no search
      miss: warm-start plans from group records -> search + realise (sandbox) -> store

Plain library code: the API, the CLI and workers call `TilingService.decide`.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from sqlalchemy.orm import Session, sessionmaker

from service.config import Settings
from service.hardware.cost import COST_MODEL_VERSION
from service.hardware.model import HardwareModel
from service.hardware.profiles import get_profile, list_profiles
from service.ir.mlir import provider_version
from service.ir.sandbox import Sandbox, result_of
from service.search.shapes import parse_shape_hints
from service.search.space import SPACE_VERSION
from service.store import repo
from service.store.db import session_scope
from service.store.models import Decision, DecisionStatus

Strategy = Literal["tpe", "nsga2", "random", "exhaustive", "supertiling"]
CacheState = Literal["hit", "warm", "miss"]


class TilingRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    module: str = Field(description="MLIR module text")
    hardware: str | HardwareModel = Field(description="a hardware profile name or an inline model")
    budget: int = Field(default=64, ge=1, le=5000, description="distinct plans to evaluate")
    seconds: float | None = Field(default=None, gt=0, le=3600, description="search time limit")
    strategy: Strategy = "tpe"
    seed: int = Field(default=0, ge=0, le=2**31 - 1)
    shape_hints: dict[str, list[int] | str] | None = Field(
        default=None, description='every dim of a dynamic argument, e.g. {"arg0": [128, 1024]} or {"arg0": "128x1024"}; '
                                  '"f2.arg0" names the argument of function @f2 only')
    buckets: dict[str, list[int]] | None = Field(default=None, description='e.g. {"arg0.0": [1, 16, 128]}')
    reuse: bool = Field(default=True, description="serve a stored decision / warm-start from stored groups")
    objective: Literal["latency"] = "latency"

    @field_validator("shape_hints")
    @classmethod
    def _hints_as_lists(cls, hints: dict[str, list[int] | str] | None) -> dict[str, list[int] | str] | None:
        """Hints written "128x1024" become [128, 1024]: one spelling, so both forms share a decision."""
        return parse_shape_hints(hints) if hints else hints


@dataclass
class TilingOutcome:
    decision: Decision
    cache: CacheState
    timings: dict[str, float]


_DONE_CACHE_SIZE = 4096
HARDWARE_TTL_S = 1.0


class PoolSaturated(Exception):
    """Every MLIR worker is busy and the queue is full: retry after `retry_after_s`."""

    def __init__(self, retry_after_s: int) -> None:
        super().__init__(f"all MLIR workers are busy; retry in {retry_after_s} s")
        self.retry_after_s = retry_after_s


class SearchFailed(Exception):
    """The search itself failed on an input that parsed (recorded on the decision)."""


# --------------------------------------------------------------------------- hardware


def resolve_hardware(session: Session, spec: str | HardwareModel) -> HardwareModel:
    """An inline model as given; a name: a stored custom model, else a built-in profile."""
    if isinstance(spec, HardwareModel):
        return spec
    stored = repo.get_hardware_by_name(session, spec)
    if stored is not None:
        return HardwareModel.model_validate(stored.spec)
    return get_profile(spec)


def known_hardware_names(session: Session) -> list[str]:
    # list_profiles() returns names (str).
    return sorted(set(list_profiles()) | {h.name for h in repo.list_hardware(session)})


# --------------------------------------------------------------------------- service


def _shape_bucket(request: TilingRequest) -> str:
    return json.dumps({"hints": request.shape_hints or {}, "buckets": request.buckets or {}}, sort_keys=True)


class TilingService:
    """Decisions for requests, shared across threads of one process (the sandbox is its pool)."""

    def __init__(self, sessions: sessionmaker[Session], sandbox: Sandbox, settings: Settings) -> None:
        self.sessions = sessions
        self.sandbox = sandbox
        self.settings = settings
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        # Queue at most one waiting task per worker; beyond that a client is told to retry.
        # A semaphore: requests run on many threads, and a plain counter races.
        self.capacity = sandbox.workers * 2
        self._slots = threading.BoundedSemaphore(self.capacity)
        # Sandbox analyses by module text: a repeated request (the cache-hit path) needs no
        # worker, and concurrent identical requests share one analysis instead of saturating
        # the pool. Values are the worker's JSON answer, so nothing MLIR lives in this process.
        self._analyses: OrderedDict[tuple[str, int], dict] = OrderedDict()
        self._analysing: dict[tuple[str, int], threading.Event] = {}
        self._analyses_lock = threading.Lock()
        # Done decisions by key (immutable once done) and hardware models by name (short TTL).
        self._done: OrderedDict[str, Decision] = OrderedDict()
        self._cache_lock = threading.Lock()
        self._hardware_by_name: dict[str, tuple[float, HardwareModel]] = {}

    def _remember(self, key: str, decision: Decision) -> None:
        with self._cache_lock:
            self._done[key] = decision
            self._done.move_to_end(key)
            if len(self._done) > _DONE_CACHE_SIZE:
                self._done.popitem(last=False)

    def _hardware(self, spec: str | HardwareModel) -> HardwareModel:
        """resolve_hardware, remembered for a short while per name: a model stored under an
        existing name takes effect within HARDWARE_TTL_S (the hit path makes no DB query)."""
        if isinstance(spec, HardwareModel):
            return spec
        now = time.monotonic()
        cached = self._hardware_by_name.get(spec)
        if cached is not None and now - cached[0] < HARDWARE_TTL_S:
            return cached[1]
        with session_scope(self.sessions) as session:
            model = resolve_hardware(session, spec)
        self._hardware_by_name[spec] = (now, model)
        return model

    def forget_hardware(self, name: str) -> None:
        """Called when a model is stored under `name` in this process."""
        self._hardware_by_name.pop(name, None)

    # -- sandbox with back-pressure
    def _run(self, fn, *args, timeout: float):
        if not self._slots.acquire(blocking=False):
            raise PoolSaturated(retry_after_s=max(1, int(timeout // 4)))
        try:
            return result_of(self.sandbox.submit(fn, *args, timeout=timeout), timeout)
        finally:
            self._slots.release()

    def decide(self, request: TilingRequest) -> TilingOutcome:
        from service.search.tasks import check_search_shapes, search_and_realise

        timings: dict[str, float] = {}
        t0 = time.perf_counter()
        hardware = self._hardware(request.hardware)
        limit = self.settings.request_timeout_s
        info = self._analyse(request.module, timeout=limit)
        if request.shape_hints or request.buckets:
            self._run(check_search_shapes, request.module, request.shape_hints, request.buckets, timeout=limit)
        timings["analyse_s"] = time.perf_counter() - t0
        parts = repo.DecisionKeyParts(
            module_fingerprint=info["fingerprint"],
            hardware_hash=hardware.content_hash(),
            search_space_version=SPACE_VERSION,
            cost_model_version=COST_MODEL_VERSION,
            objective=request.objective,
            shape_bucket=_shape_bucket(request),
            provider_version=provider_version(),
        )
        if not request.reuse:
            # A fresh search is asked for: key it apart so it never serves nor replaces the cache.
            parts = repo.DecisionKeyParts(**{**parts.as_dict(), "objective": f"{request.objective}+fresh:{uuid.uuid4().hex}"})
        key = repo.decision_key(parts)
        done = self._done.get(key)
        if done is not None:  # a done decision never changes: no database round trip
            timings["total_s"] = time.perf_counter() - t0
            return TilingOutcome(done, "hit", timings)
        claim = repo.claim_or_wait(self.sessions, parts, self.owner, lease_s=limit * 2, timeout_s=limit * 2)
        if claim.outcome is repo.ClaimOutcome.HIT:
            self._remember(key, claim.decision)
            timings["total_s"] = time.perf_counter() - t0
            return TilingOutcome(claim.decision, "hit", timings)
        if not claim.owned:
            raise PoolSaturated(retry_after_s=max(1, int(limit // 4)))

        decision_id = claim.decision.id
        try:
            warm = self._warm_start_plans(info["groups"], hardware) if request.reuse else []
            seconds = min(request.seconds or limit * 0.8, limit * 0.8)
            t1 = time.perf_counter()
            result = self._run(
                search_and_realise,
                request.module,
                hardware.model_dump_json(),
                {
                    "budget": request.budget,
                    "seconds": seconds,
                    "strategy": request.strategy,
                    "seed": request.seed,
                    "shape_hints": request.shape_hints,
                    "buckets": request.buckets,
                    "warm_start_groups": warm,
                },
                timeout=limit,
            )
            timings["search_s"] = time.perf_counter() - t1
        except BaseException as exc:
            with session_scope(self.sessions) as session:
                repo.fail_decision(session, decision_id, self.owner, f"{type(exc).__name__}: {exc}")
            raise
        cache: CacheState = "warm" if warm else "miss"
        timings["total_s"] = time.perf_counter() - t0
        with session_scope(self.sessions) as session:
            repo.upsert_module(session, info["fingerprint"], request.module, {"ops": info["ops"]})
            repo.upsert_hardware(session, hardware.content_hash(), hardware.name, hardware.model_dump(mode="json"))
            stats = result["search_stats"] | {"cache": cache, "warm_start_groups": [w["signature"] for w in warm]}
            decision = repo.complete_decision(
                session,
                decision_id,
                self.owner,
                repo.DecisionResult(
                    plan=result["plan"],
                    predicted_cost=result["predicted"],
                    baseline=result["baseline"],
                    transform_script=result["transform_script"],
                    tiled_module=result["tiled_module"],
                    compilation_info=result["compilation_info"],
                    origin_map=result["origin"],
                    search_stats=stats,
                    timings=timings,
                ),
            )
            if decision is None:  # lease lost to another owner: serve theirs
                decision = repo.get_decision(session, decision_id)
            if decision is not None and decision.status == DecisionStatus.DONE and request.reuse:
                self._remember(key, decision)
            repo.save_trials(session, decision_id, [repo.TrialRecord(**t) for t in result["trials"]])
            for group in result["group_records"]:
                repo.record_group_best(session, hardware_hash=hardware.content_hash(), decision_id=decision_id, **group)
        return TilingOutcome(decision, cache, timings)

    _ANALYSES_KEPT = 256

    def _analyse(self, module: str, *, timeout: float) -> dict:
        """`analyse_request` in the sandbox, once per module text at a time (errors are not kept)."""
        from service.search.tasks import analyse_request

        key = (hashlib.sha256(module.encode("utf-8", "surrogatepass")).hexdigest(), self.settings.max_ops)
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
            info = self._run(analyse_request, module, self.settings.max_ops, timeout=timeout)
            with self._analyses_lock:
                self._analyses[key] = info
                if len(self._analyses) > self._ANALYSES_KEPT:
                    self._analyses.popitem(last=False)
            return info
        finally:
            with self._analyses_lock:
                del self._analysing[key]
            running.set()

    def _warm_start_plans(self, groups: list[dict], hardware: HardwareModel) -> list[dict]:
        """Stored best plans of groups seen before; the worker translates them to this module."""
        signatures = {g["signature"]: g for g in groups}
        with session_scope(self.sessions) as session:
            known = repo.best_group_plans(session, signatures, hardware.content_hash())
            return [
                {"signature": sig, "anchor": signatures[sig]["anchor"], "relative": record.plan}
                for sig, record in known.items()
            ]
