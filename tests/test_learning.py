"""Learning from stored measurements (service.tiling.learning, service.measure.online_fit): the
auto-fit threshold, "used only when better on held-out modules", the hardware endpoint's
fidelity, and decisions searched again when a calibration changes the model.

Measurements here are rows written into the store as a measuring request writes them, with
times made from the cost model itself under known factors (as tests/test_calibrate.py does), so
the fit's verdict is known in advance; the real measuring paths are tests/test_measure_top.py
(POST /v1/tilings, job items) and the CLI tests at the end (real IREE on a tiny module).
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from typer.testing import CliRunner

from _shared import MATMUL_64X96X80, WORKLOADS, needs_avx512

from service.api.app import create_app
from service.cli import app as cli_app
from service.config import Settings, get_settings
from service.hardware.model import Calibration, HardwareModel
from service.hardware.profiles import get_profile
from service.ir.analysis import analyze
from service.ir.plan import Plan
from service.measure.calibration_fit import Predictor, with_calibration
from service.measure.calibration_plans import ContractionWorkload, load_contraction_workloads, sample_plans
from service.measure.calibration_samples import Sample
from service.measure.online_fit import ScoreSummary, bounded, module_folds, verdict
from service.store import calibrations, catalog, measurements, migrate
from service.store.db import make_engine, make_sessionmaker, session_scope
from service.store.models import FittedCalibration, Measurement
from service.tiling.hardware import HardwareCatalog, find_hardware, this_host
from service.tiling.learning import Learner, refit_due
from service.tiling.service import TilingRequest, TilingService

FAST = dict(learn_max_evals=60, learn_register_tiles=False)


@pytest.fixture(scope="module")
def workloads() -> list[ContractionWorkload]:
    found, _ = load_contraction_workloads(WORKLOADS)
    chosen = [w for w in found if w.name in ("matmul_1024", "mlp_chain", "attention_scores")]
    extra = [w for w in found if w not in chosen]
    assert len(chosen) == 3 and extra, [w.name for w in found]
    return chosen + extra[:1]


@pytest.fixture(scope="module")
def predictor(workloads) -> Predictor:
    return Predictor(workloads)


def nominal() -> HardwareModel:
    return get_profile("host-cpu")


def skewed(hardware: HardwareModel) -> HardwareModel:
    """A machine the nominal profile gets wrong in a way calibration can learn."""
    levels = [lv.name for lv in hardware.memory_levels]
    return with_calibration(hardware, Calibration(compute_efficiency=0.3, loop_overhead_scale=5.0,
                                                  bandwidth_efficiency={levels[0]: 0.3, levels[-1]: 0.4}))


def plans_of(w: ContractionWorkload, predictor: Predictor, n: int) -> list[dict]:
    """n plans whose nominal predictions differ (so ranks are defined)."""
    out, seen = [], set()
    for plan in sample_plans(w, 3 * n):
        latency = predictor.latency_s(w.name, plan, nominal())
        if math.isfinite(latency) and latency not in seen:
            seen.add(latency)
            out.append(plan)
        if len(out) == n:
            return out
    raise AssertionError(f"{w.name}: fewer than {n} distinct plans")


def store_timings(sessions: sessionmaker[Session], w: ContractionWorkload, timed: list[tuple[dict, float]],
                  host: str | None = None) -> None:
    """Rows as a measuring request writes them: each plan, then IREE's default paired with it."""
    fingerprint = analyze(w.text).fingerprint
    with session_scope(sessions) as session:
        catalog.upsert_module(session, fingerprint, w.text)
        for plan, seconds in timed:
            for is_default, p, t in ((False, plan, seconds), (True, Plan().model_dump(), 1e-3)):
                measurements.save_measurement(
                    session, plan_hash=Plan.model_validate(p).plan_hash(), hardware_hash="h", ok=True, median_s=t,
                    host_key=host or this_host(), module_fingerprint=fingerprint, plan=p, cpu_s=t,
                    default_cpu_s=1e-3, is_default=is_default, source="tiling")


def store_as(sessions, w, predictor, truth: HardwareModel, n: int, host: str | None = None) -> None:
    store_timings(sessions, w, [(p, predictor.latency_s(w.name, p, truth)) for p in plans_of(w, predictor, n)], host)


def learner(sessions, **settings) -> Learner:
    return Learner(sessions, HardwareCatalog(sessions), Settings(**(FAST | settings)))


