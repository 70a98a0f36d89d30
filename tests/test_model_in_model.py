"""Measuring inside the model (`--measure-top` of `model tune`): IREE's HAL profiler times each
dispatch of the real model build, and the round builds carry one plan of every root at once."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select

from _shared import SHARED, needs_avx512

from service.hardware.profiles import get_profile
from service.ir.analysis import analyze
from service.ir.dispatch import dispatches_of
from service.measure.dispatch_profile import profile_dispatches
from service.measure.lowering import LoweringConfig, levels_from_lowering_config
from service.measure.tuning_spec import contraction_matcher
from service.measure.whole_model import compile_model, entry_function, executable_sources, input_program, model_arguments
from service.measure.forcing import write_inputs
from service.model_tuning import tune as tune_module
from service.model_tuning import tune_model
from service.measure.whole_model import ModelTiming
from service.model_tuning.in_model import (
    InModelTimes,
    RootTimes,
    RootUnderTest,
    time_in_model,
    whole_build_choice,
    whole_model_shortfall,
)
from service.model_tuning.runs import store_model_run
from service.store.db import session_scope
from service.store.models import Measurement

MLP = SHARED / "models" / "mlp_512_2048_b16.linalg.mlir"


def _whole(default_s: float, tuned_s: float, faster: int = 8, rounds: int = 8) -> ModelTiming:
    """Whole-model timings whose medians are these, the spec's build faster in `faster` rounds."""
    pairs = [(default_s, tuned_s) if i < faster else (tuned_s, default_s) for i in range(rounds)]
    if tuned_s >= default_s:
        pairs = [(default_s, tuned_s)] * rounds
    return ModelTiming(default_s=[default_s] * rounds, tuned_s=[tuned_s] * rounds, rounds=pairs)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    """The MLP's two matmul dispatches, its default build and inputs."""
    work = tmp_path_factory.mktemp("mlp")
    dispatches = dispatches_of(executable_sources(MLP, work / "sources.mlir"))
    compile_model(MLP, work / "default.vmfb", work / "default_configs")
    program = input_program(MLP, work / "input.mlir")
    function = entry_function(program)
    return work, dispatches, function, write_inputs(model_arguments(program, function), work)


def _root(dispatch):
    graph = analyze(dispatch.module).graph
    (root,) = [op for op in graph.ops.values() if op.kind == "contraction"]
    return root, sum(1 for op in graph.ops.values() if op.uid < root.uid and op.name.startswith("linalg."))


def _matcher(dispatch, name: str, distribution, vector, reduction):
    config = LoweringConfig(distribution=distribution, vector_common_parallel=vector, vector_reduction=reduction)
    return contraction_matcher(_root(dispatch)[0], levels_from_lowering_config(config), name)


def test_the_profiler_times_every_dispatch_of_the_model_per_call(mlp):
    work, dispatches, function, flags = mlp
    times = profile_dispatches(work / "default.vmfb", function, flags, iterations=4)
    for d in dispatches:  # IREE's dispatch names are the executable sources' names
        assert times[d.entry].calls >= 4 * d.weight
        assert 0 < times[d.entry].wall_s < 1 and times[d.entry].cpu_s > 0


@needs_avx512  # real IREE on this CPU against the pinned AVX-512 profile's configs
def test_each_round_build_carries_a_plan_of_every_root_and_a_refused_plan_is_found_alone(mlp, tmp_path):
    work, (first, second), function, flags = mlp
    refused = _matcher(first, "r0p0", [16, 512, 0], [16, 512, 0], [0, 0, 64])  # a 32 KiB vector: IREE refuses it
    roots = [
        RootUnderTest({first.entry: 1}, _root(first)[1], [refused, _matcher(first, "r0p1", [16, 64, 0], [8, 32, 0], [0, 0, 16])]),
        RootUnderTest({second.entry: 1}, _root(second)[1], [_matcher(second, "r1p0", [16, 32, 0], [4, 16, 0], [0, 0, 8])]),
    ]
    whole = time_in_model(MLP, roots, work / "default.vmfb", function, flags, tmp_path,
                          {d.entry: d.weight for d in (first, second)}, rounds=2, iterations=3)
    a, b = whole.roots
    assert "IREE refused the config" in a.errors[0] and not a.plans_s[0]
    # The refusal was split off: the second root's plan of the same round was built and timed.
    assert b.errors == [None] and len(b.plans_s[0]) == 2
    assert a.errors[1] is None and len(a.plans_s[1]) == 2
    assert len(a.default_s) == len(b.default_s) == 2 and all(s > 0 for s in a.default_s + b.default_s)
    assert {p.name for p in tmp_path.glob("plan0*.vmfb")} == {"plan0b.vmfb"}  # halves: the refused one built nothing
    # Each build is also timed whole (both dispatches per run), beside the default build.
    assert [members for members, _ in whole.builds] == [[(1, 0)], [(0, 1)]]
    assert len(whole.default_s) == 2 and all(len(t) == 2 and min(t) > 0 for _, t in whole.builds)


