"""Which of several searches gets the next slice of a shared budget: the gradient task scheduler
of TVM's auto-scheduler (Zheng et al., Ansor, OSDI 2020, section 6), for the dispatches of a model.

The objective is the model's time, sum over tasks of weight x best latency. Every task first
gets one slice (its first estimate). Then the next slice goes to the task whose improvement of
that sum per slice is expected to be largest: the backward gradient (how much its weighted
latency fell over its last slice) and, for a task whose last slice gained nothing, a small
optimistic term in proportion to its weighted latency (a search that stalled may still move,
and a slice spent on an idle task costs the model less than one never spent on a heavy one).
Deterministic: ties go to the lower index.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

# Share of a task's weighted latency assumed winnable by one more slice when its last slice
# won nothing (Ansor's forward term, simplified to a constant rate).
_OPTIMISM = 0.02


@dataclass
class TaskState:
    name: str
    weight: float
    slices: int = 0
    best_s: float | None = None  # best latency found so far (per call)
    history: list[float] = field(default_factory=list)  # best latency after each slice

    usable: bool = True  # False once a slice found nothing usable: more slices cannot help

    @property
    def weighted_s(self) -> float:
        return self.weight * self.best_s if self.best_s is not None else math.inf

    def gradient(self) -> float:
        """Expected fall of weight x latency from one more slice."""
        if not self.usable:
            return 0.0
        if self.best_s is None:
            return math.inf
        if len(self.history) >= 2:
            gained = self.weight * max(0.0, self.history[-2] - self.history[-1])
        else:
            gained = 0.0
        return max(gained, _OPTIMISM * self.weighted_s)


def next_task(tasks: list[TaskState]) -> int:
    """Index of the task the next slice goes to."""
    untried = [i for i, t in enumerate(tasks) if t.slices == 0]
    if untried:
        return untried[0]
    return max(range(len(tasks)), key=lambda i: (tasks[i].gradient(), -i))


def schedule(tasks: list[TaskState], slices: int, run_slice: Callable[[int, int], float | None],
             stop: Callable[[], bool] = lambda: False) -> list[TaskState]:
    """Spend `slices` slices over the tasks; `run_slice(index, slice_number)` runs one slice of
    task `index` and returns its best latency so far (None when nothing usable was found)."""
    for _ in range(slices):
        if not tasks or stop():
            break
        i = next_task(tasks)
        task = tasks[i]
        best = run_slice(i, task.slices)
        task.slices += 1
        if best is not None and (task.best_s is None or best < task.best_s):
            task.best_s = best
        if task.best_s is None:
            task.usable = False
        else:
            task.history.append(task.best_s)
    return tasks
