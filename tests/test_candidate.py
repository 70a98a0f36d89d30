"""Which evaluation is better: one rule (Evaluation.rank, is_better) for the engine and the strategies."""

from __future__ import annotations

from service.search.candidate import Evaluation, is_better


def _ev(latency: float | None, feasible: bool = True, reasons: int = 0, plan_hash: str = "h") -> Evaluation:
    cost = None if latency is None else {"reasons": ["over"] * reasons if not feasible else []}
    return Evaluation(plan={"groups": []}, plan_hash=plan_hash, latency_s=latency, feasible=feasible, cost=cost)


def test_feasible_first_then_fewer_broken_limits_then_latency_then_hash():
    assert is_better(_ev(2.0, feasible=False, reasons=1), _ev(3.0))
    assert not is_better(_ev(3.0), _ev(2.0, feasible=False, reasons=1))
    assert is_better(_ev(1.0, feasible=False, reasons=2), _ev(5.0, feasible=False, reasons=1))
    assert is_better(_ev(2.0), _ev(1.0)) and not is_better(_ev(1.0), _ev(2.0))
    assert is_better(_ev(1.0, plan_hash="b"), _ev(1.0, plan_hash="a"))
    assert not is_better(_ev(1.0, plan_hash="a"), _ev(1.0, plan_hash="a"))


def test_only_costed_evaluations_count():
    assert is_better(None, _ev(1.0))
    assert not is_better(None, _ev(None))
    assert is_better(_ev(None), _ev(9.0, feasible=False, reasons=3))


def test_the_strategies_objective_orders_as_the_rank_does_but_among_infeasible_plans():
    """A strategy minimises one number: the rank's, which does not count broken limits."""
    evs = [_ev(1.0), _ev(2.0), _ev(0.5, feasible=False, reasons=1), _ev(None, feasible=False)]
    assert sorted(evs, key=lambda e: e.objective) == sorted(evs, key=lambda e: e.rank)
    assert all(e.rank[1] == e.objective for e in evs)