def _times(default_whole, roots, builds):
    """InModelTimes from medians: roots as (default, [plan...]), builds as (members, whole)."""
    return InModelTimes(roots=[RootTimes(default_s=[d], plans_s=[[x] for x in plans]) for d, plans in roots],
                        builds=[(members, [whole]) for members, whole in builds], default_s=[default_whole])


def test_a_whole_build_ships_when_it_beats_the_per_root_picks_measured_whole():
    """Two roots of 1.0 ms each in a 3.0 ms model. Per root, only the second gains (0.5 ms): the
    picks are estimated at 2.5 ms. Round 0 (both roots' first plans) measured 2.0 ms whole: the
    first root's tiling sped up what reads its output, which its own dispatch does not show."""
    times = _times(3e-3, [(1e-3, [1.0e-3, 1.1e-3]), (1e-3, [0.5e-3, 0.9e-3])],
                   [([(0, 0), (1, 0)], 2.0e-3), ([(0, 1), (1, 1)], 2.9e-3)])
    assert whole_build_choice(times, {1: 0}) == ([(0, 0), (1, 0)], 2.0e-3)
    # Within the margin of the estimate, or no faster: the per-root picks stand.
    near = _times(3e-3, [(1e-3, [1.0e-3]), (1e-3, [0.5e-3])], [([(0, 0), (1, 0)], 2.45e-3)])
    assert whole_build_choice(near, {1: 0}) is None
    assert whole_build_choice(_times(3e-3, [], []), {}) is None


def test_measure_top_decides_inside_the_model_and_confirms_on_the_whole_model(tmp_path):
    report = tune_model(MLP, get_profile("host-cpu"), tmp_path / "spec.mlir", budget=64, measure_top=2)
    for d in report.dispatches:
        assert d.iree_default_measured_s > 0
        if d.tuned:
            assert d.reason.startswith("measured inside the model: ")
            # per root, the margin; a round build that measured fastest whole ships as a whole
            if not d.reason.endswith("shipped with the whole-model build that measured fastest"):
                assert d.measured_s * 1.05 <= d.iree_default_measured_s
        else:
            # or withdrawn with the whole spec: no faster, not resolved by the rounds, or under the margin
            assert d.reason.startswith(("IREE's default measured as fast inside the model",
                                        "the whole model measured ",
                                        "left to IREE: a whole-model build without it measured faster"))
    if any(d.tuned for d in report.dispatches):
        assert report.measured_model_s < report.iree_default_measured_model_s and Path(report.spec).exists()


def test_a_spec_that_makes_the_whole_model_slower_is_withdrawn(tmp_path, monkeypatch):
    """Each root measured faster on its own dispatches, but the whole model did not: nothing ships."""
    monkeypatch.setattr(tune_module, "measured_verdict", lambda tuned_s, default_s: None)
    monkeypatch.setattr(tune_module, "confirm_in_model", lambda *args, **kwargs: _whole(1e-3, 1.2e-3))
    report = tune_model(MLP, get_profile("host-cpu"), tmp_path / "spec.mlir", budget=32, measure_top=1)
    assert not any(d.tuned for d in report.dispatches) and report.spec is None and report.searches == []
    assert not (tmp_path / "spec.mlir").exists()
    assert all(d.reason.startswith("the whole model measured no faster with the spec: 1.200 ms") for d in report.dispatches)
    assert report.measured_model_s == pytest.approx(1.2e-3)


