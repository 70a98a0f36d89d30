"""The store's tables as SQLAlchemy 2 typed ORM classes.

Relationships are never lazy-loaded: repository functions load exactly what they return, so a
row used after its session closed cannot trigger surprise queries (or fail far from the cause).
Changing a table here needs a new migration in ``migrations/versions`` (a test checks they agree).
"""

from __future__ import annotations

import enum
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    CheckConstraint,
    DateTime,
    Dialect,
    Enum,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    false,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# Deterministic constraint names: migrations (and SQLite batch rebuilds) refer to them by name.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# JSON everywhere, JSONB on PostgreSQL (indexable, compact). Python None is SQL NULL, not JSON null.
JSONType = JSON(none_as_null=True).with_variant(JSONB(none_as_null=True), "postgresql")

# Hex digests (sha256 = 64 chars) with room for a prefix such as "sha256:".
HASH_LEN = 80


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC timestamp on every backend.

    PostgreSQL stores ``timestamptz``; SQLite has no time zones, so values are stored as naive
    UTC (which also keeps its text comparison correct) and read back as aware UTC.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to the store; use an aware one (UTC)")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class DecisionStatus(enum.StrEnum):
    PENDING = "pending"
    DONE = "done"
    FAILED = "failed"


class Module(Base):
    """An MLIR module as submitted, by structural fingerprint."""

    __tablename__ = "modules"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    fingerprint: Mapped[str] = mapped_column(String(HASH_LEN), unique=True)
    text: Mapped[str] = mapped_column(Text)
    op_summary: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class HardwareModel(Base):
    """A hardware model (pydantic ``HardwareModel`` as JSON), by content hash."""

    __tablename__ = "hardware_models"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    hash: Mapped[str] = mapped_column(String(HASH_LEN), unique=True)
    # Not unique: editing a named model yields a new hash; lookups by name take the newest.
    name: Mapped[str] = mapped_column(String(200), index=True)
    spec: Mapped[dict[str, Any]] = mapped_column(JSONType)
    # Stored by a user under its name (POST /v1/hardware): it shadows the profile of that name.
    # Rows recorded only because a decision used the model (its hash names it) do not.
    custom: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class Decision(Base):
    """One answer to "how to tile this module on this hardware", keyed by all its inputs.

    The key parts are plain columns, not foreign keys: they are content hashes that identify
    their inputs on their own, and a decision can be claimed before its module row exists.
    """

    __tablename__ = "decisions"
    __table_args__ = (
        CheckConstraint("status IN ('pending', 'done', 'failed')", name="status"),
        Index("ix_decisions_fingerprint_id", "module_fingerprint", "id"),
        Index("ix_decisions_hardware_id", "hardware_hash", "id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    key: Mapped[str] = mapped_column(String(HASH_LEN), unique=True)
    module_fingerprint: Mapped[str] = mapped_column(String(HASH_LEN))
    hardware_hash: Mapped[str] = mapped_column(String(HASH_LEN))
    search_space_version: Mapped[str] = mapped_column(String(64))
    cost_model_version: Mapped[str] = mapped_column(String(64))
    objective: Mapped[str] = mapped_column(String(64))
    shape_bucket: Mapped[str] = mapped_column(String(200))
    provider_version: Mapped[str] = mapped_column(String(100))

    status: Mapped[DecisionStatus] = mapped_column(
        Enum(
            DecisionStatus,
            native_enum=False,
            create_constraint=False,  # the named CHECK above; portable and migration-stable
            length=16,
            values_callable=lambda members: [member.value for member in members],
        ),
        default=DecisionStatus.PENDING,
    )
    plan: Mapped[Any | None] = mapped_column(JSONType, default=None)
    predicted_cost: Mapped[dict[str, Any] | None] = mapped_column(JSONType, default=None)
    baseline: Mapped[dict[str, Any] | None] = mapped_column(JSONType, default=None)
    transform_script: Mapped[str | None] = mapped_column(Text, default=None)
    tiled_module: Mapped[str | None] = mapped_column(Text, default=None)
    # Per anchor op: the IREE compilation_info attribute (text) and its parts.
    compilation_info: Mapped[dict[str, Any] | None] = mapped_column(JSONType, default=None)
    # The IREE tuning spec that gives the plan's contraction anchors their configs.
    tuning_spec: Mapped[str | None] = mapped_column(Text, default=None)
    origin_map: Mapped[dict[str, Any] | None] = mapped_column(JSONType, default=None)
    # strategy, budget, seed, evaluations, evaluations_per_s, complete
    search_stats: Mapped[dict[str, Any] | None] = mapped_column(JSONType, default=None)
    timings: Mapped[dict[str, Any] | None] = mapped_column(JSONType, default=None)
    error: Mapped[str | None] = mapped_column(Text, default=None)
    # The searches behind the plan, per strategy: {"tpe": {"budget", "seconds", "complete"}}.
    # A request asking for more effort refines the decision (service.store.decisions).
    effort: Mapped[dict[str, Any] | None] = mapped_column(JSONType, default=None)
    # The normalised key (service.ir.lexical) of the module text the stored texts came from.
    realised_for: Mapped[str | None] = mapped_column(String(HASH_LEN), default=None)

    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)
    # Single-flight: who is computing a pending decision, and until when that claim holds.
    lease_owner: Mapped[str | None] = mapped_column(String(200), default=None)
    lease_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime, default=None)


