"""A multivariate Tree-structured Parzen Estimator over categorical knobs.

TPE (Bergstra et al., "Algorithms for Hyper-Parameter Optimization", 2011), as Optuna's
`TPESampler(multivariate=True)` runs it on categorical parameters:

- warm starts first; then, until `STARTUP_TRIALS` trials are told, uniform random proposals;
- then the told trials are split: the best gamma(n) = min(ceil(0.1 n), 25) feasible ones are
  the good set, every other trial (infeasible ones always) the bad set;
- each set becomes a density over whole knob vectors, l(x) from the good set and g(x) from the
  bad: a mixture of one kernel per trial plus a uniform prior of weight `PRIOR_WEIGHT`; a
  kernel keeps its trial's choice of each knob with a high probability and otherwise picks any
  choice (Aitchison-Aitken-like), and older trials weigh less in g past 25 trials;
- `EI_CANDIDATES` vectors are drawn from l and the one maximising log l(x) - log g(x) (the
  expected improvement, up to a monotone map) is proposed.

Feasibility is a constraint: an infeasible trial is never good, whatever its latency (Optuna
tops a short good set up with the least infeasible trials; here every infeasible trial breaks
the one constraint alike, so none is less infeasible than another). The two densities depend
only on the told trials, so they are rebuilt only when that count changes (the engine
suggests a whole batch before telling any of it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..candidate import Candidate, Evaluation
from ..space import Knob
from .proposed import NOVELTY_TRIES, Identity, Proposed, warm_starts_in_space

STARTUP_TRIALS = 10
# Vectors drawn from l(x) per proposal (Optuna's default is 24): each is scored against every
# told trial, and 8 meets the quality target (docs/benchmarks.md: search benchmarks).
EI_CANDIDATES = 8
PRIOR_WEIGHT = 1.0
# Past this many trials, the older ones weigh less in the bad density (Optuna's default_weights).
_FLAT_WEIGHTS = 25


def good_set_size(told: int) -> int:
    """gamma(n): how many of `told` trials form the good density (Optuna's default_gamma)."""
    return min(math.ceil(0.1 * told), 25)


def _trial_weights(n: int) -> np.ndarray:
    """Kernel weights of `n` trials oldest first: flat up to 25, then a ramp for the older ones."""
    if n < _FLAT_WEIGHTS:
        return np.ones(n)
    return np.concatenate([np.linspace(1.0 / n, 1.0, num=n - _FLAT_WEIGHTS), np.ones(_FLAT_WEIGHTS)])


@dataclass(frozen=True)
class CategoricalParzen:
    """A Parzen density over vectors of choice indices: one product kernel per observation
    (rows of `observations`, weighted `weights[:-1]`) plus a uniform prior (`weights[-1]`).
    Knob i's kernel gives its observed choice `keep[i] + (1 - keep[i]) / sizes[i]` and every
    other choice `(1 - keep[i]) / sizes[i]`."""

    observations: np.ndarray  # (n, knobs) choice indices
    weights: np.ndarray  # (n + 1,) summing to 1, the prior last
    sizes: np.ndarray  # (knobs,) choices per knob
    keep: np.ndarray  # (knobs,)

    @classmethod
    def fit(cls, observations: np.ndarray, weights: np.ndarray, sizes: np.ndarray) -> "CategoricalParzen":
        n = len(observations)
        mixture = np.append(weights, PRIOR_WEIGHT)
        # Optuna's categorical kernel: PRIOR_WEIGHT / (n + 1) on every choice, plus 1 on the
        # observed one, normalised; i.e. keep the observation with probability 1 / (1 + C p / (n + 1)).
        keep = 1.0 / (1.0 + sizes * PRIOR_WEIGHT / (n + 1))
        return cls(observations, mixture / mixture.sum(), sizes, keep)

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        """`size` vectors of choice indices, (size, knobs)."""
        n = len(self.observations)
        component = rng.choice(n + 1, size=size, p=self.weights)
        uniform = rng.integers(0, self.sizes, size=(size, len(self.sizes)))
        if n == 0:
            return uniform
        kept = (rng.random((size, len(self.sizes))) < self.keep) & (component < n)[:, np.newaxis]
        return np.where(kept, self.observations[np.minimum(component, n - 1)], uniform)

    def log_pdf(self, x: np.ndarray) -> np.ndarray:
        """log density of each row of `x` (choice indices), (len(x),)."""
        miss = (1.0 - self.keep) / self.sizes  # a kernel's probability of a choice it did not observe
        log_miss = np.log(miss)
        log_gain = np.log(self.keep + miss) - log_miss  # extra log probability when it did
        matches = (x[:, np.newaxis, :] == self.observations[np.newaxis, :, :]).astype(float)
        per_kernel = log_miss.sum() + matches @ log_gain  # (len(x), n)
        prior = np.full((len(x), 1), -np.log(self.sizes).sum())
        weighted = np.concatenate([per_kernel, prior], axis=1) + np.log(self.weights)
        top = weighted.max(axis=1, keepdims=True)
        return (top + np.log(np.exp(weighted - top).sum(axis=1, keepdims=True)))[:, 0]


class TPEStrategy:
    """TPE (module docstring) behind the `Strategy` interface. With `identity`, when TPE
    proposes a plan already proposed, a neighbour is proposed instead: one to three knobs of
    the proposal changed at random, the first whose plan is new; TPE learns from its result
    like from its own (the repeat's is told already)."""

    def __init__(self, knobs: list[Knob], seed: int, warm_start: list[dict] | None = None,
                 identity: Identity | None = None) -> None:
        self.name = "tpe"
        self.knobs = knobs
        self.rng = np.random.default_rng(seed)
        self.sizes = np.array([len(k.choices) for k in knobs], dtype=np.int64)
        warm = [{k.name: params[k.name] for k in knobs} for params in warm_starts_in_space(warm_start, knobs)]
        self.proposed = Proposed(identity, warm)
        self.told: list[tuple[int, ...]] = []  # choice indices of every told trial, in order
        self.latency: list[float] = []  # inf for an infeasible trial
        self._densities: tuple[int, CategoricalParzen, CategoricalParzen] | None = None

    def suggest(self) -> Candidate:
        if (params := self.proposed.next_warm()) is not None:
            return Candidate(params=params, source=self.name)
        row = self._draw()
        params = self._params(row)
        if not self.proposed.is_new(params):
            neighbour = self._novel_neighbour(row)
            if neighbour is not None:
                row, params = neighbour
            # else: nothing new nearby: let the repeat through (the engine counts it idle)
        return Candidate(params=params, source=self.name, token=tuple(int(i) for i in row))

    def tell(self, candidate: Candidate, evaluation: Evaluation) -> None:
        row = candidate.token if candidate.token is not None else self._indices(candidate.params)
        self.told.append(row)
        usable = evaluation.feasible and evaluation.latency_s is not None
        self.latency.append(evaluation.latency_s if usable else math.inf)

    def _draw(self) -> np.ndarray:
        """Uniform at random during the startup trials, then TPE's choice among EI_CANDIDATES."""
        if len(self.told) < STARTUP_TRIALS:
            return self.rng.integers(0, self.sizes)
        good, bad = self.densities()
        samples = good.sample(self.rng, EI_CANDIDATES)
        return samples[int(np.argmax(good.log_pdf(samples) - bad.log_pdf(samples)))]

    def densities(self) -> tuple[CategoricalParzen, CategoricalParzen]:
        """l(x) and g(x) of the trials told so far (rebuilt only when more were told)."""
        if self._densities is None or self._densities[0] != len(self.told):
            told = np.array(self.told, dtype=np.int64).reshape(len(self.told), len(self.knobs))
            latency = np.array(self.latency)
            feasible = np.flatnonzero(np.isfinite(latency))
            ranked = feasible[np.argsort(latency[feasible], kind="stable")]
            good = np.sort(ranked[:good_set_size(len(told))])
            bad = np.setdiff1d(np.arange(len(told)), good)  # sorted: oldest first
            self._densities = (
                len(told),
                CategoricalParzen.fit(told[good], np.ones(len(good)), self.sizes),
                CategoricalParzen.fit(told[bad], _trial_weights(len(bad)), self.sizes),
            )
        return self._densities[1], self._densities[2]

    def _novel_neighbour(self, row: np.ndarray) -> tuple[np.ndarray, dict] | None:
        """Choice indices near `row` whose plan was not proposed yet (now recorded), or None."""
        changeable = np.flatnonzero(self.sizes > 1)
        if not len(changeable):
            return None
        for attempt in range(NOVELTY_TRIES):
            cand = row.copy()
            changed = self.rng.choice(changeable, size=min(len(changeable), 1 + attempt * 3 // NOVELTY_TRIES),
                                      replace=False)
            for i in changed:  # another choice of knob i, uniformly
                other = self.rng.integers(0, self.sizes[i] - 1)
                cand[i] = other + (other >= row[i])
            params = self._params(cand)
            if self.proposed.is_new(params):
                return cand, params
        return None

    def _params(self, row: np.ndarray) -> dict:
        return {k.name: k.choices[i] for k, i in zip(self.knobs, row)}

    def _indices(self, params: dict) -> tuple[int, ...]:
        return tuple(k.choices.index(params[k.name]) for k in self.knobs)