def test_a_spec_whose_whole_model_gain_is_below_its_dispatches_margin_is_withdrawn(tmp_path, monkeypatch):
    """Each tuned dispatch ships measured 5% faster inside the model, so the run must show 5% of
    the tuned dispatches' share of it: on a Zen 5 a 0.5 ms MLP shipped one dispatch measured 1.21x
    faster, the whole model measured 0.5% faster, and `model bench` read 0.97x."""
    monkeypatch.setattr(tune_module, "measured_verdict", lambda tuned_s, default_s: None)
    monkeypatch.setattr(tune_module, "whole_build_choice", lambda times, picks: None)
    monkeypatch.setattr(tune_module, "confirm_in_model", lambda *args, **kwargs: _whole(1e-3, 0.999e-3))
    report = tune_model(MLP, get_profile("host-cpu"), tmp_path / "spec.mlir", budget=32, measure_top=1)
    assert not any(d.tuned for d in report.dispatches) and report.spec is None
    assert all(d.reason.startswith("the whole model measured 0.999 ms with the spec against IREE's default 1.000 ms")
               and "less than the 5% its tuned dispatches" in d.reason for d in report.dispatches)
    monkeypatch.setattr(tune_module, "confirm_in_model", lambda *args, **kwargs: _whole(1e-3, 0.5e-3))
    report = tune_model(MLP, get_profile("host-cpu"), tmp_path / "spec.mlir", budget=32, measure_top=1)
    assert all(d.tuned for d in report.dispatches) and report.spec is not None


def test_a_whole_model_gain_ships_only_when_the_rounds_resolve_it():
    """Medians can read a gain of a few percent that the rounds do not show: a 1.2 ms MLP whose
    tuned dispatch saved 2% of a run measured 2.8% faster in one tuning and 0.94x in the bench
    after (session 30). The spec's build must win enough paired rounds for a sign test."""
    assert _whole(1e-3, 0.8e-3, faster=8).sign_test_p == pytest.approx(1 / 256)
    assert _whole(1e-3, 0.8e-3, faster=7).sign_test_p == pytest.approx(9 / 256)
    assert _whole(1e-3, 0.8e-3, faster=5, rounds=5).sign_test_p == pytest.approx(1 / 32)
    assert whole_model_shortfall(_whole(1e-3, 0.8e-3, faster=7), 0.5e-3, True) is None
    why = whole_model_shortfall(_whole(1e-3, 0.8e-3, faster=6), 0.5e-3, True)
    assert why is not None and "faster in only 6 of 8 alternating rounds" in why and "probability 0.14" in why
    assert "faster in only 4 of 5" in whole_model_shortfall(_whole(1e-3, 0.8e-3, faster=4, rounds=5), 0.5e-3, True)
    # resolved, yet under the margin the tuned dispatches shipped with: still withdrawn
    assert "less than the 5%" in whole_model_shortfall(_whole(1e-3, 0.99e-3), 0.5e-3, True)


def test_timings_of_dispatches_left_to_iree_are_stored_for_learning(tmp_path, monkeypatch, sessions):
    """A root IREE's default beat inside the model is where the cost model was wrong: its timings
    are kept (with their module, no decision) beside the tuned dispatches' decisions."""
    monkeypatch.setattr(tune_module, "measured_verdict", lambda tuned_s, default_s: "left by the test")
    # and no round build measured whole ships instead (its own path, tested above)
    monkeypatch.setattr(tune_module, "whole_build_choice", lambda times, picks: None)
    report = tune_model(MLP, get_profile("host-cpu"), tmp_path / "spec.mlir", budget=32, measure_top=1)
    assert not any(d.tuned for d in report.dispatches) and report.measured_left
    expected = sum(len(m.refinement.candidates) + 1 for m in report.measured_left)
    store_model_run(sessions, MLP.read_bytes(), "mlp", get_profile("host-cpu"), report, {"measure_top": 1})
    with session_scope(sessions) as session:
        rows = session.scalars(select(Measurement).where(Measurement.source == "model")).all()
        assert len(rows) == expected and all(r.decision_id is None and r.module_fingerprint for r in rows)
        assert sum(r.is_default for r in rows) == len(report.measured_left)
        assert all(r.cpu_s and r.cpu_s > 0 for r in rows if r.ok)
