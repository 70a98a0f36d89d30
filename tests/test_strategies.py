"""Strategies: the own TPE (determinism, learning, constraints, warm starts, novelty), NSGA-II
through Optuna, and the super tiling baseline."""

from __future__ import annotations

import itertools
import statistics
import sys

import numpy as np
import pytest

from service.ir.analysis import analyze
from service.search.candidate import Evaluation
from service.search.engine import tune
from service.search.space import Knob, build_space
from service.search.strategies import RandomStrategy, TPEStrategy, make_strategy, supertiling_plan
from service.search.strategies.supertiling import _post_order
from service.search.strategies.tpe import STARTUP_TRIALS, CategoricalParzen, good_set_size

from _shared import WORKLOADS

# A synthetic space: 6 knobs of 6 choices (46656 vectors), the optimum at choice index i of knob i.
KNOBS = [Knob(f"k{i}", [0, 8, 16, 32, 64, 128]) for i in range(6)]
OPTIMUM = {k.name: k.choices[i] for i, k in enumerate(KNOBS)}


def source(name: str) -> str:
    return (WORKLOADS / f"{name}.mlir").read_text()


def distance(params: dict) -> int:
    """Choice steps from the optimum, summed over the knobs."""
    return sum(abs(k.choices.index(params[k.name]) - i) for i, k in enumerate(KNOBS))


def evaluate(params: dict, feasible=lambda params: True) -> Evaluation:
    return Evaluation(plan={"groups": []}, latency_s=1e-3 * (1 + distance(params)), feasible=feasible(params))


def drive(strategy, evaluations: int, feasible=lambda params: True, batch: int = 8) -> list[dict]:
    """Suggest a batch, then tell it, as the engine does; the knob values suggested, in order."""
    proposed: list[dict] = []
    while len(proposed) < evaluations:
        candidates = [strategy.suggest() for _ in range(batch)]
        for c in candidates:
            strategy.tell(c, evaluate(c.params, feasible))
            proposed.append(c.params)
    return proposed


# --------------------------------------------------------------------------- the own TPE


def test_tpe_is_deterministic_per_seed():
    runs = [drive(TPEStrategy(KNOBS, seed=3), 64) for _ in range(2)]
    assert runs[0] == runs[1]
    assert drive(TPEStrategy(KNOBS, seed=4), 64) != runs[0]
    assert len({tuple(p.values()) for p in runs[0][STARTUP_TRIALS:]}) > 20  # it did sample, not repeat one point


def test_tpe_concentrates_on_the_optimum_better_than_random_at_equal_budget():
    """After the random startup, TPE's proposals come closer to the optimum than random's, and
    its best of 100 is better, over several seeds."""
    tpe_near, random_near, tpe_best, random_best = [], [], [], []
    for seed in range(5):
        tpe = drive(TPEStrategy(KNOBS, seed), 100)
        rnd = drive(RandomStrategy(KNOBS, seed), 100)
        tpe_near.append(statistics.mean(distance(p) for p in tpe[40:]))
        random_near.append(statistics.mean(distance(p) for p in rnd[40:]))
        tpe_best.append(min(distance(p) for p in tpe))
        random_best.append(min(distance(p) for p in rnd))
    assert statistics.mean(tpe_near) < 0.6 * statistics.mean(random_near)
    assert statistics.median(tpe_best) < statistics.median(random_best)


def test_an_infeasible_trial_is_never_in_the_good_set():
    """Infeasible trials here are the closest to the optimum (the lowest latency): TPE must
    still take its good trials from the feasible ones only."""
    far = lambda params: distance(params) > 4  # noqa: E731  (feasible: only the far ones)
    strat = TPEStrategy(KNOBS, seed=0)
    proposed = drive(strat, 80, feasible=far)
    good, bad = strat.densities()
    good_params = [{k.name: k.choices[i] for k, i in zip(KNOBS, row)} for row in good.observations]
    assert len(good_params) == good_set_size(len(proposed))
    assert all(far(p) for p in good_params)
    assert len(good.observations) + len(bad.observations) == len(proposed)
    assert min(distance(p) for p in proposed) < min(distance(p) for p in good_params)  # better, infeasible ones were told
    # With no feasible trial at all, the good set is empty: l(x) is the prior alone.
    nothing = TPEStrategy(KNOBS, seed=0)
    drive(nothing, 24, feasible=lambda params: False)
    good, bad = nothing.densities()
    assert len(good.observations) == 0 and len(bad.observations) == 24


def test_tpe_proposes_warm_starts_first_and_drops_those_outside_the_space(caplog):
    warm = [{k.name: 16 for k in KNOBS}, {k.name: 8 for k in KNOBS}]
    outside = {**warm[0], "k0": 7}
    strat = TPEStrategy(KNOBS, seed=0, warm_start=[warm[0], outside, warm[1]])
    proposed = drive(strat, 16)
    assert proposed[:2] == warm
    assert outside not in proposed
    assert "warm start outside the search space dropped" in caplog.text


