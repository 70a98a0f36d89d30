"""How much a dispatch's time inside the model moves between profiles of the same build.

    python benchmarks/in_model_noise.py                    # every model in ../shared/models
    python benchmarks/in_model_noise.py --profiles 8 --iterations 10

`model tune --measure-top` compares plans by their dispatches' times under IREE's HAL profiler
(service/measure/dispatch_profile.py), so the spread of one build's figure from profile to
profile is the smallest gain it can tell apart. Each model's default build is profiled
`--profiles` times (each `--iterations` runs); per dispatch that takes at least 2% of the model's
time, the coefficient of variation over profiles of its time per run by the mean, the median and
the lower quartile and the minimum of its calls; their median over dispatches, the worst dispatch, and the whole model.
The last column pairs profiles taken one after the other, as `time_in_model`'s rounds do: when
it is well under the whole model's CV, the noise drifts slower than a round, and comparing each
build with the default build of its own round cancels most of it.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.model_e2e import MODELS, cpu_name  # noqa: E402
from service.measure.dispatch_profile import dispatch_calls, profile_events  # noqa: E402
from service.measure.forcing import write_inputs  # noqa: E402
from service.measure.whole_model import compile_model, entry_function, input_program, model_arguments  # noqa: E402


def _calls(jsonl: str, skip: float) -> dict[str, list[int]]:
    return {k: [wall for wall, _ in v] for k, v in dispatch_calls(jsonl, skip).items()}


def _adjacent_ratios(xs: list[float]) -> list[float]:
    """Profile 2i over profile 2i+1: what a comparison of two builds profiled one after the other sees."""
    return [a / b for a, b in zip(xs[::2], xs[1::2])]


def _paired_cv(xs: list[float]) -> str:
    ratios = _adjacent_ratios(xs)
    return f"{_cv(ratios) / math.sqrt(2):.1%}" if len(ratios) >= 2 else "- (needs 4 profiles)"


def _lower_quartile(xs: list[int]) -> float:
    return statistics.quantiles(xs, n=4)[0] if len(xs) > 1 else xs[0]


def _cv(xs: list[float]) -> float:
    return statistics.stdev(xs) / statistics.mean(xs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="*", default=None)
    ap.add_argument("--profiles", type=int, default=6)
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=0, help="runs before those, left out of the figures")
    args = ap.parse_args()
    names = args.models or sorted(p.name.removesuffix(".linalg.mlir") for p in MODELS.glob("*.linalg.mlir"))
    print(f"{cpu_name()}, {args.profiles} profiles x {args.iterations} runs of IREE's default build"
          f" (after {args.warmup} warm-up runs)\n")
    print("| model | dispatches timed | CV of mean | CV of median | CV of lower quartile | CV of min "
          "| worst CV of mean / median / p25 / min | whole model CV, mean / median / p25 / min | whole model, adjacent profiles' ratio CV / sqrt 2 (median) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name in names:
        model = MODELS / f"{name}.linalg.mlir"
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            program = input_program(model, work / "input.mlir")
            function = entry_function(program)
            flags = write_inputs(model_arguments(program, function), work)
            compile_model(model, work / "m.vmfb", work / "configs")
            total = args.warmup + args.iterations
            profiles = [_calls(profile_events(work / "m.vmfb", function, flags, iterations=total), args.warmup / total)
                        for _ in range(args.profiles)]
        runs = args.iterations  # each dispatch's calls per run = its calls kept / runs
        # per profile, per dispatch: its time per run by each statistic of its calls
        stats = {"mean": statistics.mean, "median": statistics.median, "p25": _lower_quartile, "min": min}
        per_run = {n: [{k: f(v) * len(v) / runs for k, v in p.items()} for p in profiles] for n, f in stats.items()}
        whole = statistics.mean(sum(m.values()) for m in per_run["mean"])
        heavy = [k for k in profiles[0] if per_run["mean"][0][k] >= 0.02 * whole and all(k in p for p in profiles)]
        cv = {n: [_cv([m[k] for m in got]) for k in heavy] for n, got in per_run.items()}
        print(f"| {name} | {len(heavy)} | " + " | ".join(f"{statistics.median(cv[n]):.1%}" for n in stats)
              + " | " + " / ".join(f"{max(cv[n]):.1%}" for n in stats)
              + " | " + " / ".join(f"{_cv([sum(m.values()) for m in per_run[n]]):.1%}" for n in stats)
              + f" | {_paired_cv([sum(m.values()) for m in per_run['median']])} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
