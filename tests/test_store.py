"""Store queries on SQLite and PostgreSQL: round-trips, pagination, unique keys,
single-flight claims (threads and processes), lease takeover, retry of failures, group bests."""

from __future__ import annotations

import multiprocessing
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import TypeVar

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

from service.store import catalog, decisions, measurements, searches
from service.store.db import make_engine, make_sessionmaker, session_scope
from service.store.decisions import ClaimOutcome, DecisionKeyParts, DecisionResult
from service.store.models import Decision, DecisionStatus, GroupRecord, Module, Trial
from service.store.models import HardwareModel as HardwareRow
from service.store.query import InvalidCursor
from service.store.searches import TrialRecord

T = TypeVar("T")
THREADS = 20


def parts(fingerprint: str = "fp-a", hardware_hash: str = "hw-1") -> DecisionKeyParts:
    return DecisionKeyParts(
        module_fingerprint=fingerprint,
        hardware_hash=hardware_hash,
        search_space_version="space-1",
        cost_model_version="cost-model/1",
        objective="latency",
        shape_bucket="static",
        provider_version="iree-base-compiler==3.13.0",
    )


RESULT = DecisionResult(
    plan={"groups": [{"anchor": 3, "levels": [[64, 64, 0], [8, 16, 16]]}]},
    predicted_cost={"latency_s": 1.5e-3, "breakdown": {"dram_bytes": 1024}},
    baseline={"latency_s": 3.0e-3},
    transform_script="transform.named_sequence @__transform_main ...",
    tiled_module="func.func @f() { return }",
    compilation_info={"3": "#iree_codegen.compilation_info<...>"},
    origin_map={"3": [3, 7]},
    search_stats={"strategy": "optuna", "budget": 64, "seed": 0, "evaluations": 64,
                  "evaluations_per_s": 900.5, "complete": True},
    timings={"search_s": 0.07},
)


def run_concurrently(count: int, task: Callable[[int], T]) -> list[T]:
    """Run ``task(i)`` on ``count`` threads released together by a barrier."""
    barrier = threading.Barrier(count)

    def start(index: int) -> T:
        barrier.wait(timeout=30)
        return task(index)

    with ThreadPoolExecutor(max_workers=count) as pool:
        return list(pool.map(start, range(count)))


def count_rows(sessions: sessionmaker[Session], model: type) -> int:
    with sessions() as session:
        return session.scalar(select(func.count()).select_from(model)) or 0


# ---------------------------------------------------------------------------------------------


def test_decision_key_is_canonical_and_covers_every_part() -> None:
    base = parts()
    assert decisions.decision_key(base) == decisions.decision_key(parts())
    assert len(decisions.decision_key(base)) == 64
    keys = {decisions.decision_key(base)}
    for name, value in base.as_dict().items():
        changed = DecisionKeyParts(**(base.as_dict() | {name: value + "'"}))
        keys.add(decisions.decision_key(changed))
    assert len(keys) == 1 + len(base.as_dict())


