"""View models: stored rows and their JSON turned into what the dashboard's templates show.

Templates only format; every number they print is computed here, with None where the store has
no value (the template prints "—"). Times are seconds here, formatted by the template filters.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from scipy.stats import spearmanr
from sqlalchemy.orm import Session

from service.hardware.model import HardwareModel
from service.hardware.profiles import list_profiles
from service.store import catalog
from service.store.dashboard_queries import PredictedMeasured
from service.store.models import Decision, Module, Trial
from service.tiling.hardware import find_hardware

# `func.func @name(` / `func.func private @"quoted name"(`: the name people know a module by.
_FUNC_NAME = re.compile(r'func\.func\s+(?:(?:public|private|nested)\s+)?@("(?:[^"\\]|\\.)*"|[\w$.-]+)')


def function_names(module_text: str | None) -> list[str]:
    return [name.strip('"') for name in _FUNC_NAME.findall(module_text or "")]


def status_of(row: Decision) -> str:
    return str(getattr(row.status, "value", row.status))


# --------------------------------------------------------------------------- hardware names


@dataclass(frozen=True)
class KnownHardware:
    """A hardware model the server can name: a built-in profile or a stored custom model."""

    name: str
    hash: str
    source: str  # builtin / stored
    model: HardwareModel


def known_hardware(session: Session) -> list[KnownHardware]:
    """Every name as the API resolves it: stored models shadow built-in profiles of the same
    name, and a calibration in use on this host replaces the model."""
    found: dict[str, KnownHardware] = {}
    for name in sorted(set(list_profiles()) | {row.name for row in catalog.list_hardware(session)}):
        try:
            named = find_hardware(session, name)
        except ValueError:  # an invalid JSON profile in the hardware dir: not nameable
            continue
        found[name] = KnownHardware(name, named.model.content_hash(), named.source, named.model)
    return [found[name] for name in sorted(found)]


def hardware_names(session: Session, hardware: list[KnownHardware], hashes: set[str]) -> dict[str, str]:
    """hash -> name for every hash given (older stored versions of a name included)."""
    names = {h.hash: h.name for h in hardware}
    for h in hashes - names.keys():
        row = catalog.get_hardware(session, h)
        if row is not None:
            names[h] = row.name
    return names


def hardware_model_for(session: Session, hardware_hash: str, hardware: list[KnownHardware]) -> HardwareModel | None:
    """The model a decision was made for, when this server knows it (an inline model it does not)."""
    for h in hardware:
        if h.hash == hardware_hash:
            return h.model
    row = catalog.get_hardware(session, hardware_hash)
    return HardwareModel.model_validate(row.spec) if row is not None else None


# --------------------------------------------------------------------------- decisions list


@dataclass
class Measured:
    """IREE timings of the answered plan and of IREE's own default, when the search measured."""

    latency_s: float | None
    iree_default_s: float | None
    speedup_vs_iree: float | None
    not_measurable: str | None = None
    candidates: list[dict] = field(default_factory=list)
    chosen: int | None = None


def measured_of(search_stats: dict | None) -> Measured | None:
    """`search_stats.measured` (tune --measure-top's block), or None when nothing was measured."""
    block = (search_stats or {}).get("measured")
    if not block:
        return None
    candidates = list(block.get("candidates") or [])
    chosen = block.get("chosen")
    latency = candidates[chosen].get("cpu_s") if chosen is not None and 0 <= chosen < len(candidates) else None
    default = block.get("default_cpu_s")
    if block.get("kept") == "iree_default":  # the service kept IREE's own config: that is the answer's time
        latency = default
    return Measured(
        latency_s=latency,
        iree_default_s=default,
        speedup_vs_iree=default / latency if default and latency else None,
        not_measurable=block.get("not_measurable"),
        candidates=candidates,
        chosen=chosen,
    )


@dataclass
class DecisionRow:
    id: int
    status: str
    function: str  # first function name, "" when the module is not stored
    fingerprint: str
    hardware_name: str
    hardware_hash: str
    predicted_s: float | None
    super_tiling_s: float | None
    speedup_vs_super_tiling: float | None
    measured: Measured | None
    cache: str | None
    evaluations: int | None
    created_at: datetime


def _latency(cost: dict | None) -> float | None:
    value = (cost or {}).get("latency_s")
    return float(value) if isinstance(value, (int, float)) else None