def resolved(sessions) -> HardwareModel:
    with session_scope(sessions) as session:
        return find_hardware(session, "host-cpu").model


# --------------------------------------------------------------------------- trigger


def test_a_fit_is_due_only_with_enough_measurements_over_enough_modules() -> None:
    count = measurements.LearnableCount
    assert refit_due(count(23, 3, 50), None, "b", 24, 3) is None
    assert refit_due(count(40, 2, 50), None, "b", 24, 3) is None
    assert refit_due(count(24, 3, 50), None, "b", 24, 3) is not None
    last = FittedCalibration(version=1, base_hash="b", n_measurements=24, last_measurement_id=50)
    assert refit_due(count(24, 3, 50), last, "b", 24, 3) is None  # nothing new
    assert refit_due(count(31, 3, 80), last, "b", 24, 3) is None  # fewer than 8 new
    assert refit_due(count(32, 3, 80), last, "b", 24, 3) is not None
    assert refit_due(count(24, 3, 50), last, "other", 24, 3) is not None  # the profile changed


def test_the_auto_fit_waits_for_the_threshold_then_runs_in_the_background(sessions, workloads, predictor) -> None:
    truth = skewed(nominal())
    a, b, c = workloads[:3]
    store_as(sessions, a, predictor, truth, 12)
    store_as(sessions, b, predictor, truth, 12)  # 24 measurements, 2 modules
    store_as(sessions, c, predictor, truth, 11, host="GenuineIntel-f6-m85-avx512-2t")  # another CPU's
    fits = learner(sessions)
    try:
        assert fits.refit_if_due("host-cpu") is None
        store_as(sessions, c, predictor, truth, 11)  # 35 over 3 modules: due
        started = time.perf_counter()
        fits.after_measuring()  # what TilingService.decide calls after storing a request's timings
        assert time.perf_counter() - started < 0.5  # the fit is not in the request's path
        assert fits.wait_idle(600)
        with session_scope(sessions) as session:
            (row,) = calibrations.list_calibrations(session, this_host(), "host-cpu")
        assert (row.version, row.source, row.n_measurements, row.n_modules) == (1, "auto", 35, 3)
        assert row.base_hash == nominal().content_hash()
        assert fits.refit_if_due("host-cpu") is None  # nothing new since
    finally:
        fits.close()


# --------------------------------------------------------------------------- used only when better


def test_a_calibration_that_predicts_held_out_modules_better_is_used(sessions, workloads, predictor) -> None:
    truth = skewed(nominal())
    for w in workloads:
        store_as(sessions, w, predictor, truth, 8)
    row, fit = learner(sessions).fit_now("host-cpu")
    assert fit.better and row.used, fit.reason
    assert fit.calibrated.rmse_log < 0.5 * fit.base.rmse_log
    model = resolved(sessions)
    assert model.content_hash() == row.profile_hash != nominal().content_hash()
    assert model.calibration.compute_efficiency < 0.9
    with session_scope(sessions) as session:
        assert find_hardware(session, "host-cpu").calibration_version == 1


def test_a_calibration_worse_on_held_out_modules_is_not_used(sessions, workloads, predictor) -> None:
    """Three modules measure as the uncalibrated model predicts; one as a different machine.
    Each fit that holds out one of the three learns from the odd one and predicts the held-out
    module worse than the uncalibrated model (which is exact there)."""
    base = nominal()
    for w in workloads[:3]:
        store_as(sessions, w, predictor, base, 8)
    store_as(sessions, workloads[3], predictor, skewed(base), 8)
    row, fit = learner(sessions).fit_now("host-cpu")
    assert not fit.better and not row.used
    exact = [h for h in fit.held_out if h.module != analyze(workloads[3].text).fingerprint]
    assert len(exact) == 3 and all(h.base.rmse_log < 1e-6 < h.calibrated.rmse_log for h in exact)
    assert resolved(sessions).content_hash() == base.content_hash()
    with session_scope(sessions) as session:
        assert "not used" in calibrations.in_use(session, this_host(), "host-cpu", base.content_hash()).reason


