"""The dashboard's jobs pages through the app (list, detail, the progress JSON, escaping, 404,
token), on SQLite and PostgreSQL. Jobs and items are written straight into the store in the
states each test needs; the embedded runner is kept from starting so nothing moves them (the
browser test watches a real job run).
"""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from sqlalchemy import update

from service.jobs.embedded import EmbeddedRunner
from service.store import jobs
from service.store.db import make_engine, make_sessionmaker, session_scope
from service.store.models import ItemState, Job, JobItem, utcnow
from test_dashboard import EVIL_NAME, _client, _decision, _hash

LEFT = [{"name": "dispatch_9_<i>generic</i>", "weight": 2, "root_op": "linalg.generic", "reason": "no contraction root"}]


@pytest.fixture(autouse=True)
def no_embedded_runner(monkeypatch):
    monkeypatch.setattr(EmbeddedRunner, "start", lambda self: None)
    monkeypatch.setattr(EmbeddedRunner, "stop", lambda self, timeout=30.0: None)


def _set(session, item_id: int, **values) -> None:
    session.execute(update(JobItem).where(JobItem.id == item_id).values(**values))


@pytest.fixture
def seeded_jobs(migrated_url):
    """A model job part done (done, failed, running, queued items; dispatches left to IREE),
    and an items job with its only item queued."""
    engine = make_engine(migrated_url)
    sessions = make_sessionmaker(engine)
    measured = {"default_cpu_s": 5e-3, "chosen": 0, "not_measurable": None,
                "candidates": [{"plan_hash": "p0", "predicted_latency_s": 1e-3, "cpu_s": 2.5e-3, "wall_s": 2.6e-3, "error": None}]}
    with session_scope(sessions) as s:
        decision = _decision(s, 1, fingerprint="aa11", hardware_hash=_hash("host-cpu"), latency=1e-3, measured=measured)
        options = {"budget": 16, "seconds": None, "strategy": "tpe", "seed": 0, "measure_top": 0, "reuse": True}
        model = jobs.create_job(s, kind="model", hardware="host-cpu", options=options, queue="search", notes={"left_to_iree": LEFT},
                                items=[jobs.NewItem("dispatch_0_matmul", "m0", None, 3), jobs.NewItem(EVIL_NAME, "m1", None, 1),
                                       jobs.NewItem("dispatch_2_matmul", "m2", None, 2), jobs.NewItem("dispatch_3_matmul", "m3", None, 1)])
        listed = jobs.create_job(s, kind="items", hardware="npu-sram-256k", options=options, queue="search",
                                 items=[jobs.NewItem("only", "m", None, 1)])
        first, evil, running, _ = jobs.item_ids(s, model.id)
        now = utcnow()
        _set(s, first, state=ItemState.DONE, decision_id=decision.id, trials=16, cache="miss", started_at=now, finished_at=now + timedelta(seconds=2))
        _set(s, evil, state=ItemState.FAILED, error="boom <b>bad</b>", started_at=now, finished_at=now + timedelta(seconds=3))
        _set(s, running, state=ItemState.RUNNING, trials=5, started_at=now)
        s.commit()
        ids = {"model": model.id, "items": listed.id, "decision": decision.id, "running": running}
    yield migrated_url, ids, sessions
    engine.dispose()


def _live(html: str, block: str) -> dict:
    return json.loads(re.search(rf'id="{block}">(.*?)</script>', html, re.S).group(1))


def test_no_jobs_says_how_to_submit_one(migrated_url):
    with _client(migrated_url) as client:
        page = client.get("/jobs")
        assert page.status_code == 200 and "No jobs yet" in page.text
        assert "tilesearch job submit model.mlir --hardware host-cpu --budget 64" in page.text
        assert 'href="/jobs"' in client.get("/").text  # the nav links the jobs page from every page
        assert 'aria-current="page">Jobs' in page.text