def decision_row(row: Decision, module: Module | None, names: dict[str, str]) -> DecisionRow:
    predicted, baseline = _latency(row.predicted_cost), _latency(row.baseline)
    stats = row.search_stats or {}
    functions = function_names(module.text if module else None)
    return DecisionRow(
        id=row.id,
        status=status_of(row),
        function=functions[0] if functions else "",
        fingerprint=row.module_fingerprint,
        hardware_name=names.get(row.hardware_hash) or (row.predicted_cost or {}).get("hardware") or "",
        hardware_hash=row.hardware_hash,
        predicted_s=predicted,
        super_tiling_s=baseline,
        speedup_vs_super_tiling=baseline / predicted if predicted and baseline else None,
        measured=measured_of(stats),
        cache=stats.get("cache"),
        evaluations=stats.get("evaluations"),
        created_at=row.created_at,
    )


# --------------------------------------------------------------------------- decision detail


@dataclass
class LevelBar:
    """One memory level of the chosen plan: footprint against capacity, traffic, time."""

    name: str
    footprint_bytes: int
    capacity_bytes: int
    traffic_bytes: int
    time_s: float | None
    fill_percent: float  # footprint / capacity, capped at 100 for the bar's width
    over: bool  # footprint exceeds capacity


def level_bars(cost: dict | None) -> list[LevelBar]:
    bars = []
    for level in (cost or {}).get("levels", []):
        footprint, capacity = int(level.get("footprint_bytes", 0)), int(level.get("capacity_bytes", 0))
        ratio = footprint / capacity if capacity else 0.0
        bars.append(LevelBar(
            name=level.get("name", "?"), footprint_bytes=footprint, capacity_bytes=capacity,
            traffic_bytes=int(level.get("traffic_bytes", 0)), time_s=level.get("time_s"),
            fill_percent=min(100.0, 100.0 * ratio), over=ratio > 1.0,
        ))
    return bars


@dataclass
class GroupTiles:
    """One tile group of the plan: anchor, fused members, tile sizes per level."""

    index: int
    anchor: int
    anchor_name: str
    fused: list[int]
    dims: list[str]  # "d0 (parallel)", ...
    levels: list[dict]  # {"level": i, "loop": "forall", "tile_sizes": [...]}


def group_tiles(plan: dict | None, graph: dict | None) -> list[GroupTiles]:
    ops = {op["uid"]: op for op in (graph or {}).get("ops", [])}
    out = []
    for index, group in enumerate((plan or {}).get("groups", [])):
        op = ops.get(group["anchor"], {})
        iterators = op.get("iterator_types") or []
        width = max((len(level["tile_sizes"]) for level in group["levels"]), default=0)
        dims = [f"d{d}" + (f" ({iterators[d]})" if d < len(iterators) else "") for d in range(width)]
        out.append(GroupTiles(
            index=index, anchor=group["anchor"], anchor_name=op.get("name", ""),
            fused=list(group.get("fuse", [])), dims=dims,
            levels=[{"level": i, "loop": level.get("loop", "for"), "tile_sizes": level["tile_sizes"]}
                    for i, level in enumerate(group["levels"])],
        ))
    return out


@dataclass
class TrialPoint:
    number: int
    latency_s: float
    peak_footprint_bytes: int
    pareto: bool = False
    chosen: bool = False


def peak_on_chip_footprint(cost: dict | None) -> int:
    """The largest footprint of the levels below the outermost (on-chip: caches, SRAM); the
    outermost level holds the whole problem whatever the plan, so it would hide the tiling."""
    levels = (cost or {}).get("levels", [])
    inner = levels[1:] or levels
    return max((int(level.get("footprint_bytes", 0)) for level in inner), default=0)


def mark_pareto(points: list[TrialPoint]) -> None:
    """Pareto front on (latency, footprint), both minimised: no other point is at least as good
    on both and better on one."""
    best_latency = float("inf")
    for p in sorted(points, key=lambda q: (q.peak_footprint_bytes, q.latency_s)):
        if p.latency_s < best_latency:
            p.pareto = True
            best_latency = p.latency_s


