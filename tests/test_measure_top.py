"""measure_top in the service: the K best predicted plans and IREE's default timed with IREE where
the search runs (a sandbox worker), the fastest measured kept, every timing in `measurements`,
and measurement part of a decision's effort (a measured decision answers predicted requests,
a predicted one does not answer a measuring request).

`host-cpu` is conftest's pinned reference host (AVX-512); IREE compiles for this machine, so
these tests need an AVX-512 CPU (they skip without one).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from _shared import MATMUL_64X96X80, needs_avx512, workload

from service.api.app import create_app
from service.api.dashboard.views import measured_of
from service.config import Settings
from service.ir.plan import Plan
from service.measure.cache import host_key
from service.measure.tools import benchmark_threads
from service.store import migrate
from service.store.db import make_engine, make_sessionmaker, session_scope
from service.store.decisions import Effort, effort_covers, merged_effort
from service.store.models import Measurement

# --------------------------------------------------------------------------- effort


def test_a_measured_effort_covers_predicted_requests_but_not_the_reverse() -> None:
    predicted = merged_effort(None, Effort("tpe", 8, 10.0), complete=True)
    measured = merged_effort(None, Effort("tpe", 8, 10.0, measure_top=2), complete=True)
    assert not effort_covers(predicted, Effort("tpe", 8, 10.0, measure_top=2))
    assert effort_covers(measured, Effort("tpe", 8, 10.0))
    assert effort_covers(measured, Effort("tpe", 8, 10.0, measure_top=1))
    assert not effort_covers(measured, Effort("tpe", 8, 10.0, measure_top=3))
    # a later predicted search with more budget keeps the measurement on record
    both = merged_effort(measured, Effort("tpe", 32, 10.0), complete=True)
    assert both["tpe"]["budget"] == 32 and effort_covers(both, Effort("tpe", 32, 10.0, measure_top=2))
    assert "measure_top" not in predicted["tpe"]  # effort columns written before stay as they were


# --------------------------------------------------------------------------- service


def _client(url: str) -> TestClient:
    return TestClient(create_app(Settings(database_url=url, request_timeout_s=120, pool_workers=2)))


def _measurements(url: str, decision_id: int) -> list[Measurement]:
    engine = make_engine(url)
    try:
        with session_scope(make_sessionmaker(engine)) as session:
            rows = list(session.scalars(select(Measurement).where(Measurement.decision_id == decision_id)))
            session.expunge_all()
            return rows
    finally:
        engine.dispose()


def _assert_measured(stats: dict, k: int) -> None:
    measured = stats["measured"]
    assert measured["top"] == k and measured["default_cpu_s"] > 0
    assert len(measured["candidates"]) == k and all(c["cpu_s"] for c in measured["candidates"])
    assert measured["kept"] in ("candidate", "iree_default") and stats["chosen_by"] == "measured"


def _assert_rows(rows: list[Measurement], k: int, answer: dict, source: str) -> None:
    roles = sorted(r.config["role"] for r in rows)
    assert roles == ["candidate"] * k + ["default"]
    assert all(r.ok and r.median_s > 0 and r.samples and r.iree_version for r in rows)
    assert {r.hardware_hash for r in rows} == {answer["hardware_hash"]}
    candidates = {c["plan_hash"] for c in answer["search_stats"]["measured"]["candidates"]}
    assert {r.plan_hash for r in rows if r.config["role"] == "candidate"} == candidates
    # what it takes to predict each timing again (service.tiling.learning learns from these)
    (default,) = [r for r in rows if r.is_default]
    assert default.plan == {"groups": []} and default.config["role"] == "default"
    for r in rows:
        assert (r.host_key, r.module_fingerprint, r.source) == (host_key(), answer["module_fingerprint"], source)
        assert Plan.model_validate(r.plan).plan_hash() == r.plan_hash and r.shape_hints is None
        assert r.cpu_s == pytest.approx(r.config["cpu_median_s"] / benchmark_threads())
        assert r.default_cpu_s == default.cpu_s


@needs_avx512
@pytest.mark.slow
def test_tiling_with_measure_top_keeps_the_fastest_measured(migrated_url: str) -> None:
    with _client(migrated_url) as client:
        def tile(**extra):
            return client.post("/v1/tilings", json={"module": MATMUL_64X96X80, "hardware": "host-cpu", "budget": 8, **extra})

        predicted = tile().json()
        assert predicted["cache"] == "miss" and predicted["search_stats"]["chosen_by"] == "predicted"
        assert predicted["search_stats"]["measured"] is None
        assert _measurements(migrated_url, predicted["id"]) == []

        # a predicted decision does not answer a measuring request: it is refined by measuring
        measured = tile(measure_top=2)
        assert measured.status_code == 200, measured.text
        answer = measured.json()
        assert answer["cache"] == "refined" and answer["id"] == predicted["id"]
        _assert_measured(answer["search_stats"], 2)
        measured_block = answer["search_stats"]["measured"]
        if measured_block["kept"] == "iree_default":
            assert answer["plan"] == {"groups": []} and answer["tiled_module"] is None
        else:
            chosen = measured_block["candidates"][measured_block["chosen"]]
            assert chosen["cpu_s"] == min(c["cpu_s"] for c in measured_block["candidates"])
            assert answer["predicted_cost"]["latency_s"] == pytest.approx(chosen["predicted_latency_s"])
        _assert_rows(_measurements(migrated_url, answer["id"]), 2, answer, "tiling")

        # the measured decision answers both a predicted and an equally measuring request
        for extra in ({}, {"measure_top": 2}, {"measure_top": 1}):
            hit = tile(**extra).json()
            assert (hit["cache"], hit["id"], hit["plan"]) == ("hit", answer["id"], answer["plan"])
            assert hit["search_stats"]["chosen_by"] == "measured"
        assert len(_measurements(migrated_url, answer["id"])) == 3  # hits measure nothing

        # what cannot be measured here is a 422 that says so
        other = tile(measure_top=2, hardware="gpu-h100")
        assert other.status_code == 422 and "host-cpu" in other.text
        buckets = tile(measure_top=2, buckets={"arg0.0": [16, 64]})
        assert buckets.status_code == 422 and "shape_hints" in buckets.text
        # a dynamic module measured at no shape was a 200 that measured nothing (a new user's trial)
        unsized = client.post("/v1/tilings", json={"module": workload("dynamic_matmul"), "hardware": "host-cpu",
                                                   "budget": 8, "measure_top": 2})
        assert unsized.status_code == 422 and "shape_hints" in unsized.text and "dynamic dims" in unsized.text
        inline_host = {**client.get("/v1/hardware/host-cpu").json()["spec"], "description": "mine"}
        renamed = tile(measure_top=2, hardware=inline_host)
        assert renamed.status_code == 422 and "send the name" in renamed.text
        assert tile(measure_top=17).status_code == 422


@needs_avx512
@pytest.mark.slow
def test_embedded_job_item_with_measure_top_ends_measured(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'tilesearch.db'}"
    migrate.upgrade(url)
    with _client(url) as client:
        body = {"items": [{"name": "mm", "module": MATMUL_64X96X80}], "hardware": "host-cpu", "budget": 8,
                "measure_top": 2}
        accepted = client.post("/v1/jobs", json=body)
        assert accepted.status_code == 202, accepted.text
        job_id = accepted.json()["id"]
        deadline = time.monotonic() + 180
        while (job := client.get(f"/v1/jobs/{job_id}").json())["state"] in ("queued", "running"):
            assert time.monotonic() < deadline, job
            time.sleep(0.5)
        assert job["state"] == "succeeded", job
        (item,) = job["items_detail"]
        decision = client.get(f"/v1/tilings/{item['decision_id']}").json()
        _assert_measured(decision["search_stats"], 2)
        _assert_rows(_measurements(url, decision["id"]), 2, decision, "job")
        # the item's decision is an ordinary one: a predicted request is a hit on it
        hit = client.post("/v1/tilings", json={"module": MATMUL_64X96X80, "hardware": "host-cpu", "budget": 8}).json()
        assert (hit["cache"], hit["id"]) == ("hit", decision["id"])


def test_the_dashboard_shows_iree_default_time_when_the_service_kept_it() -> None:
    block = {"default_cpu_s": 0.002, "chosen": 0, "kept": "iree_default", "top": 2,
             "candidates": [{"plan_hash": "a", "cpu_s": 0.003}, {"plan_hash": "b", "cpu_s": 0.004}]}
    shown = measured_of({"measured": block})
    assert shown is not None and shown.latency_s == 0.002 and shown.speedup_vs_iree == 1.0
    kept_plan = measured_of({"measured": block | {"kept": "candidate", "default_cpu_s": 0.006}})
    assert kept_plan is not None and kept_plan.latency_s == 0.003 and kept_plan.speedup_vs_iree == 2.0
