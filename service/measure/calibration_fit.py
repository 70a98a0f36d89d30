"""Calibration's fit: predictions rescaled per calibration (Predictor), and the calibration
factors (and, on a CPU, the register-tile terms) that minimise the squared error of log latency,
in log-parameter space."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from scipy import optimize

from service.hardware.cost import (
    Cost,
    NestTerms,
    estimate_cost,
    module_latency_s,
    nest_latency_s,
    nest_terms,
    under_calibration,
)
from service.hardware.model import Calibration, HardwareModel
from service.ir.parse import parse_module
from service.ir.plan import Plan
from service.ir.transform import apply_plan

from .calibration_samples import Sample

# Fitted parameters live in log space within these bounds (factor of the nominal figure).
COMPUTE_BOUNDS = (0.02, 2.0)
BANDWIDTH_BOUNDS = (0.02, 5.0)
OVERHEAD_BOUNDS = (0.01, 100.0)
# Pulls unidentifiable parameters back to nominal instead of letting them wander.
RIDGE = 1e-3
# Register-tile terms tried by fit_profile (Compute.register_tile_rows, fma_pipeline_depth); None:
# no row limit (L1 set conflicts, read from sysfs, price tall tiles on their own).
REGISTER_TILE_ROWS = (None, 4, 8, 16, 32)
FMA_PIPELINE_DEPTHS = (4, 8, 16)


@dataclass
class CostTerms:
    """A prediction split into the terms the calibration factors scale, per nest (estimated under
    nominal factors), combined by the cost model's own formula (service.hardware.cost.latency)."""

    nests: list[NestTerms]
    feasible: bool
    overlap_exponent: float

    def latency_s(self, cal: Calibration) -> float:
        if not self.feasible:
            return math.inf
        return module_latency_s(nest_latency_s(under_calibration(n, cal), self.overlap_exponent) for n in self.nests)


def cost_terms(cost: Cost, hardware: HardwareModel) -> CostTerms:
    """Terms of a Cost estimated under nominal factors (Calibration()) on `hardware`."""
    return CostTerms(
        nests=[nest_terms(n) for n in cost.nests],
        feasible=cost.feasible,
        overlap_exponent=hardware.overlap_exponent,
    )


class NamedModule(Protocol):
    """What the predictor needs of a workload: a name samples refer to, and its module text."""

    @property
    def name(self) -> str: ...

    @property
    def text(self) -> str: ...


# A non-nominal calibration the fast path is checked against, once per sample.
_PROBE = dict(compute_efficiency=0.37, loop_overhead_scale=2.9)


class Predictor:
    """Predicted latency of (workload, plan) on a hardware model.

    The tiled clone is built once per sample (apply_plan). The fit evaluates thousands of
    calibrations, so each sample's cost is estimated once under nominal factors and split into
    CostTerms; the terms are rescaled per calibration (cost.under_calibration). Each sample's
    terms are checked once against a full estimate under a probe calibration; if the cost model
    ever applies the factors differently, that sample falls back to full estimates (slow but
    exact).
    """

    def __init__(self, workloads: Sequence[NamedModule]):
        self._originals = {w.name: parse_module(w.text) for w in workloads}
        self._tiled: dict[tuple[str, str], Any] = {}
        self._terms: dict[tuple[str, str, str], CostTerms | None] = {}  # None: exact only

    def _key(self, workload: str, plan: dict) -> tuple[str, str]:
        return workload, Plan.model_validate(plan).canonical_json()

    def tiled(self, workload: str, plan: dict) -> Any:
        key = self._key(workload, plan)
        if key not in self._tiled:
            self._tiled[key] = apply_plan(self._originals[workload], Plan.model_validate(plan)).module
        return self._tiled[key]

    def cost(self, workload: str, plan: dict, hardware: HardwareModel) -> Cost:
        return estimate_cost(self.tiled(workload, plan), hardware, original=self._originals[workload])

    def exact_latency_s(self, workload: str, plan: dict, hardware: HardwareModel) -> float:
        cost = self.cost(workload, plan, hardware)
        return cost.latency_s if cost.feasible else math.inf

    def latency_s(self, workload: str, plan: dict, hardware: HardwareModel) -> float:
        """Predicted seconds; inf when the model calls the plan infeasible."""
        nominal = with_calibration(hardware, Calibration())
        key = (*self._key(workload, plan), nominal.content_hash())
        if key not in self._terms:
            terms = cost_terms(self.cost(workload, plan, nominal), nominal)
            probe = Calibration(**_PROBE, bandwidth_efficiency={
                lv.name: 0.3 + 0.1 * i for i, lv in enumerate(nominal.memory_levels)})
            exact = self.exact_latency_s(workload, plan, with_calibration(nominal, probe))
            fast = terms.latency_s(probe)
            agrees = (exact == fast) or (math.isfinite(exact) and abs(fast - exact) <= 1e-6 * exact)
            self._terms[key] = terms if agrees else None
        terms = self._terms[key]
        if terms is None:
            return self.exact_latency_s(workload, plan, hardware)
        return terms.latency_s(hardware.calibration)


