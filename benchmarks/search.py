"""Search benchmarks: throughput, quality vs budget, searched vs super tiling, measured vs IREE.

    python benchmarks/search.py                 # throughput, quality, vs super tiling
    python benchmarks/search.py --measure       # + IREE-measured plans vs IREE default (slow)
    python benchmarks/search.py --measure --measure-top 5   # the plan: fastest measured of the top 5
    python benchmarks/search.py --only throughput

Prints markdown tables (pasted into README.md, "Search benchmarks"). Uses the host-cpu
profile and 2 worker processes. Exhaustive optima are cached in var/search_bench_cache.json
(keyed by workload text, hardware hash, space version and the cost model's source) since they
take minutes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import statistics
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from service.hardware.profiles import get_profile  # noqa: E402
from service.search.engine import tune  # noqa: E402
from service.search.space import SPACE_VERSION  # noqa: E402

WORKLOADS = ROOT.parent / "shared" / "workloads"
CACHE = ROOT / "var" / "search_bench_cache.json"  # var/ is git-ignored
ALL = ["matmul_1024", "mlp_chain", "fuse_group", "attention_scores", "conv_relu", "softmax", "multi_consumer", "reshape_chain", "dynamic_matmul"]
QUALITY = ["matmul_1024", "mlp_chain"]
# Every workload with a contraction; conv_relu is listed to say why it cannot be measured.
CONTRACTIONS = ["matmul_1024", "mlp_chain", "fuse_group", "attention_scores", "dynamic_matmul", "conv_relu"]
# Shapes for dynamic dims: the search's default extent (128), stated rather than assumed, so the
# plan is searched and measured at the same shape.
SHAPE_HINTS = {"dynamic_matmul": ["arg0=128x1024"]}


def src(name: str) -> str:
    return (WORKLOADS / f"{name}.mlir").read_text()


def ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 1e3:.3f}"


def table(headers: list[str], rows: list[list]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def throughput(hw, budget: int, runs: int) -> str:
    """Median evaluations/s over `runs` identical searches (one run swings +-15% on this shared
    VM), and the slowest run."""
    rows = []
    for name in ALL:
        cells = []
        for strategy in ("random", "tpe"):
            got = [tune(src(name), hw, budget=budget, strategy=strategy, seed=0, workers=2) for _ in range(runs)]
            rates = sorted(r.evaluations_per_s for r in got)
            cells.append(f"{statistics.median(rates):.0f} (min {rates[0]:.0f})")
        r = got[0]
        rows.append([name, len(r.groups), r.space_size, r.evaluations, *cells])
        print(f"  throughput {name}: {cells[0]} random, {cells[1]} tpe", file=sys.stderr)
    return table(["workload", "groups", "space", "evals", f"evals/s random, median of {runs}", f"evals/s tpe, median of {runs}"], rows)


def _cache() -> dict:
    return json.loads(CACHE.read_text()) if CACHE.exists() else {}


def exhaustive_optimum(name: str, hw) -> tuple[float, int]:
    # Keyed by the cost model's source too (every module of the package): a model change moves
    # the optimum.
    model_src = "".join(p.name + p.read_text() for p in sorted((ROOT / "service" / "hardware" / "cost").glob("*.py")))
    key = hashlib.sha256((src(name) + hw.content_hash() + SPACE_VERSION + model_src).encode()).hexdigest()[:16]
    cache = _cache()
    if key in cache:
        return cache[key]["latency_s"], cache[key]["evaluations"]
    r = tune(src(name), hw, budget=10**6, strategy="exhaustive", seed=0, workers=2)
    cache[key] = {"workload": name, "latency_s": r.predicted["latency_s"], "evaluations": r.evaluations}
    CACHE.parent.mkdir(parents=True, exist_ok=True)
    CACHE.write_text(json.dumps(cache, indent=1))
    return r.predicted["latency_s"], r.evaluations


def quality(hw, seeds: int) -> str:
    rows = []
    for name in QUALITY:
        opt, n_opt = exhaustive_optimum(name, hw)
        print(f"  exhaustive {name}: {ms(opt)} ms after {n_opt} evaluations", file=sys.stderr)
        for strategy in ("tpe", "random", "exhaustive"):
            cells = []
            for budget in (50, 100, 300):
                runs = [tune(src(name), hw, budget=budget, strategy=strategy, seed=s, workers=2) for s in range(seeds if strategy != "exhaustive" else 1)]
                lat = sorted(r.predicted["latency_s"] for r in runs)[len(runs) // 2]  # median over seeds
                cells.append(f"{ms(lat)} ({(lat / opt - 1) * 100:+.1f}%)")
            rows.append([name, strategy, *cells, f"{ms(opt)} ({n_opt} evals)"])
            print(f"  quality {name} {strategy}: {cells}", file=sys.stderr)
    return table(["workload", "strategy", "50", "100", "300", "exhaustive optimum"], rows)


def versus_supertiling(hw, budget: int) -> tuple[str, dict]:
    rows, results = [], {}
    ratios = []
    for name in ALL:
        r = tune(src(name), hw, budget=budget, strategy="tpe", seed=0, workers=2, shape_hints=SHAPE_HINTS.get(name))
        base = r.baseline.get("latency_s")
        best = r.predicted["latency_s"]
        ratio = base / best if base and best else None
        if ratio:
            ratios.append(ratio)
        results[name] = r
        rows.append([name, ms(best), r.feasible, ms(base), f"{ratio:.2f}x" if ratio else "n/a", ms(r.untiled.get("latency_s"))])
    geo = math.exp(sum(math.log(x) for x in ratios) / len(ratios)) if ratios else float("nan")
    rows.append(["geomean", "", "", "", f"{geo:.2f}x", ""])
    return table(["workload", f"searched ms (tpe, {budget})", "feasible", "super tiling ms", "speedup", "untiled ms"], rows), results


def measured(results: dict, rounds: int, top: int) -> str:
    """Speedup over IREE's default in wall time and in CPU time per worker thread (moves less
    with other load on a shared machine; the fidelity benchmark's measure). Each of `rounds`
    comparisons compiles both and times them in 5 alternating rounds; the table gives the median
    comparison and the range, since one comparison on this shared VM can be off by 1.5x.
    With `top` > 0 the plan is the fastest measured of the search's `top` best predicted
    (`tune --measure-top`); the comparisons are fresh measurements, not the ones it won."""
    from service.measure.forcing import NotMeasurable
    from service.measure.timing import BenchSettings, measure_plan_and_default
    from service.search.refine import refine, with_measured_choice
    from service.search.shapes import parse_shape_hints

    rows, ratios, cpu_ratios, static = [], [], [], []
    for name in CONTRACTIONS:
        r = results.get(name)
        if r is not None and top:
            r = with_measured_choice(r, refine(src(name), r, top))
            print(f"  measure-top {top} {name}: chose {(r.measured or {}).get('chosen')} {r.measured}", file=sys.stderr)
        plan = r.plan if r is not None else None
        if not plan or not plan.get("groups"):
            rows.append([name, "no plan", "", "", ""])
            continue
        walls, cpus, forced_s, default_s, error = [], [], [], [], None
        for _ in range(rounds):
            try:
                c = measure_plan_and_default(src(name), plan, settings=BenchSettings(repetitions=5, min_time_s=0.1),
                                             shape_hints=parse_shape_hints(SHAPE_HINTS.get(name)) or None)
            except NotMeasurable as exc:
                error = f"not measurable: {exc.reason}"
                break
            if not c.forced.ok:
                error = f"FAILED {c.forced.error}"[:80]
                break
            walls.append(c.speedup_over_default)
            cpus.append(c.default.cpu_median_s / c.forced.cpu_median_s)
            forced_s.append(c.forced.median_s)
            default_s.append(c.default.median_s)
        if error or not walls:
            rows.append([name, error or "no measurement", "", "", ""])
            continue
        wall, cpu = statistics.median(walls), statistics.median(cpus)
        ratios.append(wall)
        cpu_ratios.append(cpu)
        if name not in SHAPE_HINTS:
            static.append((wall, cpu))
        rows.append([name, ms(statistics.median(forced_s)), ms(statistics.median(default_s)),
                     f"{wall:.2f}x ({min(walls):.2f}-{max(walls):.2f})", f"{cpu:.2f}x ({min(cpus):.2f}-{max(cpus):.2f})"])
        print(f"  measured {name}: {rows[-1]}", file=sys.stderr)

    def geo(xs: list[float]) -> str:
        return f"{math.exp(sum(math.log(x) for x in xs) / len(xs)):.2f}x" if xs else "n/a"

    rows.append(["geomean", "", "", geo(ratios), geo(cpu_ratios)])
    rows.append(["geomean, static shapes only", "", "", geo([w for w, _ in static]), geo([c for _, c in static])])
    return table(["workload", "searched plan ms (IREE, forced)", "IREE default ms",
                  f"speedup (wall), median of {rounds} (range)", f"speedup (CPU), median of {rounds} (range)"], rows)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", choices=["throughput", "quality", "baseline"], default=None)
    ap.add_argument("--measure", action="store_true", help="compile and time plans with IREE (slow)")
    ap.add_argument("--budget", type=int, default=300, help="budget for the vs-baseline table")
    ap.add_argument("--measure-rounds", type=int, default=3, help="paired comparisons per workload (median)")
    ap.add_argument("--measure-top", type=int, default=0, help="measure the K best predicted plans first and take the fastest (tune --measure-top)")
    ap.add_argument("--seeds", type=int, default=3, help="seeds per TPE/random quality cell (median)")
    ap.add_argument("--runs", type=int, default=3, help="runs per throughput cell (median)")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    hw = get_profile("host-cpu")
    t0 = time.time()
    print(f"host-cpu ({hw.compute.cores} cores), 2 worker processes, space {SPACE_VERSION}\n")
    if args.only in (None, "throughput"):
        print(f"### Evaluations per second (budget 200, random and TPE, median of {args.runs} runs)\n")
        print(throughput(hw, 200, args.runs) + "\n")
    if args.only in (None, "quality"):
        print(f"### Best predicted latency (ms) vs budget, median of {args.seeds} seeds; % over the exhaustive optimum\n")
        print(quality(hw, args.seeds) + "\n")
    if args.only in (None, "baseline") or args.measure:
        text, results = versus_supertiling(hw, args.budget)
        print(f"### Searched (TPE, budget {args.budget}) vs super tiling (seed 000), predicted\n")
        print(text + "\n")
        if args.measure:
            chosen = f"the fastest measured of the top {args.measure_top} predicted" if args.measure_top else "the predicted best"
            print(f"### Measured on this CPU with IREE: searched plan ({chosen}) forced vs IREE's default\n")
            print(measured(results, args.measure_rounds, args.measure_top) + "\n")
    print(f"(total {time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
