"""Whole models: IREE's dispatches in, one tuning spec out (see tune.py)."""

from .tune import DispatchReport, ModelInputError, ModelTuneReport, SpecNotApplied, bench_model, tune_model

__all__ = ["DispatchReport", "ModelInputError", "ModelTuneReport", "SpecNotApplied", "bench_model", "tune_model"]
