"""The tiling service: a request in, a stored decision out.

    check text -> analyse (sandbox, or the cache by normalised text) -> decision key
    -> claim with the request's effort (single-flight through the DB)
      hit:    the stored decision, answered in the requester's own IR (re-applied when the
              stored texts came from another text of the same structure)
      refine: the stored decision tried less hard than asked: search again from its plan,
              keep the better one and record the effort
    measure_top K: the search also times its K best plans and IREE's default with IREE on this
    machine (the sandbox worker) and keeps the fastest measured; every timing is stored in
    `measurements` with its plan, module and host, and may start a calibration fit in the
    background (service.tiling.learning). A measured decision answers later predicted requests;
    a predicted one does not answer a measuring request (it is refined by measuring)
      miss:   warm-start plans from group records -> search + realise (sandbox) -> store

Plain library code: the API, the CLI and workers call `TilingService.decide`.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from pebble.common.types import RemoteTraceback
from sqlalchemy.orm import Session, sessionmaker

from service.config import Settings
from service.hardware.cost import COST_MODEL_VERSION
from service.hardware.model import HardwareModel
from service.hardware.profiles import HOST_CPU, UnknownHardwareError
from service.ir.errors import IRError
from service.ir.lexical import check_text, normalised_key
from service.ir.mlir import provider_version
from service.ir.plan import Plan
from service.ir.sandbox import Sandbox, result_of
from service.search.errors import SearchInputError
from service.search.space import SPACE_VERSION
from service.store import catalog, decisions, searches
from service.store.db import session_scope
from service.store.models import Decision, DecisionStatus

from .capacity import ByteBoundedCache, LeaseHeartbeat, WorkQueue
from .contract import ModuleAnalysis, Realisation, SearchObserver, SearchOutcome, SearchStopped, SearchTask, WarmStart
from .errors import PoolSaturated, TilingFailed
from .hardware import HardwareCatalog
from .learning import Learner, save_measurements
from .request import TilingRequest
from .worker import analyse_request, check_search_shapes, realise_plan, search_and_realise

log = logging.getLogger("tilesearch.tiling")

CacheState = Literal["hit", "warm", "miss", "refined"]
T = TypeVar("T")

__all__ = ["CacheState", "StoredSearch", "TilingOutcome", "TilingRequest", "TilingService", "decision_parts", "store_outcome"]


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
    # The decision's texts in the requester's own IR when its stored ones came from another
    # text of the same structure (None: the stored texts are the requester's).
    realisation: Realisation | None = None


# What a request can get wrong (and a search stopped on purpose); any other exception out of a
# worker is a bug of ours.
_CALLER_ERRORS = (IRError, SearchInputError, UnknownHardwareError, PoolSaturated, SearchStopped)


def _shape_bucket(request: TilingRequest) -> str:
    return json.dumps({"hints": request.shape_hints or {}, "buckets": request.buckets or {}}, sort_keys=True)


def decision_parts(fingerprint: str, hardware: HardwareModel, request: TilingRequest) -> decisions.DecisionKeyParts:
    """The key parts of the decision that answers `request` for a module of this fingerprint."""
    return decisions.DecisionKeyParts(
        module_fingerprint=fingerprint,
        hardware_hash=hardware.content_hash(),
        search_space_version=SPACE_VERSION,
        cost_model_version=COST_MODEL_VERSION,
        objective=request.objective,
        shape_bucket=_shape_bucket(request),
        provider_version=provider_version(),
    )


def _decision_bytes(row: Decision) -> int:
    """About what a cached decision holds: its texts and JSON columns."""
    texts = sum(len(t or "") for t in (row.tiled_module, row.transform_script, row.tuning_spec))
    blobs = (row.plan, row.predicted_cost, row.baseline, row.compilation_info, row.origin_map, row.search_stats,
             row.timings, row.effort)
    return 512 + texts + sum(len(json.dumps(b)) for b in blobs if b is not None)


def _latency(cost: dict[str, Any] | None) -> float:
    value = (cost or {}).get("latency_s")
    return float(value) if value is not None else float("inf")


def _chosen_by_measurement(search_stats: dict[str, Any] | None) -> bool:
    return (search_stats or {}).get("chosen_by") == "measured"


def _replaces(outcome: SearchOutcome, stored: Decision) -> bool:
    """Whether a refinement's outcome replaces the stored plan: a measured choice always (it
    was asked for, and it measured the stored plan's rivals on this machine); never an
    unmeasured one over a measured one (measurement beats prediction); otherwise a lower
    predicted latency, or a measuring attempt that could time nothing (its search_stats say why)."""
    if outcome.stats.chosen_by == "measured":
        return True
    if _chosen_by_measurement(stored.search_stats):
        return False
    return outcome.stats.measured is not None or _latency(outcome.predicted) < _latency(stored.predicted_cost)


def _with_refinement(stored: Decision, outcome: SearchOutcome) -> dict:
    """The stored decision's search_stats, with a refinement that found nothing better listed
    (its figures were the first search's alone, beside every trial stored since)."""
    stats = dict(stored.search_stats or {})
    stats["refinements"] = [*stats.get("refinements", []), {
        "strategy": outcome.stats.strategy, "budget": outcome.stats.budget, "seed": outcome.stats.seed,
        "evaluations": outcome.stats.evaluations, "complete": outcome.stats.complete, "replaced": False}]
    if stats.get("no_tuning_spec") and (stats.get("iree_default") or {}).get("kept"):
        # The guard's reason counted the first search's plans only; any other reason (a
        # convolution, dynamic dims) does not depend on how many were searched.
        stats["no_tuning_spec"] += f"; then {outcome.stats.evaluations} more ({outcome.stats.strategy}): nothing better"
    return stats


@dataclass(frozen=True)
class StoredSearch:
    """What a finished search is stored against: its module, the claim on its decision and the
    effort it was asked for."""

    module: str
    analysis: ModuleAnalysis
    hardware: HardwareModel
    claimed: Decision
    owner: str
    effort: decisions.Effort
    source: str = "tiling"  # who took its measurements (stored with them)
    shape_hints: dict | None = None


def store_outcome(sessions: sessionmaker[Session], stored: StoredSearch, outcome: SearchOutcome, *,
                  cache: CacheState, warm: list[WarmStart], timings: dict[str, float], text_key: str) -> Decision:
    """Complete the claimed decision with the search's outcome (a refinement: only if it is
    better than the stored plan), record the effort, store trials, measurements and group records."""
    claimed, hardware, analysis = stored.claimed, stored.hardware, stored.analysis
    realised = outcome.realised
    stats = outcome.stats.model_dump() | {"cache": cache, "warm_start_groups": [w.signature for w in warm],
                                          "no_tuning_spec": outcome.no_tuning_spec}
    refining = claimed.status == DecisionStatus.DONE
    better = not refining or _replaces(outcome, claimed)
    new_effort = decisions.merged_effort(claimed.effort if refining else None, stored.effort, outcome.stats.complete)
    result = decisions.DecisionResult(
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
        realised_for=text_key,
    ) if better else None
    with session_scope(sessions) as session:
        catalog.upsert_module(session, analysis.fingerprint, stored.module,
                              {"ops": [op.model_dump() for op in analysis.ops]})
        catalog.upsert_hardware(session, hardware.content_hash(), hardware.name, hardware.model_dump(mode="json"))
        decision = decisions.complete_decision(session, claimed.id, stored.owner, result, effort=new_effort,
                                               search_stats=None if better else _with_refinement(claimed, outcome))
        if decision is None:  # lease lost to another owner: serve theirs
            decision = decisions.get_decision(session, claimed.id)
        searches.save_trials(session, claimed.id, [
            searches.TrialRecord(**t.model_dump()) for t in outcome.trials])
        save_measurements(session, outcome.measurements, hardware_hash=hardware.content_hash(),
                          module_fingerprint=analysis.fingerprint, source=stored.source, decision_id=claimed.id,
                          shape_hints=stored.shape_hints)
        for best in outcome.group_bests:
            searches.record_group_best(session, signature=best.signature, hardware_hash=hardware.content_hash(),
                                       plan=best.plan.model_dump(mode="json"), latency_s=best.latency_s,
                                       decision_id=claimed.id)
    if decision is None:
        raise TilingFailed("DecisionVanished", f"decision {claimed.id} is gone from the store")
    return decision


class TilingService:
    """Decisions for requests, shared across threads of one process (the sandbox is its pool)."""

    def __init__(self, sessions: sessionmaker[Session], sandbox: Sandbox, settings: Settings) -> None:
        self.sessions = sessions
        self.sandbox = sandbox
        self.settings = settings
        self.hardware = HardwareCatalog(sessions)
        # Fits a calibrated profile in the background once enough measurements are stored.
        self.learner = Learner(sessions, self.hardware, settings, run_task=self._run)
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        # MLIR tasks queue for the workers (bounded, with a wait); see WorkQueue.
        self.queue = WorkQueue(sandbox.workers, settings.queue_depth, settings.queue_wait_s)
        # Analyses by normalised text (service.ir.lexical): a repeated module, also one that
        # differs only in comments or SSA names, needs no worker; concurrent identical requests
        # share one analysis. Values are the worker's answer: nothing MLIR lives in this process.
        self._analyses: ByteBoundedCache[tuple[str, int], ModuleAnalysis] = ByteBoundedCache(
            settings.analysis_cache_bytes, lambda a: len(a.model_dump_json()))
        self._analysing: dict[tuple[str, int], threading.Event] = {}
        self._analyses_lock = threading.Lock()
        # Shape checks that passed, by (normalised text, hints, buckets).
        self._shapes_ok: ByteBoundedCache[tuple[str, str], bool] = ByteBoundedCache(1024 * 1024, lambda _: 200)
        # Done decisions by key, with the effort they were served for: a refinement in this
        # process replaces its entry; one in another process is seen at the next claim that
        # asks for more than the cached entry covers.
        self._done: ByteBoundedCache[str, Decision] = ByteBoundedCache(settings.decision_cache_bytes, _decision_bytes)
        # A decision's texts re-applied to another text of the same structure.
        self._realised: ByteBoundedCache[tuple[str, str, str], Realisation] = ByteBoundedCache(
            max(1, settings.decision_cache_bytes // 4), lambda r: len(r.model_dump_json()))

    def close(self) -> None:
        """Stop background learning (the sandbox is the caller's to close)."""
        self.learner.close()

    def decide(self, request: TilingRequest, long: LongSearch | None = None) -> TilingOutcome:
        """The decision for `request`: stored (hit), refined, or searched now (warm / miss).

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
        check_text(request.module)  # before any worker: a lone surrogate, NUL, deep nesting
        text_key = normalised_key(request.module)
        hardware = self.hardware.resolve(request.hardware)
        if request.measure_top:
            self.check_measurable_here(hardware)
        limit = self.settings.request_timeout_s
        analysis = self._analyse(request.module, text_key, timeout=limit)
        if request.shape_hints or request.buckets:
            self._check_shapes(request, text_key, timeout=limit)
        if request.measure_top and not request.shape_hints and any(None in op.loop_ranges for op in analysis.ops):
            raise SearchInputError("measure_top times the module at one shape, and it has dynamic dims: give their sizes "
                                   "in shape_hints (e.g. {\"arg0\": [128, 1024]}) or drop measure_top")
        timings["analyse_s"] = time.perf_counter() - t0
        parts = decision_parts(analysis.fingerprint, hardware, request)
        if not request.reuse:
            # A fresh search is asked for: key it apart so it never serves nor replaces the cache.
            parts = decisions.DecisionKeyParts(**{**parts.as_dict(), "objective": f"{request.objective}+fresh:{uuid.uuid4().hex}"})
        key = decisions.decision_key(parts)
        search_limit = long.limit_s if long else limit
        # A measuring search leaves half the limit to IREE's compiles and timed runs after it.
        cap = search_limit * (0.4 if request.measure_top else 0.8)
        seconds = min(request.seconds or cap, cap)
        effort = decisions.Effort(request.strategy, request.budget, seconds, request.measure_top)
        done = self._done.get(key)
        if done is not None and decisions.effort_covers(done.effort, effort):
            return self._hit(done, request, text_key, hardware, timings, t0)
        owner = long.owner if long else self.owner
        lease_s = long.lease_s if long else self.settings.lease_s
        claim = decisions.claim_or_wait(self.sessions, parts, owner, lease_s=lease_s,
                                        timeout_s=max(search_limit, limit) + self.settings.queue_wait_s, effort=effort)
        if claim.outcome is decisions.ClaimOutcome.HIT:
            if request.reuse:
                self._done.put(key, claim.decision)
            return self._hit(claim.decision, request, text_key, hardware, timings, t0)
        if not claim.owned:
            raise PoolSaturated(retry_after_s=self.queue.retry_after_s())

        refining = claim.outcome is decisions.ClaimOutcome.REFINE
        stored = claim.decision
        with LeaseHeartbeat(self.sessions, stored.id, owner, lease_s):
            try:
                warm = self._warm_starts(analysis, hardware) if request.reuse else []
                # Trials follow those the decision keeps: a refinement's, or those of a job item
                # whose worker died (it resumes from their best plan with what is left of the budget).
                with session_scope(self.sessions) as session:
                    kept = searches.kept_trials(session, stored.id) if refining or long else None
                resuming = kept is not None and not refining and kept.count > 0
                task = SearchTask(
                    hardware=hardware,
                    budget=max(1, request.budget - kept.count) if resuming else request.budget,
                    seconds=seconds,
                    strategy=request.strategy,
                    seed=request.seed,
                    shape_hints=request.shape_hints,
                    buckets=request.buckets,
                    warm_starts=warm,
                    warm_plans=[Plan.model_validate(stored.plan)] if refining and stored.plan else [],
                    trial_offset=kept.next_number if kept else 0,
                    resume_plan=Plan.model_validate(kept.best_plan) if resuming and kept.best_plan else None,
                    measure_top=request.measure_top,
                )
                t1 = time.perf_counter()
                observer = long.observer(stored.id) if long else None
                outcome = self._run(search_and_realise, request.module, task, observer, timeout=search_limit)
                timings["search_s"] = time.perf_counter() - t1
            except BaseException as exc:
                with session_scope(self.sessions) as session:
                    decisions.fail_decision(session, stored.id, owner, f"{type(exc).__name__}: {exc}")
                raise
            cache: CacheState = "refined" if refining else "warm" if warm else "miss"
            timings["total_s"] = time.perf_counter() - t0
            decision = self._store(request, analysis, hardware, stored, outcome, cache, warm, timings, key,
                                   text_key, effort, owner, source="job" if long else "tiling")
        if outcome.measurements:
            self.learner.after_measuring()
        return self._answer(decision, cache, request, text_key, hardware, timings)

    def _hit(self, decision: Decision, request: TilingRequest, text_key: str, hardware: HardwareModel,
             timings: dict[str, float], t0: float) -> TilingOutcome:
        outcome = self._answer(decision, "hit", request, text_key, hardware, timings)
        timings["total_s"] = time.perf_counter() - t0
        return outcome

    def _answer(self, decision: Decision, cache: CacheState, request: TilingRequest, text_key: str,
                hardware: HardwareModel, timings: dict[str, float]) -> TilingOutcome:
        """The decision in the requester's IR: its stored texts when they came from this very
        text (up to comments and SSA names), else its plan re-applied to the requester's text."""
        if decision.status != DecisionStatus.DONE or decision.plan is None or decision.realised_for == text_key:
            return TilingOutcome(decision, cache, timings)
        plan = Plan.model_validate(decision.plan)
        realised_key = (decision.key, json.dumps(decision.plan, sort_keys=True), text_key)
        realisation = self._realised.get(realised_key)
        if realisation is None:
            t1 = time.perf_counter()
            realisation = self._run(realise_plan, request.module, plan, hardware, timeout=self.settings.request_timeout_s)
            if decision.tuning_spec is None and realisation.tuning_spec is not None:
                # The decision's spec was not proved (IREE did not apply it): no text of its module gets one.
                realisation = realisation.model_copy(update={
                    "tuning_spec": None, "no_tuning_spec": (decision.search_stats or {}).get("no_tuning_spec")})
            timings["realise_s"] = time.perf_counter() - t1
            self._realised.put(realised_key, realisation)
        return TilingOutcome(decision, cache, timings, realisation)

    def _store(self, request: TilingRequest, analysis: ModuleAnalysis, hardware: HardwareModel, claimed: Decision,
               outcome: SearchOutcome, cache: CacheState, warm: list[WarmStart], timings: dict[str, float],
               key: str, text_key: str, effort: decisions.Effort, owner: str, source: str) -> Decision:
        decision = store_outcome(self.sessions, StoredSearch(request.module, analysis, hardware, claimed, owner, effort,
                                                             source, request.shape_hints),
                                 outcome, cache=cache, warm=warm, timings=timings, text_key=text_key)
        if decision.status == DecisionStatus.DONE and request.reuse:
            self._done.put(key, decision)
        return decision

    def check_measurable_here(self, hardware: HardwareModel) -> None:
        """A measurement times IREE on this machine: it means something only for this host's
        hardware profile (host-cpu), so another hardware with measure_top is refused."""
        host = self.hardware.resolve(HOST_CPU)
        if hardware.name == HOST_CPU and hardware.content_hash() != host.content_hash():
            raise SearchInputError("measure_top times plans with IREE on this server's CPU; the inline model named "
                                   "host-cpu is not that CPU as detected (its figures differ): send the name "
                                   "\"host-cpu\" instead of a model, or drop measure_top")
        if hardware.content_hash() != host.content_hash():
            raise SearchInputError(f"measure_top times plans with IREE on this server's CPU, which is host-cpu; "
                                   f"hardware {hardware.name!r} is another machine: drop measure_top or ask for host-cpu")

    def _run(self, fn: Callable[..., T], *args: object, timeout: float) -> T:
        """fn(*args) in a sandbox worker, after waiting in the bounded queue (PoolSaturated when
        the queue is full or the wait too long)."""
        with self.queue.slot():
            return result_of(self.sandbox.submit(fn, *args, timeout=timeout), timeout)

    def _check_shapes(self, request: TilingRequest, text_key: str, *, timeout: float) -> None:
        key = (text_key, json.dumps([request.shape_hints, request.buckets], sort_keys=True))
        if self._shapes_ok.get(key):
            return
        self._run(check_search_shapes, request.module, request.shape_hints, request.buckets, timeout=timeout)
        self._shapes_ok.put(key, True)

    def _analyse(self, module: str, text_key: str, *, timeout: float) -> ModuleAnalysis:
        """`analyse_request` in the sandbox, once per normalised text at a time (errors are not kept)."""
        key = (text_key, self.settings.max_ops)
        while True:
            with self._analyses_lock:
                cached = self._analyses.get(key)
                if cached is not None:
                    return cached
                running = self._analysing.get(key)
                if running is None:
                    running = self._analysing[key] = threading.Event()
                    break
            running.wait(timeout)  # then look again: done, or failed and ours to retry
        try:
            analysis = self._run(analyse_request, module, self.settings.max_ops, timeout=timeout)
            self._analyses.put(key, analysis)
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
