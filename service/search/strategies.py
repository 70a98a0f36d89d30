"""Search strategies behind one small interface, in Optuna's ask/tell style.

    s = make_strategy("tpe", knobs, seed=0)
    c = s.suggest()          # a Candidate, or None when the strategy has nothing left
    s.tell(c, evaluation)    # what the engine found

All are deterministic for a given seed when told results in the order they were suggested
(the engine guarantees that, even with a process pool). With `identity` (knob values -> the
plan they make; many knob values make the same plan), tpe, random and exhaustive avoid
proposing a plan they proposed before: a repeat costs the engine nothing to evaluate, but it
costs Optuna a full `ask`, and a converging TPE repeats itself far more often than it finds
something new. `supertiling` is seed 000 as written;
it proposes one whole plan and is scored by every search as the baseline.
"""

from __future__ import annotations

import itertools
import logging
import math
import random
from collections import deque
from typing import Any, Callable, Hashable, Protocol

import numpy as np
import optuna
from optuna.samplers._tpe import probability_distributions as _probability_distributions
from optuna.samplers._tpe import sampler as _tpe_sampler
from optuna.study import _tell as _optuna_tell

from service.hardware.model import HardwareModel
from service.ir.errors import PlanError
from service.ir.graph import OpGraph
from service.ir.plan import Group, Level, Plan
from service.ir.transform import layout_group

from .candidate import Candidate, Evaluation
from .errors import UnknownStrategyError
from .space import Knob, ShapeContext, innermost_memory, op_bytes

STRATEGIES = ("tpe", "nsga2", "random", "exhaustive", "supertiling")
# Optuna needs finite objective values: unusable candidates get this instead of infinity.
_WORST = 1e9
# Candidates TPE draws from its good-trials density per ask (Optuna's default is 24). Each ask
# scores them all against every past trial; 8 halves the ask (the main process's largest cost
# per evaluation) and still meets the quality target (README: search benchmarks).
_TPE_EI_CANDIDATES = 8
# Redraws (random) or neighbours (tpe) tried for a plan not proposed before.
_NOVELTY_TRIES = 64
Identity = Callable[[dict[str, Any]], Hashable]
_FINISHED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)

optuna.logging.set_verbosity(logging.WARNING)
log = logging.getLogger(__name__)


class Strategy(Protocol):
    name: str

    def suggest(self) -> Candidate | None: ...

    def tell(self, candidate: Candidate, evaluation: Evaluation) -> None: ...


class _Proposed:
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


class _Choices(optuna.distributions.CategoricalDistribution):
    """A knob's categorical distribution, equal to another of its kind when the choices are.

    Optuna compares a parameter's distribution with the study's on every suggest, choice by
    choice through isinstance checks against numbers.Real (for NaN): a fifth of the main
    process's CPU per evaluation. A knob's choices are ints, bools and strings, never NaN, so
    tuple equality is the same test. The studies live in memory (a JSON round trip would give
    back Optuna's own class)."""

    def __eq__(self, other: Any) -> bool:
        if type(other) is _Choices:
            return self is other or self.choices == other.choices
        if isinstance(other, optuna.distributions.CategoricalDistribution):  # as Optuna's own sees it
            return optuna.distributions.CategoricalDistribution.__eq__(other, self)
        return super().__eq__(other)

    __hash__ = optuna.distributions.CategoricalDistribution.__hash__

    def __deepcopy__(self, memo: dict) -> "_Choices":
        # Immutable: the study's deep copy of every trial told (a distribution per knob) shares it.
        return self


