"""The strategies that learn nothing from results: uniform random and exhaustive enumeration."""

from __future__ import annotations

import itertools
import random

from ..candidate import Candidate, Evaluation
from ..space import Knob
from .proposed import NOVELTY_TRIES, Identity, Proposed


class RandomStrategy:
    """Uniform over the knobs; with `identity`, redrawn (up to NOVELTY_TRIES times) until the
    plan is one not proposed before."""

    def __init__(self, knobs: list[Knob], seed: int, warm_start: list[dict] | None = None,
                 identity: Identity | None = None) -> None:
        self.name = "random"
        self.knobs = knobs
        self.rng = random.Random(seed)
        self.proposed = Proposed(identity, warm_start)

    def suggest(self) -> Candidate:
        if (params := self.proposed.next_warm()) is not None:
            return Candidate(params=params, source=self.name)
        for _ in range(NOVELTY_TRIES):
            params = {k.name: self.rng.choice(k.choices) for k in self.knobs}
            if self.proposed.is_new(params):
                break
        return Candidate(params=params, source=self.name)

    def tell(self, candidate: Candidate, evaluation: Evaluation) -> None:
        pass


class ExhaustiveStrategy:
    """Every combination in a fixed order (complete only when the space fits the budget)."""

    def __init__(self, knobs: list[Knob], seed: int = 0, warm_start: list[dict] | None = None,
                 identity: Identity | None = None) -> None:
        self.name = "exhaustive"
        self.knobs = knobs
        self._it = itertools.product(*[k.choices for k in knobs])
        self.proposed = Proposed(identity, warm_start)

    def suggest(self) -> Candidate | None:
        if (params := self.proposed.next_warm()) is not None:
            return Candidate(params=params, source=self.name)
        for values in self._it:
            params = dict(zip((k.name for k in self.knobs), values))
            if self.proposed.is_new(params):  # else: the same plan as an earlier combination
                return Candidate(params=params, source=self.name)
        return None

    def tell(self, candidate: Candidate, evaluation: Evaluation) -> None:
        pass
