"""The dashboard's pages: decisions (list, detail), hardware (list, detail), login.

Server-rendered with Jinja2 (autoescaped: module text and names are user data); tables work
without JavaScript, charts and the DAG are drawn by vendored scripts from the data the page
embeds as JSON. The jobs pages (whole models are jobs) are in job_pages.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from concurrent.futures import TimeoutError as FutureTimeout
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from jinja2 import Environment, FileSystemLoader
from pebble import ProcessExpired

from service.api.dashboard import views
from service.api.dashboard.auth import (
    COOKIE_MAX_AGE_S,
    COOKIE_NAME,
    LoginRequired,
    cookie_value,
    login_location,
    require_viewer,
    safe_next,
    token_matches,
)
from service.api.dashboard.op_graph import dag_view, module_graph_task
from service.api.deps import DbSession
from service.store import dashboard_queries as queries
from service.store import catalog, decisions
from service.store.models import DecisionStatus

TEMPLATE_DIR = Path(__file__).resolve().parent.parent / "templates"
PER_PAGE_CHOICES = (25, 50, 100, 200)
CACHE_OUTCOMES = ("miss", "warm")  # what a stored decision records; a hit returns an existing one
# How long a page waits for a sandbox worker to rebuild a module's op graph.
GRAPH_TIMEOUT_S = 20.0
_GRAPH_CACHE_SIZE = 64
FIRST_DECISION_CURL = (
    "curl -s -X POST http://127.0.0.1:8000/v1/tilings -H 'Content-Type: application/json' \\\n"
    "  -d \"$(jq -Rs '{module: ., hardware: \"host-cpu\", budget: 64}' < model.mlir)\""
)
FIRST_DECISION_CLI = "tilesearch tune model.mlir --hardware host-cpu --server http://127.0.0.1:8000"


def format_seconds(value: float | None) -> str:
    if value is None:
        return "—"
    if value < 1e-3:
        return f"{value * 1e6:.1f} µs"
    if value < 1:
        return f"{value * 1e3:.3f} ms"
    return f"{value:.3f} s"


def _format_bytes(value: float | None) -> str:
    if value is None:
        return "—"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= size:
            return f"{value / size:.1f} {unit}"
    return f"{int(value)} B"


def _format_ratio(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}×"


def _format_count(value: float | None) -> str:
    return "—" if value is None else f"{value:,.0f}"


def _templates() -> Jinja2Templates:
    env = Environment(loader=FileSystemLoader(TEMPLATE_DIR), autoescape=True)
    env.filters.update(seconds=format_seconds, bytes=_format_bytes, ratio=_format_ratio, number=_format_count)
    return Jinja2Templates(env=env)


templates = _templates()
router = APIRouter(include_in_schema=False)
pages = APIRouter(include_in_schema=False, dependencies=[Depends(require_viewer)])


def login_redirect(request: Request, exc: LoginRequired) -> Response:
    """Exception handler: a page asked for without a credential goes to the login form."""
    return RedirectResponse(login_location(exc.next_path), status_code=303)


def render(request: Request, name: str, context: dict[str, Any], status_code: int = 200) -> HTMLResponse:
    settings = request.app.state.settings
    return templates.TemplateResponse(
        request, name, {"token_required": bool(settings.api_token), **context}, status_code=status_code
    )


def not_found(request: Request, what: str) -> HTMLResponse:
    return render(request, "dashboard/not_found.html", {"what": what}, status_code=404)


# --------------------------------------------------------------------------- decisions list


def _parse_date(text: str | None, problems: list[str], label: str) -> date | None:
    if not text:
        return None
    try:
        return date.fromisoformat(text)
    except ValueError:
        problems.append(f"{label}: '{text}' is not a date (YYYY-MM-DD); ignored")
        return None


def _parse_int(text: str | None, default: int, low: int, high: int) -> int:
    try:
        return min(high, max(low, int(text))) if text else default
    except ValueError:
        return default


def _resolve_hardware_filter(value: str, hardware: list[views.KnownHardware]) -> str:
    for h in hardware:
        if value in (h.name, h.hash):
            return h.hash
    return value  # a hash of a model this server cannot name (an inline one)


@pages.get("/", response_class=HTMLResponse)
def decisions_page(request: Request, session: DbSession) -> HTMLResponse:
    """Decisions, filtered, sorted, paginated; works without JavaScript (plain GET forms and links)."""
    q = request.query_params
    problems: list[str] = []
    hardware = views.known_hardware(session)
    counts = queries.decision_counts_by_hardware(session)
    names = views.hardware_names(session, hardware, set(counts))

    day_from = _parse_date(q.get("from"), problems, "from")
    day_to = _parse_date(q.get("to"), problems, "to")
    cache = q.get("cache") or None
    if cache is not None and cache not in CACHE_OUTCOMES:
        problems.append(f"cache: '{cache}' is not one of {', '.join(CACHE_OUTCOMES)}; ignored")
        cache = None
    status = None
    if q.get("status"):
        try:
            status = DecisionStatus(q["status"])
        except ValueError:
            problems.append(f"status: '{q['status']}' is not one of pending, done, failed; ignored")
    try:
        sort = queries.DecisionSort(q.get("sort") or "created")
    except ValueError:
        sort = queries.DecisionSort.CREATED
    descending = q.get("order", "desc") != "asc"
    per_page = _parse_int(q.get("per_page"), 50, 1, queries.MAX_PAGE_SIZE)
    page = _parse_int(q.get("page"), 1, 1, 10**6)

    filters = queries.DecisionFilter(
        hardware_hash=_resolve_hardware_filter(q["hardware"], hardware) if q.get("hardware") else None,
        module=(q.get("module") or "").strip() or None,
        created_from=datetime.combine(day_from, time(), UTC) if day_from else None,
        created_before=datetime.combine(day_to + timedelta(days=1), time(), UTC) if day_to else None,
        cache=cache,
        status=status,
    )
    result = queries.page_of_decisions(session, filters, sort=sort, descending=descending, page=page, per_page=per_page)
    modules = queries.modules_by_fingerprint(session, (r.module_fingerprint for r in result.rows))
    rows = [views.decision_row(r, modules.get(r.module_fingerprint), names) for r in result.rows]
    pages_total = max(1, -(-result.total // per_page))

    kept = {k: v for k, v in q.items() if v and k != "page"}

    def link(**changes: Any) -> str:
        params = {**kept, **{k: str(v) for k, v in changes.items() if v is not None}}
        return "/?" + urlencode(params)

    def sort_link(column: str) -> str:
        flip = "asc" if sort.value == column and descending else "desc"
        return link(sort=column, order=flip)

    hardware_options = sorted({(names.get(h) or h, h) for h in counts} | {(h.name, h.hash) for h in hardware})
    return render(request, "dashboard/decisions.html", {
        "rows": rows,
        "total": result.total,
        "page": page,
        "pages_total": pages_total,
        "per_page": per_page,
        "per_page_choices": PER_PAGE_CHOICES,
        "prev_link": link(page=page - 1) if page > 1 else None,
        "next_link": link(page=page + 1) if page < pages_total else None,
        "sort": sort.value,
        "descending": descending,
        "sort_link": sort_link,
        "filters": {k: q.get(k, "") for k in ("hardware", "module", "from", "to", "cache", "status")},
        "filtered": any(q.get(k) for k in ("hardware", "module", "from", "to", "cache", "status")),
        "hardware_options": hardware_options,
        "cache_outcomes": CACHE_OUTCOMES,
        "statuses": [s.value for s in DecisionStatus],
        "problems": problems,
        "first_curl": FIRST_DECISION_CURL,
        "first_cli": FIRST_DECISION_CLI,
    })


# --------------------------------------------------------------------------- decision detail

_graph_cache: OrderedDict[tuple[str, str, str], dict] = OrderedDict()
_graph_lock = threading.Lock()


def _module_graph(request: Request, module_text: str, hardware_json: str | None, hints: dict, key: tuple[str, str, str]) -> tuple[dict | None, str | None]:
    """The module's op graph from a sandbox worker (cached by content), or why there is none."""
    with _graph_lock:
        if key in _graph_cache:
            _graph_cache.move_to_end(key)
            return _graph_cache[key], None
    future = request.app.state.sandbox.submit(module_graph_task, module_text, hardware_json, hints, timeout=GRAPH_TIMEOUT_S)
    try:
        graph = future.result(timeout=GRAPH_TIMEOUT_S * 2)  # queueing behind searches included
    except FutureTimeout:
        future.cancel()
        return None, f"the op graph took longer than {GRAPH_TIMEOUT_S:g} s to rebuild (workers busy?); reload later"
    except ProcessExpired as exc:
        return None, f"rebuilding the op graph crashed its worker (exit code {exc.exitcode})"
    except Exception as exc:  # the module was valid when stored; say what changed rather than 500
        return None, f"the op graph could not be rebuilt: {type(exc).__name__}: {exc}"
    with _graph_lock:
        _graph_cache[key] = graph
        while len(_graph_cache) > _GRAPH_CACHE_SIZE:
            _graph_cache.popitem(last=False)
    return graph, None


