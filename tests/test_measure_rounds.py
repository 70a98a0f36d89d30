"""Paired timing rounds put every build in every position of a round equally often: timed one
after the other, the second of two identical builds ran faster in 51 of 80 rounds on a Zen 4
(docs/benchmarks.md, session 32), so a build always timed second would win rounds it did not
earn, and the sign test over them (`ModelTiming.sign_test_p`) would ship noise."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from service.measure import timing as timing_module
from service.measure import whole_model
from service.measure.dispatch_profile import DispatchTime
from service.measure.forcing import ForcedModule
from service.measure.rounds import round_order
from service.measure.tools import BenchSamples
from service.model_tuning import in_model


@pytest.mark.parametrize("builds", [1, 2, 3, 5])
def test_over_a_multiple_of_rounds_every_build_takes_every_position_equally_often(builds):
    rounds = [round_order(builds, r) for r in range(4 * builds)]
    assert all(sorted(order) == list(range(builds)) for order in rounds)
    for position in range(builds):
        assert Counter(order[position] for order in rounds) == {b: 4 for b in range(builds)}


class _SecondIsFaster:
    """A machine on which a build timed right after another one runs 10% faster: the same
    build's time is 1.0 ms timed first in a round and 0.9 ms timed after another build."""

    def __init__(self, builds_per_round: int) -> None:
        self.order: list[str] = []
        self.builds_per_round = builds_per_round

    def seconds(self, name: str) -> float:
        self.order.append(name)
        return 1e-3 if len(self.order) % self.builds_per_round == 1 else 0.9e-3

    def benchmark_module(self, vmfb: Path, *args, **kwargs) -> BenchSamples:
        t = self.seconds(vmfb.name)
        return BenchSamples(real_s=[t] * 3, cpu_s=[t] * 3)


def test_an_identical_build_timed_whole_does_not_win_its_rounds_by_going_second(monkeypatch):
    machine = _SecondIsFaster(2)
    monkeypatch.setattr(whole_model, "benchmark_module", machine.benchmark_module)
    timing = whole_model.time_models(Path("default.vmfb"), Path("tuned.vmfb"), [], rounds=8)
    # Each build first in half the rounds, and each round's pair still reads (default, tuned).
    assert [machine.order[2 * r] for r in range(8)] == ["default.vmfb", "tuned.vmfb"] * 4
    assert timing.rounds[:2] == [(1e-3, 0.9e-3), (0.9e-3, 1e-3)]
    assert timing.tuned_faster_rounds == 4 and timing.sign_test_p > 0.5


def test_the_grid_and_the_default_build_take_turns_going_first(monkeypatch, tmp_path):
    machine = _SecondIsFaster(2)
    monkeypatch.setattr(timing_module, "benchmark_module", machine.benchmark_module)
    prepared = ForcedModule(text="", function="main", arguments=[], configs=[])
    compiled = [timing_module._Compiled(prepared, tmp_path / f"{tag}.vmfb", []) for tag in ("plan", "default")]
    plan, default = timing_module._time_rounds(compiled, [], timing_module.BenchSettings(repetitions=4), rounds=4)
    assert Counter(machine.order[::2]) == {"plan.vmfb": 2, "default.vmfb": 2}
    assert sorted(plan.samples_s) == sorted(default.samples_s)  # neither gained from its position


def test_inside_the_model_the_default_build_and_round_builds_take_turns_going_first(monkeypatch, tmp_path):
    machine = _SecondIsFaster(3)

    def profile(vmfb: Path, function, flags, iterations):
        t = machine.seconds(vmfb.name)
        return {"d0": DispatchTime(calls=iterations, wall_s=t, cpu_s=t)}

    def build(model, roots, members, workdir, tag, errors):
        return [in_model._Build(tmp_path / f"{tag}.vmfb", members)]

    monkeypatch.setattr(in_model, "profile_dispatches", profile)
    monkeypatch.setattr(in_model, "_build", build)
    root = in_model.RootUnderTest({"d0": 1}, 0, matchers=[object(), object()])
    times = in_model.time_in_model(Path("m.mlir"), [root], tmp_path / "default.vmfb", "main", [], tmp_path,
                                   {"d0": 1}, rounds=3, iterations=1)
    assert Counter(machine.order[::3]) == {"default.vmfb": 1, "plan0.vmfb": 1, "plan1.vmfb": 1}
    # Each build read in every position once: the same median for all three.
    (root_times,) = times.roots
    assert sorted(root_times.default_s) == sorted(root_times.plans_s[0]) == sorted(root_times.plans_s[1])


def test_the_bench_verdict_is_the_rounds_either_way():
    from service.measure.whole_model import ModelTiming
    from service.model_tuning import ModelBenchmark

    def bench(pairs):
        t = ModelTiming(default_s=[d for d, _ in pairs], tuned_s=[x for _, x in pairs], rounds=pairs)
        return ModelBenchmark(model="m", spec="s", default_median_s=t.default_median_s, tuned_median_s=t.tuned_median_s,
                              speedup=t.speedup, default_samples_s=t.default_s, tuned_samples_s=t.tuned_s, dispatches=1,
                              dispatches_changed=1, tuned_faster_rounds=t.tuned_faster_rounds, sign_test_p=t.sign_test_p,
                              default_faster_p=t.default_faster_p)

    assert bench([(1.0, 0.9)] * 5).resolved == "faster"  # p = 1/32
    assert bench([(0.9, 1.0)] * 5).resolved == "slower"
    assert bench([(1.0, 0.9)] * 4 + [(0.9, 1.0)]).resolved is None  # 4 of 5: p = 6/32
