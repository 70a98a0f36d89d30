"""NSGA-II (latency vs peak footprint, feasibility as a constraint): Optuna's NSGAIISampler
through its public ask/tell interface."""

from __future__ import annotations

import logging

import optuna

from ..candidate import Candidate, Evaluation
from ..space import Knob
from .proposed import Identity, warm_starts_in_space

# Optuna needs finite objective values: unusable candidates get this instead of infinity.
_WORST = 1e9
_POPULATION = 20

optuna.logging.set_verbosity(logging.WARNING)


class NSGA2Strategy:
    """Its generations live in the study's trials. It keeps them as they come: repeats of a
    plan are not swapped for neighbours (`identity` is accepted for the common signature)."""

    def __init__(self, knobs: list[Knob], seed: int, warm_start: list[dict] | None = None,
                 identity: Identity | None = None) -> None:
        self.name = "nsga2"
        self.distributions = {k.name: optuna.distributions.CategoricalDistribution(k.choices) for k in knobs}
        sampler = optuna.samplers.NSGAIISampler(seed=seed, population_size=_POPULATION)
        self.study = optuna.create_study(directions=["minimize", "minimize"], sampler=sampler)
        for params in warm_starts_in_space(warm_start, knobs):
            self.study.enqueue_trial(params, skip_if_exists=True)

    def suggest(self) -> Candidate:
        trial = self.study.ask(self.distributions)
        return Candidate(params=dict(trial.params), source=self.name, token=trial)

    def tell(self, candidate: Candidate, evaluation: Evaluation) -> None:
        latency = min(evaluation.objective, _WORST) if evaluation.latency_s is not None else _WORST
        footprint = float(evaluation.peak_footprint_bytes) if evaluation.peak_footprint_bytes is not None else _WORST
        trial: optuna.trial.Trial = candidate.token
        trial.set_constraint("infeasible", 0.0 if evaluation.feasible else 1.0)  # <= 0: satisfied
        self.study.tell(trial, [latency, footprint])