def _shape_hints(shape_bucket: str) -> dict:
    try:
        return dict(json.loads(shape_bucket).get("hints") or {})
    except (ValueError, AttributeError):
        return {}


@pages.get("/decisions/{decision_id}", response_class=HTMLResponse)
def decision_page(decision_id: int, request: Request, session: DbSession) -> HTMLResponse:
    row = decisions.get_decision(session, decision_id) if 0 < decision_id < 2**31 else None
    if row is None:
        return not_found(request, f"decision {decision_id}")
    hardware = views.known_hardware(session)
    names = views.hardware_names(session, hardware, {row.hardware_hash})
    module = catalog.get_module(session, row.module_fingerprint)
    summary = views.decision_row(row, module, names)
    model = views.hardware_model_for(session, row.hardware_hash, hardware)

    missing: list[str] = []
    graph = None
    if module is None:
        missing.append("the module text is not stored, so its op graph cannot be drawn")
    else:
        graph, problem = _module_graph(
            request, module.text, model.model_dump_json() if model else None, _shape_hints(row.shape_bucket),
            (row.module_fingerprint, row.hardware_hash if model else "", row.shape_bucket),
        )
        if problem:
            missing.append(problem)
    dag = dag_view(graph, row.plan, row.origin_map, missing=missing)

    trials = queries.trials_of(session, row.id)
    stored_total = len(trials) if len(trials) < queries.MAX_TRIALS else len(trials) + 1
    trial_view = views.trials_view(trials, row.plan, stored_total=stored_total)
    pairs = queries.predicted_and_measured(session, row.hardware_hash, decision_id=row.id)

    cost = row.predicted_cost or {}
    return render(request, "dashboard/decision.html", {
        "d": summary,
        "row": row,
        "module": module,
        "functions": views.function_names(module.text if module else None),
        "cost": cost,
        "bars": views.level_bars(cost),
        "groups": views.group_tiles(row.plan, graph),
        "dag": dag,
        "dag_json": dag.to_json(),
        "trials": trial_view,
        "charts_json": trial_view.chart_json(),
        "measured": summary.measured,
        "pairs": pairs,
        "pairs_json": views.fidelity(pairs).chart_json(),
        "origin": views.origin_rows(row.origin_map),
        "compilation_infos": views.compilation_info_text(row.compilation_info),
        "stats": row.search_stats or {},
        "baseline": row.baseline or {},
    })


