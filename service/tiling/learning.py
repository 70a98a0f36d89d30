"""Learning from the measurements the service takes.

Every IREE timing (a `measure_top` request or job item, `tilesearch tune --measure-top`,
`tilesearch calibrate`) is stored with its plan, module and host (`save_measurements`). From a
host's stored measurements:

- its fidelity (service.measure.online_fit.fidelity) under the model a name resolves to, for
  `GET /v1/hardware/{name}` (`Learner.report`);
- a calibrated profile, fitted after a measuring request once the host has enough measurements
  (`Learner.after_measuring`: in a thread, the fit in a process of its own at low priority,
  never in the request's path), or on `tilesearch calibrate` (`Learner.fit_now`). Each fit is a
  new version in `calibrations`; the name resolves to it only when it predicts held-out modules
  better than the uncalibrated profile (service.tiling.hardware).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel, Field
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from service.config import Settings
from service.hardware.model import HardwareModel
from service.hardware.profiles import HOST_CPU
from service.ir.analysis import analyze
from service.ir.errors import IRError
from service.ir.plan import Plan
from service.ir.sandbox import Sandbox, result_of
from service.measure.calibration_fit import NamedModule
from service.measure.calibration_samples import Sample
from service.measure.online_fit import Fidelity, FitSettings, OnlineFit, ScoreSummary, StoredModule, fidelity_of, fit_online
from service.search.refine import Refinement
from service.store import calibrations, catalog, measurements
from service.store.db import session_scope
from service.store.models import FittedCalibration

from .contract import PlanMeasurement
from .hardware import HardwareCatalog, find_base_hardware, find_hardware, this_host
from .worker import plan_measurement as _timing
from .worker import refinement_measurements

log = logging.getLogger("tilesearch.learning")
T = TypeVar("T")

# A refit is due once the measurements grew by this share since the last fit (at least REFIT_MIN_NEW).
REFIT_GROWTH = 0.25
REFIT_MIN_NEW = 8
FIDELITY_TIMEOUT_S = 120.0
# Fits and reports read the newest this many measurements of a host (a fit bounds its own samples further).
LEARN_WINDOW = 2000
FIDELITY_CACHE = 8  # reports kept, by (host, model, newest measurement)


def save_measurements(session: Session, timings: Sequence[PlanMeasurement], *, hardware_hash: str,
                      module_fingerprint: str, source: str, decision_id: int | None = None,
                      shape_hints: dict[str, Any] | None = None) -> None:
    """Every IREE timing taken, with what it takes to predict it again (the module must be a
    `modules` row: the caller stores it in the same transaction)."""
    for m in timings:
        measurements.save_measurement(
            session, plan_hash=m.plan_hash, hardware_hash=hardware_hash, ok=m.ok, median_s=m.median_s,
            samples=m.samples_s, error=m.error, iree_version=m.iree_version, decision_id=decision_id,
            config={"role": m.role, "lowering_configs": m.config, "cpu_median_s": m.cpu_median_s,
                    "cpu_samples_s": m.cpu_samples_s},
            host_key=m.host_key, module_fingerprint=module_fingerprint, plan=m.plan, shape_hints=shape_hints,
            cpu_s=m.cpu_s, default_cpu_s=m.default_cpu_s, is_default=m.role == "default", source=source,
        )


def record_refinement(session: Session, module_text: str, refinement: Refinement, hardware: HardwareModel,
                      shape_hints: dict[str, Any] | None = None, source: str = "tune") -> int:
    """Store the timings of a `tune --measure-top` refinement (and its module); how many."""
    fingerprint = analyze(module_text).fingerprint
    catalog.upsert_module(session, fingerprint, module_text)
    timings = refinement_measurements(refinement)
    save_measurements(session, timings, hardware_hash=hardware.content_hash(), module_fingerprint=fingerprint,
                      source=source, shape_hints=shape_hints)
    return len(timings)


def record_calibration_samples(session: Session, workloads: Sequence[NamedModule], samples: Sequence[Sample],
                               hardware: HardwareModel) -> tuple[int, dict[str, str]]:
    """Store `tilesearch calibrate`'s timings (each plan and its paired IREE default): how many,
    and each workload's module fingerprint -> its name."""
    fingerprints = {w.name: analyze(w.text).fingerprint for w in workloads}
    for w in workloads:
        catalog.upsert_module(session, fingerprints[w.name], w.text)
    host, stored = this_host(), 0
    for s in samples:
        if s.forced is None or s.workload not in fingerprints:
            continue  # not measurable at all (NotMeasurable): nothing was timed
        default = s.default
        timings = [_timing(s.plan, Plan.model_validate(s.plan).plan_hash(), "candidate", s.forced, default, host)]
        if default is not None:
            timings.append(_timing(Plan().model_dump(), Plan().plan_hash(), "default", default, default, host))
        save_measurements(session, timings, hardware_hash=hardware.content_hash(),
                          module_fingerprint=fingerprints[s.workload], source="calibrate")
        stored += len(timings)
    return stored, {fp: name for name, fp in fingerprints.items()}


