"""`--measure-top` for a whole model: each tuned root's K best plans timed inside the model.

A dispatch compiled and timed on its own is not the dispatch inside the model (IREE configures
it differently alone, and its inputs stay hot in cache), so the plans are timed where they run:
- Round i builds the model once with a spec giving every measured root its i-th best plan. Each
  dispatch's time comes from IREE's profiler (service.measure.dispatch_profile), so the roots do
  not disturb each other's reading and K plans of every root cost K builds, not K per root.
- A build IREE refuses is split in halves until the plan it refuses is alone (that plan's error).
- A plan counts only if IREE's configuration dump shows its root compiled with it.
- The builds and IREE's default build are profiled in alternating rounds, so load from other
  processes hits them alike, each first in its turn (`round_order`). A root's time is the wall time of its dispatches per model run
  (calls x the fastest call of a profile, see dispatch_profile.py), summed over the dispatches
  its matcher applies to; the median over rounds is what the guard compares.
- Each build is also timed whole (all dispatches per run): a root's tiling changes the
  dispatches reading its output, which its own time does not show (`whole_build_choice`).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from service.measure.dispatch_profile import DispatchTime, profile_dispatches
from service.measure.rounds import round_order
from service.measure.tools import ToolFailure
from service.measure.tuning_spec import RootMatcher, tuning_spec
from service.measure.whole_model import ModelTiming, canonical_attribute, compile_model, dispatch_configs, time_models
from service.search.guard import MEASURED_MARGIN


@dataclass(frozen=True)
class RootUnderTest:
    """One matcher's worth: the dispatches a root config applies to, and its plans to time."""

    dispatches: dict[str, int]  # dispatch function -> calls per model run
    root_index: int  # the root's position among its dispatch's structured ops (as dumps list them)
    matchers: Sequence[RootMatcher]  # one per plan, in predicted order; names unique per root


@dataclass
class RootTimes:
    """Seconds per model run of a root's dispatches: IREE's default, and each plan's."""

    default_s: list[float] = field(default_factory=list)
    plans_s: list[list[float]] = field(default_factory=list)
    per_call: list[list[DispatchTime]] = field(default_factory=list)  # per plan: its first dispatch, per round
    default_per_call: list[DispatchTime] = field(default_factory=list)
    errors: list[str | None] = field(default_factory=list)


@dataclass
class InModelTimes:
    """What the round builds measured: per root, and per build the whole model."""

    roots: list[RootTimes]
    builds: list[tuple[list[tuple[int, int]], list[float]]]  # (its (root, plan)s, all dispatches per run, per round)
    default_s: list[float]  # all dispatches per run, IREE's default build, per round


@dataclass
class _Build:
    vmfb: Path
    members: list[tuple[int, int]]  # (root, plan) pairs it carries


def _build(model: Path, roots: Sequence[RootUnderTest], members: list[tuple[int, int]], workdir: Path, tag: str,
           errors: dict[tuple[int, int], str]) -> list[_Build]:
    """Compile the model with a spec of `members`; halves on a refusal until the refused plan is alone."""
    spec = workdir / f"{tag}.spec.mlir"
    spec.write_text(tuning_spec([roots[r].matchers[p] for r, p in members]))
    vmfb, configs = workdir / f"{tag}.vmfb", workdir / f"{tag}_configs"
    try:
        compile_model(model, vmfb, configs, spec=spec)
    except ToolFailure as failure:
        if len(members) == 1:
            errors[members[0]] = f"IREE refused the config: {failure.line}"
            return []
        half = len(members) // 2
        return (_build(model, roots, members[:half], workdir, f"{tag}a", errors)
                + _build(model, roots, members[half:], workdir, f"{tag}b", errors))
    dumped = dispatch_configs(configs)
    applied = []
    for r, p in members:
        wanted = canonical_attribute(roots[r].matchers[p].lowering_config)
        got = [dumped.get(name) for name in roots[r].dispatches]
        if all(g is not None and roots[r].root_index < len(g.ops) and g.ops[roots[r].root_index][1] == wanted
               for g in got):
            applied.append((r, p))
        else:
            errors[(r, p)] = "IREE did not apply the config (its dump shows another)"
    return [_Build(vmfb, applied)] if applied else []


def _per_run(root: RootUnderTest, times: dict[str, DispatchTime]) -> float | None:
    if any(name not in times for name in root.dispatches):
        return None
    return total_per_run({name: times[name] for name in root.dispatches}, root.dispatches)


def time_in_model(model: Path, roots: Sequence[RootUnderTest], default_vmfb: Path, function: str,
                  input_flags: Sequence[str], workdir: Path, calls: dict[str, int], *, rounds: int = 5,
                  iterations: int = 10) -> InModelTimes:
    """Every root's plans and IREE's default, timed inside the model (see the module's doc);
    `calls`: every dispatch's calls per model run, for the whole-model times."""
    out = [RootTimes(plans_s=[[] for _ in r.matchers], per_call=[[] for _ in r.matchers],
                     errors=[None] * len(r.matchers)) for r in roots]
    workdir.mkdir(parents=True, exist_ok=True)
    errors: dict[tuple[int, int], str] = {}
    builds: list[_Build] = []
    for p in range(max((len(r.matchers) for r in roots), default=0)):
        members = [(r, p) for r, root in enumerate(roots) if p < len(root.matchers)]
        builds += _build(model, roots, members, workdir, f"plan{p}", errors)
    for (r, p), error in errors.items():
        out[r].errors[p] = error
    whole = InModelTimes(out, [(b.members, []) for b in builds], [])
    first = [next(iter(r.dispatches)) for r in roots]
    vmfbs = [default_vmfb, *(b.vmfb for b in builds)]
    for round_index in range(rounds if builds else 0):
        profiled: list[dict[str, DispatchTime]] = [{} for _ in vmfbs]
        for i in round_order(len(vmfbs), round_index):
            profiled[i] = profile_dispatches(vmfbs[i], function, input_flags, iterations=iterations)
        default, *planned = profiled
        whole.default_s.append(total_per_run(default, calls))
        for r, root in enumerate(roots):
            seconds = _per_run(root, default)
            if seconds is not None:
                out[r].default_s.append(seconds)
                out[r].default_per_call.append(default[first[r]])
        for build, (_, totals), times in zip(builds, whole.builds, planned):
            totals.append(total_per_run(times, calls))
            for r, p in build.members:
                seconds = _per_run(roots[r], times)
                if seconds is not None:
                    out[r].plans_s[p].append(seconds)
                    out[r].per_call[p].append(times[first[r]])
    return whole