def test_jobs_list_shows_state_kind_counts_progress(seeded_jobs):
    url, ids, _ = seeded_jobs
    with _client(url) as client:
        html = client.get("/jobs").text
        rows = re.findall(r'<td><a href="/jobs/(\d+)">\d+</a></td>', html)
        assert rows == [str(ids["items"]), str(ids["model"])]  # newest first
        assert "2 jobs" in html and "kind-model" in html and "4 dispatches" in html
        assert 'status-running">running' in html and 'status-queued">queued' in html
        assert '<progress max="4" value="2"' in html  # done + failed of 4
        assert '<progress max="1" value="0"' in html
        assert 'href="/hardware/host-cpu"' in html and "npu-sram-256k" in html and "budget 16" in html
        assert EVIL_NAME not in html


def test_jobs_list_pages_with_a_cursor(migrated_url):
    engine = make_engine(migrated_url)
    with session_scope(make_sessionmaker(engine)) as s:
        made = [jobs.create_job(s, kind="items", hardware="host-cpu", options={"budget": 1}, queue="search",
                                items=[jobs.NewItem("x", "m")]).id for _ in range(27)]
        s.commit()
    engine.dispose()
    with _client(migrated_url) as client:
        first = client.get("/jobs").text
        assert "27 jobs" in first and first.count('<td><a href="/jobs/') == 25
        older = re.search(r'href="([^"]*)" rel="next"', first).group(1).replace("&amp;", "&")
        second = client.get(older).text
        assert re.findall(r'<td><a href="/jobs/(\d+)">', second) == [str(made[1]), str(made[0])]
        assert 'rel="first"' in second and 'rel="next"' not in second
        bad = client.get("/jobs", params={"cursor": "nonsense"})
        assert bad.status_code == 200 and "is not one this page made" in bad.text and "27 jobs" in bad.text


def test_job_detail_items_dispatches_spec_and_escaping(seeded_jobs):
    url, ids, _ = seeded_jobs
    with _client(url) as client:
        page = client.get(f"/jobs/{ids['model']}")
        assert page.status_code == 200
        html = page.text
        for text in ("whole model, 4 tunable dispatches", 'data-live="state">running', "dispatch_0_matmul",
                     f'href="/decisions/{ids["decision"]}"', "1.000 ms", "3.000 ms",  # predicted, weight 3 x predicted
                     "2.500 ms", "tuned (cache miss)", "failed: boom &lt;b&gt;bad&lt;/b&gt;", "searching", "waiting for a worker",
                     f'href="/v1/jobs/{ids["model"]}/spec"', "Dispatches left to IREE", "dispatch_9_&lt;i&gt;generic&lt;/i&gt;",
                     "no contraction root", "updates itself every second",
                     f"--iree-codegen-tuning-spec-path=job-{ids['model']}-spec.mlir --mlir-disable-threading"):
            assert text in html, text
        assert EVIL_NAME not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
        assert "<b>bad</b>" not in html and "<i>generic</i>" not in html
        for block in re.findall(r'<script type="application/json" id="[^"]+">(.*?)</script>', html, re.S):
            assert "<" not in block
        live = _live(html, "job-live")
        assert live == {"url": f"/jobs/{ids['model']}/progress.json", "interval_ms": 1000, "active": True}
        progress = _live(html, "job-progress-data")
        assert progress["series"]["finished"] == [0, 1, 2] and progress["series"]["t_s"][1] < progress["series"]["t_s"][2]

        other = client.get(f"/jobs/{ids['items']}").text
        assert "1 module" in other and "Dispatches left to IREE" not in other
        # An NPU's job never has a spec: the page says so instead of offering a link that answers 404.
        assert "None: this job is for npu-sram-256k, which is not a CPU profile" in other and "spec-link" not in other
        assert "No item has finished yet" in other

        for missing in (999999, 0, 2**40):
            gone = client.get(f"/jobs/{missing}")
            assert gone.status_code == 404 and f"no job {missing}" in gone.text.lower()
        assert client.get("/jobs/abc").status_code == 422
        assert client.get(f"/jobs/{ids['model']}", params={"cursor": "???"}).status_code == 200


