"""Hardware by name: the one place a name (or an inline model) becomes a HardwareModel.

A name is a custom model stored through the API (the newest of that name), else a profile
(a JSON profile in the hardware dir, else a built-in). A stored name shadows a profile.
An unknown name raises UnknownHardwareError listing every known name, stored ones included.
On top of that base, the calibration in use for the name on this host (service.store
.calibrations: the newest fitted version, when it beat the base on held-out modules) replaces
it: its content hash differs, so decisions made under the base are not served under it.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from functools import cache
from typing import Literal

from sqlalchemy.orm import Session, sessionmaker

from service.hardware.model import HardwareModel
from service.hardware.profiles import HOST_CPU, UnknownHardwareError, get_profile, list_profiles
from service.measure.cache import host_key
from service.store import calibrations, catalog
from service.store.db import session_scope

from .errors import ReservedHardwareName

HardwareSource = Literal["builtin", "stored"]

# How long a process keeps a name's model: a model stored under an existing name by another
# process takes effect within this time, and the cache-hit path makes no database query.
HARDWARE_TTL_S = 1.0


@dataclass(frozen=True)
class NamedHardware:
    model: HardwareModel
    source: HardwareSource
    calibration_version: int | None = None  # the stored calibration in use on this host, if any


@cache
def this_host() -> str:
    """The CPU this process measures on (service.measure.cache.host_key), read once."""
    return host_key()


def known_hardware_names(session: Session) -> list[str]:
    return sorted(set(list_profiles()) | {row.name for row in catalog.list_hardware(session)})


def find_base_hardware(session: Session, name: str) -> NamedHardware:
    """The model called `name` before any stored calibration; UnknownHardwareError if none. The
    detected host is never a stored row's (one stored before store_hardware refused the name)."""
    stored = catalog.get_hardware_by_name(session, name) if name != HOST_CPU else None
    if stored is not None:
        return NamedHardware(HardwareModel.model_validate(stored.spec), "stored")
    try:
        return NamedHardware(get_profile(name), "builtin")
    except UnknownHardwareError:
        raise UnknownHardwareError(name, known_hardware_names(session)) from None


def _calibrated(session: Session, name: str, base: NamedHardware) -> NamedHardware:
    used = calibrations.in_use(session, this_host(), name, base.model.content_hash()).calibration
    if used is None:
        return base
    return NamedHardware(HardwareModel.model_validate(used.profile), base.source, used.version)


def find_hardware(session: Session, name: str) -> NamedHardware:
    """The model called `name` (calibrated when a calibration is in use on this host) and where
    it comes from; UnknownHardwareError if none."""
    return _calibrated(session, name, find_base_hardware(session, name))


def resolve_hardware(session: Session, spec: str | HardwareModel) -> HardwareModel:
    """An inline model as given; a name as `find_hardware` finds it."""
    if isinstance(spec, HardwareModel):
        return spec
    return find_hardware(session, spec).model


def list_named_hardware(session: Session) -> list[NamedHardware]:
    """Every known model by name, a stored one in place of a profile of the same name."""
    builtin = {name: NamedHardware(get_profile(name), "builtin") for name in list_profiles()}
    stored = {row.name: NamedHardware(HardwareModel.model_validate(row.spec), "stored") for row in catalog.list_hardware(session)
              if row.name != HOST_CPU}
    merged = builtin | stored
    return [_calibrated(session, name, merged[name]) for name in sorted(merged)]


def store_hardware(session: Session, model: HardwareModel) -> HardwareModel:
    """Store a custom model (idempotent by content hash); the stored model is returned. It may
    shadow a fixed built-in profile, never the detected host (ReservedHardwareName)."""
    if model.name == HOST_CPU:
        raise ReservedHardwareName(model.name)
    row = catalog.upsert_hardware(session, model.content_hash(), model.name, model.model_dump(mode="json"), custom=True)
    return HardwareModel.model_validate(row.spec)


class HardwareCatalog:
    """`resolve_hardware` for one process's requests, each name remembered for HARDWARE_TTL_S."""

    def __init__(self, sessions: sessionmaker[Session], ttl_s: float = HARDWARE_TTL_S) -> None:
        self.sessions = sessions
        self.ttl_s = ttl_s
        self._by_name: dict[str, tuple[float, HardwareModel]] = {}
        self._lock = threading.Lock()

    def resolve(self, spec: str | HardwareModel) -> HardwareModel:
        if isinstance(spec, HardwareModel):
            return spec
        now = time.monotonic()
        cached = self._by_name.get(spec)
        if cached is not None and now - cached[0] < self.ttl_s:
            return cached[1]
        with session_scope(self.sessions) as session:
            model = find_hardware(session, spec).model
        with self._lock:
            self._by_name[spec] = (now, model)
        return model

    def store(self, model: HardwareModel) -> HardwareModel:
        """Store a custom model; this process uses it under its name from now on."""
        with session_scope(self.sessions) as session:
            stored = store_hardware(session, model)
        self.forget(model.name)
        return stored

    def forget(self, name: str) -> None:
        with self._lock:
            self._by_name.pop(name, None)
