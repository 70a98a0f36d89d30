"""Strategies driven by the search: TPE, NSGA-II, super tiling."""

from __future__ import annotations


import pytest

from service.ir.analysis import analyze
from service.search.engine import tune
from service.search.space import build_space
from service.search.strategies import supertiling_plan

from _shared import WORKLOADS


def source(name: str) -> str:
    return (WORKLOADS / f"{name}.mlir").read_text()


def test_nsga2_runs_and_keeps_footprints(host):
    r = tune(source("matmul_1024"), host, budget=16, strategy="nsga2", seed=0, workers=0)
    costed = [t for t in r.trials if t.stage == "cost"]
    assert r.feasible and all(t.peak_footprint_bytes is not None for t in costed)


def test_supertiling_baseline_is_scored(host):
    graph = analyze(source("matmul_1024")).graph
    plan, _ = supertiling_plan(graph, host, build_space(graph, host).shapes)
    assert [g.anchor for g in plan.groups] == [1]
    assert plan.groups[0].levels[0].tile_sizes[0] == 0 and plan.groups[0].levels[0].tile_sizes[1] > 0
    r = tune(source("matmul_1024"), host, budget=10, strategy="supertiling", workers=0)
    assert r.baseline["latency_s"] and r.baseline["plan"] == r.trials[0].plan


def test_tpe_does_not_repeat_plans(host):
    # A converging TPE re-proposes its favourite; with the plan identity it proposes a new
    # neighbour instead, so (almost) every suggestion is a new evaluation.
    r = tune(source("matmul_1024"), host, budget=120, strategy="tpe", seed=0, workers=0)
    searched = [t for t in r.trials if t.source == "tpe"]
    assert r.evaluations == 120
    assert sum(t.cached for t in searched) <= 3


def test_super_tiling_walks_a_chain_longer_than_the_recursion_limit(host):
    """The baseline's post-order DFS recursed once per op: a 6000-op chain crashed `tune`."""
    import sys

    from service.search.strategies import _post_order

    n = sys.getrecursionlimit() + 500
    lines = [f"  %v{i + 1} = linalg.map {{ math.exp }} ins(%v{i} : tensor<64xf32>) outs(%e : tensor<64xf32>)" for i in range(n)]
    src = ("func.func @chain(%v0: tensor<64xf32>) -> tensor<64xf32> {\n  %e = tensor.empty() : tensor<64xf32>\n"
           + "\n".join(lines) + f"\n  return %v{n} : tensor<64xf32>\n}}")
    graph = analyze(src).graph
    assert _post_order(graph) == list(reversed(range(n)))  # every op after its consumers
    supertiling_plan(graph, host, build_space(graph, host).shapes)


def test_tpe_reusing_its_estimators_within_a_batch_samples_as_optuna_does():
    # The engine asks a whole batch before telling any of it; the estimators are built once per
    # batch instead of once per ask, and must give exactly Optuna's own TPE samples.
    import optuna

    from service.search.strategies import _Choices, _KnownSpaceTPESampler

    space = {f"k{i}": optuna.distributions.CategoricalDistribution([0, 8, 16, 32, 64, 128]) for i in range(5)}
    ours = {name: _Choices(d.choices) for name, d in space.items()}  # the strategies' distributions
    options = dict(seed=3, multivariate=True, n_startup_trials=10, n_ei_candidates=8, constant_liar=False)
    studies = [optuna.create_study(sampler=_KnownSpaceTPESampler(ours, **options)),
               optuna.create_study(sampler=optuna.samplers.TPESampler(**options))]
    asked: list[list[dict]] = [[], []]
    for _ in range(8):
        for study, log, distributions in zip(studies, asked, (ours, space)):
            trials = [study.ask(distributions) for _ in range(8)]
            for t in trials:
                t.set_constraint("infeasible", float(t.params["k0"] > 64))
                study.tell(t, sum(abs(v - 16 * i) for i, v in enumerate(t.params.values())))
                log.append(t.params)
    assert asked[0] == asked[1]
    assert not studies[0].sampler._constant_liar
    assert len({tuple(p.values()) for p in asked[0][10:]}) > 20  # it did sample, not repeat one point
    with pytest.raises(ValueError, match="constant liar"):
        _KnownSpaceTPESampler(space, constant_liar=True)


def test_the_tpe_strategy_proposes_what_optunas_ask_and_tell_would():
    # The strategy draws from its sampler without Study.ask (most of an ask's cost) and tells
    # every result as a completed trial: its proposals must be those of Optuna's own TPE driven
    # by ask and tell, warm start first, random startup, then TPE, batch after batch.
    import optuna

    from service.search.candidate import Evaluation
    from service.search.space import Knob
    from service.search.strategies import _TPE_EI_CANDIDATES, OptunaStrategy

    knobs = [Knob(f"k{i}", [0, 8, 16, 32, 64, 128]) for i in range(5)]
    warm = {k.name: 16 for k in knobs}
    ours = OptunaStrategy("tpe", knobs, seed=3, warm_start=[warm])
    sampler = optuna.samplers.TPESampler(seed=3, multivariate=True, n_startup_trials=10,
                                         n_ei_candidates=_TPE_EI_CANDIDATES, constant_liar=False)
    study = optuna.create_study(direction="minimize", sampler=sampler)
    study.enqueue_trial(warm)
    space = {k.name: optuna.distributions.CategoricalDistribution(k.choices) for k in knobs}

    def latency(params: dict) -> float:
        return 1e-3 * (1 + sum(abs(v - 16 * i) for i, v in enumerate(params.values())))

    proposed: list[dict] = []
    for _ in range(8):  # the engine asks a batch, then tells it
        candidates = [ours.suggest() for _ in range(8)]
        trials = [study.ask(space) for _ in range(8)]
        assert [c.params for c in candidates] == [t.params for t in trials]
        for c, t in zip(candidates, trials):
            feasible = c.params["k0"] <= 64
            ev = Evaluation(plan={"groups": []}, latency_s=latency(c.params), feasible=feasible)
            ours.tell(c, ev)
            t.set_constraint("infeasible", 0.0 if feasible else 1.0)
            study.tell(t, ev.objective)
            proposed.append(c.params)
    assert proposed[0] == warm
    assert len({tuple(p.values()) for p in proposed[10:]}) > 20  # it did sample, not repeat one point
    assert [t.params for t in ours.study.trials] == proposed  # every result told, in order


def test_knob_distributions_are_equal_exactly_when_their_choices_are():
    """The strategies' categorical (plain tuple equality, for speed) agrees with Optuna's own."""
    import optuna

    from service.search.strategies import _Choices

    base = optuna.distributions.CategoricalDistribution
    a, b = _Choices([0, 8, True, "for"]), _Choices([0, 8, True, "for"])
    assert a == b and a == base([0, 8, True, "for"]) and base([0, 8, True, "for"]) == a
    assert hash(a) == hash(b)
    assert a != _Choices([0, 8, False, "for"]) and a != _Choices([0, 8, True]) and a != base([0, 16, True, "for"])


def test_tpe_drops_a_warm_start_outside_the_space(host):
    from service.search.strategies import make_strategy

    spec = build_space(analyze(source("attention_scores")).graph, host, {}).groups[0]
    outside = {**spec.default_params(), f"{spec.name}.inner.d0": 0}  # a batch dim: 1 only
    strat = make_strategy("tpe", spec.knobs(), 0, warm_start=[outside, spec.default_params()])
    first = strat.suggest()
    assert first.params == spec.default_params()
