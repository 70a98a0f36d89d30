"""The FastAPI app factory. `create_app()` wires settings, the store, ONE sandbox pool and the
tiling service into `app.state` for the app's lifetime; routes only translate HTTP."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

from service.api.dashboard import job_pages as dashboard_job_pages
from service.api.dashboard import pages as dashboard_pages
from service.api.dashboard.auth import LoginRequired
from service.api.errors import install_error_handlers
from service.api.metrics import ApiMetrics
from service.api.middleware import BodySizeLimit, RequestMetrics
from service.api.routes import hardware, health, jobs, models, tilings
from service.config import Settings, get_settings
from service.ir.sandbox import Sandbox
from service.jobs.wiring import open_jobs
from service.store.db import make_engine, make_sessionmaker
from service.store.migrate import check_ready
from service.tiling.service import TilingService

log = logging.getLogger("tilesearch.api")
_STATIC_DIR = Path(__file__).parent / "static"
_SWAGGER = "/static/vendor/swagger-ui"
# Threads for /readyz's database check: its own few, never behind other requests.
_PROBE_THREADS = 4

# Threads blocked in requests each may hold a connection (waiting on a single-flight owner,
# reading a page); the threadpool has 40 by default.
_DB_POOL = {"pool_size": 20, "max_overflow": 30}


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = make_engine(settings.database_url, **_DB_POOL)
        sessions = make_sessionmaker(engine)
        sandbox = Sandbox(settings.pool_workers, start_method="forkserver")
        app.state.engine = engine
        app.state.sessions = sessions
        app.state.sandbox = sandbox
        app.state.tiling = TilingService(sessions, sandbox, settings)
        app.state.tiling_limiter = anyio.CapacityLimiter(settings.tiling_threads)
        app.state.probe_limiter = anyio.CapacityLimiter(_PROBE_THREADS)
        app.state.jobs, close_jobs = open_jobs(sessions, sandbox, app.state.tiling, settings)
        ready, detail = check_ready(engine)
        if not ready:  # it starts anyway: the migration may come next, /readyz answers 503 meanwhile
            log.warning("%s (/readyz answers 503 until then)", detail.splitlines()[0])
        try:
            yield
        finally:
            close_jobs()
            app.state.tiling.close()
            sandbox.close()
            engine.dispose()

    app = FastAPI(
        title="tilesearch",
        version="1",
        summary="Tile-and-fuse decisions for MLIR tensor programs, searched once and stored.",
        lifespan=lifespan,
        # /docs is served below from the vendored Swagger UI (no CDN: it works offline).
        docs_url=None,
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.metrics = metrics = ApiMetrics()
    install_error_handlers(app)
    for router in (tilings.router, hardware.router, health.router, jobs.router, models.router):
        app.include_router(router)

    # The dashboard: server-rendered pages at / and its vendored scripts under /static.
    app.include_router(dashboard_pages.router)
    app.include_router(dashboard_job_pages.router)
    app.add_exception_handler(LoginRequired, dashboard_pages.login_redirect)
    app.mount("/static", StaticFiles(directory=_STATIC_DIR), name="static")

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url=app.openapi_url or "/openapi.json", title="tilesearch API",
                                   swagger_js_url=f"{_SWAGGER}/swagger-ui-bundle.js",
                                   swagger_css_url=f"{_SWAGGER}/swagger-ui.css",
                                   swagger_favicon_url=f"{_SWAGGER}/favicon-32x32.png")

    # Outermost first at runtime: metrics see every request, including 413s.
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(RequestMetrics, metrics=metrics)
    return app
