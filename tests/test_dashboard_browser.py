"""The dashboard in a real browser: Debian's Chromium, headless, driven by Playwright, against a
real `tilesearch serve` process on a loopback port with a temporary SQLite store.

Screenshots go to var/test-artifacts/dashboard/ (printed at the end of the run). `make test`
installs Chromium when it is missing (scripts/ensure-chromium.sh); without it these tests skip.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from service.store import migrate
from _shared import MLP_CHAIN_BUDGET, workload

playwright_api = pytest.importorskip("playwright.sync_api")

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
ARTIFACTS = Path(__file__).resolve().parents[1] / "var" / "test-artifacts" / "dashboard"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is not installed (scripts/ensure-chromium.sh)"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def _serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A `tilesearch serve` process on a free loopback port with an empty migrated SQLite store
    (on SQLite the server runs job items itself)."""
    db = tmp_path_factory.mktemp("browser-db") / "tilesearch.db"
    url = f"sqlite:///{db}"
    migrate.upgrade(url)
    port = _free_port()
    env = {**os.environ, "TILESEARCH_DATABASE_URL": url, "TILESEARCH_POOL_WORKERS": "1"}
    env.pop("TILESEARCH_API_TOKEN", None)
    log = (tmp_path_factory.mktemp("browser-log") / "serve.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "service.cli", "serve", "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"],
        env=env, stdout=log, stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(base + "/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert process.poll() is None, "tilesearch serve exited"
            assert time.monotonic() < deadline, "tilesearch serve did not start"
            time.sleep(0.3)
        yield base
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A server with two decisions made through POST /v1/tilings."""
    with _serve(tmp_path_factory) as base:
        for name in ("mlp_chain", "softmax"):
            made = httpx.post(base + "/v1/tilings", json={"module": workload(name), "hardware": "host-cpu",
                                                          "budget": MLP_CHAIN_BUDGET}, timeout=120)
            assert made.status_code == 200, made.text
        yield base


@pytest.fixture(scope="module")
def job_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A server of its own for the job test: the job's decisions stay out of the lists above."""
    with _serve(tmp_path_factory) as base:
        yield base


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    with playwright_api.sync_playwright() as p:
        instance = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        yield instance
        instance.close()
    print(f"\ndashboard screenshots: {ARTIFACTS}")


@pytest.fixture
def page(browser, server):
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=server)
    page = context.new_page()
    page.requests_seen = []  # type: ignore[attr-defined]
    page.errors_seen = []  # type: ignore[attr-defined]
    page.on("request", lambda request: page.requests_seen.append(request.url))
    page.on("pageerror", lambda error: page.errors_seen.append(str(error)))
    yield page
    context.close()


def _shot(page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def _only_own_host(page, server: str) -> None:
    own = urlsplit(server).netloc
    foreign = [u for u in page.requests_seen if not u.startswith("data:") and urlsplit(u).netloc != own]
    assert not foreign, foreign
    assert page.requests_seen, "no request recorded"


def test_list_filter_open_decision_charts_dag_copy(page, server):
    page.goto(server + "/")
    rows = page.locator("table.decisions tbody tr")
    assert rows.count() == 2
    _shot(page, "decisions")

    page.fill("input[name=module]", "soft")
    page.click("form#filters button[type=submit]")
    page.wait_for_load_state()
    assert "module=soft" in page.url and rows.count() == 1
    assert "softmax" in rows.first.inner_text()
    page.goto(server + "/?module=mlp")
    assert rows.count() == 1
    page.click("table.decisions tbody tr >> a.fn")
    page.wait_for_selector("#dag svg g.node")
    assert "/decisions/" in page.url

    assert page.locator("#dag svg g.node").count() >= 4
    assert page.locator("#dag svg path.edge").count() >= 3
    box = page.locator("#dag svg").bounding_box()
    assert box and box["width"] > 100 and box["height"] > 100
    for chart in ("#scatter", "#progress"):
        canvas = page.locator(f"{chart} canvas")
        assert canvas.count() == 1
        # a drawn chart: some pixel of the plotting area is not blank
        drawn = page.evaluate(
            """(sel) => { const c = document.querySelector(sel); const ctx = c.getContext('2d');
                   const d = ctx.getImageData(0, 0, c.width, c.height).data;
                   let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i] > 0) n++; return n; }""",
            f"{chart} canvas",
        )
        assert drawn > 500, chart
    legend = page.locator("#scatter").inner_text()  # uPlot draws axis titles on the canvas
    assert "Pareto front" in legend and "chosen" in legend

    page.click("button[data-copy-target=transform-script]")
    page.wait_for_selector("button[data-copy-target=transform-script][data-copied=true]")
    copied = page.evaluate("navigator.clipboard.readText()")
    assert copied.startswith("module attributes {transform.with_named_sequence}")
    assert "Copied" in page.locator("button[data-copy-target=transform-script] ~ .copy-status").inner_text()
    _shot(page, "decision")

    assert not page.errors_seen, page.errors_seen
    _only_own_host(page, server)


def test_hardware_pages_and_no_foreign_requests(page, server):
    page.goto(server + "/hardware")
    assert page.locator("table tbody tr").count() >= 3
    page.click("text=host-cpu >> nth=0")
    page.wait_for_load_state()
    assert "Memory levels" in page.content() and "No measurements stored for this host" in page.content()
    _shot(page, "hardware")
    page.goto(server + "/decisions/999999")
    assert "There is no decision 999999" in page.content()
    assert not page.errors_seen, page.errors_seen
    _only_own_host(page, server)


def test_tables_work_without_javascript(browser, server):
    context = browser.new_context(java_script_enabled=False, viewport={"width": 1400, "height": 900})
    page = context.new_page()
    page.goto(server + "/?sort=predicted&order=asc")
    assert page.locator("table.decisions tbody tr").count() == 2
    page.click("table.decisions tbody tr >> nth=0 >> a.fn")
    page.wait_for_load_state()
    assert page.locator("table.levels tbody tr").count() >= 2
    assert page.locator("text=The graph as tables").count() == 1
    _shot(page, "decision-no-js")
    context.close()


JOB_MODULES = ("mlp_chain", "softmax", "fuse_group", "attention_scores")
MATMUL_SOFTMAX_MODEL = """
func.func @main(%a: tensor<16x64xf32>, %b: tensor<64x32xf32>) -> tensor<16x32xf32> {
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<16x32xf32>
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<16x32xf32>) -> tensor<16x32xf32>
  %m = linalg.matmul ins(%a, %b : tensor<16x64xf32>, tensor<64x32xf32>) outs(%f : tensor<16x32xf32>) -> tensor<16x32xf32>
  %e2 = tensor.empty() : tensor<16x32xf32>
  %s = linalg.softmax dimension(1) ins(%m : tensor<16x32xf32>) outs(%e2 : tensor<16x32xf32>) -> tensor<16x32xf32>
  return %s : tensor<16x32xf32>
}
"""


def _finished(page) -> int:
    return int(page.locator('[data-live="finished"]').first.inner_text())


def test_job_page_shows_progress_live_without_a_reload(browser, job_server):
    items = [{"name": name, "module": workload(name)} for name in JOB_MODULES]
    submitted = httpx.post(job_server + "/v1/jobs", json={"items": items, "hardware": "host-cpu", "budget": 48}, timeout=60)
    assert submitted.status_code == 202, submitted.text
    job_id = submitted.json()["id"]

    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.requests_seen = []  # type: ignore[attr-defined]
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("request", lambda request: page.requests_seen.append(request.url))
    page.goto(f"{job_server}/jobs/{job_id}")
    at_load = _finished(page)
    assert at_load < len(JOB_MODULES), "the job finished before its page loaded: raise the budget"
    assert page.locator("table.items tbody tr").count() == len(JOB_MODULES)
    page.evaluate("window.__sameDocument = true")

    page.wait_for_function(f"Number(document.querySelector('[data-live=finished]').textContent) > {at_load}", timeout=180_000)
    _shot(page, "job-running")
    assert page.evaluate("window.__sameDocument === true"), "the page reloaded instead of updating itself"
    page.wait_for_function("document.querySelector('[data-live=state]').textContent === 'succeeded'", timeout=300_000)
    assert page.evaluate("window.__sameDocument === true")
    assert _finished(page) == len(JOB_MODULES) and int(page.get_attribute("[data-live=progress]", "value")) == len(JOB_MODULES)
    assert page.locator("table.items [data-item=decision] a").count() == len(JOB_MODULES)
    assert page.locator("table.items [data-item=state]").all_inner_texts() == ["done"] * len(JOB_MODULES)
    drawn = page.evaluate(
        """() => { const c = document.querySelector('#job-chart canvas'); const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
               let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i] > 0) n++; return n; }""")
    assert drawn > 500
    assert "no longer updates" in page.locator("[data-live=note]").inner_text()
    _shot(page, "job-done")
    assert not errors, errors
    _only_own_host(page, job_server)

    spec = page.request.get(f"{job_server}/v1/jobs/{job_id}/spec")
    assert spec.status == 200 and "transform.named_sequence" in spec.text()

    # a whole model: IREE forms a matmul dispatch (tuned) and a softmax one (left to IREE)
    model = httpx.post(job_server + "/v1/jobs", json={"model": MATMUL_SOFTMAX_MODEL, "hardware": "host-cpu", "budget": 8}, timeout=120)
    assert model.status_code == 202, model.text
    model_id = model.json()["id"]
    page.goto(f"{job_server}/jobs/{model_id}")
    page.wait_for_function("document.querySelector('[data-live=state]').textContent === 'succeeded'", timeout=120_000)
    page.reload()  # the rendered (not script-updated) page: the weighted total card appears
    assert "whole model, 1 tunable dispatch" in page.locator("h1").inner_text()
    dispatch = page.locator("table.items tbody tr").first.inner_text()
    assert "matmul" in dispatch and "tuned" in dispatch
    left = page.locator("table.left tbody tr").first.inner_text()
    assert "softmax" in left and "no contraction root" in left
    _shot(page, "job-model")

    page.goto(job_server + "/jobs")
    listed = page.locator("table.jobs").inner_text()
    assert page.locator("table.jobs tbody tr").count() == 2 and "model" in listed and "succeeded" in listed
    _shot(page, "jobs")
    context.close()

    static = browser.new_context(java_script_enabled=False, viewport={"width": 1400, "height": 900})
    plain = static.new_page()
    plain.goto(f"{job_server}/jobs/{job_id}")
    assert plain.locator("[data-live=state]").inner_text() == "succeeded"
    assert plain.locator("table.items tbody tr").count() == len(JOB_MODULES)
    static.close()
