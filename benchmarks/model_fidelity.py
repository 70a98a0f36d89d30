"""How well does the cost model rank tilings of shapes it was never tuned on? The broad corpus.

The corpus (fidelity_corpus.py): contraction shapes from public model configurations, each with
a fixed grid of 18 IREE CPU configs plus IREE's own default, measured on this CPU with
fidelity_measure.py (cached per host in benchmarks/measurements/). The model ranks the measured
configs of each shape; per shape: Spearman rho between predicted and measured time, and top-1
regret (measured time of the model's pick / best measured - 1). Figures are reported per shape
class and half; the held-out half was fixed (by a hash of the names) before any model change,
and the targets are read on it.

Models compared:
- nominal: the host-cpu profile as shipped, no calibration;
- calibrated: calibration factors fitted (calibration_fit.fit_profile) on the tune half only.

--search also makes the service's single-module decision (the search from IREE's default,
TPE, --budget plans, guarded against that default) on each held-out shape and measures its pick
against IREE's default, paired in alternating rounds (cached like the grid), each call running
the dispatch --dispatch-repeat times back to back, as inside a model. The grids are read (and
measured) with 16 runs of the dispatch back to back a call, as inside a model and as every
measurement the service takes, where the host's whole grid is cached so; the hosts first
measured one dispatch a call are read that way until they are measured again (one dispatch a
call misranks configs of a DRAM-bound shape: docs/benchmarks.md, session 34). --grid-repeat N
reads (with --measure, times) the grid with N runs a call, cached apart.

    python benchmarks/model_fidelity.py [--measure] [--grid-repeat 1|16] [--search [--unguarded] [--device local-sync] [--rounds 9]
                                        [--dispatch-repeat 16]] [--budget 200]
                                        [--details [tune]] [--host KEY|all]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from dataclasses import replace
from pathlib import Path

from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fidelity_corpus import Shape, corpus, module_text  # noqa: E402
from fidelity_measure import (  # noqa: E402
    CACHE_DIR,
    SETTINGS,
    TIMINGS,
    ShapeMeasurements,
    host_cache,
    host_profile,
    host_translation,
    measure_shape,
    read_time,
)

from service.hardware.model import Calibration, HardwareModel  # noqa: E402
from service.hardware.profiles import get_profile  # noqa: E402
from service.measure.cache import MeasurementCache, host_key, measurement_key  # noqa: E402
from service.measure.calibration_fit import Predictor, fit_profile, with_calibration  # noqa: E402
from service.measure.calibration_samples import Sample  # noqa: E402
from service.measure.forcing import NotMeasurable  # noqa: E402
from service.measure.timing import Measurement, measure_plans_and_default  # noqa: E402
from service.measure.tools import BENCH_DEVICE, DISPATCH_REPEAT  # noqa: E402
from service.search.engine import KEEP_START_MARGIN  # noqa: E402
from service.search.guard import tune_from_iree_default  # noqa: E402

CLASSES = ("M<=32", "square-ish", "tall-skinny", "batched")
GRID_REPEAT = DISPATCH_REPEAT  # back to back, as inside a model


def samples_of(r: ShapeMeasurements) -> list[Sample]:
    """The shape's measured configs (the grid's, then IREE's default) as calibration samples."""
    out = [Sample(workload=r.shape.name, plan=p, measured_s=t) for p, t in zip(r.plans, r.measured_s) if t]
    if r.default_plan is not None and r.default_s:
        out.append(Sample(workload=r.shape.name, plan=r.default_plan, measured_s=r.default_s))
    return out


def ranking(samples: list[Sample], predicted: list[float]) -> dict:
    measured = [s.measured_s for s in samples]
    finite = [(p, m) for p, m in zip(predicted, measured) if math.isfinite(p)]
    rho = stats.spearmanr(*zip(*finite)).statistic if len(finite) >= 3 else float("nan")
    pick = min(range(len(samples)), key=lambda i: predicted[i])
    return {"rho": float(rho), "regret": measured[pick] / min(measured) - 1.0, "pick": pick}


def register_and_reduction_tile(plan: dict) -> tuple[str, int]:
    """A three-level plan's register tile ('8x16') and reduction tile (k)."""
    levels = plan["groups"][0]["levels"]
    k = max(levels[2]["tile_sizes"]) if len(levels) > 2 else 0
    reduction = [i for i, t in enumerate(levels[2]["tile_sizes"]) if t] if len(levels) > 2 else []
    reg = [t for i, t in enumerate(levels[1]["tile_sizes"]) if i not in reduction][-2:] if len(levels) > 1 else []
    return "x".join(map(str, reg)), k