def test_module_and_hardware_round_trip(sessions: sessionmaker[Session]) -> None:
    with session_scope(sessions) as session:
        first = catalog.upsert_module(session, "fp-a", "module {}", {"ops": {"linalg.matmul": 2}})
        again = catalog.upsert_module(session, "fp-a", "module { // other text }", {})
        assert again.id == first.id
        # hw-1 recorded for a decision first, then stored by a user: custom from then on
        catalog.upsert_hardware(session, "hw-1", "cpu", {"cores": 2, "levels": [{"name": "L1"}]})
        catalog.upsert_hardware(session, "hw-1", "cpu", {"cores": 2}, custom=True)
        catalog.upsert_hardware(session, "hw-2", "cpu", {"cores": 4}, custom=True)
        catalog.upsert_hardware(session, "hw-3", "gpu", {"sms": 132}, custom=True)
        # a model a decision used, recorded under a name: it names its hash, it shadows nothing
        catalog.upsert_hardware(session, "hw-4", "cpu", {"cores": 8})
        catalog.upsert_hardware(session, "hw-5", "npu", {"cores": 1})
    with session_scope(sessions) as session:
        module = session.scalars(select(Module).where(Module.fingerprint == "fp-a")).one_or_none()
        assert module is not None
        assert module.text == "module {}" and module.op_summary == {"ops": {"linalg.matmul": 2}}
        assert module.created_at.tzinfo is not None
        assert session.scalars(select(Module).where(Module.fingerprint == "nope")).one_or_none() is None
        hardware = session.scalars(select(HardwareRow).where(HardwareRow.hash == "hw-1")).one_or_none()
        assert hardware is not None and hardware.spec["levels"] == [{"name": "L1"}] and hardware.custom
        assert catalog.get_hardware(session, "hw-4") is not None and catalog.get_hardware_by_name(session, "npu") is None
        newest = catalog.get_hardware_by_name(session, "cpu")
        assert newest is not None and newest.hash == "hw-2"
        assert [h.hash for h in catalog.list_hardware(session)] == ["hw-2", "hw-3"]
    assert count_rows(sessions, Module) == 1


def test_claim_complete_hit_round_trip(sessions: sessionmaker[Session]) -> None:
    with sessions() as session:
        claim = decisions.claim_decision(session, parts(), owner="a", lease_s=30)
        assert claim.outcome is ClaimOutcome.OWNED and claim.owned
        pending = claim.decision
        assert pending.status == DecisionStatus.PENDING and pending.lease_owner == "a"
        assert pending.key == decisions.decision_key(parts())
        done = decisions.complete_decision(session, pending.id, "a", RESULT)
        assert done is not None and done.status == DecisionStatus.DONE
    with sessions() as session:
        stored = decisions.get_decision(session, pending.id)
        assert stored is not None
        for field in ("plan", "predicted_cost", "baseline", "transform_script", "tiled_module",
                      "compilation_info", "origin_map", "search_stats", "timings"):
            assert getattr(stored, field) == getattr(RESULT, field), field
        assert stored.lease_owner is None and stored.lease_expires_at is None
        assert stored.status is DecisionStatus.DONE
        assert session.scalar(text("SELECT status FROM decisions")) == "done"  # the CHECK's value
        assert stored.module_fingerprint == "fp-a" and stored.provider_version.startswith("iree")
        assert stored.created_at.tzinfo is not None and stored.updated_at >= stored.created_at
        assert decisions.get_decision_by_key(session, stored.key) is not None
        assert decisions.get_decision(session, 10**9) is None

        hit = decisions.claim_decision(session, parts(), owner="b", lease_s=30)
        assert hit.outcome is ClaimOutcome.HIT and hit.decision.id == pending.id
    assert count_rows(sessions, Decision) == 1


def test_list_decisions_keyset_pagination(sessions: sessionmaker[Session]) -> None:
    with sessions() as session:
        ids = [
            decisions.claim_decision(session, parts(f"fp-{i % 2}", f"hw-{i // 2}"), "o", 30).decision.id
            for i in range(7)
        ]
    with sessions() as session:
        seen: list[int] = []
        cursor = None
        pages = 0
        while True:
            rows, cursor = decisions.list_decisions(session, limit=3, cursor=cursor)
            seen += [row.id for row in rows]
            pages += 1
            if cursor is None:
                break
        assert pages == 3 and seen == sorted(ids, reverse=True)

        rows, cursor = decisions.list_decisions(session, fingerprint="fp-0", limit=10)
        assert cursor is None and [r.id for r in rows] == [ids[6], ids[4], ids[2], ids[0]]
        rows, _ = decisions.list_decisions(session, hardware_hash="hw-1")
        assert [r.id for r in rows] == [ids[3], ids[2]]
        rows, _ = decisions.list_decisions(session, fingerprint="fp-", limit=10)  # a prefix, as inspect prints it
        assert [r.id for r in rows] == sorted(ids, reverse=True)
        rows, _ = decisions.list_decisions(session, fingerprint="fp_", limit=10)  # LIKE's wildcard is a character
        assert rows == []
        rows, _ = decisions.list_decisions(session, fingerprint="fp-0", hardware_hash="hw-1")
        assert [r.id for r in rows] == [ids[2]]
        rows, _ = decisions.list_decisions(session, status=DecisionStatus.DONE)
        assert rows == []
        rows, cursor = decisions.list_decisions(session, limit=7)
        assert len(rows) == 7 and cursor is None

        with pytest.raises(InvalidCursor):
            decisions.list_decisions(session, cursor="not-a-cursor")
        with pytest.raises(ValueError):
            decisions.list_decisions(session, limit=0)