@dataclass(frozen=True)
class LearningData:
    modules: list[StoredModule]
    samples: list[Sample]
    count: measurements.LearnableCount


def learning_data(session: Session, host: str) -> LearningData:
    """A host's learnable measurements as samples (workload = module fingerprint), and their modules."""
    rows = measurements.learnable_rows(session, host, limit=LEARN_WINDOW)
    texts = measurements.module_texts(session, [r.module_fingerprint for r in rows])
    samples = [Sample(workload=r.module_fingerprint, plan=r.plan, measured_s=r.cpu_s, raw_s=r.cpu_s,
                      default_s=r.default_cpu_s) for r in rows if r.module_fingerprint in texts]
    return LearningData([StoredModule(fp, text) for fp, text in sorted(texts.items())], samples,
                        measurements.count_learnable(session, host))


def refit_due(count: measurements.LearnableCount, last: FittedCalibration | None, base_hash: str,
              min_measurements: int, min_modules: int) -> str | None:
    """Why a fit is due now (None: it is not): enough measurements over enough modules, and
    none fitted yet, or the base profile changed, or enough new measurements since."""
    if count.measurements < min_measurements or count.modules < min_modules:
        return None
    if last is None:
        return f"{count.measurements} measurements of {count.modules} modules"
    if last.base_hash != base_hash:
        return f"the profile changed since version {last.version}"
    if count.last_id > last.last_measurement_id and \
            count.measurements >= last.n_measurements + max(REFIT_MIN_NEW, int(REFIT_GROWTH * last.n_measurements)):
        return f"{count.measurements - last.n_measurements} measurements since version {last.version}"
    return None


def fit_at_low_priority(modules: list[StoredModule], samples: list[Sample], base: HardwareModel,
                        settings: FitSettings, label: str) -> OnlineFit:
    """`fit_online` in a background process, below the searches and timings of this host."""
    try:
        os.nice(10)
    except OSError:  # not allowed: fit at the normal priority
        pass
    return fit_online(modules, samples, base, settings, label)


def _scores(fit: OnlineFit) -> dict[str, Any]:
    return {"base": fit.base.model_dump(), "calibrated": fit.calibrated.model_dump(),
            "held_out": [h.model_dump() for h in fit.held_out]}


def store_fit(sessions: sessionmaker[Session], host: str, name: str, base: HardwareModel, fit: OnlineFit,
              count: measurements.LearnableCount, source: str) -> FittedCalibration:
    """Store `fit` as the next version of (host, name)."""
    new = calibrations.NewCalibration(
        host_key=host, hardware_name=name, base_hash=base.content_hash(), profile_hash=fit.profile.content_hash(),
        profile=fit.profile.model_dump(mode="json"), n_measurements=count.measurements, n_modules=count.modules,
        last_measurement_id=count.last_id, scores=_scores(fit), used=fit.better, reason=fit.reason, source=source)
    for attempt in range(3):
        try:
            with session_scope(sessions) as session:
                return calibrations.save_calibration(session, new)
        except IntegrityError:  # another process stored that version first
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


# --------------------------------------------------------------------------- reports


class CalibrationStatus(BaseModel):
    """Which stored calibration a hardware name resolves to on this host, and why."""

    in_use: int | None = Field(description="the calibration version in use; None: the uncalibrated profile")
    reason: str
    newest_version: int | None = None
    newest_used: bool | None = None
    newest_n_measurements: int | None = None
    newest_n_modules: int | None = None
    held_out_uncalibrated: ScoreSummary | None = Field(default=None, description="newest fit: medians over held-out modules")
    held_out_calibrated: ScoreSummary | None = None