def test_the_verdict_needs_a_gain_and_no_loss() -> None:
    base = ScoreSummary(spearman=0.6, regret=0.2, rmse_log=1.0)
    assert verdict(base, ScoreSummary(spearman=0.8, regret=0.2, rmse_log=1.0), 3)[0]
    assert verdict(base, ScoreSummary(spearman=0.6, regret=0.2, rmse_log=0.5), 3)[0]
    assert not verdict(base, ScoreSummary(spearman=0.6, regret=0.2, rmse_log=0.95), 3)[0]  # no gain
    assert not verdict(base, ScoreSummary(spearman=0.5, regret=0.1, rmse_log=0.2), 3)[0]  # ranks worse
    assert not verdict(base, ScoreSummary(spearman=0.9, regret=0.3, rmse_log=0.2), 3)[0]  # picks worse
    assert not verdict(base, ScoreSummary(spearman=0.9, regret=0.0, rmse_log=0.2), 2)[0]  # too few modules


def test_a_fit_on_many_modules_holds_out_folds_and_bounds_its_samples() -> None:
    folds = module_folds([f"m{i:02d}" for i in range(12)], 5)
    assert len(folds) == 5 and sorted(m for fold in folds for m in fold) == [f"m{i:02d}" for i in range(12)]
    assert module_folds(["a", "b", "c"], 5) == [["a"], ["b"], ["c"]]  # few modules: one at a time
    samples = [Sample(workload=f"m{i % 4}", plan={"groups": []}, measured_s=float(i + 1)) for i in range(400)]
    kept = bounded(samples, 40)
    assert len(kept) == 40 and {s.workload for s in kept} == {"m0", "m1", "m2", "m3"}
    m0 = [s.measured_s for s in kept if s.workload == "m0"]
    assert min(m0) == 1.0 and max(m0) == 397.0  # each module's fastest and slowest plans stay


# --------------------------------------------------------------------------- decisions


def _insert_calibration(sessions, profile: HardwareModel, base: HardwareModel, used: bool) -> None:
    with session_scope(sessions) as session:
        calibrations.save_calibration(session, calibrations.NewCalibration(
            host_key=this_host(), hardware_name="host-cpu", base_hash=base.content_hash(),
            profile_hash=profile.content_hash(), profile=profile.model_dump(mode="json"), n_measurements=30,
            n_modules=3, last_measurement_id=0, scores={}, used=used, reason="test", source="auto"))


def test_a_decision_made_under_the_old_profile_is_searched_again_under_a_better_calibration(
        service: TilingService, sessions, workloads, predictor) -> None:
    module = (WORKLOADS / "matmul_1024.mlir").read_text()
    request = TilingRequest(module=module, hardware="host-cpu", budget=6, seed=1)
    first = service.decide(request)
    assert first.cache == "miss" and service.decide(request).cache == "hit"
    base = nominal()
    for w in workloads:
        store_as(sessions, w, predictor, skewed(base), 8)
    row, _ = learner(sessions).fit_now("host-cpu")
    assert row.used, row.reason
    service.hardware.forget("host-cpu")  # else within HARDWARE_TTL_S
    again = service.decide(request)
    assert again.cache == "miss" and again.decision.id != first.decision.id
    assert again.decision.hardware_hash == row.profile_hash != first.decision.hardware_hash
    assert again.decision.cost_model_version == first.decision.cost_model_version
    assert service.decide(request).decision.id == again.decision.id  # a hit under the calibration
    # a newer fit that lost retires the calibration: the old decision answers again
    _insert_calibration(sessions, skewed(base), base, used=False)
    service.hardware.forget("host-cpu")
    back = service.decide(request)
    assert back.cache == "hit" and back.decision.id == first.decision.id


# --------------------------------------------------------------------------- the endpoint