def test_trials_save_replace_and_paginate(sessions: sessionmaker[Session]) -> None:
    with sessions() as session:
        decision_id = decisions.claim_decision(session, parts(), "o", 30).decision.id
    trials = [
        TrialRecord(number=n, plan={"tile": [n, 8]}, plan_hash=f"p{n}", feasible=n != 2,
                    cost={"latency_s": 0.1 * (n + 1)}, latency_s=0.1 * (n + 1),
                    reason="does not fit L1" if n == 2 else None)
        for n in range(5)
    ]
    with session_scope(sessions) as session:
        assert searches.save_trials(session, decision_id, trials) == 5
        assert searches.save_trials(session, decision_id, []) == 0
    with session_scope(sessions) as session:  # a re-run replaces trial 1
        searches.save_trials(session, decision_id, [TrialRecord(1, {"tile": [9]}, "p9", True)])
    with sessions() as session:
        page1, cursor = searches.list_trials(session, decision_id, limit=2)
        page2, cursor2 = searches.list_trials(session, decision_id, limit=2, cursor=cursor)
        page3, cursor3 = searches.list_trials(session, decision_id, limit=2, cursor=cursor2)
        assert cursor3 is None
        numbers = [t.number for t in page1 + page2 + page3]
        assert numbers == [0, 1, 2, 3, 4]
        by_number = {t.number: t for t in page1 + page2 + page3}
        assert by_number[1].plan == {"tile": [9]} and by_number[1].latency_s is None
        assert not by_number[2].feasible and by_number[2].reason == "does not fit L1"
        assert by_number[4].cost == {"latency_s": pytest.approx(0.5)}
    assert count_rows(sessions, Trial) == 5


def test_unique_keys_are_enforced(sessions: sessionmaker[Session]) -> None:
    with sessions() as session:
        decision_id = decisions.claim_decision(session, parts(), "o", 30).decision.id
    cases: dict[str, Callable[[], list[object]]] = {
        "decision key (one stored above)": lambda: [
            Decision(key=decisions.decision_key(parts()), **parts().as_dict())
        ],
        "module fingerprint": lambda: [
            Module(fingerprint="fp", text="", op_summary={}) for _ in range(2)
        ],
        "group signature + hardware": lambda: [
            GroupRecord(signature="g", hardware_hash="hw", plan={}, latency_s=1.0)
            for _ in range(2)
        ],
        "trial number within a decision": lambda: [
            Trial(decision_id=decision_id, number=0, plan={}, plan_hash="p", feasible=True)
            for _ in range(2)
        ],
    }
    for case, rows in cases.items():
        with sessions() as session:
            session.add_all(rows())
            with pytest.raises(IntegrityError):
                session.commit()
                pytest.fail(f"duplicate {case} accepted")


def test_claim_single_flight_threads(sessions: sessionmaker[Session]) -> None:
    def claim(index: int) -> decisions.Claim:
        with sessions() as session:
            return decisions.claim_decision(session, parts(), owner=f"worker-{index}", lease_s=60)

    claims = run_concurrently(THREADS, claim)
    outcomes = Counter(c.outcome for c in claims)
    assert outcomes == {ClaimOutcome.OWNED: 1, ClaimOutcome.BUSY: THREADS - 1}
    assert len({c.decision.id for c in claims}) == 1
    assert count_rows(sessions, Decision) == 1


