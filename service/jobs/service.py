"""The jobs use case as the API and the CLI call it: submit, read, cancel, retry, merged spec.
Where items run is the dispatcher's business: procrastinate (PostgreSQL) or the embedded runner."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from service.hardware.model import HardwareModel
from service.hardware.profiles import HOST_CPU, UnknownHardwareError
from service.store import decisions, jobs
from service.store.db import session_scope
from service.store.models import ItemState, Job
from service.tiling.hardware import this_host

from .contract import JobRequest
from .queue import SEARCH_QUEUE, measure_queue
from .run import JobRuntime
from .tasks import merged_spec, model_items


class JobNotFound(LookupError):
    def __init__(self, job_id: int) -> None:
        super().__init__(f"no job {job_id}")


class NoSpecYet(Exception):
    """No finished item configures a contraction yet, and items are still to run or failed."""


class NoSpec(Exception):
    """The job has finished and none of its items configures a contraction (each left to IREE's
    own config, with the reason): no spec is the job's answer, not a failure."""


class NothingToRetry(Exception):
    """The job has no failed item: retry queues failed items only."""


class JobFinished(Exception):
    """The job has finished (succeeded, failed or cancelled): there is nothing left to cancel."""


class Dispatcher(Protocol):
    def enqueue(self, items: list[tuple[int, str]]) -> None: ...

    def abort(self, queue_job_ids: list[int]) -> None: ...