def test_the_hardware_endpoint_reports_fidelity_on_this_hosts_measurements(migrated_url, workloads, predictor) -> None:
    engine = make_engine(migrated_url)
    sessions = make_sessionmaker(engine)
    base = nominal()
    a, b, c = workloads[:3]
    # a and c measure in the model's order (rho 1, regret 0), b in the reverse order
    store_as(sessions, a, predictor, base, 5)
    plans = sorted(plans_of(b, predictor, 5), key=lambda p: predictor.latency_s(b.name, p, base))
    store_timings(sessions, b, [(p, (5 - i) * 1e-3) for i, p in enumerate(plans)])
    store_as(sessions, c, predictor, base, 5)
    try:
        with TestClient(create_app(Settings(database_url=migrated_url, request_timeout_s=60, learn_auto=False))) as client:
            body = client.get("/v1/hardware/host-cpu").json()
            fidelity = body["fidelity"]
            assert (fidelity["n_measurements"], fidelity["n_modules"], fidelity["host_key"]) == (15, 3, this_host())
            assert fidelity["spearman_rho"] == pytest.approx(1.0) and fidelity["median_regret"] == pytest.approx(0.0)
            assert fidelity["median_rmse_log"] == pytest.approx(0.0, abs=1e-9) and fidelity["note"] is None
            assert body["calibration"] == body["calibration"] | {"in_use": None, "newest_version": None}
            assert "no calibration" in body["calibration"]["reason"] and body["calibration_version"] is None

            calibrated = skewed(base)
            _insert_calibration(sessions, calibrated, base, used=True)
            body = client.get("/v1/hardware/host-cpu").json()
            assert body["hash"] == body["fidelity"]["hardware_hash"] == calibrated.content_hash()
            assert body["calibration_version"] == body["calibration"]["in_use"] == 1
            assert body["fidelity"]["median_rmse_log"] > 0.1  # the skewed profile mispredicts these times

            other = client.get("/v1/hardware/gpu-h100").json()
            assert other["fidelity"]["n_measurements"] == 0 and "another machine" in other["fidelity"]["note"]
            assert client.get("/v1/hardware/no-such-thing").status_code == 404
    finally:
        engine.dispose()


def test_the_hardware_endpoint_says_when_nothing_is_measured(migrated_url) -> None:
    with TestClient(create_app(Settings(database_url=migrated_url, learn_auto=False))) as client:
        body = client.get("/v1/hardware/host-cpu").json()
        assert body["fidelity"]["n_measurements"] == 0 and body["fidelity"]["spearman_rho"] is None
        assert body["fidelity"]["note"] == "no measurements stored for this host"


# --------------------------------------------------------------------------- the CLI (real IREE)

@pytest.fixture
def sqlite_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    url = f"sqlite:///{tmp_path / 'tilesearch.db'}"
    migrate.upgrade(url)
    monkeypatch.chdir(tmp_path)  # the measurement cache (var/measure) goes here too
    monkeypatch.setenv("TILESEARCH_DATABASE_URL", url)
    for key, value in FAST.items():
        monkeypatch.setenv(f"TILESEARCH_{key.upper()}", str(value))
    get_settings.cache_clear()
    engine = make_engine(url)
    yield make_sessionmaker(engine)
    engine.dispose()
    get_settings.cache_clear()


def _rows(sessions) -> list[Measurement]:
    with session_scope(sessions) as session:
        return list(session.scalars(select(Measurement).order_by(Measurement.id)))


@needs_avx512
@pytest.mark.slow
def test_tune_and_calibrate_store_their_measurements(sqlite_store, tmp_path: Path) -> None:
    module = tmp_path / "mm.mlir"
    module.write_text(MATMUL_64X96X80)
    runner = CliRunner()
    tuned = runner.invoke(cli_app, ["tune", str(module), "--budget", "8", "--measure-top", "2", "--json"])
    assert tuned.exit_code == 0, tuned.output
    rows = _rows(sqlite_store)
    fingerprint = analyze(MATMUL_64X96X80).fingerprint
    assert [r.is_default for r in rows] == [False, False, True]
    assert {(r.source, r.host_key, r.module_fingerprint) for r in rows} == {("tune", this_host(), fingerprint)}
    assert all(r.ok and r.cpu_s > 0 and r.default_cpu_s == rows[-1].cpu_s for r in rows)
    with session_scope(sqlite_store) as session:
        assert catalog.get_module(session, fingerprint).text == MATMUL_64X96X80

    (tmp_path / "workloads").mkdir()
    (tmp_path / "workloads" / "mm.mlir").write_text(MATMUL_64X96X80)
    calibrated = runner.invoke(cli_app, ["calibrate", "--workloads", str(tmp_path / "workloads"), "--plans", "3",
                                         "--json"])
    assert calibrated.exit_code == 0, calibrated.output
    new = [r for r in _rows(sqlite_store) if r.source == "calibrate"]
    assert len(new) == 6 and sum(r.is_default for r in new) == 3
    assert all(r.module_fingerprint == fingerprint and r.plan["groups"] for r in new if not r.is_default)
    with session_scope(sqlite_store) as session:
        (row,) = calibrations.list_calibrations(session, this_host(), "host-cpu")
    # one module: nothing to hold out, so the fit is stored but not used
    assert (row.version, row.source, row.used) == (1, "calibrate", False) and "held out on 0 modules" in row.reason
    assert row.n_measurements == 5  # two from tune, three from calibrate
