"""Calibration: plan sampling inside IREE's limits, and a fit that improves a held-out workload.

The fit is tested against a synthetic ground truth (the cost model under known, non-nominal
factors, with 5% noise), so the test is fast and deterministic; the real-measurement path is the
harness (tests/test_measure.py) plus `tilesearch calibrate`.
"""

from __future__ import annotations

import math
import random

import pytest

from service.hardware.model import Calibration
from service.hardware.profiles import get_profile  # the pinned reference host (conftest)
from service.measure.calibrate import score
from service.measure.calibration_fit import Predictor, fit_calibration, fit_profile, with_calibration, with_register_tile
from service.measure.calibration_plans import (
    MAX_VECTOR_ELEMENTS,
    iree_config_of,
    load_contraction_workloads,
    max_vector_elements,
    sample_plans,
)
from service.measure.calibration_samples import Sample, normalize_to_default
from service.measure.lowering import vector_tile_elements

from _shared import WORKLOADS


@pytest.fixture(scope="module")
def workloads():
    found, skipped = load_contraction_workloads(WORKLOADS)
    return {w.name: w for w in found}, skipped


def test_only_measurable_contractions_are_loaded(workloads):
    found, skipped = workloads
    assert {"matmul_1024", "mlp_chain", "attention_scores"} <= set(found)
    assert "convolution" in skipped["conv_relu"]
    assert "dynamic" in skipped["dynamic_matmul"]
    # IREE fuses fill, broadcast and the elementwise tail into the matmul's dispatch: so does the plan.
    assert found["mlp_chain"].fuse == [0, 2, 3, 4]


def test_sampled_plans_are_distinct_inside_iree_limits_and_include_the_default(workloads):
    w = workloads[0]["matmul_1024"]
    plans = sample_plans(w, 20)
    configs = [iree_config_of(w, p) for p in plans]
    keys = {(tuple(c.distribution), tuple(c.vector_common_parallel), tuple(c.vector_reduction)) for c in configs}
    assert len(plans) == 20 and len(keys) == 20
    assert all(vector_tile_elements(c) <= MAX_VECTOR_ELEMENTS for c in configs)
    assert ((64, 64, 0), (8, 16, 0), (0, 0, 16)) in keys  # IREE's own default config
    sizes = sorted(vector_tile_elements(c) for c in configs)
    assert sizes[0] < 64 and sizes[-1] >= 2048  # spans bad and good


def test_sampled_plans_stay_inside_the_hosts_vector_limit(workloads):
    """An AVX2 host compiles vector tiles of 16 KiB or less: the sample keeps below it there
    (it sampled up to 32 KiB, and half its large tiles failed to compile)."""
    w = workloads[0]["matmul_1024"]
    avx2 = get_profile("host-cpu").model_copy(update={"max_vector_tile_bytes": 16 * 1024})
    assert max_vector_elements(avx2) == 4095 and max_vector_elements(get_profile("host-cpu")) == MAX_VECTOR_ELEMENTS
    configs = [iree_config_of(w, p) for p in sample_plans(w, 20, max_elements=max_vector_elements(avx2))]
    assert len(configs) == 20 and max(vector_tile_elements(c) for c in configs) in range(2048, 4096)


def synthetic_samples(workloads, predictor, truth, plans: int, noise: float, seed: int) -> list[Sample]:
    """Sampled plans 'measured' as the cost model under `truth` predicts them, with log-normal noise."""
    rng = random.Random(seed)
    return [
        Sample(workload=w.name, plan=p,
               measured_s=predictor.latency_s(w.name, p, truth) * math.exp(rng.gauss(0, noise)))
        for w in workloads
        for p in sample_plans(w, plans)
    ]


def test_fit_improves_a_held_out_workload(workloads):
    found, _ = workloads
    names = ["matmul_1024", "mlp_chain", "attention_scores"]
    chosen = [found[n] for n in names]
    predictor = Predictor(chosen)
    nominal = with_calibration(get_profile("host-cpu"), Calibration())
    levels = [lv.name for lv in nominal.memory_levels]
    truth = with_calibration(
        nominal,
        Calibration(compute_efficiency=0.35, loop_overhead_scale=4.0,
                    bandwidth_efficiency={levels[0]: 0.4, levels[-1]: 0.5}),
    )
    samples = synthetic_samples(chosen, predictor, truth, plans=6, noise=0.05, seed=0)
    train = [s for s in samples if s.workload != "attention_scores"]
    held_out = [s for s in samples if s.workload == "attention_scores"]

    fitted = with_calibration(nominal, fit_calibration(train, predictor, nominal, max_evals=400))

    before, after = score(held_out, predictor, nominal), score(held_out, predictor, fitted)
    assert after.rmse_log < 0.5 * before.rmse_log, (before, after)
    assert score(train, predictor, fitted).rmse_log < score(train, predictor, nominal).rmse_log
    assert fitted.calibration.fitted_on == ["matmul_1024", "mlp_chain"]


def test_fit_recovers_the_register_tile_terms_of_another_microarchitecture(workloads):
    """Ground truth: a CPU whose lowering runs register tiles past 8 rows slower (where the
    nominal profile says 16), with non-nominal factors. fit_profile must find the row limit,
    which the continuous factors alone cannot mimic."""
    found, _ = workloads
    chosen = [found[n] for n in ("matmul_1024", "mlp_chain")]
    predictor = Predictor(chosen)
    nominal = with_register_tile(with_calibration(get_profile("host-cpu"), Calibration()), 16, 8)
    truth = with_calibration(with_register_tile(nominal, 8, 8),
                             Calibration(compute_efficiency=0.5, loop_overhead_scale=2.0))
    samples = synthetic_samples(chosen, predictor, truth, plans=12, noise=0.03, seed=1)
    fitted = fit_profile(samples, predictor, nominal, max_evals=300)
    assert fitted.compute.register_tile_rows == 8
    assert fitted.compute.fma_pipeline_depth == 8
    only_factors = with_calibration(nominal, fit_calibration(samples, predictor, nominal, max_evals=300))
    assert score(samples, predictor, fitted).rmse_log < 0.5 * score(samples, predictor, only_factors).rmse_log


def test_fast_rescaled_prediction_equals_the_full_estimate(workloads):
    w = workloads[0]["mlp_chain"]
    predictor = Predictor([w])
    nominal = with_calibration(get_profile("host-cpu"), Calibration())
    cal = Calibration(compute_efficiency=0.6, loop_overhead_scale=1.7,
                      bandwidth_efficiency={lv.name: 0.8 for lv in nominal.memory_levels})
    hw = with_calibration(nominal, cal)
    for plan in sample_plans(w, 4):
        fast, exact = predictor.latency_s(w.name, plan, hw), predictor.exact_latency_s(w.name, plan, hw)
        assert fast == pytest.approx(exact, rel=1e-9)


def test_paired_default_normalization_removes_a_load_burst():
    # Same plan quality (plan = 0.5 x default); the second pair was timed under 2x load.
    samples = [
        Sample(workload="w", plan={"p": 1}, raw_s=0.010, default_s=0.020),
        Sample(workload="w", plan={"p": 2}, raw_s=0.020, default_s=0.040),
        Sample(workload="w", plan={"p": 3}, raw_s=0.015, default_s=0.020),
    ]
    out = normalize_to_default(samples)
    assert out[0].measured_s == pytest.approx(out[1].measured_s)
    assert out[2].measured_s > out[0].measured_s
    assert out[0].raw_s == 0.010  # what was timed stays on record
