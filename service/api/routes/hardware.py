"""/v1/hardware: built-in profiles and stored custom models."""

from __future__ import annotations

from fastapi import APIRouter

from service.api.deps import DbSession, TilingServiceDep, WriteAuth
from service.api.schemas import ErrorBody, HardwareList, HardwareOut
from service.hardware.model import HardwareModel
from service.hardware.profiles import get_profile, list_profiles
from service.store import repo

router = APIRouter(prefix="/v1/hardware", tags=["hardware"])


@router.post("", response_model=HardwareOut, status_code=201, dependencies=[WriteAuth])
def create_hardware(model: HardwareModel, session: DbSession, service: TilingServiceDep) -> HardwareOut:
    """Store a custom model; requests then name it. A stored name shadows a built-in profile
    (other API processes see it within their short name cache, HARDWARE_TTL_S)."""
    row = repo.upsert_hardware(session, model.content_hash(), model.name, model.model_dump(mode="json"))
    session.commit()
    service.forget_hardware(model.name)
    return HardwareOut.from_row(row)


@router.get("", response_model=HardwareList)
def list_hardware(session: DbSession) -> HardwareList:
    stored = {row.name: HardwareOut.from_row(row) for row in repo.list_hardware(session)}
    builtin = {name: HardwareOut.from_model(get_profile(name), "builtin") for name in list_profiles()}
    merged = builtin | stored
    return HardwareList(items=[merged[name] for name in sorted(merged)])


@router.get("/{name}", response_model=HardwareOut, responses={404: {"model": ErrorBody}})
def get_hardware(name: str, session: DbSession) -> HardwareOut:
    row = repo.get_hardware_by_name(session, name)
    if row is not None:
        return HardwareOut.from_row(row)
    return HardwareOut.from_model(get_profile(name), "builtin")  # UnknownHardwareError -> 404