def print_residuals(shapes: list[tuple[ShapeMeasurements, list[float], list[Sample]]]) -> None:
    """Per config, measured / predicted over the shape's median of that ratio (above 1: runs
    slower than the model thinks, against the shape's other configs); geomean per group."""
    groups: dict[tuple, list[float]] = {}
    for r, predicted, ss in shapes:
        ratios = [x.measured_s / p for x, p in zip(ss, predicted) if math.isfinite(p) and p > 0]
        if len(ratios) < 3:
            continue
        mid = statistics.median(ratios)
        for x, p in zip(ss, predicted):
            if math.isfinite(p) and p > 0:
                reg, k = register_and_reduction_tile(x.plan)
                key = (r.shape.b_layout, r.shape.shape_class, reg, "k<16" if k < 16 else "k>=16")
                groups.setdefault(key, []).append(x.measured_s / p / mid)
    print("\n| B layout | class | register tile | reduction | configs | measured/predicted (geomean, shape-normalised) |")
    print("|---|---|---|---|---|---|")
    for key in sorted(groups):
        xs = groups[key]
        if len(xs) >= 3:
            print(f"| {' | '.join(key)} | {len(xs)} | {math.exp(statistics.fmean(map(math.log, xs))):.2f} |")


def geomean(xs: list[float]) -> float:
    return math.exp(statistics.fmean(map(math.log, xs)))


def grid_picks_vs_default(rows: list[tuple[ShapeMeasurements, dict, list[Sample]]]) -> dict[str, list[float]]:
    """Per shape (its grid holding IREE's default, the last sample), IREE's default's measured
    time over: the grid's best (an oracle choosing among the grid), the model's pick among the
    grid, and that pick guarded as the single-module search guards its own (kept only when
    predicted KEEP_START_MARGIN faster than IREE's default; else IREE's default, 1.00x)."""
    out: dict[str, list[float]] = {"grid's best": [], "model's pick": [], "model's pick, guarded": []}
    for r, x, ss in rows:
        if r.default_plan is None or not r.default_s:
            continue
        predicted, pick = x["predicted"], ss[x["pick"]]
        out["grid's best"].append(r.default_s / min(s.measured_s for s in ss))
        out["model's pick"].append(r.default_s / pick.measured_s)
        kept = predicted[x["pick"]] * (1 + KEEP_START_MARGIN) <= predicted[-1]
        out["model's pick, guarded"].append(r.default_s / pick.measured_s if kept else 1.0)
    return out


def median(xs) -> float:
    xs = [x for x in xs if not math.isnan(x)]
    return statistics.median(xs) if xs else float("nan")


# Timed alone, a dispatch this short spends as much in IREE's task executor (waking its workers,
# handing out workgroups) as in its tiles: 50-300 us more than on one thread, varying 2x between
# runs of the same config on 2-vCPU guests (docs/benchmarks.md, session 27). The search's picks
# are reported on both sides of it.
SHORT_DISPATCH_S = 0.5e-3
# Rounds of a search pick against IREE's default. Three (the grid's) left one shape's ratio
# moving 0.85x <-> 1.13x between runs on a Zen 3 guest; the quartiles over the rounds are printed.
SEARCH_ROUNDS = 9


def search_vs_default(s: Shape, hardware: HardwareModel, budget: int, cache: MeasurementCache,
                      timing: str, guard: bool = True, device: str = BENCH_DEVICE,
                      rounds: int = SEARCH_ROUNDS, dispatch_repeat: int = DISPATCH_REPEAT,
                      ) -> tuple[float | None, tuple[float, float] | None, str]:
    """(IREE's default time / the decision's time, measured paired (None: not measurable); the
    quartiles of that ratio over the rounds (None: the guard kept IREE's default); the pick's
    tiles). The decision is the service's for one module (`tune_from_iree_default`): the search
    starts from IREE's default and its pick is guarded against it by prediction; when the guard
    keeps IREE's default, the answer is IREE's own build: 1.00x by definition. guard=False: the
    search's pick as it is (what the guard is worth). device: local-sync times both on one
    thread, the tiling's own work without the task executor's hand-off. rounds: alternating
    rounds of the pick and IREE's default, one repetition each. dispatch_repeat: runs of the
    dispatch back to back per call (BenchSettings; 1: each call alone, waking the workers)."""
    text = module_text(s)
    result = tune_from_iree_default(text, hardware, guard=guard, budget=budget, seed=0, workers=1)
    plan = result.plan
    if not plan.get("groups"):  # the answer leaves the op to IREE: IREE compiles its own config
        kept = result.iree_default and result.iree_default.get("kept")
        return 1.0, None, "IREE's default kept (guard)" if kept else "untiled"
    tiles = " / ".join(str(level["tile_sizes"]) for level in plan["groups"][0]["levels"])
    settings = replace(SETTINGS, device=device, repetitions=rounds, dispatch_repeat=dispatch_repeat)
    key = measurement_key(text, {"search_pick": plan}, settings)
    forced, default = cache.get(key), cache.get(key + ":default")
    if forced is None or default is None:
        try:
            (forced,), default = measure_plans_and_default(text, [plan], settings=settings)
        except NotMeasurable:
            return None, None, tiles
        cache.put(key, forced)
        cache.put(key + ":default", default)
    f, d = read_time(forced, default, timing), read_time(default, default, timing)
    return (d / f if f and d else None), round_ratio_quartiles(forced, default, timing), tiles