def test_single_flight_end_to_end_one_search(sessions: sessionmaker[Session]) -> None:
    """Every caller gets the same done decision; exactly one of them ran the search."""
    searches: list[int] = []

    def resolve(index: int) -> tuple[int, str]:
        owner = f"worker-{index}"
        with sessions() as session:
            while True:
                claim = decisions.claim_decision(session, parts(), owner=owner, lease_s=60)
                if claim.outcome is ClaimOutcome.HIT:
                    return claim.decision.id, claim.decision.status
                if claim.owned:
                    searches.append(index)
                    time.sleep(0.2)  # the search
                    done = decisions.complete_decision(session, claim.decision.id, owner, RESULT)
                    assert done is not None
                    return done.id, done.status
                row = decisions.wait_for_decision(sessions, claim.decision.key, timeout_s=20)
                if row is not None and row.status == DecisionStatus.DONE:
                    return row.id, row.status

    answers = run_concurrently(THREADS, resolve)
    assert len(searches) == 1
    assert len(set(answers)) == 1 and answers[0][1] == DecisionStatus.DONE
    assert count_rows(sessions, Decision) == 1


def test_claim_or_wait_serves_everyone_the_same_decision(sessions: sessionmaker[Session]) -> None:
    searches: list[int] = []

    def resolve(index: int) -> int:
        owner = f"worker-{index}"
        claim = decisions.claim_or_wait(sessions, parts(), owner, lease_s=60, timeout_s=20)
        if claim.owned:
            searches.append(index)
            time.sleep(0.2)
            with sessions() as session:
                done = decisions.complete_decision(session, claim.decision.id, owner, RESULT)
            assert done is not None
            return done.id
        assert claim.outcome is ClaimOutcome.HIT
        return claim.decision.id

    assert len(set(run_concurrently(THREADS, resolve))) == 1
    assert len(searches) == 1

    # Nobody finishes: a waiter gives up after its timeout and says BUSY.
    with sessions() as session:
        decisions.claim_decision(session, parts("fp-slow"), owner="slow", lease_s=60)
    started = time.monotonic()
    claim = decisions.claim_or_wait(sessions, parts("fp-slow"), "impatient", lease_s=60, timeout_s=0.2)
    assert claim.outcome is ClaimOutcome.BUSY and time.monotonic() - started < 5


def _claim_in_process(url: str, owner: str, start_at: float, out: multiprocessing.Queue) -> None:
    engine = make_engine(url, poolclass=NullPool)
    try:
        time.sleep(max(0.0, start_at - time.time()))
        with make_sessionmaker(engine)() as session:
            claim = decisions.claim_decision(session, parts(), owner=owner, lease_s=60)
            out.put((claim.outcome.value, claim.decision.id))
    finally:
        engine.dispose()


def test_claim_single_flight_processes(migrated_url: str, sessions: sessionmaker[Session]) -> None:
    context = multiprocessing.get_context("fork")
    out: multiprocessing.Queue = context.Queue()
    start_at = time.time() + 0.5
    processes = [
        context.Process(target=_claim_in_process, args=(migrated_url, f"proc-{i}", start_at, out))
        for i in range(4)
    ]
    for process in processes:
        process.start()
    results = [out.get(timeout=30) for _ in processes]
    for process in processes:
        process.join(timeout=30)
        assert process.exitcode == 0
    assert Counter(outcome for outcome, _ in results) == {"owned": 1, "busy": 3}
    assert len({decision_id for _, decision_id in results}) == 1
    assert count_rows(sessions, Decision) == 1


