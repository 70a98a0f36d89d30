"""The gradient task scheduler, on made-up tasks (no MLIR)."""

from service.search.task_scheduler import TaskState, next_task, schedule


def _improving(curves: dict[int, list[float]]):
    """run_slice that walks each task down its latency curve, one point per slice."""
    calls: list[int] = []

    def run(i: int, n: int) -> float | None:
        calls.append(i)
        curve = curves[i]
        return curve[min(n, len(curve) - 1)]

    return run, calls


def test_every_task_gets_a_slice_before_any_gets_a_second():
    tasks = [TaskState(f"t{i}", 1.0) for i in range(3)]
    run, calls = _improving({0: [1.0, 0.5], 1: [1.0, 0.9], 2: [1.0]})
    schedule(tasks, 3, run)
    assert calls == [0, 1, 2]


def test_slices_go_where_the_model_time_falls_fastest():
    # Task 1 runs ten times as often; both halve their latency on every slice.
    tasks = [TaskState("light", 1.0), TaskState("heavy", 10.0)]
    halving = [1.0 / 2 ** k for k in range(20)]
    run, calls = _improving({0: halving, 1: halving})
    schedule(tasks, 12, run)
    assert calls.count(1) > calls.count(0) >= 1
    assert tasks[1].best_s < tasks[0].best_s


def test_a_task_that_found_nothing_usable_gets_no_second_slice():
    tasks = [TaskState("broken", 100.0), TaskState("fine", 1.0)]
    run, calls = _improving({0: [None], 1: [1.0, 0.9, 0.8, 0.7]})
    schedule(tasks, 5, run)
    assert calls.count(0) == 1 and not tasks[0].usable


def test_a_stalled_task_still_gets_slices_in_proportion_to_its_weight():
    tasks = [TaskState("stalled heavy", 50.0), TaskState("moving light", 1.0)]
    run, calls = _improving({0: [1.0], 1: [1.0 - 0.001 * k for k in range(50)]})
    schedule(tasks, 10, run)
    assert calls.count(0) > calls.count(1)


def test_the_same_inputs_give_the_same_schedule():
    def once():
        tasks = [TaskState(f"t{i}", float(i + 1)) for i in range(4)]
        run, calls = _improving({i: [1.0 / (1 + k * (i + 1)) for k in range(30)] for i in range(4)})
        schedule(tasks, 20, run)
        return calls
    assert once() == once()


def test_stop_ends_the_schedule():
    tasks = [TaskState("a", 1.0)]
    run, calls = _improving({0: [1.0, 0.5, 0.2]})
    schedule(tasks, 10, run, stop=lambda: len(calls) >= 2)
    assert calls == [0, 0]


def test_next_task_breaks_ties_by_index():
    tasks = [TaskState("a", 1.0, slices=1, best_s=1.0, history=[1.0]), TaskState("b", 1.0, slices=1, best_s=1.0, history=[1.0])]
    assert next_task(tasks) == 0
