"""Modules and hardware models in the store, by content hash (queries over a Session; the
caller's ``session_scope`` commits)."""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import Table, func, select
from sqlalchemy.orm import Session

from service.store.models import HardwareModel, Module
from service.store.query import upsert_insert


def upsert_module(
    session: Session, fingerprint: str, text: str, op_summary: dict[str, Any] | None = None
) -> Module:
    """Store a module by fingerprint; the first stored text wins (same structure anyway)."""
    statement = (
        upsert_insert(session, cast(Table, Module.__table__))
        .values(fingerprint=fingerprint, text=text, op_summary=op_summary or {})
        .on_conflict_do_nothing(index_elements=["fingerprint"])
    )
    session.execute(statement)
    return session.scalars(select(Module).where(Module.fingerprint == fingerprint)).one()


def get_module(session: Session, fingerprint: str) -> Module | None:
    return session.scalars(select(Module).where(Module.fingerprint == fingerprint)).one_or_none()


def upsert_hardware(
    session: Session, hardware_hash: str, name: str, spec: dict[str, Any], *, custom: bool = False
) -> HardwareModel:
    """Store a hardware model by content hash (same hash = same model). `custom`: a user stored
    it under its name (it then shadows the profile of that name; a row a decision recorded
    becomes custom when a user stores the same model)."""
    insert = upsert_insert(session, cast(Table, HardwareModel.__table__)).values(
        hash=hardware_hash, name=name, spec=spec, custom=custom)
    statement = (insert.on_conflict_do_update(index_elements=["hash"], set_={"custom": True}) if custom
                 else insert.on_conflict_do_nothing(index_elements=["hash"]))
    session.execute(statement)
    return session.scalars(select(HardwareModel).where(HardwareModel.hash == hardware_hash)).one()


def get_hardware(session: Session, hardware_hash: str) -> HardwareModel | None:
    return session.scalars(select(HardwareModel).where(HardwareModel.hash == hardware_hash)).one_or_none()


def get_hardware_by_name(session: Session, name: str) -> HardwareModel | None:
    """The newest model a user stored under ``name`` (not those recorded for decisions)."""
    statement = (
        select(HardwareModel)
        .where(HardwareModel.name == name, HardwareModel.custom.is_(True))
        .order_by(HardwareModel.id.desc())
        .limit(1)
    )
    return session.scalars(statement).first()


def list_hardware(session: Session) -> list[HardwareModel]:
    """The newest model users stored under every name, by name."""
    newest = select(func.max(HardwareModel.id)).where(HardwareModel.custom.is_(True)).group_by(HardwareModel.name)
    statement = (
        select(HardwareModel).where(HardwareModel.id.in_(newest)).order_by(HardwareModel.name)
    )
    return list(session.scalars(statement))
