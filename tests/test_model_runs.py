"""Model runs in the store: a tuned model kept with its spec and per-dispatch report, each tuned
dispatch an ordinary decision; read back through the library, the CLI and /v1/models/runs.
On SQLite and PostgreSQL; the tuning itself runs the real iree-compile."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import delete
from typer.testing import CliRunner

from _shared import SHARED, tuning_every_dispatch

from service.api.app import create_app
from service.cli import app
from service.config import Settings, get_settings
from service.hardware.profiles import get_profile
from service.model_tuning import tune_model
from service.model_tuning.runs import model_fingerprint, store_model_run, stored_run, stored_runs
from service.store import decisions, migrate, model_runs, searches
from service.store.db import make_engine, make_sessionmaker, session_scope
from service.store.models import Decision, DecisionStatus, ModelRun, ModelRunDecision
from service.tiling.request import TilingRequest

MLP = SHARED / "models" / "mlp_512_2048_b16.linalg.mlir"
OPTIONS = {"budget": 256, "seconds": None, "seed": 0, "measure_top": 0}
LEFT = {"name": "main$async_dispatch_1_softmax_8x128_f32", "fingerprint": None, "weight": 2, "root_op": None,
        "tuned": False, "reason": "no contraction root (reduction): tilesearch configures contractions only",
        "predicted_s": None, "config": None}


@pytest.fixture(scope="module")
def tuned_mlp(tmp_path_factory):
    out = tmp_path_factory.mktemp("mlp-run")
    with tuning_every_dispatch():
        report = tune_model(MLP, get_profile("host-cpu"), out / "spec.mlir", budget=256)
    assert report.searches, "the MLP should have a dispatch that beats IREE's default"
    return report


@pytest.mark.slow
def test_a_model_run_round_trips_with_its_spec_and_its_dispatches_decisions(sessions, tuned_mlp):
    report = tuned_mlp
    hw = get_profile("host-cpu")
    run_id = store_model_run(sessions, MLP.read_bytes(), "mlp_512_2048_b16", hw, report, OPTIONS)
    with session_scope(sessions) as session:
        run = stored_run(session, run_id)
        assert run.fingerprint == hashlib.sha256(MLP.read_bytes()).hexdigest() == model_fingerprint(MLP.read_text())
        assert (run.name, run.hardware, run.hardware_hash, run.options) == ("mlp_512_2048_b16", hw.name,
                                                                            hw.content_hash(), OPTIONS)
        assert run.has_spec and model_runs.get_model_run(session, run_id).spec == Path(report.spec).read_text()
        assert run.predicted_total_s == pytest.approx(report.predicted_total_s) and run.verified
        assert [d.name for d in run.dispatches] == [d.name for d in report.dispatches]
        for stored, reported in zip(run.dispatches, report.dispatches):
            assert stored.model_dump(exclude={"decision_id"}) == reported.model_dump()
            assert (stored.decision_id is not None) == reported.tuned
        search = report.searches[0]
        linked = next(d.decision_id for d in run.dispatches if d.name == search.name)
        decision = decisions.get_decision(session, linked)
        assert decision.status == DecisionStatus.DONE and decision.plan == search.result.plan
        assert "transform.iree.match.contraction" in decision.tuning_spec
        assert decision.effort["tpe"]["budget"] == search.result.evaluations
        assert searches.kept_trials(session, linked).count == len([t for t in search.result.trials if t.plan])
    # The same model again: a second run, linked to the decisions the first one made.
    again = store_model_run(sessions, MLP.read_bytes(), "mlp_512_2048_b16", hw, report, OPTIONS)
    with session_scope(sessions) as session:
        assert model_runs.run_decisions(session, again) == model_runs.run_decisions(session, run_id)
        page, cursor = stored_runs(session, limit=1)
        assert [r.id for r in page] == [again] and cursor is not None
        rest, end = stored_runs(session, limit=5, cursor=cursor)
        assert [r.id for r in rest] == [run_id] and end is None
        assert stored_runs(session, limit=5, fingerprint="0" * 64) == ([], None)


@pytest.mark.slow
def test_a_later_request_for_a_tuned_dispatch_is_a_hit(service, sessions, tuned_mlp):
    report = tuned_mlp
    run_id = store_model_run(sessions, MLP.read_bytes(), "mlp", get_profile("host-cpu"), report, OPTIONS)
    search = report.searches[0]
    with session_scope(sessions) as session:
        linked = model_runs.run_decisions(session, run_id)[search.name]
    outcome = service.decide(TilingRequest(module=search.module, hardware="host-cpu",
                                           budget=min(64, search.result.evaluations)))
    assert outcome.cache == "hit" and outcome.decision.id == linked
    assert outcome.decision.plan == search.result.plan


def _run(session, *, spec: str | None, decision_id: int | None = None) -> ModelRun:
    return model_runs.save_model_run(
        session, fingerprint="ab" * 32, name="tiny", hardware="host-cpu", hardware_hash="h", options=OPTIONS,
        dispatches=[LEFT], predicted_total_s=0.0, verified=False, spec=spec, elapsed_s=1.5,
        decisions={} if decision_id is None else {"main$async_dispatch_0_matmul_8x8x8_f32": decision_id})


def test_a_deleted_decision_unlinks_and_a_deleted_run_takes_its_links(sessions):
    parts = decisions.DecisionKeyParts("fp", "hw", "s", "c", "latency", "{}", "p")
    with session_scope(sessions) as session:
        claim = decisions.claim_decision(session, parts, "me", lease_s=60)
        decisions.complete_decision(session, claim.decision.id, "me", decisions.DecisionResult(plan={"groups": []}))
        run = _run(session, spec="spec", decision_id=claim.decision.id)
    with session_scope(sessions) as session:
        session.execute(delete(Decision).where(Decision.id == claim.decision.id))
    with session_scope(sessions) as session:
        assert model_runs.run_decisions(session, run.id) == {"main$async_dispatch_0_matmul_8x8x8_f32": None}
        session.execute(delete(ModelRun).where(ModelRun.id == run.id))
    with session_scope(sessions) as session:
        assert session.query(ModelRunDecision).count() == 0


def test_runs_over_the_api_need_the_token_and_unknown_ones_are_404(migrated_url, sessions):
    with session_scope(sessions) as session:
        with_spec, without = _run(session, spec="module {}\n").id, _run(session, spec=None).id
    settings = Settings(database_url=migrated_url, request_timeout_s=60, pool_workers=1, api_token="s3cret")
    auth = {"Authorization": "Bearer s3cret"}
    with TestClient(create_app(settings)) as client:
        for path in ("/v1/models/runs", f"/v1/models/runs/{with_spec}", f"/v1/models/runs/{with_spec}/spec"):
            assert client.get(path).status_code == 401, path
        page = client.get("/v1/models/runs", headers=auth).json()
        assert [r["id"] for r in page["items"]] == [without, with_spec] and page["next_cursor"] is None
        one = client.get(f"/v1/models/runs/{with_spec}", headers=auth).json()
        assert one["has_spec"] and one["dispatches"] == [LEFT | {"decision_id": None, "iree_default": None,
                                                                 "iree_default_predicted_s": None, "measured_s": None,
                                                                 "iree_default_measured_s": None, "evaluations": 0}]
        spec = client.get(f"/v1/models/runs/{with_spec}/spec", headers=auth)
        assert spec.status_code == 200 and spec.text == "module {}\n" and spec.headers["content-type"].startswith("text/plain")
        none = client.get(f"/v1/models/runs/{without}/spec", headers=auth)
        assert none.status_code == 404 and none.json()["detail"]["error"] == "NoSpec"
        for path in ("/v1/models/runs/999999", "/v1/models/runs/99999999999", "/v1/models/runs/0/spec"):
            got = client.get(path, headers=auth)
            assert got.status_code == 404 and got.json()["detail"]["error"] == "NotFound", path
        assert client.get("/v1/models/runs?fingerprint=xyz", headers=auth).status_code == 422
        assert client.get("/v1/models/runs?cursor=bm9wZQ", headers=auth).status_code == 422


@pytest.fixture
def store_env(tmp_path, monkeypatch):
    """DATABASE_URL for the CLI: a SQLite file of its own, not migrated."""
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    monkeypatch.setenv("TILESEARCH_DATABASE_URL", url)
    get_settings.cache_clear()
    yield url
    get_settings.cache_clear()


@pytest.mark.slow
def test_model_tune_stores_a_run_that_model_runs_and_model_spec_read_back(store_env, tmp_path):
    runner = CliRunner()
    spec = tmp_path / "spec.mlir"
    refused = runner.invoke(app, ["model", "tune", str(MLP), "--spec-out", str(spec), "--budget", "8"])
    assert refused.exit_code == 2 and "the store is not ready" in refused.output and not spec.exists()
    assert "or pass --no-store" in refused.output
    assert not (tmp_path / "cli.db").exists()  # the check created no empty database (a new user's trial)
    unready = runner.invoke(app, ["model", "runs"])  # no --no-store to offer there (a new user's trial)
    assert unready.exit_code == 2 and "the store is not ready" in unready.output and "--no-store" not in unready.output
    migrate.upgrade(store_env)
    with tuning_every_dispatch():
        tuned = runner.invoke(app, ["model", "tune", str(MLP), "--spec-out", str(spec), "--budget", "256", "--json"])
    assert tuned.exit_code == 0, tuned.output
    answer = json.loads(tuned.stdout)
    run_id = answer["run_id"]
    assert answer["spec"] == str(spec) and all("iree_default_predicted_s" in d for d in answer["dispatches"])
    # IREE's own config of each root, beside ours, so a reader can see what the spec changed
    assert all(d["iree_default"].startswith("#iree_cpu.lowering_config<") for d in answer["dispatches"])
    listed = runner.invoke(app, ["model", "runs", "--json"])
    assert listed.exit_code == 0 and [r["id"] for r in json.loads(listed.stdout)] == [run_id]
    assert f"{run_id}  " in runner.invoke(app, ["model", "runs"]).stdout
    back = tmp_path / "back.mlir"
    written = runner.invoke(app, ["model", "spec", str(run_id), "-o", str(back)])
    assert written.exit_code == 0 and back.read_text() == spec.read_text()
    missing = runner.invoke(app, ["model", "spec", "999"])
    assert missing.exit_code == 2 and "no model run 999" in missing.output
    unstored = runner.invoke(app, ["model", "tune", str(MLP), "--spec-out", str(spec), "--budget", "8", "--no-store",
                                   "--json"])
    assert unstored.exit_code == 0 and json.loads(unstored.stdout)["run_id"] is None
    assert len(json.loads(runner.invoke(app, ["model", "runs", "--json"]).stdout)) == 1
    # A run that tuned nothing: no spec is its answer, as `job spec` says it; a file there is stale.
    with session_scope(make_sessionmaker(make_engine(store_env))) as session:
        untuned = _run(session, spec=None).id
    stale = tmp_path / "stale.mlir"
    stale.write_text("module {}\n")
    none = runner.invoke(app, ["model", "spec", str(untuned), "-o", str(stale)])
    assert none.exit_code == 0 and not stale.exists(), none.output
    assert f"note: no tuning spec written to {stale}: model run {untuned} tuned no dispatch" in none.output
