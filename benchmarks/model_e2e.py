"""Whole models end to end: dispatches found / tuned / left to IREE, tuning time, and the
MEASURED whole-model latency with the tuning spec against IREE's default, on this machine.

    python benchmarks/model_e2e.py                       # every model in ../shared/models, --measure-top 0
    python benchmarks/model_e2e.py --measure-top 3       # measurement in the loop
    python benchmarks/model_e2e.py --models mlp_512_2048_b16 --rounds 7
    python benchmarks/model_e2e.py --files bert.onnx gpt2.mlir  # any model files, ONNX imported

Each model: `tune_model` (IREE forms the dispatches; a dispatch ships its tuned config only when
it beats IREE's own default, "by the guard" counts those left for that; the spec is checked
against IREE's own configuration dumps), then `bench_model` (both builds timed with iree-benchmark-module in
interleaved rounds, wall time, median). Prints a markdown table and the geomean speedup.
"""

from __future__ import annotations

import argparse
import math
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from service.hardware.profiles import get_profile  # noqa: E402
from service.model_tuning import ModelInputError, bench_model, tune_model  # noqa: E402

MODELS = ROOT.parent / "shared" / "models"


def cpu_name() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return platform.processor() or "unknown CPU"
    fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    get = lambda k: fields.get(k, "?").strip()  # noqa: E731
    return f"{get('Model name')} (family {get('CPU family')}, model {get('Model')})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="*", default=None, help="names in ../shared/models (default: all)")
    ap.add_argument("--files", nargs="*", type=Path, default=None,
                    help="model files instead (MLIR or ONNX, e.g. models it has never seen)")
    ap.add_argument("--measure-top", type=int, default=0)
    ap.add_argument("--budget", type=int, default=None, help="evaluations per model (default: 64 per tunable dispatch)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved benchmark rounds")
    args = ap.parse_args()
    if args.files:
        models = {f.name: f for f in args.files}
    else:
        names = args.models or sorted(p.name.removesuffix(".linalg.mlir") for p in MODELS.glob("*.linalg.mlir"))
        models = {name: MODELS / f"{name}.linalg.mlir" for name in names}
    hw = get_profile("host-cpu")
    print(f"{cpu_name()}, host-cpu profile, --measure-top {args.measure_top}\n")
    print("| model | dispatches | tuned | left to IREE | of them by the guard | tuning s | IREE default ms | with spec ms | speedup |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    speedups = []
    for name, model in models.items():
        with tempfile.TemporaryDirectory() as tmp:
            spec = Path(tmp) / "spec.mlir"
            try:
                report = tune_model(model, hw, spec, budget=args.budget, measure_top=args.measure_top)
            except ModelInputError as exc:  # IREE itself refuses the model: nothing to compare
                print(f"| {name} | - | - | - | - | - | - | - | not in the geomean: {exc} |", flush=True)
                continue
            tuned = sum(d.tuned for d in report.dispatches)
            guarded = sum(not d.tuned and (d.reason or "").startswith("IREE's default") for d in report.dispatches)
            if report.spec is None:
                print(f"| {name} | {len(report.dispatches)} | 0 | {len(report.dispatches)} | {guarded} | "
                      f"{report.elapsed_s:.1f} | - | - | 1.00x |")
                speedups.append(1.0)
                continue
            bench = bench_model(model, spec, rounds=args.rounds)
        speedups.append(bench.speedup)
        print(f"| {name} | {len(report.dispatches)} | {tuned} | {len(report.dispatches) - tuned} | {guarded} | {report.elapsed_s:.1f} | "
              f"{bench.default_median_s * 1e3:.3f} | {bench.tuned_median_s * 1e3:.3f} | {bench.speedup:.2f}x |",
              flush=True)
    if not speedups:
        return 1
    geomean = math.exp(sum(math.log(s) for s in speedups) / len(speedups))
    print(f"\ngeomean speedup over IREE's default: {geomean:.2f}x; slowest {min(speedups):.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
