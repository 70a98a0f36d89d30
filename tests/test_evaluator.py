"""The evaluator: plans scored once, in worker processes or in this one, alike; a group scored on
its extract as on the whole module; one plan's failure (cost model bug, MLIR crash) costs only
that plan; the nest costs a worker keeps."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from service.ir.analysis import analyze
from service.ir.plan import Plan
from service.search import evaluator
from service.search.candidate import Candidate
from service.search.engine import tune
from service.search.evaluator import Evaluator, GroupScope, evaluate_plans
from service.search.space import build_space, complete_plan

from _shared import RESNET_SHARED_BIAS_INIT
from _shared import workload as source


def test_process_pool_does_not_change_the_search(host):
    # Results are told in suggestion order, so the pool's completion order does not matter.
    # 96: past the first 64 proposals, where rounds grow from 8 to 16 candidates.
    pooled = tune(source("matmul_1024"), host, budget=96, strategy="tpe", seed=1, workers=2)
    serial = tune(source("matmul_1024"), host, budget=96, strategy="tpe", seed=1, workers=0)
    assert [t.plan_hash for t in pooled.trials] == [t.plan_hash for t in serial.trials]
    assert pooled.plan == serial.plan and pooled.evaluations == serial.evaluations


def test_identical_candidates_evaluated_once(host):
    r = tune(source("softmax"), host, budget=20, strategy="random", seed=0, workers=0)
    hashes = [t.plan_hash for t in r.trials if t.plan_hash and not t.cached]
    assert len(hashes) == len(set(hashes)) == r.evaluations


@pytest.mark.parametrize("name", ["softmax", "multi_consumer"])
def test_a_group_scored_on_its_extract_scores_as_on_the_whole_module(host, name):
    """Each group of a multi-group module is searched on an extract of its ops; its scores must be
    the whole module's (the rest of the module, held at the context, adds a constant)."""
    src = source(name)
    space = build_space(analyze(src).graph, host)
    assert len(space.groups) > 1
    context = {g.name: g.default_params() for g in space.groups}

    def plan_of(by_group: dict) -> Plan | str:
        plan = space.to_plan({k: v for p in by_group.values() for k, v in p.items()})
        return plan if isinstance(plan, str) else complete_plan(space, plan, host)

    rng = random.Random(0)
    compared = 0
    for spec in space.groups:
        (ctx,) = Evaluator(src, host, {}, 0).evaluate([(Candidate({}, "context"), plan_of(context))])
        scope = Evaluator(src, host, {}, 0).group_scope(spec.name, spec.ops, ctx)
        assert isinstance(scope, GroupScope), scope
        for _ in range(12):
            plan = plan_of({**context, spec.name: {k.name: rng.choice(k.choices) for k in spec.knobs()}})
            if isinstance(plan, str) or not scope.covers(plan):
                continue
            (whole,) = Evaluator(src, host, {}, 0).evaluate([(Candidate({}, "whole"), plan)])
            alone = Evaluator(src, host, {}, 0)
            (scoped,) = alone.collect(alone.submit([(Candidate({}, "scoped"), plan)], scope))
            if whole.stage != "cost":
                continue
            assert scoped.cost["scope"]["group"] == spec.name
            assert scoped.latency_s == pytest.approx(whole.latency_s, rel=1e-9)
            assert scoped.feasible == whole.feasible
            assert scoped.cost["scope"]["group_latency_s"] < whole.latency_s
            compared += 1
    assert compared >= 10


def test_multi_group_search_uses_extracts_and_reports_the_whole_module(host):
    src = source("softmax")
    r = tune(src, host, budget=40, strategy="random", seed=0, workers=0)
    scoped = [t for t in r.trials if t.cost and "scope" in t.cost]
    assert {t.cost["scope"]["group"] for t in scoped} == {f"g{g['anchor']}" for g in r.groups}
    # The returned plan's breakdown is the whole module's: every op, every nest.
    assert "scope" not in r.predicted
    assert sorted({u for n in r.predicted["nests"] for u in n["uids"]}) == sorted(analyze(src).graph.ops)
    assert r.predicted["latency_s"] == pytest.approx(sum(n["latency_s"] for n in r.predicted["nests"]))


def test_a_group_whose_extract_fails_is_searched_on_the_whole_module(host, monkeypatch):
    """A crash while building an extract (a dead worker, an MLIR bug) costs the extract, not the
    search: the group is searched on the whole module and the response says why."""

    def crash(source, scope):
        raise RuntimeError("worker died")

    monkeypatch.setattr(evaluator, "prepare_scope", crash)
    r = tune(source("softmax"), host, budget=30, strategy="random", seed=0, workers=0)
    assert r.predicted["feasible"] and r.evaluations == 30
    assert not [t for t in r.trials if t.cost and "scope" in t.cost]
    assert any("searched on the whole module: building the extract failed" in w for w in r.warnings)