def test_progress_json_follows_the_store(seeded_jobs):
    url, ids, sessions = seeded_jobs
    with _client(url) as client:
        before = client.get(f"/jobs/{ids['model']}/progress.json")
        assert before.status_code == 200 and before.headers["cache-control"] == "no-store"
        p = before.json()
        assert p["state"] == "running" and p["active"] is True and p["finished"] == 2 and p["total"] == 4
        assert p["counts"] == {"queued": 1, "running": 1, "done": 1, "failed": 1, "cancelled": 0}
        assert [i["state"] for i in p["items"]] == ["done", "failed", "running", "queued"]
        with session_scope(sessions) as s:
            for item_id in jobs.item_ids(s, ids["model"], [ItemState.RUNNING, ItemState.QUEUED]):
                _set(s, item_id, state=ItemState.DONE, decision_id=ids["decision"], finished_at=utcnow())
            s.commit()
        after = client.get(f"/jobs/{ids['model']}/progress.json").json()
        assert after["state"] == "failed" and after["active"] is False and after["finished"] == 4
        assert after["items"][2]["decision_id"] == ids["decision"] and after["items"][2]["predicted"] == "1.000 ms"
        assert after["series"]["finished"] == [0, 1, 2, 3, 4]
        finished_page = client.get(f"/jobs/{ids['model']}").text
        assert _live(finished_page, "job-live")["active"] is False and "updates itself" not in finished_page
        assert client.get("/jobs/999999/progress.json").status_code == 404


def test_token_guards_jobs_pages_json_and_spec_link(seeded_jobs):
    url, ids, _ = seeded_jobs
    with _client(url, api_token="s3cret") as client:
        for path in ("/jobs", f"/jobs/{ids['model']}"):
            gate = client.get(path, follow_redirects=False)
            assert gate.status_code == 303 and gate.headers["location"].startswith("/login?next=/jobs"), path
        assert client.get(f"/jobs/{ids['model']}/progress.json").status_code == 401
        assert client.get(f"/v1/jobs/{ids['items']}/spec").status_code == 401
        bearer = {"Authorization": "Bearer s3cret"}
        assert client.get("/jobs", headers=bearer).status_code == 200
        assert client.post("/login", data={"token": "s3cret", "next": "/jobs"}, follow_redirects=False).status_code == 303
        assert client.get(f"/jobs/{ids['model']}").status_code == 200  # the cookie
        assert client.get(f"/jobs/{ids['model']}/progress.json").status_code == 200
        # the page's download link works with the cookie: past the token, the NPU job has no spec
        spec = client.get(f"/v1/jobs/{ids['items']}/spec")
        assert spec.status_code == 404 and "npu-sram-256k, which is not a CPU profile" in spec.text
        spec = client.get(f"/v1/jobs/{ids['model']}/spec")  # a CPU's, with no done item yet
        assert spec.status_code == 409 and "none is done yet" in spec.text


def test_jobs_pages_load_only_local_resources(seeded_jobs):
    url, ids, _ = seeded_jobs
    with _client(url) as client:
        for path in ("/jobs", f"/jobs/{ids['model']}"):
            html = client.get(path).text
            for ref in re.findall(r'(?:src|href)="([^"]*)"', html):
                assert ref.startswith(("/", "#", "data:")), (path, ref)
            for asset in re.findall(r'(?:src|href)="(/static/[^"]*)"', html):
                assert client.get(asset).status_code == 200, asset


def test_retry_requeues_the_failed_items_only_and_says_when_there_are_none(seeded_jobs):
    url, ids, _ = seeded_jobs
    with _client(url) as client:
        retried = client.post(f"/v1/jobs/{ids['model']}/retry")
        assert retried.status_code == 200, retried.text
        assert retried.json()["items"]["failed"] == 0 and retried.json()["items"]["queued"] == 2
        assert [i["name"] for i in retried.json()["items_detail"] if i["state"] == "queued"] == [EVIL_NAME, "dispatch_3_matmul"]
        again = client.post(f"/v1/jobs/{ids['model']}/retry")  # a new user's trial: a 200 that did nothing
        assert again.status_code == 409 and again.json()["detail"]["error"] == "NothingToRetry"
        assert "no failed item" in again.json()["detail"]["message"]