# --------------------------------------------------------------------------- hardware


@pages.get("/hardware", response_class=HTMLResponse)
def hardware_list_page(request: Request, session: DbSession) -> HTMLResponse:
    hardware = views.known_hardware(session)
    counts = queries.decision_counts_by_hardware(session)
    names = views.hardware_names(session, hardware, set(counts))
    known_hashes = {h.hash for h in hardware}
    unnamed = sorted((names.get(h) or "(inline model)", h, n) for h, n in counts.items() if h not in known_hashes)
    return render(request, "dashboard/hardware_list.html", {
        "hardware": [(h, views.calibration_state(h.model), counts.get(h.hash, 0)) for h in hardware],
        "unnamed": unnamed,
    })


@pages.get("/hardware/{name}", response_class=HTMLResponse)
def hardware_page(name: str, request: Request, session: DbSession) -> HTMLResponse:
    hardware = views.known_hardware(session)
    found = next((h for h in hardware if name in (h.name, h.hash)), None)
    if found is None:
        return not_found(request, f"hardware '{name}'")
    counts = queries.decision_counts_by_hardware(session)
    fidelity = views.fidelity(queries.predicted_and_measured(session, found.hash))
    return render(request, "dashboard/hardware.html", {
        "h": found,
        "model": found.model,
        "calibration": views.calibration_state(found.model),
        "decisions": counts.get(found.hash, 0),
        "fidelity": fidelity,
        "fidelity_json": fidelity.chart_json(),
        "min_pairs": views.MIN_FIDELITY_PAIRS,
    })


# --------------------------------------------------------------------------- login


@router.get("/login", response_class=HTMLResponse)
def login_form(request: Request) -> HTMLResponse:
    return render(request, "dashboard/login.html", {"next": safe_next(request.query_params.get("next")), "error": None})


@router.post("/login", response_model=None)
async def login(request: Request) -> Response:
    """The form posts the token; a right one sets the session cookie and goes to `next`."""
    # Parsed here: FastAPI's Form() would pull in python-multipart for one urlencoded field.
    form = parse_qs((await request.body()).decode("utf-8", "replace"))
    given = (form.get("token") or [""])[0]
    next_path = safe_next((form.get("next") or ["/"])[0])
    token = request.app.state.settings.api_token
    if not token:
        return RedirectResponse(next_path, status_code=303)
    if not token_matches(given, token):
        return render(request, "dashboard/login.html", {"next": next_path, "error": "wrong token"}, status_code=401)
    response = RedirectResponse(next_path, status_code=303)
    response.set_cookie(COOKIE_NAME, cookie_value(token), max_age=COOKIE_MAX_AGE_S, httponly=True,
                        samesite="strict", path="/")
    return response


@router.post("/logout", response_model=None)
def logout() -> Response:
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(COOKIE_NAME, path="/", httponly=True, samesite="strict")
    return response


router.include_router(pages)