class _KnownSpaceTPESampler(optuna.samplers.TPESampler):
    """TPE over a search space known up front, its Parzen estimators built once per batch.

    Every trial draws every knob, so the space TPE would infer on each ask (intersecting all
    past trials' spaces, a deep copy each time) is always this one.

    Without the constant liar, TPE's two estimators depend only on the finished trials, and
    the engine asks a whole batch before telling any of it: building them again for every ask
    of the batch (splitting and converting every past trial: three quarters of an ask) gives
    the same estimators. They are kept while the count of finished trials stays the same, so
    the samples are exactly those of Optuna's own `_sample` (tests/test_search.py checks it).
    Overrides Optuna's private `_sample`, hence the exact Optuna pin in pyproject.toml."""

    def __init__(self, distributions: dict[str, optuna.distributions.BaseDistribution], **kwargs: Any) -> None:
        if kwargs.setdefault("constant_liar", False):  # Optuna 5 turns it on by default
            raise ValueError("the estimators are reused across asks only without the constant liar")
        super().__init__(**kwargs)
        self._distributions = distributions
        self._estimators: tuple[int, tuple, Any, Any] | None = None

    def infer_relative_search_space(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> dict:
        return dict(self._distributions)

    def _sample(self, study: optuna.Study, trial: optuna.trial.FrozenTrial,
                search_space: dict[str, optuna.distributions.BaseDistribution]) -> dict[str, Any]:
        finished = study._get_trials(deepcopy=False, states=_FINISHED, use_cache=True)
        key = (len(finished), tuple(search_space))
        if self._estimators is None or self._estimators[:2] != key:
            if self._gamma is None:  # as in Optuna's _sample
                self._gamma = _tpe_sampler.default_gamma
            below, above = _tpe_sampler._split_trials(study, finished, self._gamma(len(finished)))
            self._estimators = (
                *key,
                self._build_parzen_estimator(study, search_space, below, handle_below=True),
                self._build_parzen_estimator(study, search_space, above, handle_below=False),
            )
        *_, below, above = self._estimators
        samples = below.sample(self._rng.rng, self._n_ei_candidates)
        best = int(np.argmax(below.log_pdf(samples) - above.log_pdf(samples)))
        return {name: dist.to_external_repr(samples[best, i].item()) for i, (name, dist) in enumerate(search_space.items())}

    def _build_parzen_estimator(self, study, search_space, trials, handle_below):
        return _CategoricalMixture(super()._build_parzen_estimator(study, search_space, trials, handle_below))


class _CategoricalMixture:
    """Optuna's Parzen estimator over categorical knobs, sampled and scored with the same
    arithmetic in the same order and the same draws from the generator, so the same samples
    (tests/test_search.py), without what costs most per ask for a small batch: checking every
    sampled row's probabilities sum to 1, and a per-knob `take_along_axis` over a broadcast
    3-D view. Half of the main process's CPU per TPE evaluation was these two calls (mlp_chain)."""

    def __init__(self, estimator: Any) -> None:
        mixture = estimator._mixture_distribution
        self.weights = mixture.weights
        self.log_weights = np.log(mixture.weights[np.newaxis])
        self.knobs = []  # per knob: (weights per component, their cumulative sums, last set to 1)
        for d in mixture.distributions:
            if not isinstance(d, _probability_distributions._BatchedCategoricalDistributions):
                raise TypeError("knobs are categorical")
            cumulative = np.cumsum(d.weights, axis=-1)
            cumulative[:, -1] = 1  # as Optuna does (numerical errors)
            self.knobs.append((d.weights, cumulative))

    def sample(self, rng: np.random.RandomState, size: int) -> np.ndarray:
        """Rows of choice indices (as floats, as Optuna's)."""
        active = rng.choice(len(self.weights), p=self.weights, size=size)
        out = np.empty((size, len(self.knobs)), dtype=float)
        for i, (_, cumulative) in enumerate(self.knobs):
            quantile = rng.rand(size)
            out[:, i] = np.sum(cumulative[active] < quantile[:, np.newaxis], axis=-1)
        return out

    def log_pdf(self, x: np.ndarray) -> np.ndarray:
        weighted = np.zeros((len(x), len(self.weights)), dtype=np.float64)
        for i, (weights, _) in enumerate(self.knobs):
            weighted += np.log(weights[:, x[:, i].astype(np.int64)].T)
        weighted += self.log_weights
        max_ = weighted.max(axis=1)
        max_[np.isneginf(max_)] = 0
        with np.errstate(divide="ignore"):
            return np.log(np.exp(weighted - max_[:, None]).sum(axis=1)) + max_


class OptunaStrategy:
    """TPE (latency, feasibility as a constraint) or NSGA-II (latency vs peak footprint).

    TPE draws from its sampler directly (`_suggest_tpe`) and every result enters the study as a
    completed trial, in the order suggested. With `identity`: when the sampler proposes a plan
    already proposed, a neighbour is proposed instead: one to three knobs of the proposal
    changed at random (seeded), the first whose plan is new; TPE learns from its result like
    from its own (the repeat's is in the study already)."""

    def __init__(self, name: str, knobs: list[Knob], seed: int, warm_start: list[dict] | None = None,
                 identity: Identity | None = None) -> None:
        self.name = name
        self.knobs = knobs
        # NSGA-II keeps its own generations: only TPE swaps repeats for neighbours.
        self.proposed = _Proposed(identity) if name == "tpe" and identity is not None else None
        self.rng = random.Random(seed)
        self.distributions = {k.name: _Choices(k.choices) for k in knobs}
        if name == "nsga2":
            sampler = optuna.samplers.NSGAIISampler(seed=seed, population_size=20)
            self.study = optuna.create_study(directions=["minimize", "minimize"], sampler=sampler)
        else:
            sampler = _KnownSpaceTPESampler(
                self.distributions, seed=seed, multivariate=True, n_startup_trials=10,
                n_ei_candidates=_TPE_EI_CANDIDATES,
            )
            self.study = optuna.create_study(direction="minimize", sampler=sampler)
        self.warm: deque[dict] = deque()
        for params in warm_start or []:
            # Optuna raises on a value outside a knob's choices, from inside a later ask.
            if not all(params.get(k.name) in k.choices for k in knobs):
                log.warning("warm start outside the search space dropped: %s", params)
            elif name == "tpe":
                self.warm.append({k.name: params[k.name] for k in knobs})
            else:
                self.study.enqueue_trial(params, skip_if_exists=True)

    def suggest(self) -> Candidate | None:
        if self.name == "tpe":
            return self._suggest_tpe()
        trial = self.study.ask(self.distributions)  # NSGA-II: its generations live in the study's trials
        return Candidate(params=dict(trial.params), source=self.name, token=trial)

    def _suggest_tpe(self) -> Candidate:
        """TPE's proposal without `Study.ask`: the sampler's own draws, told back as completed
        trials (`tell`). `ask` makes a running trial and suggests each knob through it, each
        suggestion checking the knob against the study's trials: with a space known up front
        that is most of an ask's cost, and it decides nothing. The draws are those `ask` makes
        (warm starts first; random ones until `n_startup_trials` have finished; then the
        multivariate TPE sample), so the proposals are Optuna's own (tests/test_search.py)."""
        sampler, study = self.study.sampler, self.study
        if self.warm:
            params = self.warm.popleft()
        else:
            study._thread_local.cached_all_trials = None  # as `ask` does: see the trials told since
            finished = study._get_trials(deepcopy=False, states=_FINISHED, use_cache=True)
            if len(finished) < sampler._n_startup_trials:
                params = {name: sampler._random_sampler.sample_independent(study, None, name, dist)
                          for name, dist in self.distributions.items()}
            else:
                params = sampler._sample(study, None, self.distributions)
        if self.proposed is not None and not self.proposed.is_new(params):
            neighbour = _novel_neighbour(params, self.knobs, self.proposed, self.rng)
            if neighbour is not None:
                params = neighbour
            # else: nothing new nearby: let the repeat through (the engine counts it idle)
        return Candidate(params=params, source=self.name, token=None)

    def tell(self, candidate: Candidate, evaluation: Evaluation) -> None:
        usable = evaluation.latency_s is not None
        # Feasibility as an Optuna constraint (<= 0 satisfied); samplers prefer feasible trials.
        constraint = 0.0 if evaluation.feasible else 1.0
        latency = min(evaluation.objective, _WORST) if usable else _WORST
        if self.name == "nsga2":
            footprint = float(evaluation.peak_footprint_bytes) if evaluation.peak_footprint_bytes is not None else _WORST
            values = [latency, footprint]
        else:
            values = [latency]
        trial = candidate.token
        if trial is None:  # TPE: every result enters the study as a completed trial
            self.study.add_trial(optuna.trial.create_trial(
                params=candidate.params, distributions=self.distributions, values=values,
                system_attrs={"constraints:infeasible": constraint},
            ))
            return
        trial.set_constraint("infeasible", constraint)
        _tell(self.study, trial, values)


def _tell(study: optuna.Study, trial: optuna.trial.Trial, values: list[float]) -> None:
    """`study.tell` without the deep copy of the finished trial it returns (unused here): that
    copy was a sixth of the main process's CPU per evaluation (Optuna 5.0.0's `Study.tell` is
    `_tell_with_warning` and then the copy; private, hence the exact pin)."""
    _optuna_tell._tell_with_warning(study=study, trial=trial, value_or_values=values)


def _novel_neighbour(params: dict, knobs: list[Knob], proposed: _Proposed, rng: random.Random) -> dict | None:
    """Knob values near `params` whose plan was not proposed yet (now recorded), or None."""
    changeable = [k for k in knobs if len(k.choices) > 1]
    if not changeable:
        return None
    for attempt in range(_NOVELTY_TRIES):
        cand = dict(params)
        for k in rng.sample(changeable, min(len(changeable), 1 + attempt * 3 // _NOVELTY_TRIES)):
            cand[k.name] = rng.choice([c for c in k.choices if c != params[k.name]])
        if proposed.is_new(cand):
            return cand
    return None


class RandomStrategy:
    def __init__(self, knobs: list[Knob], seed: int, warm_start: list[dict] | None = None,
                 identity: Identity | None = None) -> None:
        self.name = "random"
        self.knobs = knobs
        self.rng = random.Random(seed)
        self.proposed = _Proposed(identity, warm_start)

    def suggest(self) -> Candidate | None:
        if (params := self.proposed.next_warm()) is not None:
            return Candidate(params=params, source=self.name)
        for _ in range(_NOVELTY_TRIES):
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
        self.size = math.prod(len(k.choices) for k in knobs)
        self._it = itertools.product(*[k.choices for k in knobs])
        self.proposed = _Proposed(identity, warm_start)

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


class SuperTilingStrategy:
    """Seed 000's plan, proposed once."""

    def __init__(self, plan: Plan) -> None:
        self.name = "supertiling"
        self.plan = plan
        self.done = False

    def suggest(self) -> Candidate | None:
        if self.done:
            return None
        self.done = True
        return Candidate(params={}, source=self.name, plan=self.plan)

    def tell(self, candidate: Candidate, evaluation: Evaluation) -> None:
        pass


def check_strategy(name: str) -> None:
    """UnknownStrategyError (the caller's mistake, with the choices) unless `name` is one."""
    if name not in STRATEGIES:
        raise _unknown_strategy(name)


def _unknown_strategy(name: str) -> UnknownStrategyError:
    return UnknownStrategyError(f"unknown strategy {name!r}; choose one of {', '.join(STRATEGIES)}")


def make_strategy(name: str, knobs: list[Knob], seed: int, warm_start: list[dict] | None = None,
                  identity: Identity | None = None) -> Strategy:
    """`identity`: knob values -> a key of the plan they make (see the module docstring)."""
    if name in ("tpe", "nsga2"):
        return OptunaStrategy(name, knobs, seed, warm_start, identity)
    if name == "random":
        return RandomStrategy(knobs, seed, warm_start, identity)
    if name == "exhaustive":
        return ExhaustiveStrategy(knobs, seed, warm_start, identity)
    raise _unknown_strategy(name)


# --------------------------------------------------------------------------- super tiling (seed 000)


def _post_order(graph: OpGraph) -> list[int]:
    """DFS over the data-flow DAG from its sources along consumer edges, post-order: every op
    comes after all its consumers (so a consumer is tiled before its producers are considered)."""
    order: list[int] = []
    visited: set[int] = set()

    def visit(root: int) -> None:
        # Iterative (a chain of thousands of ops would exceed Python's recursion limit): each
        # stack entry is an op and the index of the next consumer to descend into.
        visited.add(root)
        stack = [(root, 0)]
        while stack:
            u, i = stack.pop()
            consumers = graph.op(u).consumers
            while i < len(consumers) and consumers[i] in visited:
                i += 1
            if i < len(consumers):
                stack.append((u, i + 1))
                visited.add(consumers[i])
                stack.append((consumers[i], 0))
            else:
                order.append(u)

    for u in graph.topological_order():
        if not graph.op(u).producers and u not in visited:
            visit(u)
    for u in graph.topological_order():  # ops on cycles through non-tileable ops (defensive)
        if u not in visited:
            visit(u)
    return order


def _fuse_group_footprint(graph: OpGraph, uid: int, shapes: ShapeContext) -> int:
    """Seed 000: a fuse-group op counts only if no consumer is in its group; then the group's
    inputs (operands not produced inside the group) plus its output stand for the whole pattern."""
    op = graph.op(uid)
    members = {v for g in op.fuse_groups for v in graph.fuse_groups.get(g, [])}
    if any(c in members for c in op.consumers):
        return 0
    total = 0
    for m in members:
        mop = graph.op(m)
        inside = {e.operand for e in graph.edges_into(m) if e.producer in members}
        ranges = shapes.loop_ranges(mop)
        for i in range(mop.num_inputs):
            shape = mop.operand_shapes[i]
            if shape is None or i in inside:
                continue
            total += math.prod(s if s is not None else ranges[0] for s in shape) * 4
    out = op.result_shapes[0] if op.result_shapes else []
    return total + math.prod(s or 1 for s in out) * 4


def _fits_group(graph: OpGraph, anchor: int, fuse: list[int], sizes: list[int]) -> bool:
    try:
        layout_group(graph, 0, Group(anchor=anchor, fuse=fuse, levels=[Level(tile_sizes=sizes, loop="for")]))
        return True
    except PlanError:
        return False


def supertiling_plan(graph: OpGraph, hardware: HardwareModel, shapes: ShapeContext) -> tuple[Plan, list[str]]:
    """Seed 000 as written: post-order DFS; an op not yet fused that does not fit the available
    memory is tiled along dim 1 (dim 0 if 1-D) by factor = footprint / available memory, its
    producers fused; repeat with a bigger factor while max-over-fused-ops / factor still does
    not fit. Available memory = the innermost level (the seed's on-chip memory). Fused ops are
    never tiled again (the seed's multi-consumer TODO, kept on purpose: this is the baseline)."""
    avail = innermost_memory(hardware)
    fused: set[int] = set()
    groups: list[Group] = []
    notes: list[str] = []
    for uid in _post_order(graph):
        if uid in fused:
            continue
        op = graph.op(uid)
        footprint = _fuse_group_footprint(graph, uid, shapes) if op.fuse_groups else op_bytes(op, shapes)
        if footprint <= avail or op.kind == "fill" and not op.fuse_groups:
            continue
        ranges = shapes.loop_ranges(op)
        if not ranges:
            continue
        dim = 1 if len(ranges) > 1 else 0
        producers = sorted(u for u in graph.upstream(uid) if u not in fused)
        # tileConsumerAndFuseProducersUsingSCF fuses what it can: drop producers MLIR's rules reject.
        fuse = producers
        if not _fits_group(graph, uid, fuse, [0] * dim + [1] + [0] * (len(ranges) - dim - 1)):
            direct = [e.producer for e in graph.edges_into(uid) if not e.via and e.producer not in fused]
            fuse = sorted(set(direct) | {v for d in direct for v in graph.upstream(d) if v not in fused})
            if not _fits_group(graph, uid, fuse, [0] * dim + [1] + [0] * (len(ranges) - dim - 1)):
                fuse = []
        factor = math.ceil(footprint / avail)
        biggest = max([op_bytes(graph.op(u), shapes) for u in [uid, *fuse]] + [footprint])
        while True:
            tile = max(1, math.ceil(ranges[dim] / factor))
            if biggest / factor <= avail or tile == 1:
                break
            factor = max(factor + 1, math.ceil(biggest / avail))
        if tile >= ranges[dim]:
            continue
        if biggest / factor > avail:
            notes.append(f"super tiling: op {uid} still does not fit with tile 1 on dim {dim}")
        sizes = [0] * len(ranges)
        sizes[dim] = tile
        members = {uid, *fuse}
        shared = [u for u in fuse if any(c not in members for c in graph.op(u).consumers)]
        # scf.for, as the seed's tileConsumerAndFuseProducersUsingSCF; but MLIR aborts fusing a
        # producer with outside uses into scf.for, so those groups use scf.forall.
        loop = "forall" if shared and graph.op(uid).iterator_types[dim] == "parallel" else "for"
        if shared and loop == "for":
            fuse = [u for u in fuse if u not in shared]
        groups.append(Group(anchor=uid, fuse=fuse, levels=[Level(tile_sizes=sizes, loop=loop)]))
        fused.update(fuse)
        fused.add(uid)
    return Plan(groups=groups), notes
