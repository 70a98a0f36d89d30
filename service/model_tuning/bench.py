"""`model bench`: a whole model timed with and without a tuning spec on this CPU."""

from __future__ import annotations

import tempfile
from pathlib import Path

from pydantic import BaseModel

from service.measure.forcing import write_inputs
from service.measure.whole_model import (
    compile_model,
    dispatch_configs,
    entry_function,
    input_program,
    model_arguments,
    time_models,
)

from .in_model import RESOLVED_P
from .model_input import ModelInputError, importable_model, refused_as


class ModelBenchmark(BaseModel):
    model: str
    spec: str
    default_median_s: float
    tuned_median_s: float
    speedup: float
    default_samples_s: list[float]
    tuned_samples_s: list[float]
    dispatches: int  # dispatch functions of the model
    dispatches_changed: int  # of them, those whose ops the spec compiled with other configs (at least one)
    tuned_faster_rounds: int  # alternating rounds in which the spec's build ran faster
    sign_test_p: float  # the chance of that many when both builds are equally fast (ModelTiming.sign_test_p)
    default_faster_p: float  # the same test for IREE's default build's rounds (ModelTiming.default_faster_p)

    @property
    def resolved(self) -> str | None:
        """'faster' or 'slower' (the spec's build) where the paired rounds resolve the difference
        at RESOLVED_P, the level `model tune` ships a measured spec at; None: within the noise."""
        if self.sign_test_p <= RESOLVED_P:
            return "faster"
        return "slower" if self.default_faster_p <= RESOLVED_P else None


def bench_model(model: Path, spec: Path, *, rounds: int = 5, function: str | None = None) -> ModelBenchmark:
    """Whole-model wall time with and without the spec, interleaved rounds on this CPU; run by
    `function`, by default the model's one public function."""
    with tempfile.TemporaryDirectory(prefix="tilesearch-bench-") as tmp:
        workdir = Path(tmp)
        source = model
        model = importable_model(model, workdir)
        with refused_as(f"IREE cannot compile {model.name}"):
            program = input_program(model, workdir / "input.mlir")
        with refused_as(f"cannot run {model.name}"):
            function = function or entry_function(program)
            arguments = model_arguments(program, function)
        with refused_as(f"IREE cannot compile {model.name}"):
            compile_model(model, workdir / "default.vmfb", workdir / "default_configs")
        with refused_as(f"IREE cannot compile {model.name} with the spec {spec.name}"):
            compile_model(model, workdir / "tuned.vmfb", workdir / "tuned_configs", spec=spec)
        default, tuned = dispatch_configs(workdir / "default_configs"), dispatch_configs(workdir / "tuned_configs")
        changed = sum(1 for name, c in default.items() if tuned.get(name) != c)
        if not changed:
            raise ModelInputError(f"the spec {spec.name} changed the config of none of {model.name}'s {len(default)} "
                                  "dispatches (was it tuned for this model?): two identical builds, nothing to time")
        with refused_as(f"cannot time {model.name}"):
            flags = write_inputs(arguments, workdir)
        timing = time_models(workdir / "default.vmfb", workdir / "tuned.vmfb", flags, function=function, rounds=rounds)
    return ModelBenchmark(model=str(source), spec=str(spec), default_median_s=timing.default_median_s,
                          tuned_median_s=timing.tuned_median_s, speedup=timing.speedup,
                          default_samples_s=timing.default_s, tuned_samples_s=timing.tuned_s,
                          dispatches=len(default), dispatches_changed=changed,
                          tuned_faster_rounds=timing.tuned_faster_rounds, sign_test_p=timing.sign_test_p,
                          default_faster_p=timing.default_faster_p)