@dataclass
class TrialsView:
    points: list[TrialPoint]  # feasible trials with a cost
    infeasible: int
    total: int
    truncated: bool  # more trials are stored than were read

    def chart_json(self) -> dict:
        """Arrays for the charts: scatter sorted by footprint (uPlot wants ascending x)."""
        by_footprint = sorted(self.points, key=lambda p: (p.peak_footprint_bytes, p.latency_s))
        by_number = sorted(self.points, key=lambda p: p.number)
        best, best_so_far = float("inf"), []
        for p in by_number:
            best = min(best, p.latency_s)
            best_so_far.append(best)
        return {
            "scatter": {
                "footprint_kib": [p.peak_footprint_bytes / 1024 for p in by_footprint],
                "latency_ms": [p.latency_s * 1e3 for p in by_footprint],
                "pareto_ms": [p.latency_s * 1e3 if p.pareto else None for p in by_footprint],
                "chosen_ms": [p.latency_s * 1e3 if p.chosen else None for p in by_footprint],
                "number": [p.number for p in by_footprint],
            },
            "progress": {
                "trial": [p.number for p in by_number],
                "latency_ms": [p.latency_s * 1e3 for p in by_number],
                "best_ms": [b * 1e3 for b in best_so_far],
            },
        }


def trials_view(trials: list[Trial], chosen_plan: Any, *, stored_total: int) -> TrialsView:
    points, infeasible = [], 0
    for t in trials:
        if not t.feasible or t.latency_s is None:
            infeasible += 1
            continue
        points.append(TrialPoint(
            number=t.number, latency_s=float(t.latency_s), peak_footprint_bytes=peak_on_chip_footprint(t.cost),
            chosen=chosen_plan is not None and t.plan == chosen_plan,
        ))
    mark_pareto(points)
    return TrialsView(points=points, infeasible=infeasible, total=len(trials), truncated=stored_total > len(trials))


@dataclass
class OriginRow:
    uid: int
    name: str
    fused: bool
    outside: bool
    copies: list[dict]


def origin_rows(origin_map: dict | None) -> list[OriginRow]:
    rows = []
    for uid, entry in sorted((origin_map or {}).items(), key=lambda item: int(item[0])):
        rows.append(OriginRow(uid=int(uid), name=entry.get("name", ""), fused=bool(entry.get("fused")),
                              outside=bool(entry.get("outside")), copies=list(entry.get("copies", []))))
    return rows


def compilation_info_text(compilation_info: dict | None) -> str:
    """The per-op IREE compilation_info attributes, one `uid op: attribute` block each."""
    lines = []
    for uid, entry in sorted((compilation_info or {}).items(), key=lambda item: int(item[0])):
        honoured = entry.get("honoured_by_iree")
        note = "" if honoured in (None, True) else "  // not honoured by IREE"
        lines.append(f"// op {uid}: {entry.get('op', '')}{note}\n{entry.get('compilation_info', '')}")
    return "\n\n".join(lines)


# --------------------------------------------------------------------------- hardware


@dataclass
class CalibrationState:
    calibrated: bool
    compute_efficiency: float
    bandwidth_efficiency: dict[str, float]
    loop_overhead_scale: float
    fitted_on: list[str]


def calibration_state(model: HardwareModel) -> CalibrationState:
    c = model.calibration
    calibrated = bool(c.fitted_on) or c.compute_efficiency != 1.0 or bool(c.bandwidth_efficiency) or c.loop_overhead_scale != 1.0
    return CalibrationState(calibrated=calibrated, compute_efficiency=c.compute_efficiency,
                            bandwidth_efficiency=dict(c.bandwidth_efficiency),
                            loop_overhead_scale=c.loop_overhead_scale, fitted_on=list(c.fitted_on))


@dataclass
class Fidelity:
    """How well predictions rank plans on one hardware: Spearman's rho over measured plans."""

    pairs: list[PredictedMeasured]
    spearman: float | None  # None below MIN_FIDELITY_PAIRS, or when either side is constant

    def chart_json(self) -> dict:
        ordered = sorted(self.pairs, key=lambda p: p.predicted_s)
        return {"predicted_ms": [p.predicted_s * 1e3 for p in ordered],
                "measured_ms": [p.measured_s * 1e3 for p in ordered]}


MIN_FIDELITY_PAIRS = 3


def fidelity(pairs: list[PredictedMeasured]) -> Fidelity:
    rho = None
    if len(pairs) >= MIN_FIDELITY_PAIRS:
        value = spearmanr([p.predicted_s for p in pairs], [p.measured_s for p in pairs]).statistic
        rho = None if math.isnan(value) else float(value)
    return Fidelity(pairs=pairs, spearman=rho)