class HostFidelity(BaseModel):
    """The model a name resolves to, held to this host's stored measurements."""

    host_key: str
    hardware_hash: str
    n_measurements: int
    n_modules: int
    spearman_rho: float | None = Field(description="median over modules of Spearman's rho (predicted vs measured)")
    spearman_rho_pooled: float | None
    median_regret: float | None = Field(description="median over modules of measured(model's pick) / best measured - 1")
    median_rmse_log: float | None
    note: str | None = None


class HardwareLearning(BaseModel):
    fidelity: HostFidelity
    calibration: CalibrationStatus


def calibration_status(session: Session, host: str, name: str, base_hash: str) -> CalibrationStatus:
    used = calibrations.in_use(session, host, name, base_hash)
    last = used.newest
    scores = last.scores if last is not None else {}
    return CalibrationStatus(
        in_use=used.calibration.version if used.calibration is not None else None, reason=used.reason,
        newest_version=last.version if last else None, newest_used=last.used if last else None,
        newest_n_measurements=last.n_measurements if last else None, newest_n_modules=last.n_modules if last else None,
        held_out_uncalibrated=ScoreSummary.model_validate(scores["base"]) if "base" in scores else None,
        held_out_calibrated=ScoreSummary.model_validate(scores["calibrated"]) if "calibrated" in scores else None,
    )


def _fidelity_out(host: str, hardware: HardwareModel, f: Fidelity | None, note: str | None) -> HostFidelity:
    return HostFidelity(
        host_key=host, hardware_hash=hardware.content_hash(), n_measurements=f.n_measurements if f else 0,
        n_modules=f.n_modules if f else 0, spearman_rho=f.spearman_rho if f else None,
        spearman_rho_pooled=f.spearman_rho_pooled if f else None, median_regret=f.median_regret if f else None,
        median_rmse_log=f.median_rmse_log if f else None, note=note)


TaskRunner = Callable[..., Any]  # run(fn, *args, timeout=...) -> fn(*args), in a process that may parse MLIR