def parameter_names(hardware: HardwareModel) -> list[str]:
    return ["compute_efficiency", *[f"bandwidth_efficiency.{lv.name}" for lv in hardware.memory_levels],
            "loop_overhead_scale"]


def _bounds(hardware: HardwareModel) -> list[tuple[float, float]]:
    bw = [tuple(map(math.log, BANDWIDTH_BOUNDS))] * len(hardware.memory_levels)
    return [tuple(map(math.log, COMPUTE_BOUNDS)), *bw, tuple(map(math.log, OVERHEAD_BOUNDS))]


def calibration_from_vector(hardware: HardwareModel, theta: Sequence[float], fitted_on: Sequence[str] = ()) -> Calibration:
    levels = hardware.memory_levels
    return Calibration(
        compute_efficiency=math.exp(theta[0]),
        bandwidth_efficiency={lv.name: math.exp(t) for lv, t in zip(levels, theta[1:1 + len(levels)])},
        loop_overhead_scale=math.exp(theta[-1]),
        fitted_on=list(fitted_on),
    )


def with_calibration(hardware: HardwareModel, calibration: Calibration) -> HardwareModel:
    return hardware.model_copy(update={"calibration": calibration})


def log_errors(samples: Sequence[Sample], predictor: Predictor, hardware: HardwareModel) -> np.ndarray:
    """log(predicted / measured) per measured sample; a huge error when the model says infeasible
    for a plan IREE ran (the fit must not learn to call real plans infeasible)."""
    out = []
    for s in samples:
        pred = predictor.latency_s(s.workload, s.plan, hardware)
        out.append(math.log(pred / s.measured_s) if math.isfinite(pred) and pred > 0 else 10.0)
    return np.array(out)


def _fit_continuous(train: Sequence[Sample], predictor: Predictor, base: HardwareModel,
                    max_evals: int) -> tuple[Calibration, float]:
    """The calibration factors minimising mean squared log error (+ ridge), and that loss."""
    names = sorted({s.workload for s in train})
    base = with_calibration(base, Calibration())

    def loss(theta: np.ndarray) -> float:
        hw = with_calibration(base, calibration_from_vector(base, theta))
        err = log_errors(train, predictor, hw)
        return float(np.mean(err**2) + RIDGE * np.sum(theta**2))

    start = np.zeros(len(parameter_names(base)))
    result = optimize.minimize(loss, start, method="Powell", bounds=_bounds(base),
                               options={"maxfev": max_evals, "xtol": 1e-3, "ftol": 1e-6})
    return calibration_from_vector(base, result.x, fitted_on=names), float(result.fun)


def _measured(samples: Sequence[Sample]) -> list[Sample]:
    train = [s for s in samples if s.measured_s]
    if not train:
        raise ValueError("no successful measurements to fit on")
    return train


def fit_calibration(
    samples: Sequence[Sample], predictor: Predictor, base: HardwareModel, max_evals: int = 600
) -> Calibration:
    """Calibration factors minimising mean squared log error on `samples` (measured ones)."""
    return _fit_continuous(_measured(samples), predictor, base, max_evals)[0]


def with_register_tile(hardware: HardwareModel, rows: int | None, pipeline_depth: int) -> HardwareModel:
    compute = hardware.compute.model_copy(update={"register_tile_rows": rows, "fma_pipeline_depth": pipeline_depth})
    return hardware.model_copy(update={"compute": compute})


def fit_profile(
    samples: Sequence[Sample], predictor: Predictor, base: HardwareModel, max_evals: int = 600
) -> HardwareModel:
    """`base` with fitted register-tile terms (CPU only) and calibration factors.

    The register-tile terms are small integers the continuous fit cannot move through, and what
    the cost model does not explain otherwise (L1 set conflicts, from the profile's cache
    associativity, explain the row limits measured so far) may differ between
    microarchitectures: every combination gets its own continuous fit and the one with the
    least loss is kept.
    """
    train = _measured(samples)
    if base.compute.vector_registers is None:
        return with_calibration(base, _fit_continuous(train, predictor, base, max_evals)[0])
    best: tuple[float, HardwareModel] | None = None
    for rows, depth in itertools.product(REGISTER_TILE_ROWS, FMA_PIPELINE_DEPTHS):
        candidate = with_register_tile(base, rows, depth)
        calibration, loss = _fit_continuous(train, predictor, candidate, max_evals)
        if best is None or loss < best[0]:
            best = (loss, with_calibration(candidate, calibration))
    return best[1]
