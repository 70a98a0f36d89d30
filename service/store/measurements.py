"""Measurements: plans compiled and timed on real hardware with IREE, kept per host with what it
takes to predict them again, so the cost model's fidelity on that host can be read off them and
a calibration fitted to them (service.tiling.learning)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, func, select
from sqlalchemy.orm import Session

from .models import Measurement, Module


def save_measurement(
    session: Session,
    *,
    plan_hash: str,
    hardware_hash: str,
    ok: bool,
    median_s: float | None = None,
    samples: Sequence[float] = (),
    config: dict[str, Any] | None = None,
    error: str | None = None,
    iree_version: str | None = None,
    decision_id: int | None = None,
    host_key: str | None = None,
    module_fingerprint: str | None = None,
    plan: Any | None = None,
    shape_hints: dict[str, Any] | None = None,
    cpu_s: float | None = None,
    default_cpu_s: float | None = None,
    is_default: bool = False,
    source: str | None = None,
) -> Measurement:
    measurement = Measurement(
        plan_hash=plan_hash,
        hardware_hash=hardware_hash,
        ok=ok,
        median_s=median_s,
        samples=list(samples),
        config=config or {},
        error=error,
        iree_version=iree_version,
        decision_id=decision_id,
        host_key=host_key,
        module_fingerprint=module_fingerprint,
        plan=plan,
        shape_hints=shape_hints or None,
        cpu_s=cpu_s,
        default_cpu_s=default_cpu_s,
        is_default=is_default,
        source=source,
    )
    session.add(measurement)
    session.flush()
    return measurement


def list_measurements(session: Session, plan_hash: str, hardware_hash: str | None = None) -> list[Measurement]:
    """Measurements of a plan, oldest first."""
    statement = select(Measurement).where(Measurement.plan_hash == plan_hash)
    if hardware_hash is not None:
        statement = statement.where(Measurement.hardware_hash == hardware_hash)
    return list(session.scalars(statement.order_by(Measurement.id)))


def _learnable(host_key: str) -> list[ColumnElement[bool]]:
    """Rows a model can be held to: timed, of a tiled plan (IREE's default is IREE's own config,
    not a plan the model predicts), on a stored module at its static shapes, on this host."""
    return [
        Measurement.host_key == host_key,
        Measurement.ok.is_(True),
        Measurement.is_default.is_(False),
        Measurement.cpu_s.is_not(None),
        Measurement.plan.is_not(None),
        Measurement.module_fingerprint.is_not(None),
        Measurement.shape_hints.is_(None),
    ]


@dataclass(frozen=True)
class LearnableCount:
    measurements: int
    modules: int
    last_id: int  # 0: none


def count_learnable(session: Session, host_key: str) -> LearnableCount:
    n, modules, last = session.execute(
        select(func.count(Measurement.id), func.count(func.distinct(Measurement.module_fingerprint)),
               func.max(Measurement.id)).where(*_learnable(host_key))
    ).one()
    return LearnableCount(int(n), int(modules), int(last or 0))


@dataclass(frozen=True)
class LearnableRow:
    id: int
    module_fingerprint: str
    plan: Any
    cpu_s: float
    default_cpu_s: float | None


def learnable_rows(session: Session, host_key: str, *, limit: int = 20000) -> list[LearnableRow]:
    """The host's learnable measurements, newest `limit` of them, oldest first."""
    statement = (
        select(Measurement.id, Measurement.module_fingerprint, Measurement.plan, Measurement.cpu_s,
               Measurement.default_cpu_s)
        .where(*_learnable(host_key))
        .order_by(Measurement.id.desc())
        .limit(limit)
    )
    rows = [LearnableRow(*row) for row in session.execute(statement)]
    return rows[::-1]


def module_texts(session: Session, fingerprints: Sequence[str]) -> dict[str, str]:
    """fingerprint -> module text, for those the store holds."""
    wanted = sorted(set(fingerprints))
    out: dict[str, str] = {}
    for i in range(0, len(wanted), 500):
        statement = select(Module.fingerprint, Module.text).where(Module.fingerprint.in_(wanted[i:i + 500]))
        out.update({fp: text for fp, text in session.execute(statement)})
    return out