@dataclass
class JobService:
    runtime: JobRuntime
    dispatcher: Dispatcher

    def submit(self, request: JobRequest) -> jobs.JobSummary:
        rt = self.runtime
        hardware = rt.tiling.hardware.resolve(request.hardware)  # an unknown name is the caller's 404
        if request.measure_top:  # as a tiling request's: refused now, not item by item on a worker
            rt.tiling.check_measurable_here(hardware)
        notes, still_dynamic = None, []
        hints = request.shape_hints or None  # a model's only, as lists (JobRequest bounds them)
        if request.is_model:
            if not hardware.is_cpu:
                raise ValueError(f"hardware {hardware.name} is not a CPU profile: a model job tunes the dispatches IREE "
                                 "forms for its llvm-cpu backend and its spec is that backend's; use host-cpu")
            found = request.dispatches or rt.sandbox.run(model_items, request.model, hints,
                                                         timeout=rt.settings.request_timeout_s * 5)
            new_items = [jobs.NewItem(d.name, d.module, None, d.weight) for d in found.tunable]
            notes = {"left_to_iree": [d.model_dump(exclude={"dynamic"}) for d in found.left_to_iree]}
            still_dynamic = found.still_dynamic
            if why := found.why_nothing_to_tune("the model"):
                raise ValueError(why)
        else:
            new_items = [jobs.NewItem(i.name, i.module, i.shape_hints) for i in request.items or []]
        queue = measure_queue(this_host()) if request.measure_top else SEARCH_QUEUE
        hardware_json = request.hardware if isinstance(request.hardware, str) else hardware.model_dump(mode="json")
        options = request.model_dump(include={"budget", "seconds", "strategy", "seed", "measure_top", "reuse"})
        if hints:  # the sizes the spec's model has, said in its header
            options["shape_hints"] = hints
            if request.sized_model:
                options["sized_model"] = request.sized_model
            if still_dynamic:
                options["still_dynamic"] = still_dynamic
        with session_scope(rt.sessions) as session:
            job = jobs.create_job(session, kind="model" if request.is_model else "items",
                                  hardware=hardware_json, options=options, queue=queue, items=new_items, notes=notes)
            session.commit()
            ids = jobs.item_ids(session, job.id)
            summary = jobs.summarise(session, job)
        self.dispatcher.enqueue([(i, queue) for i in ids])
        return summary

    def summary(self, job_id: int) -> jobs.JobSummary:
        with session_scope(self.runtime.sessions) as session:
            return jobs.summarise(session, self._job(session, job_id))

    def cancel(self, job_id: int) -> jobs.JobSummary:
        with session_scope(self.runtime.sessions) as session:
            job = self._job(session, job_id)
            state = jobs.summarise(session, job).state
            if state in ("succeeded", "failed", "cancelled"):  # a finished job keeps the state it ended in
                raise JobFinished(f"job {job_id} has already {'been cancelled' if state == 'cancelled' else state}: "
                                  "nothing is left to cancel")
            queue_jobs = jobs.request_cancel(session, job_id)
        self.dispatcher.abort(queue_jobs)
        return self.summary(job_id)

    def retry(self, job_id: int) -> jobs.JobSummary:
        with session_scope(self.runtime.sessions) as session:
            job = self._job(session, job_id)
            ids = jobs.requeue_failed(session, job_id)
            if not ids:
                state = jobs.summarise(session, job).state
                raise NothingToRetry(f"job {job_id} has no failed item to retry (it is {state}); "
                                     + ("cancelled items are not retried: submit the job again" if state == "cancelled"
                                        else "retry queues failed items only"))
        self.dispatcher.enqueue([(i, job.queue) for i in ids])
        return self.summary(job_id)

    def spec(self, job_id: int) -> str:
        """The job's merged tuning spec over its done items (heaviest first). NoSpecYet when no
        done item configures a contraction."""
        rt = self.runtime
        with session_scope(rt.sessions) as session:
            job = self._job(session, job_id)
            why = self.why_no_spec_ever(job)
            if why is not None:
                raise NoSpec(f"job {job_id} {why}")
            done = jobs.done_items(session, job_id)
            plans = []
            for item in sorted(done, key=lambda i: -i.weight):
                decision = decisions.get_decision(session, item.decision_id) if item.decision_id else None
                if decision is not None and decision.plan:
                    stored_reason = (decision.search_stats or {}).get("no_tuning_spec")
                    plans.append((item.name, item.module, decision.plan, stored_reason))
            state = jobs.summarise(session, job).state
        host_cpu = _hardware_name(job) == HOST_CPU
        spec, left_out = (rt.sandbox.run(merged_spec, plans, host_cpu, job.options.get("shape_hints"),
                                         job.options.get("sized_model"), job.options.get("still_dynamic"),
                                         timeout=rt.settings.request_timeout_s)
                          if plans else (None, []))
        if spec is None:
            why = (f": {'; '.join(left_out)}" if left_out else
                   " (none is done yet)" if state in ("queued", "running") else f" (the job is {state})")
            if state == "cancelled" and not done:
                raise NoSpec(f"job {job_id} was cancelled before any item finished: it has no tuning spec and will "
                             "not get one; submit it again")
            if state == "succeeded" and left_out:
                raise NoSpec(f"job {job_id} needs no tuning spec: each of its {len(done)} items is left to "
                             f"IREE's own config{why}")
            raise NoSpecYet(f"job {job_id}: none of its {len(done)} done items configures a contraction{why}")
        return spec

    def why_no_spec_ever(self, job: Job) -> str | None:
        """Why the job can have no tuning spec whatever its items do (its hardware is not a CPU,
        as each of its items' decisions says), or None."""
        try:
            hardware = self.runtime.tiling.hardware.resolve(
                job.hardware if isinstance(job.hardware, str) else HardwareModel.model_validate(job.hardware))
        except UnknownHardwareError:  # a name no longer known: its items' decisions say
            return None
        if hardware.is_cpu:
            return None
        return (f"is for {hardware.name}, which is not a CPU profile: a tuning spec configures IREE's llvm-cpu "
                "backend; the items' plans and tiled IR are the answer")

    def _job(self, session, job_id: int) -> Job:
        job = jobs.get_job(session, job_id) if 0 < job_id < 2**31 else None
        if job is None:
            raise JobNotFound(job_id)
        return job


def _hardware_name(job: Job) -> str:
    return job.hardware if isinstance(job.hardware, str) else HardwareModel.model_validate(job.hardware).name


__all__ = ["Dispatcher", "ItemState", "JobFinished", "JobNotFound", "JobService", "NoSpec", "NoSpecYet", "NothingToRetry"]
