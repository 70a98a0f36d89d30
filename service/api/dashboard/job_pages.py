"""The dashboard's jobs pages: the list, a job's detail (items; for a model, its dispatches) and
the small JSON the detail page's script polls for live progress.

A whole model has no page of its own because it is no stored concept of its own: it is submitted
as a job of kind "model" whose items are its tunable dispatches, and these pages show it as such.
Without JavaScript the detail page shows the state at render time (reload for more).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, JSONResponse
from sqlalchemy.orm import Session

from service.api.dashboard import job_views
from service.api.dashboard.auth import is_authorised, require_viewer
from service.api.dashboard.pages import format_seconds, not_found, render
from service.api.deps import DbSession
from service.store import dashboard_queries as queries
from service.store import jobs
from service.store.models import Job
from service.store.query import InvalidCursor

JOBS_PER_PAGE = 25
ITEMS_PER_PAGE = 100
POLL_INTERVAL_MS = 1000
FIRST_JOB_CLI = "tilesearch job submit model.mlir --hardware host-cpu --budget 64 --server http://127.0.0.1:8000"
FIRST_JOB_DIR_CLI = "tilesearch job submit modules/ --hardware host-cpu --budget 32   # every *.mlir in the directory"

router = APIRouter(include_in_schema=False)
pages = APIRouter(include_in_schema=False, dependencies=[Depends(require_viewer)])


def _job(session: Session, job_id: int) -> Job | None:
    return jobs.get_job(session, job_id) if 0 < job_id < 2**31 else None


def _items_page(session: Session, job_id: int, cursor: str | None) -> tuple[list, str | None, str | None]:
    """One page of items (a bad cursor: the first page, and why)."""
    try:
        rows, next_cursor = jobs.list_items(session, job_id, limit=ITEMS_PER_PAGE, cursor=cursor or None)
        return rows, next_cursor, None
    except InvalidCursor:
        rows, next_cursor = jobs.list_items(session, job_id, limit=ITEMS_PER_PAGE)
        return rows, next_cursor, f"cursor '{cursor}' is not one this page made; showing the first items"


def _progress(session: Session, job: Job, items: list) -> dict[str, Any]:
    """What the page's script redraws: the job's counts and these items' states and results."""
    row = job_views.job_row(jobs.summarise(session, job))
    item_rows = job_views.item_rows(items, queries.decisions_by_id(session, (i.decision_id for i in items)))
    return {
        "state": row.state,
        "active": row.active,
        "counts": row.counts,
        "total": row.total,
        "finished": row.finished,
        "percent": round(row.percent, 1),
        "trials": row.trials,
        "eta": format_seconds(row.eta_s) if row.eta_s is not None else "—",
        "items": [{"id": r.id, "state": r.state, "trials": r.trials, "decision_id": r.decision_id,
                   "predicted": format_seconds(r.predicted_s), "weighted": format_seconds(r.weighted_s),
                   "why": r.why} for r in item_rows],
        "series": job_views.finished_series(job.created_at, queries.finished_items_of(session, job.id)),
    }


@pages.get("/jobs", response_class=HTMLResponse)
def jobs_page(request: Request, session: DbSession) -> HTMLResponse:
    """Jobs newest first, a page at a time (keyset: "older" links carry a cursor)."""
    cursor = request.query_params.get("cursor") or None
    problems: list[str] = []
    try:
        rows, next_cursor = jobs.list_jobs(session, limit=JOBS_PER_PAGE, cursor=cursor)
    except InvalidCursor:
        problems.append(f"cursor '{cursor}' is not one this page made; showing the newest jobs")
        cursor = None
        rows, next_cursor = jobs.list_jobs(session, limit=JOBS_PER_PAGE)
    return render(request, "dashboard/jobs.html", {
        "rows": [job_views.job_row(jobs.summarise(session, r)) for r in rows],
        "total": queries.job_count(session),
        "first_page": cursor is None,
        "next_link": "/jobs?" + urlencode({"cursor": next_cursor}) if next_cursor else None,
        "problems": problems,
        "first_cli": FIRST_JOB_CLI,
        "first_dir_cli": FIRST_JOB_DIR_CLI,
    })


@pages.get("/jobs/{job_id}", response_class=HTMLResponse)
def job_page(job_id: int, request: Request, session: DbSession) -> HTMLResponse:
    job = _job(session, job_id)
    if job is None:
        return not_found(request, f"job {job_id}")
    cursor = request.query_params.get("cursor") or None
    items, next_cursor, problem = _items_page(session, job_id, cursor)
    summary = job_views.job_row(jobs.summarise(session, job))
    item_rows = job_views.item_rows(items, queries.decisions_by_id(session, (i.decision_id for i in items)))
    predicted_total = sum(r.weighted_s for r in item_rows if r.weighted_s is not None)
    progress_url = f"/jobs/{job_id}/progress.json" + (f"?{urlencode({'cursor': cursor})}" if cursor and not problem else "")
    return render(request, "dashboard/job.html", {
        "j": summary,
        "items": item_rows,
        "first_items": cursor is None or problem is not None,
        "next_link": f"/jobs/{job_id}?" + urlencode({"cursor": next_cursor}) if next_cursor else None,
        "problems": [problem] if problem else [],
        "left_to_iree": job_views.left_to_iree(job.notes),
        "predicted_total_s": predicted_total or None,
        "live_json": {"url": progress_url, "interval_ms": POLL_INTERVAL_MS, "active": summary.active},
        "progress_json": _progress(session, job, items),
        "no_spec_ever": request.app.state.jobs.why_no_spec_ever(job),
    })


@router.get("/jobs/{job_id}/progress.json", response_model=None)
def job_progress(job_id: int, request: Request, session: DbSession) -> JSONResponse:
    """The detail page's poll: 401 (not a login redirect: a script asks) without the credential."""
    if not is_authorised(request, request.app.state.settings):
        return JSONResponse({"error": "Unauthorized", "message": "log in at /login"}, status_code=401)
    job = _job(session, job_id)
    if job is None:
        return JSONResponse({"error": "NotFound", "message": f"no job {job_id}"}, status_code=404)
    items, _, _ = _items_page(session, job_id, request.query_params.get("cursor"))
    return JSONResponse(_progress(session, job, items), headers={"Cache-Control": "no-store"})


router.include_router(pages)
