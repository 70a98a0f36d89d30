"""/v1/hardware: built-in profiles and stored custom models."""

from __future__ import annotations

from fastapi import APIRouter

from service.api.deps import DbSession, TilingServiceDep, TokenAuth
from service.api.schemas import ErrorBody, HardwareDetail, HardwareList, HardwareOut
from service.hardware.model import HardwareModel
from service.tiling.hardware import NamedHardware, find_hardware, list_named_hardware

router = APIRouter(prefix="/v1/hardware", tags=["hardware"], dependencies=[TokenAuth])


@router.post("", response_model=HardwareOut, status_code=201, responses={409: {"model": ErrorBody}})
def create_hardware(model: HardwareModel, service: TilingServiceDep) -> HardwareOut:
    """Store a custom model; requests then name it. A stored name shadows a fixed built-in
    profile (other API processes see it within their short name cache, HARDWARE_TTL_S); the
    detected host's name is refused (409)."""
    return HardwareOut.from_named(NamedHardware(service.hardware.store(model), "stored"))


@router.get("", response_model=HardwareList)
def list_hardware(session: DbSession) -> HardwareList:
    return HardwareList(items=[HardwareOut.from_named(named) for named in list_named_hardware(session)])


@router.get("/{name}", response_model=HardwareDetail, responses={404: {"model": ErrorBody}})
def get_hardware(name: str, session: DbSession, service: TilingServiceDep) -> HardwareDetail:
    """The model the name resolves to (calibrated when a calibration is in use on this host), its
    fidelity on this host's stored measurements and its calibration state."""
    named = find_hardware(session, name)  # UnknownHardwareError -> 404
    return HardwareDetail.from_parts(named, service.learner.report(name))
