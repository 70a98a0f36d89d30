"""What the strategies share: the plans proposed so far (by `identity`) and warm starts."""

from __future__ import annotations

import logging
from collections import deque
from typing import Any, Callable, Hashable

from ..space import Knob

# Knob values -> a key of the plan they make (many knob values make the same plan).
Identity = Callable[[dict[str, Any]], Hashable]
# Redraws (random) or neighbours (tpe) tried for a plan not proposed before.
NOVELTY_TRIES = 64

log = logging.getLogger(__name__)


class Proposed:
    """The plans a strategy proposed so far, by `identity` (without one, every proposal is new),
    and the warm-start knob values still to propose first."""

    def __init__(self, identity: Identity | None, warm_start: list[dict] | None = None) -> None:
        self.identity = identity
        self.seen: set = set()
        self.warm = deque(warm_start or [])

    def next_warm(self) -> dict | None:
        """The next warm-start knob values (now recorded as proposed), or None."""
        if not self.warm:
            return None
        params = self.warm.popleft()
        self.is_new(params)
        return params

    def is_new(self, params: dict) -> bool:
        """True the first time these knob values' plan is proposed (and remember it)."""
        if self.identity is None:
            return True
        key = self.identity(params)
        if key in self.seen:
            return False
        self.seen.add(key)
        return True


def warm_starts_in_space(warm_start: list[dict] | None, knobs: list[Knob]) -> list[dict]:
    """The warm starts whose every knob value is one of the knob's choices; the others are
    dropped with a warning (a value outside the choices cannot be sampled around or told)."""
    kept = []
    for params in warm_start or []:
        if all(params.get(k.name) in k.choices for k in knobs):
            kept.append(params)
        else:
            log.warning("warm start outside the search space dropped: %s", params)
    return kept
