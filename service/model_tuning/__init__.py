"""Whole models: IREE's dispatches in, one tuning spec out (see tune.py; bench.py times a spec)."""

from .bench import ModelBenchmark, bench_model
from .model_input import ModelInputError
from .tune import DispatchReport, ModelTuneReport, SpecNotApplied, tune_model

__all__ = ["DispatchReport", "ModelBenchmark", "ModelInputError", "ModelTuneReport", "SpecNotApplied", "bench_model",
           "tune_model"]
