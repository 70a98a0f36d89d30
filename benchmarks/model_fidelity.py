"""How well does the cost model rank real tilings? Measured (IREE on this CPU) vs predicted.

For every contraction / convolution workload in the workloads dir: >= 20 plans IREE accepts,
spanning bad to good, each measured and predicted. Each plan is timed in alternating rounds with
IREE's default. The machine is shared (2 cores, several people), so by default the time compared
is process CPU time per worker thread, which moves far less with other load than wall time
(--timing wall: wall medians normalized by the paired default). Measurements are cached in
var/measure, so a rerun only re-predicts.
Per workload: Spearman rho and Kendall tau between predicted and measured latency, top-1 regret
(measured latency of the model's pick / best measured), and the model's pick vs IREE's default.

Predictions come from the cost model under three hardware models:
- nominal: the host-cpu profile's figures, no calibration;
- held-out: calibration fitted on the OTHER workloads' measurements (the honest number);
- profile: the saved profile as loaded by get_profile (calibrated in-sample if calibrated here).

Convolutions are listed as not measurable: IREE 3.13 drops a forced compilation_info on them.

    python benchmarks/model_fidelity.py [--workloads DIR] [--plans 20] [--hardware host-cpu]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from service.hardware.model import Calibration, HardwareModel  # noqa: E402
from service.hardware.profiles import get_profile  # noqa: E402
from service.measure.cache import MeasurementCache  # noqa: E402
from service.measure.calibration_fit import Predictor, fit_profile, with_calibration  # noqa: E402
from service.measure.calibration_plans import (  # noqa: E402
    MAX_VECTOR_ELEMENTS,
    ContractionWorkload,
    iree_config_of,
    load_contraction_workloads,
    max_vector_elements,
    sample_plans,
)
from service.measure.calibration_samples import TIMINGS, Sample, finish_samples, paired_sample  # noqa: E402
from service.measure.timing import BenchSettings  # noqa: E402

SETTINGS = BenchSettings(repetitions=3, min_time_s=0.05)  # same as calibrate: shares the cache
# (3 alternating rounds of plan / IREE default per plan)


def measured_samples(w: ContractionWorkload, want: int, cache: MeasurementCache, timing: str, log,
                     seed: int = 0, max_elements: int = MAX_VECTOR_ELEMENTS) -> list[Sample]:
    """`want` plans that IREE compiled and ran, each timed paired with IREE's default (samples
    more when some fail)."""
    samples: list[Sample] = []
    for plan in sample_plans(w, want + 8, seed, max_elements):
        if len([s for s in samples if s.raw_s]) >= want:
            break
        s = paired_sample(w, plan, SETTINGS, cache, timing)
        samples.append(s)
        c = iree_config_of(w, plan)
        log(f"  {w.name} {c.distribution} {c.vector_common_parallel} {c.vector_reduction}: "
            + (f"{s.raw_s * 1e3:.2f} ms, default {s.default_s * 1e3:.2f} ms" if s.raw_s else f"failed {s.error}"))
    return finish_samples(samples, timing)


def ranking(samples: list[Sample], predicted: list[float], default_s: float | None) -> dict:
    measured = [s.measured_s for s in samples]
    pick = min(range(len(samples)), key=lambda i: predicted[i])
    best = min(measured)
    finite = [(p, m) for p, m in zip(predicted, measured) if math.isfinite(p)]
    rho = stats.spearmanr(*zip(*finite)).statistic if len(finite) >= 3 else float("nan")
    tau = stats.kendalltau(*zip(*finite)).statistic if len(finite) >= 3 else float("nan")
    return {
        "rho": rho,
        "tau": tau,
        "regret": measured[pick] / best - 1.0,
        "pick_s": measured[pick],
        "best_s": best,
        "pick_vs_default": (default_s / measured[pick]) if default_s else None,
        "pick_plan": samples[pick].plan,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "workloads")
    ap.add_argument("--plans", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0,
                    help="which plans to sample: another seed measures plans the model was not tuned on")
    ap.add_argument("--hardware", default="host-cpu")
    ap.add_argument("--timing", choices=TIMINGS, default="cpu",
                    help="cpu: CPU time per worker thread (robust to other load); wall: wall time "
                         "normalized by the paired IREE default")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args()
    log = (lambda _: None) if args.quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))

    workloads, skipped = load_contraction_workloads(args.workloads)
    cache = MeasurementCache()
    profile = get_profile(args.hardware)
    nominal: HardwareModel = with_calibration(profile, Calibration())

    samples: dict[str, list[Sample]] = {}
    defaults: dict[str, float | None] = {}
    for w in workloads:
        log(f"measuring {w.name}")
        samples[w.name] = [s for s in measured_samples(w, args.plans, cache, args.timing, log, args.seed,
                                                       max_vector_elements(profile)) if s.measured_s]
        # IREE's default: the median of its timings paired with each plan (same load as them).
        paired = [s.default_s for s in samples[w.name] if s.default_s]
        defaults[w.name] = statistics.median(paired) if paired else None

    predictor = Predictor(workloads)
    all_samples = [s for ss in samples.values() for s in ss]
    models: dict[str, dict[str, HardwareModel]] = {}
    for w in workloads:
        others = [s for s in all_samples if s.workload != w.name]
        held_out = fit_profile(others, predictor, nominal) if others else nominal
        models[w.name] = {"nominal": nominal, "held-out": held_out, "profile": profile}

    rows = []
    for w in workloads:
        ss = samples[w.name]
        for label, hw in models[w.name].items():
            predicted = [predictor.latency_s(s.workload, s.plan, hw) for s in ss]
            rows.append((w.name, label, len(ss), ranking(ss, predicted, defaults[w.name]), defaults[w.name]))

    print(f"timing: {args.timing}; IREE default = median of its runs paired with the plans\n")
    print("| workload | model | plans | Spearman rho | Kendall tau | top-1 regret | model's pick | best measured | IREE default | pick vs default |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, label, n, r, default_s in rows:
        vs = f"{r['pick_vs_default']:.2f}x" if r["pick_vs_default"] else "n/a"
        dflt = f"{default_s * 1e3:.2f} ms" if default_s else "failed"
        print(f"| {name} | {label} | {n} | {r['rho']:.2f} | {r['tau']:.2f} | {r['regret'] * 100:.0f}% | "
              f"{r['pick_s'] * 1e3:.2f} ms | {r['best_s'] * 1e3:.2f} ms | {dflt} | {vs} |")
    for name, why in skipped.items():
        if "convolution" in why or "dynamic" in why:
            print(f"| {name} | - | 0 | not measurable: {why} | | | | | | |")
    for label in ("nominal", "held-out", "profile"):
        chosen = [r for _, lab, _, r, _ in rows if lab == label]
        if chosen:
            rhos = [r["rho"] for r in chosen if not math.isnan(r["rho"])]
            print(f"\n{label}: median rho {statistics.median(rhos):.2f}, "
                  f"median regret {statistics.median(r['regret'] for r in chosen) * 100:.0f}%", end="")
    print()
    for w in workloads:
        r = next(r for name, lab, _, r, _ in rows if name == w.name and lab == "held-out")
        c = iree_config_of(w, r["pick_plan"])
        print(f"{w.name}: held-out model picks dist={c.distribution} vec={c.vector_common_parallel} "
              f"red={c.vector_reduction}")


if __name__ == "__main__":
    main()