def test_expired_lease_is_taken_over_once(sessions: sessionmaker[Session]) -> None:
    t0 = datetime(2030, 1, 1, tzinfo=UTC)
    with sessions() as session:
        first = decisions.claim_decision(session, parts(), owner="dead", lease_s=30, now=t0)
        assert first.outcome is ClaimOutcome.OWNED
        early = decisions.claim_decision(session, parts(), "x", 30, now=t0 + timedelta(seconds=10))
        assert early.outcome is ClaimOutcome.BUSY and early.decision.lease_owner == "dead"

    later = t0 + timedelta(seconds=31)

    def claim(index: int) -> decisions.Claim:
        with sessions() as session:
            return decisions.claim_decision(session, parts(), owner=f"w{index}", lease_s=30, now=later)

    claims = run_concurrently(THREADS, claim)
    outcomes = Counter(c.outcome for c in claims)
    assert outcomes == {ClaimOutcome.TAKEN_OVER: 1, ClaimOutcome.BUSY: THREADS - 1}
    (winner,) = [c for c in claims if c.outcome is ClaimOutcome.TAKEN_OVER]
    assert winner.decision.id == first.decision.id
    assert winner.decision.lease_expires_at == later + timedelta(seconds=30)

    with sessions() as session:
        new_owner = winner.decision.lease_owner
        assert new_owner is not None
        # The old owner lost its lease: it can neither complete nor fail.
        assert decisions.complete_decision(session, first.decision.id, "dead", RESULT) is None
        assert decisions.fail_decision(session, first.decision.id, "dead", "boom") is None
        done = decisions.complete_decision(session, first.decision.id, new_owner, RESULT)
        assert done is not None and done.status == DecisionStatus.DONE
    assert count_rows(sessions, Decision) == 1


def test_failed_decision_is_retried_not_served(sessions: sessionmaker[Session]) -> None:
    with sessions() as session:
        claim = decisions.claim_decision(session, parts(), owner="a", lease_s=30)
        failed = decisions.fail_decision(session, claim.decision.id, "a", "search crashed",
                                    timings={"search_s": 1.0})
        assert failed is not None and failed.status == DecisionStatus.FAILED
        assert failed.error == "search crashed" and failed.lease_owner is None

        retry = decisions.claim_decision(session, parts(), owner="b", lease_s=30)
        assert retry.outcome is ClaimOutcome.TAKEN_OVER
        assert retry.decision.id == claim.decision.id
        assert retry.decision.status == DecisionStatus.PENDING and retry.decision.error is None
        assert decisions.claim_decision(session, parts(), "c", 30).outcome is ClaimOutcome.BUSY
        assert decisions.complete_decision(session, claim.decision.id, "b", RESULT) is not None
        assert decisions.claim_decision(session, parts(), "c", 30).outcome is ClaimOutcome.HIT


def test_wait_for_decision(sessions: sessionmaker[Session]) -> None:
    assert decisions.wait_for_decision(sessions, "no-such-key", timeout_s=0.1) is None
    with sessions() as session:
        claim = decisions.claim_decision(session, parts(), owner="a", lease_s=60)
    key = claim.decision.key

    started = time.monotonic()
    row = decisions.wait_for_decision(sessions, key, timeout_s=0.2)
    assert row is not None and row.status == DecisionStatus.PENDING  # timed out
    assert 0.15 < time.monotonic() - started < 5

    def finish_soon() -> None:
        time.sleep(0.2)
        with sessions() as session:
            decisions.complete_decision(session, claim.decision.id, "a", RESULT)

    finisher = threading.Thread(target=finish_soon)
    finisher.start()
    row = decisions.wait_for_decision(sessions, key, timeout_s=10)
    finisher.join()
    assert row is not None and row.status == DecisionStatus.DONE

    # An owner that died: the waiter returns once the lease has expired, to take over.
    with sessions() as session:
        dying = decisions.claim_decision(session, parts("fp-b"), owner="dying", lease_s=0.3)
    started = time.monotonic()
    row = decisions.wait_for_decision(sessions, dying.decision.key, timeout_s=10)
    assert row is not None and row.status == DecisionStatus.PENDING
    assert time.monotonic() - started < 5
    with sessions() as session:
        assert decisions.claim_decision(session, parts("fp-b"), "heir", 30).outcome is ClaimOutcome.TAKEN_OVER