def test_tpe_with_identity_never_repeats_a_plan():
    """Many knob values make one plan (here: only k0 and k1 matter, 36 plans); with the
    identity every suggestion is a new plan as long as one is near, and the warm start counts."""
    identity = lambda params: (params["k0"], params["k1"])  # noqa: E731
    strat = TPEStrategy(KNOBS, seed=0, warm_start=[OPTIMUM], identity=identity)
    proposed = drive(strat, 32)
    plans = [identity(p) for p in proposed]
    assert len(set(plans)) == len(plans)
    without = drive(TPEStrategy(KNOBS, seed=0, warm_start=[OPTIMUM]), 32)
    assert len({identity(p) for p in without}) < len(without)  # the identity is what prevents repeats


def test_the_parzen_density_is_a_distribution_and_samples_follow_it():
    knobs = np.array([3, 2, 4])
    observations = np.array([[0, 1, 3], [2, 0, 0], [0, 1, 2]])
    density = CategoricalParzen.fit(observations, np.array([1.0, 0.5, 1.0]), knobs)
    space = np.array(list(itertools.product(*(range(n) for n in knobs))))
    pdf = np.exp(density.log_pdf(space))
    assert pdf.sum() == pytest.approx(1.0)
    assert pdf[np.argmax(pdf)] > 3 / len(space)  # concentrated on the observations
    rng = np.random.default_rng(0)
    samples = density.sample(rng, 20000)
    frequency = np.array([np.mean(np.all(samples == v, axis=1)) for v in space])
    assert np.abs(frequency - pdf).max() < 0.01
    empty = CategoricalParzen.fit(np.zeros((0, 3), dtype=np.int64), np.ones(0), knobs)
    assert np.exp(empty.log_pdf(space)) == pytest.approx(np.full(len(space), 1 / len(space)))


def test_the_good_set_is_a_tenth_of_the_trials_up_to_25():
    assert [good_set_size(n) for n in (1, 10, 11, 100, 250, 251, 1000)] == [1, 1, 2, 10, 25, 25, 25]


def test_tpe_drops_a_warm_start_outside_the_space(host):
    spec = build_space(analyze(source("attention_scores")).graph, host, {}).groups[0]
    outside = {**spec.default_params(), f"{spec.name}.inner.d0": 0}  # a batch dim: 1 only
    strat = make_strategy("tpe", spec.knobs(), 0, warm_start=[outside, spec.default_params()])
    first = strat.suggest()
    assert first.params == spec.default_params()


def test_tpe_does_not_repeat_plans(host):
    # A converging TPE re-proposes its favourite; with the plan identity it proposes a new
    # neighbour instead, so (almost) every suggestion is a new evaluation.
    r = tune(source("matmul_1024"), host, budget=120, strategy="tpe", seed=0, workers=0)
    searched = [t for t in r.trials if t.source == "tpe"]
    assert r.evaluations == 120
    assert sum(t.cached for t in searched) <= 3


# --------------------------------------------------------------------------- NSGA-II


def test_nsga2_runs_and_keeps_footprints(host):
    r = tune(source("matmul_1024"), host, budget=16, strategy="nsga2", seed=0, workers=0)
    costed = [t for t in r.trials if t.stage == "cost"]
    assert r.feasible and all(t.peak_footprint_bytes is not None for t in costed)


def test_nsga2_proposes_its_warm_start_first_and_is_deterministic_per_seed():
    warm = {k.name: 16 for k in KNOBS}
    runs = [drive(make_strategy("nsga2", KNOBS, 5, warm_start=[warm, {**warm, "k0": 7}]), 48) for _ in range(2)]
    assert runs[0][0] == warm and runs[0] == runs[1]
    assert all(p["k0"] != 7 for p in runs[0])


# --------------------------------------------------------------------------- super tiling


def test_supertiling_baseline_is_scored(host):
    graph = analyze(source("matmul_1024")).graph
    plan, _ = supertiling_plan(graph, host, build_space(graph, host).shapes)
    assert [g.anchor for g in plan.groups] == [1]
    assert plan.groups[0].levels[0].tile_sizes[0] == 0 and plan.groups[0].levels[0].tile_sizes[1] > 0
    r = tune(source("matmul_1024"), host, budget=10, strategy="supertiling", workers=0)
    assert r.baseline["latency_s"] and r.baseline["plan"] == r.trials[0].plan


def test_super_tiling_walks_a_chain_longer_than_the_recursion_limit(host):
    """The baseline's post-order DFS recursed once per op: a 6000-op chain crashed `tune`."""
    n = sys.getrecursionlimit() + 500
    lines = [f"  %v{i + 1} = linalg.map {{ math.exp }} ins(%v{i} : tensor<64xf32>) outs(%e : tensor<64xf32>)" for i in range(n)]
    src = ("func.func @chain(%v0: tensor<64xf32>) -> tensor<64xf32> {\n  %e = tensor.empty() : tensor<64xf32>\n"
           + "\n".join(lines) + f"\n  return %v{n} : tensor<64xf32>\n}}")
    graph = analyze(src).graph
    assert _post_order(graph) == list(reversed(range(n)))  # every op after its consumers
    supertiling_plan(graph, host, build_space(graph, host).shapes)
