"""Search strategies behind one small interface, in ask/tell style.

    s = make_strategy("tpe", knobs, seed=0)
    c = s.suggest()          # a Candidate, or None when the strategy has nothing left
    s.tell(c, evaluation)    # what the engine found

All are deterministic for a given seed when told results in the order they were suggested
(the engine guarantees that, even with a process pool). With `identity` (knob values -> the
plan they make; many knob values make the same plan), tpe, random and exhaustive avoid
proposing a plan they proposed before: a repeat costs the engine nothing to evaluate, but a
converging TPE repeats itself far more often than it finds something new.

- tpe: the project's own multivariate categorical TPE (`tpe.py`), feasibility as a constraint;
- nsga2: Optuna's NSGA-II, latency vs peak footprint (`nsga2.py`);
- random, exhaustive: `simple.py`;
- supertiling: one whole plan made without search, scored by every search as the baseline
  (`supertiling.py`; not a `make_strategy` name: the engine makes its plan itself).
"""

from __future__ import annotations

from typing import Protocol

from ..candidate import Candidate, Evaluation
from ..errors import UnknownStrategyError
from ..space import Knob
from .nsga2 import NSGA2Strategy
from .proposed import Identity
from .simple import ExhaustiveStrategy, RandomStrategy
from .supertiling import SuperTilingStrategy, supertiling_plan
from .tpe import TPEStrategy

__all__ = [
    "STRATEGIES", "Strategy", "Identity", "check_strategy", "make_strategy",
    "TPEStrategy", "NSGA2Strategy", "RandomStrategy", "ExhaustiveStrategy", "SuperTilingStrategy", "supertiling_plan",
]

STRATEGIES = ("tpe", "nsga2", "random", "exhaustive", "supertiling")


class Strategy(Protocol):
    name: str

    def suggest(self) -> Candidate | None: ...

    def tell(self, candidate: Candidate, evaluation: Evaluation) -> None: ...


_SEARCHING = {"tpe": TPEStrategy, "nsga2": NSGA2Strategy, "random": RandomStrategy, "exhaustive": ExhaustiveStrategy}


def check_strategy(name: str) -> None:
    """UnknownStrategyError (the caller's mistake, with the choices) unless `name` is one."""
    if name not in STRATEGIES:
        raise _unknown_strategy(name)


def _unknown_strategy(name: str) -> UnknownStrategyError:
    return UnknownStrategyError(f"unknown strategy {name!r}; choose one of {', '.join(STRATEGIES)}")


def make_strategy(name: str, knobs: list[Knob], seed: int, warm_start: list[dict] | None = None,
                  identity: Identity | None = None) -> Strategy:
    """`identity`: knob values -> a key of the plan they make (see the module docstring)."""
    if name not in _SEARCHING:
        raise _unknown_strategy(name)
    return _SEARCHING[name](knobs, seed, warm_start, identity)
