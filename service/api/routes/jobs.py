"""/v1/jobs: batch tuning jobs. Every route needs the bearer token when one is configured:
jobs carry the users' modules."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import PlainTextResponse

from service.api.deps import DbSession, TokenAuth
from service.api.job_schemas import ItemOut, ItemPage, JobAccepted, JobOut, JobPage, JobRequest, counts
from service.api.schemas import ErrorBody
from service.jobs.service import JobFinished, JobService, NoSpec, NoSpecYet, NothingToRetry
from service.model_tuning.model_input import ModelInputError
from service.store import jobs
from service.store.models import ItemState
from service.store.query import DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], dependencies=[TokenAuth])

_CURSOR = r"^[A-Za-z0-9_=-]+$"
_FIRST_ITEMS = 50
_ERRORS = {404: {"model": ErrorBody, "description": "unknown job or hardware"},
           422: {"model": ErrorBody, "description": "bad parameters, or a model IREE cannot compile"}}


def _service(request: Request) -> JobService:
    return request.app.state.jobs


@router.post("", status_code=202, response_model=JobAccepted, responses=_ERRORS)
def submit_job(body: JobRequest, request: Request) -> JobAccepted:
    """Queue a job: its items run on workers (or in this server on SQLite); poll GET /v1/jobs/{id}."""
    try:
        summary = _service(request).submit(body)
    except (ModelInputError, ValueError) as exc:
        raise HTTPException(422, {"error": "InvalidJob", "message": str(exc)}) from None
    return JobAccepted(id=summary.job.id, state=summary.state, items=counts(summary))


@router.get("", response_model=JobPage, responses=_ERRORS)
def list_jobs(
    session: DbSession,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE_SIZE)] = DEFAULT_PAGE_SIZE,
    cursor: Annotated[str | None, Query(pattern=_CURSOR, max_length=200)] = None,
) -> JobPage:
    """Jobs newest first, one page (no item details: see GET /v1/jobs/{id}/items)."""
    rows, next_cursor = jobs.list_jobs(session, limit=limit, cursor=cursor)
    return JobPage(items=[JobOut.from_summary(jobs.summarise(session, r), [], None) for r in rows],
                   next_cursor=next_cursor)


@router.get("/{job_id}", response_model=JobOut, responses=_ERRORS)
def get_job(job_id: int, request: Request, session: DbSession) -> JobOut:
    summary = _service(request).summary(job_id)
    first, next_cursor = jobs.list_items(session, job_id, limit=_FIRST_ITEMS)
    return JobOut.from_summary(summary, first, next_cursor)


@router.get("/{job_id}/items", response_model=ItemPage, responses=_ERRORS)
def list_items(
    job_id: int,
    request: Request,
    session: DbSession,
    state: ItemState | None = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE_SIZE)] = 100,
    cursor: Annotated[str | None, Query(pattern=_CURSOR, max_length=200)] = None,
) -> ItemPage:
    _service(request).summary(job_id)
    rows, next_cursor = jobs.list_items(session, job_id, limit=limit, cursor=cursor, state=state)
    return ItemPage(items=[ItemOut.from_row(r) for r in rows], next_cursor=next_cursor)


@router.post("/{job_id}/cancel", response_model=JobOut,
             responses={**_ERRORS, 409: {"model": ErrorBody, "description": "the job has finished already"}})
def cancel_job(job_id: int, request: Request, session: DbSession) -> JobOut:
    """Queued items are cancelled, running ones stop within seconds; finished results stay."""
    try:
        summary = _service(request).cancel(job_id)
    except JobFinished as exc:
        raise HTTPException(409, {"error": "JobFinished", "message": str(exc)}) from None
    first, next_cursor = jobs.list_items(session, job_id, limit=_FIRST_ITEMS)
    return JobOut.from_summary(summary, first, next_cursor)


@router.post("/{job_id}/retry", response_model=JobOut,
             responses={**_ERRORS, 409: {"model": ErrorBody, "description": "the job has no failed item"}})
def retry_job(job_id: int, request: Request, session: DbSession) -> JobOut:
    """Queue the failed items again (only those); a cancelled job stays cancelled."""
    try:
        summary = _service(request).retry(job_id)
    except NothingToRetry as exc:
        raise HTTPException(409, {"error": "NothingToRetry", "message": str(exc)}) from None
    first, next_cursor = jobs.list_items(session, job_id, limit=_FIRST_ITEMS)
    return JobOut.from_summary(summary, first, next_cursor)


@router.get("/{job_id}/spec", response_class=PlainTextResponse,
            responses={**_ERRORS, 409: {"model": ErrorBody, "description": "no done item configures a contraction yet"},
                       404: {"model": ErrorBody, "description": "no such job, or (NoSpec) the job succeeded and "
                                                              "every item is left to IREE's own config"}})
def job_spec(job_id: int, request: Request) -> PlainTextResponse:
    """The IREE tuning spec merging the done items' configs (`iree-compile --iree-codegen-tuning-spec-path=FILE --mlir-disable-threading`)."""
    try:
        spec = _service(request).spec(job_id)
    except NoSpecYet as exc:
        raise HTTPException(409, {"error": "NoSpecYet", "message": str(exc)}) from None
    except NoSpec as exc:  # as a model run that tuned nothing: GET /v1/models/runs/{id}/spec
        raise HTTPException(404, {"error": "NoSpec", "message": str(exc)}) from None
    return PlainTextResponse(spec, media_type="text/plain")