class Trial(Base):
    """One evaluated candidate of a decision's search."""

    __tablename__ = "trials"
    __table_args__ = (UniqueConstraint("decision_id", "number"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    decision_id: Mapped[int] = mapped_column(ForeignKey("decisions.id", ondelete="CASCADE"))
    number: Mapped[int] = mapped_column(Integer)
    plan: Mapped[Any] = mapped_column(JSONType)
    plan_hash: Mapped[str] = mapped_column(String(HASH_LEN), index=True)
    cost: Mapped[dict[str, Any] | None] = mapped_column(JSONType, default=None)
    latency_s: Mapped[float | None] = mapped_column(Float, default=None)
    feasible: Mapped[bool] = mapped_column(Boolean)
    reason: Mapped[str | None] = mapped_column(Text, default=None)


class GroupRecord(Base):
    """The best known plan of one tile group (by signature) on one hardware: warm starts."""

    __tablename__ = "group_records"
    __table_args__ = (UniqueConstraint("signature", "hardware_hash"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    signature: Mapped[str] = mapped_column(String(HASH_LEN))
    hardware_hash: Mapped[str] = mapped_column(String(HASH_LEN))
    plan: Mapped[Any] = mapped_column(JSONType)
    latency_s: Mapped[float] = mapped_column(Float)
    decision_id: Mapped[int | None] = mapped_column(
        ForeignKey("decisions.id", ondelete="SET NULL"), default=None
    )
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)


class Measurement(Base):
    """A plan compiled and timed on real hardware (IREE), successful or not, with what it takes
    to predict it again: the plan, the module (by fingerprint, a `modules` row), the host
    (service.measure.cache.host_key) and the shape hints it was measured at."""

    __tablename__ = "measurements"
    __table_args__ = (
        Index("ix_measurements_plan_hardware", "plan_hash", "hardware_hash"),
        Index("ix_measurements_host_id", "host_key", "id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    decision_id: Mapped[int | None] = mapped_column(
        ForeignKey("decisions.id", ondelete="SET NULL"), default=None, index=True
    )
    plan_hash: Mapped[str] = mapped_column(String(HASH_LEN))
    hardware_hash: Mapped[str] = mapped_column(String(HASH_LEN))
    config: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    ok: Mapped[bool] = mapped_column(Boolean)
    median_s: Mapped[float | None] = mapped_column(Float, default=None)
    samples: Mapped[list[float]] = mapped_column(JSONType, default=list)
    error: Mapped[str | None] = mapped_column(Text, default=None)
    iree_version: Mapped[str | None] = mapped_column(String(100), default=None)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    # Rows from before migration 0006 have none of these: they are not learnt from.
    host_key: Mapped[str | None] = mapped_column(String(100), default=None)
    module_fingerprint: Mapped[str | None] = mapped_column(String(HASH_LEN), default=None)
    plan: Mapped[Any | None] = mapped_column(JSONType, default=None)
    shape_hints: Mapped[dict[str, Any] | None] = mapped_column(JSONType, default=None)
    # Load-robust time (CPU time per benchmark thread), and IREE's default's timed in the same rounds.
    cpu_s: Mapped[float | None] = mapped_column(Float, default=None)
    default_cpu_s: Mapped[float | None] = mapped_column(Float, default=None)
    is_default: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    source: Mapped[str | None] = mapped_column(String(16), default=None)  # tiling, job, tune, calibrate


class FittedCalibration(Base):
    """A profile fitted to one host's stored measurements (service.measure.online_fit): version
    N of (host, hardware name). Only the newest version is a candidate for use, and only when it
    beat the uncalibrated profile on held-out modules (`used`) and was fitted on the profile the
    name resolves to now (`base_hash`)."""

    __tablename__ = "calibrations"
    __table_args__ = (UniqueConstraint("host_key", "hardware_name", "version"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    host_key: Mapped[str] = mapped_column(String(100))
    hardware_name: Mapped[str] = mapped_column(String(200))
    version: Mapped[int] = mapped_column(Integer)
    base_hash: Mapped[str] = mapped_column(String(HASH_LEN))
    profile_hash: Mapped[str] = mapped_column(String(HASH_LEN))
    profile: Mapped[dict[str, Any]] = mapped_column(JSONType)
    n_measurements: Mapped[int] = mapped_column(Integer)
    n_modules: Mapped[int] = mapped_column(Integer)
    # The newest measurement row the fit saw: a later fit is due only when more arrived.
    last_measurement_id: Mapped[int] = mapped_column(Integer)
    # Held-out scores per module (base and calibrated) and their medians.
    scores: Mapped[dict[str, Any]] = mapped_column(JSONType)
    used: Mapped[bool] = mapped_column(Boolean)
    reason: Mapped[str] = mapped_column(Text)
    source: Mapped[str] = mapped_column(String(16))  # auto, calibrate
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class ItemState(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


class Job(Base):
    """A batch of tiling searches (a model's dispatches or a list of modules) run by workers.

    Its state is not stored: it follows from its items' states (service.store.jobs.job_state),
    so no worker has to update a shared row as items finish.
    """

    __tablename__ = "jobs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))  # "items" or "model"
    # A profile name, or an inline hardware model as JSON.
    hardware: Mapped[Any] = mapped_column(JSONType)
    # budget, seconds, strategy, seed, measure_top, reuse: what every item's search gets.
    options: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    queue: Mapped[str] = mapped_column(String(100))
    # For a model: the dispatches left to IREE, with why (reported beside the spec).
    notes: Mapped[Any | None] = mapped_column(JSONType, default=None)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)


class JobItem(Base):
    """One search of a job: a module, its shape hints, and where its run stands."""

    __tablename__ = "job_items"
    __table_args__ = (
        CheckConstraint("state IN ('queued', 'running', 'done', 'failed', 'cancelled')", name="state"),
        UniqueConstraint("job_id", "position"),
        Index("ix_job_items_state_id", "state", "id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    position: Mapped[int] = mapped_column(Integer)
    name: Mapped[str] = mapped_column(String(200))
    module: Mapped[str] = mapped_column(Text)
    shape_hints: Mapped[dict[str, Any] | None] = mapped_column(JSONType, default=None)
    weight: Mapped[int] = mapped_column(Integer, default=1)  # times one run of the model dispatches it
    state: Mapped[ItemState] = mapped_column(
        Enum(ItemState, native_enum=False, create_constraint=False, length=16,
             values_callable=lambda members: [member.value for member in members]),
        default=ItemState.QUEUED,
    )
    # Who runs it now (one run of one worker); trials and results from any other run are refused.
    run_owner: Mapped[str | None] = mapped_column(String(200), default=None)
    # Asked of the running search: "cancel" (the job was cancelled) or "release" (the worker stops).
    stop: Mapped[str | None] = mapped_column(String(16), default=None)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    queue_job_id: Mapped[int | None] = mapped_column(Integer, default=None)  # procrastinate's job
    decision_id: Mapped[int | None] = mapped_column(ForeignKey("decisions.id", ondelete="SET NULL"), default=None)
    trials: Mapped[int] = mapped_column(Integer, default=0)  # trials stored so far, by every run
    cache: Mapped[str | None] = mapped_column(String(16), default=None)  # hit, warm or miss
    error: Mapped[str | None] = mapped_column(Text, default=None)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime, default=None)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime, default=None)
    heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime, default=None)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class ModelRun(Base):
    """One whole model tuned (`tilesearch model tune`): what went in, the per-dispatch report,
    and the IREE tuning spec that came out."""

    __tablename__ = "model_runs"
    __table_args__ = (Index("ix_model_runs_fingerprint_id", "fingerprint", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    fingerprint: Mapped[str] = mapped_column(String(HASH_LEN))  # sha256 of the model's text as given
    name: Mapped[str] = mapped_column(String(200))
    hardware: Mapped[str] = mapped_column(String(200))  # the hardware model's name
    hardware_hash: Mapped[str] = mapped_column(String(HASH_LEN))
    # budget, seconds, seed, measure_top: what the run was asked for.
    options: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    # One entry per dispatch IREE formed: tuned or left to IREE with why, predictions, measurements.
    dispatches: Mapped[list[dict[str, Any]]] = mapped_column(JSONType, default=list)
    predicted_total_s: Mapped[float] = mapped_column(Float)
    verified: Mapped[bool] = mapped_column(Boolean)
    spec: Mapped[str | None] = mapped_column(Text, default=None)  # None: nothing was tuned
    elapsed_s: Mapped[float] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class ModelRunDecision(Base):
    """A tuned dispatch of a model run and the decision its module has (an ordinary decision:
    a later request for the same dispatch is served from it)."""

    __tablename__ = "model_run_decisions"
    __table_args__ = (UniqueConstraint("run_id", "name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("model_runs.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(300))  # IREE's name of the dispatch function
    decision_id: Mapped[int | None] = mapped_column(ForeignKey("decisions.id", ondelete="SET NULL"), default=None)