def test_a_plan_that_breaks_the_cost_model_costs_only_itself(host, monkeypatch):
    """An unexpected exception while costing one plan rejects that plan with the reason; the other
    plans of its batch are still scored (the API runs searches in-process: it failed the request)."""
    real = evaluator.estimate_cost
    calls = []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise KeyError("attempt to access a non-existent attribute")
        return real(*args, **kwargs)

    monkeypatch.setattr(evaluator, "estimate_cost", flaky)
    plan = {"groups": [{"anchor": 1, "fuse": [0], "levels": [{"tile_sizes": [64, 64, 0], "loop": "forall"}]}]}
    first, second = evaluate_plans(source("matmul_1024"), host.canonical_json(), {}, [plan, plan])
    assert first["stage"] == "rejected" and "KeyError" in first["reason"]
    assert second["stage"] == "cost" and second["latency_s"] > 0





def test_a_plan_that_crashes_mlir_costs_that_plan_even_with_one_worker(tmp_path):
    """The super-tiling baseline's plan crashes MLIR (segfault) on RESNET_SHARED_BIAS_INIT.
    `tune --workers 1` evaluated in its own process and died with it; every CLI search now
    evaluates in worker processes (in-process is workers=0, for the API's jobs, which are
    isolated themselves)."""
    module = tmp_path / "resnet_shared_bias_init.mlir"
    module.write_text(RESNET_SHARED_BIAS_INIT)
    tilesearch = str(Path(sys.executable).with_name("tilesearch"))
    run = subprocess.run([tilesearch, "tune", str(module), "--hardware", "npu-sram-256k", "--budget", "16",
                          "--workers", "1", "--json"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    warnings = json.loads(run.stdout)["warnings"]
    assert any("super-tiling baseline could not be applied" in w for w in warnings), warnings


def test_workers_keep_nest_costs_on_static_shapes_only(host):
    """A worker keeps the nest cost of a group tiling one op alone across the plans it scores
    (NestMemo), never on dynamic shapes, where a dim is sized by walking the IR outside the nest."""

    def alone(anchor: int, sizes: list[int]) -> dict:
        return {"anchor": anchor, "fuse": [], "levels": [{"tile_sizes": sizes, "loop": "forall"}]}

    evaluator._nest_costs.clear()
    plans = [{"groups": [alone(1, [64, 64, 0]), alone(4, [32, 256])]}, {"groups": [alone(1, [32, 128, 0]), alone(4, [32, 256])]}]
    first = evaluate_plans(source("mlp_chain"), host.canonical_json(), {}, plans)
    (kept,) = evaluator._nest_costs.values()
    assert set(kept) == {(1, (((64, 64, 0), "forall"),)), (1, (((32, 128, 0), "forall"),)), (4, (((32, 256), "forall"),))}
    again = evaluate_plans(source("mlp_chain"), host.canonical_json(), {}, plans)  # from what was kept
    assert [{**r, "seconds": 0} for r in again] == [{**r, "seconds": 0} for r in first]
    evaluator._nest_costs.clear()
    (dynamic,) = evaluate_plans(source("dynamic_matmul"), host.canonical_json(), {}, [{"groups": [alone(1, [32, 128, 0])]}])
    assert dynamic["stage"] == "cost" and not evaluator._nest_costs


def test_a_rejected_plan_names_its_failing_group_in_a_field(host):
    """The IR core's PlanError.group reaches the evaluation typed: start-plan repair reads the
    failing group off it, not off the message."""
    plan = Plan.model_validate({"groups": [
        {"anchor": 4, "fuse": [3], "levels": [{"loop": "for", "tile_sizes": [128, 0]}]},
        {"anchor": 1, "fuse": [0, 2, 5], "levels": [{"loop": "for", "tile_sizes": [32, 0]}]},
    ]})
    (ev,) = Evaluator(source("softmax"), host, {}, 0).evaluate([(Candidate({}, "test"), plan)])
    assert ev.stage == "rejected" and ev.failed_group == 0 and ev.reason.startswith("group 0: ")
    # Numbered as evaluated: in the plan's canonical (anchor) order.
    assert sorted(plan.groups, key=lambda g: g.anchor)[ev.failed_group].anchor == 1
    assert "failed_group" not in ev.model_dump()  # the search's own: trials are reported as before
    (raw,) = evaluate_plans(source("softmax"), host.canonical_json(), {}, [json.loads(plan.canonical_json())])
    assert raw["failed_group"] == 0