def test_group_best_keeps_the_better_plan(sessions: sessionmaker[Session]) -> None:
    with session_scope(sessions) as session:
        decision_id = decisions.claim_decision(session, parts(), "o", 30).decision.id
    with session_scope(sessions) as session:
        assert searches.record_group_best(session, signature="g1", hardware_hash="hw", plan={"t": 2},
                                      latency_s=2.0)
        assert not searches.record_group_best(session, signature="g1", hardware_hash="hw",
                                          plan={"t": 3}, latency_s=3.0)
        assert searches.record_group_best(session, signature="g1", hardware_hash="hw", plan={"t": 1},
                                      latency_s=1.0, decision_id=decision_id)
        assert searches.record_group_best(session, signature="g1", hardware_hash="other",
                                      plan={"t": 9}, latency_s=9.0)
        with pytest.raises(ValueError):
            searches.record_group_best(session, signature="g2", hardware_hash="hw", plan={},
                                   latency_s=float("nan"))
    with sessions() as session:
        best = searches.best_group_plans(session, ["g1", "g2", "g1"], "hw")
        assert set(best) == {"g1"}
        assert best["g1"].plan == {"t": 1} and best["g1"].latency_s == 1.0
        assert best["g1"].decision_id == decision_id
        assert searches.best_group_plans(session, [], "hw") == {}
        assert searches.best_group_plans(session, ["g1"], "other")["g1"].latency_s == 9.0


def test_group_best_under_concurrent_writers(sessions: sessionmaker[Session]) -> None:
    latencies = random.Random(7).sample([1.0 + i for i in range(THREADS)], THREADS)

    def record(index: int) -> bool:
        with session_scope(sessions) as session:
            return searches.record_group_best(session, signature="g", hardware_hash="hw",
                                          plan={"i": index}, latency_s=latencies[index])

    run_concurrently(THREADS, record)
    with sessions() as session:
        best = searches.best_group_plans(session, ["g"], "hw")["g"]
    assert best.latency_s == min(latencies)
    assert best.plan == {"i": latencies.index(min(latencies))}
    assert count_rows(sessions, GroupRecord) == 1


def test_measurements_round_trip(sessions: sessionmaker[Session]) -> None:
    with session_scope(sessions) as session:
        decision_id = decisions.claim_decision(session, parts(), "o", 30).decision.id
    with session_scope(sessions) as session:
        saved = measurements.save_measurement(
            session, plan_hash="p1", hardware_hash="hw", ok=True, median_s=9.5e-3,
            samples=[9.4e-3, 9.5e-3, 9.9e-3], config={"distribution": [256, 256, 0]},
            iree_version="3.13.0", decision_id=decision_id,
        )
        assert saved.id is not None
        measurements.save_measurement(session, plan_hash="p1", hardware_hash="hw", ok=False,
                                      error="vector tile too large")
        measurements.save_measurement(session, plan_hash="p1", hardware_hash="other", ok=True, median_s=1.0)
    with sessions() as session:
        rows = measurements.list_measurements(session, "p1", "hw")
        assert [m.ok for m in rows] == [True, False]
        assert rows[0].samples == [9.4e-3, 9.5e-3, 9.9e-3] and rows[0].median_s == 9.5e-3
        assert rows[0].config == {"distribution": [256, 256, 0]}
        assert rows[0].decision_id == decision_id and rows[0].created_at.tzinfo is not None
        assert rows[1].error == "vector tile too large" and rows[1].samples == []
        assert len(measurements.list_measurements(session, "p1")) == 3


def test_session_scope_rolls_back_on_error(sessions: sessionmaker[Session]) -> None:
    with pytest.raises(RuntimeError):
        with session_scope(sessions) as session:
            catalog.upsert_module(session, "fp-x", "module {}")
            raise RuntimeError("request failed")
    assert count_rows(sessions, Module) == 0