def round_ratio_quartiles(forced: Measurement, default: Measurement, timing: str) -> tuple[float, float] | None:
    """The lower and upper quartiles of IREE's default time / the pick's, round by round (both
    timed in each round): how far one shape's ratio is resolved on this machine."""
    pick, iree = ((forced.samples_s, default.samples_s) if timing == "wall"
                  else (forced.cpu_samples_s, default.cpu_samples_s))
    if not (forced.ok and default.ok and len(pick) == len(iree) >= 3):
        return None
    q1, _, q3 = statistics.quantiles([d / f for f, d in zip(pick, iree)], n=4)
    return q1, q3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--measure", action="store_true", help="measure shapes missing from this host's cache")
    ap.add_argument("--search", nargs="?", const="held-out", choices=("held-out", "tune"),
                    help="measure the search's pick on the held-out shapes (or on the tune half, to diagnose)")
    ap.add_argument("--budget", type=int, default=200, help="--search: plans the search evaluates per shape")
    ap.add_argument("--unguarded", action="store_true",
                    help="--search: measure the search's pick even where the guard would keep IREE's default")
    ap.add_argument("--rounds", type=int, default=SEARCH_ROUNDS,
                    help="--search: alternating rounds of the pick and IREE's default (at least 3)")
    ap.add_argument("--grid-repeat", type=int, default=None,
                    help="the grid as timed with each call running the dispatch this many times back to back "
                         f"(default: {GRID_REPEAT} where the host's whole grid is cached so, and with --measure; "
                         "else 1, one dispatch a call, as every host's grid was first measured)")
    ap.add_argument("--dispatch-repeat", type=int, default=DISPATCH_REPEAT,
                    help="--search: runs of the dispatch back to back per timed call (1: alone, as before session 27)")
    ap.add_argument("--device", choices=("local-task", "local-sync"), default=BENCH_DEVICE,
                    help="--search: IREE device the pick and IREE's default are timed on (local-sync: one thread)")
    ap.add_argument("--details", nargs="?", const="all", choices=("all", "tune", "held-out"),
                    help="a row per shape (of one half: look at 'tune' only while changing the model)")
    ap.add_argument("--timing", choices=TIMINGS, default="cpu", help="see fidelity_measure.py")
    ap.add_argument("--residuals", action="store_true",
                    help="tune half: where the nominal model errs, per B layout, register tile and reduction tile")
    ap.add_argument("--nominal-only", action="store_true", help="skip the calibrated model (its fit takes minutes)")
    ap.add_argument("--host", default=None,
                    help="another host's stored measurements, held against the model built from that host's facts; "
                         "'all': every host in benchmarks/measurements")
    args = ap.parse_args()
    hosts = [args.host or host_key()]
    if args.host == "all":
        hosts = sorted(p.name.removesuffix(".host.json") for p in CACHE_DIR.glob("*.host.json"))
    if (args.measure or args.search) and hosts != [host_key()]:
        ap.error(f"{'--measure' if args.measure else '--search'} measures on this host ({host_key()}) only")
    for key in hosts:
        report(key, args)
        print()


def grid_repeat(cache: MeasurementCache, measure: bool, lanes_f32: int, translation: str | None) -> int:
    """Runs of the dispatch a call the host's grid is read with: GRID_REPEAT when measuring or
    where every shape is cached so, else 1 (a host measured only one dispatch a call)."""
    if measure or all(measure_shape(s, cache, measure=False, lanes_f32=lanes_f32, translation_info=translation,
                                    dispatch_repeat=GRID_REPEAT) is not None for s in corpus()):
        return GRID_REPEAT
    return 1


