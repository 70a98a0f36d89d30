"""The one formula that turns a nest's terms into latency, and how calibration rescales them.

A nest's compute and the transfers of each memory level overlap imperfectly (a soft roofline
over them, `overlapped`), and its loop overheads come on top. A module runs its nests one after
another. The cost model (nest_cost.py) and calibration (service.measure) both combine terms
here, so the fit and the search see the same model.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..model import Calibration
from .results import NestCost


@dataclass(frozen=True)
class NestTerms:
    """What a nest's latency is made of, each already scaled by the hardware's calibration."""

    compute_s: float
    level_times_s: dict[str, float]  # per memory level, outermost first
    overhead_s: float

    def times(self) -> dict[str, float]:
        """Compute first, then each level: the resources that overlap."""
        return {"compute": self.compute_s, **self.level_times_s}

    def bound_by(self) -> str:
        """The resource that takes longest (the first of equals)."""
        times = self.times()
        return max(times, key=times.get)


def overlapped(times: Iterable[float], p: float) -> float:
    """A soft roofline: resources that each need time t_i, overlapping imperfectly, take
    (sum t_i**p)**(1/p); the slowest alone when p is large, all of them in turn when p = 1."""
    ts = [t for t in times if t > 0]
    if not ts:
        return 0.0
    slowest = max(ts)
    return slowest * sum((t / slowest) ** p for t in ts) ** (1 / p)


def nest_latency_s(terms: NestTerms, overlap_exponent: float) -> float:
    """A nest's latency: its compute and level transfers overlapped, plus its loop overheads."""
    return overlapped(terms.times().values(), overlap_exponent) + terms.overhead_s


def module_latency_s(nest_latencies: Iterable[float]) -> float:
    """A module's latency: its nests run one after another."""
    return sum(nest_latencies)


def nest_terms(nest: NestCost) -> NestTerms:
    """The terms a costed nest was combined from."""
    return NestTerms(
        compute_s=nest.compute_s,
        level_times_s={lv.name: lv.time_s for lv in nest.levels},
        overhead_s=nest.overhead_s,
    )


def under_calibration(nominal: NestTerms, calibration: Calibration) -> NestTerms:
    """Terms estimated under nominal factors (Calibration()), as `calibration` scales them: the
    compute efficiency divides compute time, each level's bandwidth efficiency its transfer time,
    and the loop overhead scale multiplies the overheads (HardwareModel.effective_*)."""
    return NestTerms(
        compute_s=nominal.compute_s / calibration.compute_efficiency,
        level_times_s={name: t / calibration.bandwidth_efficiency.get(name, 1.0)
                       for name, t in nominal.level_times_s.items()},
        overhead_s=nominal.overhead_s * calibration.loop_overhead_scale,
    )
