"""A fixed plan set's costs and a fixed set of searches' decisions, as JSON, to compare a
refactor's before and after to the bit.

    python benchmarks/cost_snapshot.py -o before.json      # on the old code
    python benchmarks/cost_snapshot.py -o after.json       # on the new code
    python benchmarks/cost_snapshot.py --compare before.json after.json

Plans: for every workload in ../shared/workloads and every hardware model named, each group's
default and smallest start plus --plans random assignments of the search space's knobs (seeded),
applied to a clone and costed with the exact cost model (recompute pass included). Decisions:
`tune` with each strategy at a small budget and a fixed seed, its chosen plan hash and latency.
The same machine must run both sides: `host-cpu` is detected from it.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from service.hardware.profiles import get_profile  # noqa: E402
from service.ir.analysis import analyze  # noqa: E402
from service.search.engine import tune  # noqa: E402
from service.search.evaluator import evaluate_plans  # noqa: E402
from service.search.space import build_space  # noqa: E402

WORKLOADS = ROOT.parent / "shared" / "workloads"
SHAPE_HINTS = {"dynamic_matmul": {"arg0": [128, 1024]}}
STRATEGIES = ("tpe", "nsga2", "random", "exhaustive", "supertiling")


def plan_set(source: str, hardware, hints: dict, count: int, seed: int) -> list[dict]:
    space = build_space(analyze(source).graph, hardware, hints or None)
    rng = random.Random(seed)
    params_list = [{k: v for g in space.groups for k, v in g.default_params().items()},
                   {k: v for g in space.groups for k, v in g.smallest_params().items()}]
    knobs = space.knobs()
    params_list += [{k.name: rng.choice(k.choices) for k in knobs} for _ in range(count)]
    plans = []
    for params in params_list:
        plan = space.to_plan(params)
        if not isinstance(plan, str):
            plans.append(plan.model_dump(mode="json"))
    return plans


def snapshot(hardware_names: list[str], count: int, budget: int) -> dict:
    out: dict = {"costs": {}, "decisions": {}}
    for path in sorted(WORKLOADS.glob("*.mlir")):
        source = path.read_text()
        hints = SHAPE_HINTS.get(path.stem, {})
        for name in hardware_names:
            hw = get_profile(name)
            plans = plan_set(source, hw, hints, count, seed=0)
            results = evaluate_plans(source, hw.model_dump_json(), hints, plans, exact=True)
            for r in results:
                r.pop("seconds", None)
                r.pop("failed_group", None)  # a rejection's group as a field: its reason names it too
            out["costs"][f"{path.stem}@{name}"] = [{"plan": p, "result": r} for p, r in zip(plans, results)]
            for strategy in STRATEGIES:
                b = 24 if strategy == "exhaustive" else budget
                res = tune(source, hw, budget=b, strategy=strategy, seed=0, shape_hints=hints or None, workers=2)
                out["decisions"][f"{path.stem}@{name}/{strategy}"] = {
                    "plan_hash": res.plan_hash, "latency_s": res.predicted.get("latency_s"),
                    "evaluations": res.evaluations, "plan": res.plan,
                }
            print(f"{path.stem} on {name}: {len(plans)} plans", file=sys.stderr)
    return out


def compare(a_path: Path, b_path: Path) -> int:
    a, b = json.loads(a_path.read_text()), json.loads(b_path.read_text())
    differences = 0
    for section in ("costs", "decisions"):
        for key in sorted(set(a[section]) | set(b[section])):
            if a[section].get(key) != b[section].get(key):
                differences += 1
                print(f"{section} differ: {key}")
    n_plans = sum(len(v) for v in a["costs"].values())
    print(f"{n_plans} plans on {len(a['costs'])} workload x hardware pairs, {len(a['decisions'])} searches: "
          f"{'identical' if differences == 0 else f'{differences} differ'}")
    return 1 if differences else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-o", "--out", type=Path)
    parser.add_argument("--hardware", nargs="+", default=["host-cpu", "npu-sram-256k"])
    parser.add_argument("--plans", type=int, default=40)
    parser.add_argument("--budget", type=int, default=48)
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    args = parser.parse_args()
    if args.compare:
        return compare(*args.compare)
    text = json.dumps(snapshot(args.hardware, args.plans, args.budget), indent=1, sort_keys=True)
    if args.out:
        args.out.write_text(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