class Learner:
    """One process's learning: background fits after measuring requests, fits on demand, and the
    fidelity reports (cached until new measurements arrive)."""

    def __init__(self, sessions: sessionmaker[Session], catalog: HardwareCatalog, settings: Settings,
                 run_task: TaskRunner | None = None) -> None:
        self.sessions = sessions
        self.catalog = catalog
        self.settings = settings
        self.fit_settings = FitSettings(max_evals=settings.learn_max_evals, register_tiles=settings.learn_register_tiles)
        # Reports parse MLIR: in the caller's sandbox (the service's pool), else in this process (the CLI).
        self._run_task: TaskRunner = run_task or (lambda fn, *args, timeout: fn(*args))
        self._fit_sandbox: Sandbox | None = None
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._again = False
        self._closed = False
        self._fidelity: dict[tuple[str, str, int, int], Fidelity] = {}

    # ----------------------------------------------------------------------- fitting

    def after_measuring(self) -> None:
        """A measuring request stored its timings: fit in the background if a fit is due (one
        fit at a time; a request finishing meanwhile asks for one more look afterwards)."""
        if not self.settings.learn_auto:
            return
        with self._lock:
            if self._closed:
                return
            if self._thread is not None and self._thread.is_alive():
                self._again = True
                return
            self._thread = threading.Thread(target=self._background, name="learner", daemon=True)
            self._thread.start()

    def _background(self) -> None:
        while True:
            try:
                self.refit_if_due(HOST_CPU)
            except Exception:  # a failed background fit must not take the process down; logged
                log.exception("background calibration fit failed")
            with self._lock:
                if not self._again or self._closed:
                    self._thread = None
                    return
                self._again = False

    def refit_if_due(self, name: str) -> FittedCalibration | None:
        """Fit and store a new version for `name` on this host when one is due (None: not due)."""
        host = this_host()
        with session_scope(self.sessions) as session:
            base = find_base_hardware(session, name).model
            count = measurements.count_learnable(session, host)
            why = refit_due(count, calibrations.newest(session, host, name), base.content_hash(),
                            self.settings.learn_min_measurements, self.settings.learn_min_modules)
        if why is None:
            return None
        log.info("fitting a calibration of %s on %s: %s", name, host, why)
        return self._fit(name, "auto", self._run_in_fit_process)

    def fit_now(self, name: str, source: str = "calibrate",
                progress: Callable[[str], None] = lambda _: None) -> tuple[FittedCalibration, OnlineFit]:
        """Fit `name` to this host's stored measurements now, in this process (the CLI)."""
        fit: list[OnlineFit] = []

        def run(modules, samples, base, label):
            fit.append(fit_online(modules, samples, base, self.fit_settings, label, progress))
            return fit[0]

        row = self._fit(name, source, run)
        return row, fit[0]

    def _fit(self, name: str, source: str, run: Callable[..., OnlineFit]) -> FittedCalibration:
        host = this_host()
        with session_scope(self.sessions) as session:
            base = find_base_hardware(session, name).model
            data = learning_data(session, host)
        if not data.samples:
            raise ValueError(f"no measurements of stored modules on {host} to fit {name} to")
        fit = run(data.modules, data.samples, base, f"measurements on {host}")
        row = store_fit(self.sessions, host, name, base, fit, data.count, source)
        self.catalog.forget(name)
        log.info("calibration %s v%d of %s: %s", host, row.version, name, row.reason)
        return row

    def _run_in_fit_process(self, modules: list[StoredModule], samples: list[Sample], base: HardwareModel,
                            label: str) -> OnlineFit:
        """The fit in a process of its own, started for it (fits are rare; it holds no memory between)."""
        with self._lock:
            if self._closed:
                raise RuntimeError("learner closed")
            sandbox = self._fit_sandbox = Sandbox(workers=1, start_method="forkserver")
        timeout = self.settings.learn_fit_timeout_s
        try:
            return result_of(sandbox.submit(fit_at_low_priority, modules, samples, base, self.fit_settings, label,
                                            timeout=timeout), timeout)
        finally:
            with self._lock:
                if self._fit_sandbox is sandbox:
                    self._fit_sandbox = None
            sandbox.close()

    def wait_idle(self, timeout: float) -> bool:
        """Wait for the background fit (tests, shutdown); whether it finished."""
        with self._lock:
            thread = self._thread
        if thread is not None:
            thread.join(timeout)
            return not thread.is_alive()
        return True

    def close(self) -> None:
        with self._lock:
            self._closed = True
            sandbox, self._fit_sandbox = self._fit_sandbox, None
        if sandbox is not None:
            sandbox.close()  # stops a running fit: it is redone after the next measuring request

    # ----------------------------------------------------------------------- reports

    def report(self, name: str) -> HardwareLearning:
        """`name`'s model (calibrated when in use) held to this host's stored measurements, and
        its calibration state. Only `host-cpu`, or a name calibrated on this host, describes the
        CPU the measurements ran on."""
        host = this_host()
        with session_scope(self.sessions) as session:
            base = find_base_hardware(session, name)
            model = find_hardware(session, name).model
            status = calibration_status(session, host, name, base.model.content_hash())
            if name != HOST_CPU and status.newest_version is None:
                note = (f"measurements are taken on this server's CPU ({host}) for {HOST_CPU}; "
                        f"{name} describes another machine")
                return HardwareLearning(fidelity=_fidelity_out(host, model, None, note), calibration=status)
            count = measurements.count_learnable(session, host)
            if count.measurements == 0:
                return HardwareLearning(fidelity=_fidelity_out(host, model, None, "no measurements stored for this host"),
                                        calibration=status)
            key = (host, model.content_hash(), count.last_id, count.measurements)
            cached = self._fidelity.get(key)
            data = None if cached is not None else learning_data(session, host)
        if cached is None:
            assert data is not None
            try:
                cached = self._run_task(fidelity_of, data.modules, data.samples, model, timeout=FIDELITY_TIMEOUT_S)
            except IRError as exc:  # a timeout or a crash predicting them: the report says so
                return HardwareLearning(fidelity=_fidelity_out(host, model, None, f"fidelity not computed: {exc}"),
                                        calibration=status)
            with self._lock:
                if len(self._fidelity) >= FIDELITY_CACHE:
                    self._fidelity.pop(next(iter(self._fidelity)))
                self._fidelity[key] = cached
        return HardwareLearning(fidelity=_fidelity_out(host, model, cached, None), calibration=status)
