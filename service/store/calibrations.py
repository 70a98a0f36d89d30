"""Fitted calibrations: versions of a hardware name's profile fitted to one host's stored
measurements (service.measure.online_fit), and which one, if any, is in use.

In use: the newest version for (host, name), when it beat the uncalibrated profile on held-out
modules and was fitted on the profile the name resolves to now. The newest is judged on the
most measurements, so a newer version that lost also retires the ones before it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from .models import FittedCalibration


@dataclass(frozen=True)
class NewCalibration:
    host_key: str
    hardware_name: str
    base_hash: str
    profile_hash: str
    profile: dict[str, Any]
    n_measurements: int
    n_modules: int
    last_measurement_id: int
    scores: dict[str, Any]
    used: bool
    reason: str
    source: str  # auto, calibrate


def save_calibration(session: Session, new: NewCalibration) -> FittedCalibration:
    """Store `new` as the next version of (host, name). Raises IntegrityError when another
    process stored that version first (the caller retries in a new transaction)."""
    version = 1 + (session.scalar(
        select(func.max(FittedCalibration.version)).where(
            FittedCalibration.host_key == new.host_key, FittedCalibration.hardware_name == new.hardware_name)
    ) or 0)
    row = FittedCalibration(version=version, **asdict(new))
    session.add(row)
    session.flush()
    return row


def newest(session: Session, host_key: str, hardware_name: str) -> FittedCalibration | None:
    statement = (
        select(FittedCalibration)
        .where(FittedCalibration.host_key == host_key, FittedCalibration.hardware_name == hardware_name)
        .order_by(FittedCalibration.version.desc())
        .limit(1)
    )
    return session.scalars(statement).first()


def list_calibrations(session: Session, host_key: str, hardware_name: str) -> list[FittedCalibration]:
    """Every version, newest first."""
    statement = (
        select(FittedCalibration)
        .where(FittedCalibration.host_key == host_key, FittedCalibration.hardware_name == hardware_name)
        .order_by(FittedCalibration.version.desc())
    )
    return list(session.scalars(statement))


@dataclass(frozen=True)
class InUse:
    """The calibration a name resolves to on a host (None: the uncalibrated profile), and why."""

    calibration: FittedCalibration | None
    reason: str
    newest: FittedCalibration | None


def in_use(session: Session, host_key: str, hardware_name: str, base_hash: str) -> InUse:
    last = newest(session, host_key, hardware_name)
    if last is None:
        return InUse(None, "no calibration fitted on this host yet", None)
    if not last.used:
        return InUse(None, f"version {last.version} not used: {last.reason}", last)
    if last.base_hash != base_hash:
        return InUse(None, f"version {last.version} was fitted on profile {last.base_hash}; "
                           f"{hardware_name} is now {base_hash} (refit pending)", last)
    return InUse(last, f"version {last.version}: {last.reason}", last)