def report(key: str, args: argparse.Namespace) -> None:
    cache = host_cache(key)
    profile = get_profile("host-cpu") if key == host_key() else host_profile(key)
    lanes_f32 = profile.compute.vector_width_bytes // 4
    translation = host_translation(key)
    repeat = args.grid_repeat or grid_repeat(cache, args.measure, lanes_f32, translation)
    results = [r for r in (measure_shape(s, cache, measure=args.measure, timing=args.timing, lanes_f32=lanes_f32,
                                         translation_info=translation, dispatch_repeat=repeat)
                           for s in corpus()) if r is not None]
    missing = len(corpus()) - len(results)
    nominal = with_calibration(profile, Calibration())
    predictor = Predictor([r.workload for r in results])
    samples = {r.shape.name: samples_of(r) for r in results}
    tune_samples = [x for r in results if r.shape.half == "tune" for x in samples[r.shape.name]]
    models = {"nominal": nominal}
    if not args.nominal_only:
        models["calibrated"] = fit_profile(tune_samples, predictor, nominal)

    rows = []
    for r in results:
        ss = samples[r.shape.name]
        if len(ss) < 3:
            continue
        for label, hw in models.items():
            predicted = [predictor.latency_s(x.workload, x.plan, hw) for x in ss]
            rows.append((r, label, ranking(ss, predicted) | {"predicted": predicted}, ss))

    print(f"host {key}, timing {args.timing}, {repeat} dispatch run(s) a call; {len(results)} shapes measured ({missing} not in the cache), "
          f"{sum(len(v) for v in samples.values())} configs\n")
    print("| model | half | class | shapes | median rho | median top-1 regret |")
    print("|---|---|---|---|---|---|")
    for label in models:
        for half in ("held-out", "tune"):
            for cls in (*CLASSES, "all"):
                chosen = [x for r, lab, x, _ in rows if lab == label and r.shape.half == half
                          and (cls == "all" or r.shape.shape_class == cls)]
                if chosen:
                    print(f"| {label} | {half} | {cls} | {len(chosen)} | {median(x['rho'] for x in chosen):.2f} | "
                          f"{median(x['regret'] for x in chosen) * 100:.0f}% |")
    print("\nWhat the grid holds against IREE's default (measured; geomean over the shapes, nominal model):\n")
    print("| half | choice | shapes | geomean vs IREE's default | min | below 0.97x |")
    print("|---|---|---|---|---|---|")
    for half in ("held-out", "tune"):
        for choice, ratios in grid_picks_vs_default([(r, x, ss) for r, lab, x, ss in rows
                                                      if lab == "nominal" and r.shape.half == half]).items():
            if ratios:
                print(f"| {half} | {choice} | {len(ratios)} | {geomean(ratios):.2f}x | {min(ratios):.2f}x | "
                      f"{sum(v < 0.97 for v in ratios)} |")
    if args.details:
        print("\n| shape | class | half | model | configs | rho | regret | pick | best | IREE default |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for r, label, x, ss in rows:
            if args.details != "all" and r.shape.half != args.details:
                continue
            print(f"| {r.shape.name} | {r.shape.shape_class} | {r.shape.half} | {label} | {len(ss)} | {x['rho']:.2f} | "
                  f"{x['regret'] * 100:.0f}% | {ss[x['pick']].measured_s * 1e3:.3f} ms | "
                  f"{min(s.measured_s for s in ss) * 1e3:.3f} ms | "
                  + (f"{r.default_s * 1e3:.3f} ms |" if r.default_s else "failed |"))
    if args.residuals:
        print_residuals([(r, x["predicted"], ss) for r, lab, x, ss in rows if lab == "nominal" and r.shape.half == "tune"])
    if args.search:
        print(f"\n| {args.search} shape | class | search pick vs IREE default (measured; quartiles over rounds) | pick's tiles |")
        print("|---|---|---|---|")
        ratios: list[tuple[float, float | None]] = []  # (ratio, IREE default's measured time)
        for r in results:
            if r.shape.half != args.search:
                continue
            ratio, spread, tiles = search_vs_default(r.shape, profile, args.budget, cache, args.timing,
                                                     not args.unguarded, args.device, args.rounds,
                                                     args.dispatch_repeat)
            if ratio:
                ratios.append((ratio, r.default_s))
            shown = f"{ratio:.2f}x" if ratio else "not measurable"
            if spread:
                shown += f" ({spread[0]:.2f}-{spread[1]:.2f})"
            print(f"| {r.shape.name} | {r.shape.shape_class} | {shown} | {tiles} |", flush=True)
        short = [x for x, d in ratios if d is not None and d < SHORT_DISPATCH_S]
        long = [x for x, d in ratios if d is None or d >= SHORT_DISPATCH_S]
        for label, chosen in ((f"{args.search} shapes", [x for x, _ in ratios]),
                              (f"under {SHORT_DISPATCH_S * 1e3:g} ms (IREE's default, timed alone)", short),
                              (f"{SHORT_DISPATCH_S * 1e3:g} ms and over", long)):
            if chosen:
                print(f"\nsearch pick vs default: geomean {math.exp(statistics.fmean(map(math.log, chosen))):.2f}x, "
                      f"min {min(chosen):.2f}x, {sum(x < 0.97 for x in chosen)} below 0.97x, over {len(chosen)} {label}")


if __name__ == "__main__":
    main()