def whole_build_choice(times: InModelTimes, picks: dict[int, int]) -> tuple[list[tuple[int, int]], float] | None:
    """A round build to ship instead of the per-root picks (`picks`: root -> plan), with its
    whole-model seconds per run, or None. The picks' whole-model time is estimated from their own
    dispatches' gains, as if they added up; a round build's was measured whole, with what each
    root's tiling does to the dispatches reading its output (docs/benchmarks.md has a ResNet
    block where that was most of the gain). A build must beat the estimate by the guard's
    MEASURED_MARGIN."""
    if not times.default_s:
        return None
    estimate = statistics.median(times.default_s) - sum(
        statistics.median(times.roots[r].default_s) - statistics.median(times.roots[r].plans_s[p])
        for r, p in picks.items() if times.roots[r].default_s and times.roots[r].plans_s[p])
    timed = [(statistics.median(totals), members) for members, totals in times.builds if totals]
    if not timed:
        return None
    seconds, members = min(timed, key=lambda t: t[0])
    return (members, seconds) if seconds * (1 + MEASURED_MARGIN) < estimate else None


def total_per_run(times: dict[str, DispatchTime], calls: dict[str, int]) -> float:
    """Every dispatch's wall time in one model run (calls per run x its time per call)."""
    return sum(calls.get(name, 1) * t.wall_s for name, t in times.items())


# Whole-model rounds of the final spec against IREE's default: with 8, the spec's build may lose
# one round and its gain still be resolved at RESOLVED_P (7 of 8: p = 0.035); with 5 it must win all.
CONFIRM_ROUNDS = 8
# A whole model's gain ships only if a sign test over the rounds says noise would give it this
# rarely: a 1.2 ms MLP whose one tuned dispatch saves 2% of a run varies 5% between rounds, and
# its medians read 2.8% faster in one tuning and 0.94x in the bench after (docs/benchmarks.md,
# session 30).
RESOLVED_P = 0.05


def confirm_in_model(default_vmfb: Path, tuned_vmfb: Path, function: str, input_flags: Sequence[str], *,
                     rounds: int = CONFIRM_ROUNDS) -> ModelTiming:
    """IREE's default build and the build with the final spec, timed whole in alternating rounds
    with iree-benchmark-module (wall time per run, what `model bench` reads). A root's own
    dispatches are not all a config changes: the dispatches that read its output run on the
    data where it left it (which core's cache), and the executor's hand-off between workgroups
    and dispatches, which the profiler's dispatch times leave out, is part of the run (a 0.5 ms
    MLP whose tuned dispatch profiled faster ran 0.72x whole)."""
    return time_models(default_vmfb, tuned_vmfb, list(input_flags), function=function, rounds=rounds)


def whole_model_shortfall(timing: ModelTiming, tuned_default_s: float, several: bool) -> str | None:
    """Why the whole model, measured (IREE's default build, the spec's: `confirm_in_model`), does
    not show the gain its tuned dispatches shipped with, or None when it does; `tuned_default_s`:
    those dispatches' time per run under IREE's default, `several`: the model has more than one
    dispatch. The spec's build must be faster in enough of the paired rounds that noise would
    rarely give it (`RESOLVED_P`), and each tuned dispatch was measured at least MEASURED_MARGIN
    faster inside the model, so the run must be faster by that margin on their share of it: a
    0.5 ms model whose one dispatch measured 1.21x faster in one round ran 0.5% faster whole,
    and 0.97x in `model bench` (docs/benchmarks.md, session 23)."""
    default_s, tuned_s = timing.default_median_s, timing.tuned_median_s
    why = "a tuned dispatch can slow the ones that read its output" if several else "the whole run is what ships"
    if tuned_s >= default_s:
        return (f"the whole model measured no faster with the spec: {tuned_s * 1e3:.3f} ms against IREE's default "
                f"{default_s * 1e3:.3f} ms per run, all dispatches ({why}): IREE's own config is kept")
    if timing.sign_test_p > RESOLVED_P:
        return (f"the whole model measured {tuned_s * 1e3:.3f} ms with the spec against IREE's default {default_s * 1e3:.3f} ms "
                f"per run, but was faster in only {timing.tuned_faster_rounds} of {len(timing.rounds)} alternating rounds: "
                f"noise gives that with probability {timing.sign_test_p:.2f} (sign test; at most {RESOLVED_P:g} ships), "
                "so the gain is not resolved on this machine: IREE's own config is kept")
    share_s = min(default_s, tuned_default_s)
    if default_s - tuned_s >= share_s * (1 - 1 / (1 + MEASURED_MARGIN)):
        return None
    return (f"the whole model measured {tuned_s * 1e3:.3f} ms with the spec against IREE's default {default_s * 1e3:.3f} ms "
            f"per run: less than the {MEASURED_MARGIN:.0%} its tuned dispatches ({share_s / default_s:.0%} of the run) "
            "shipped with, so their gain was the timing's noise: IREE's own config is kept")
