"""The order builds are timed in within each round of a paired comparison.

Timed one after the other, the second of two identical builds ran faster than the first in
51 of 80 rounds on an AMD Zen 4 (docs/benchmarks.md, session 32): a build timed second in every
round wins more of them than noise allows, which is what a sign test over the rounds counts.
So the order rotates from round to round and every build is timed in every position equally
often (a Latin square: with two builds, A B, B A, A B, ...)."""

from __future__ import annotations


def round_order(builds: int, round_index: int) -> list[int]:
    """Indices of `builds` builds in the order round `round_index` times them."""
    return [(round_index + i) % builds for i in range(builds)]


__all__ = ["round_order"]
