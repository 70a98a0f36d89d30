"""Measurements: plans compiled and timed on real hardware with IREE, kept per host so the cost
model's fidelity on that host can be read off them (and a calibration fitted to them)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from .models import Measurement


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
