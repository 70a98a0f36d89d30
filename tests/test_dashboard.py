"""The dashboard's pages through the app (status, key content, escaping, filters, pagination,
auth), on SQLite and PostgreSQL. Most decisions are written straight into the store, to control
every value the pages show; one is searched through the API for the op graph of a real module.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient

from service.api.app import create_app
from service.api.dashboard.auth import COOKIE_NAME
from service.config import Settings
from service.hardware.profiles import get_profile
from service.store import measurements
from service.store.db import make_engine, make_sessionmaker, session_scope
from service.store.models import Decision, DecisionStatus, Module, Trial
from _shared import MLP_CHAIN_BUDGET, workload



def _hash(name: str) -> str:
    # Resolved when a test runs: conftest pins host-cpu to the reference host per session.
    return get_profile(name).content_hash()


EVIL_NAME = "<script>alert(1)</script>"
EVIL_MODULE = f'func.func @"{EVIL_NAME}"(%a: tensor<4xf32>) -> tensor<4xf32> {{\n  return %a : tensor<4xf32>\n}}\n'
LEVELS = [
    {"name": "DRAM", "footprint_bytes": 6 << 20, "traffic_bytes": 7 << 20, "capacity_bytes": 1 << 34, "time_s": 2e-4},
    {"name": "L2", "footprint_bytes": 2 << 20, "traffic_bytes": 9 << 20, "capacity_bytes": 1 << 20, "time_s": 1e-3},
]


def _client(url: str, **overrides) -> TestClient:
    settings = Settings(**{"database_url": url, "request_timeout_s": 60, "pool_workers": 1, **overrides})
    return TestClient(create_app(settings))


def _cost(latency_s: float, footprint: int = 2 << 20) -> dict:
    levels = [dict(LEVELS[0]), {**LEVELS[1], "footprint_bytes": footprint}]
    return {"hardware": "x", "latency_s": latency_s, "feasible": True, "reasons": [], "notes": ["a <b>note</b>"],
            "bound_by": "L2", "levels": levels, "flops": 1e6, "recompute_flops": 0.0, "unfused_intermediate_bytes": 0, "nests": []}


def _decision(session, n: int, *, fingerprint: str, hardware_hash: str, cache: str = "miss", latency: float = 1e-3,
              baseline: float = 4e-3, created: datetime | None = None, measured: dict | None = None,
              status: DecisionStatus = DecisionStatus.DONE) -> Decision:
    stats = {"strategy": "tpe", "budget": 8, "seed": 0, "evaluations": 8 + n, "complete": True, "cache": cache}
    if measured:
        stats["measured"] = measured
        # as a measured search stored it before its record carried IREE's default's prediction
        stats["iree_default"] = {"anchor": 0, "config": "#iree_cpu.lowering_config<default>", "plan_hash": "d0"}
    row = Decision(
        key=f"key-{n}", module_fingerprint=fingerprint, hardware_hash=hardware_hash, search_space_version="s",
        cost_model_version="c", objective="latency", shape_bucket="{}", provider_version="p", status=status,
        plan={"groups": [{"anchor": 0, "fuse": [], "levels": [{"loop": "forall", "tile_sizes": [2]}]}]},
        predicted_cost=_cost(latency) if status == DecisionStatus.DONE else None,
        baseline={"latency_s": baseline, "feasible": True, "bound_by": "L2"} if status == DecisionStatus.DONE else None,
        transform_script=f"// script {n} <&>", tiled_module=f"// tiled {n}", search_stats=stats,
        compilation_info={"0": {"op": "linalg.generic", "compilation_info": "#iree_codegen.compilation_info<x>", "honoured_by_iree": True}},
        tuning_spec=f"module {{ // spec {n} <&> }}",
        origin_map={"0": {"name": "linalg.generic", "copies": [{"loops": ["g0.l0"], "escapes": True}], "fused": False, "outside": False}},
        created_at=created or datetime.now(UTC),
    )
    session.add(row)
    session.flush()
    return row


@pytest.fixture
def seeded(migrated_url):
    """Five decisions: three mlp (host-cpu; one warm, one measured, one a week old), one npu,
    one for a module whose function name is a script tag; trials and measurements on one."""
    engine = make_engine(migrated_url)
    sessions = make_sessionmaker(engine)
    ids = {}
    with session_scope(sessions) as s:
        s.add(Module(fingerprint="aa11", text="func.func @mlp_chain() {\n}\n", op_summary={}))
        s.add(Module(fingerprint="bb22", text=EVIL_MODULE, op_summary={}))
        week_ago = datetime.now(UTC) - timedelta(days=7)
        ids["old"] = _decision(s, 1, fingerprint="aa11", hardware_hash=_hash("host-cpu"), created=week_ago, latency=3e-3).id
        ids["warm"] = _decision(s, 2, fingerprint="aa11", hardware_hash=_hash("host-cpu"), cache="warm", latency=2e-3).id
        measured = {"default_cpu_s": 5e-3, "chosen": 0, "not_measurable": None,
                    "candidates": [{"plan_hash": "p0", "predicted_latency_s": 1e-3, "cpu_s": 2.5e-3, "wall_s": 2.6e-3, "error": None}]}
        ids["measured"] = _decision(s, 3, fingerprint="aa11", hardware_hash=_hash("host-cpu"), measured=measured).id
        ids["npu"] = _decision(s, 4, fingerprint="aa11", hardware_hash=_hash("npu-sram-256k"), latency=5e-3, baseline=5e-3).id
        ids["evil"] = _decision(s, 5, fingerprint="bb22", hardware_hash=_hash("host-cpu")).id
        plans = [{"groups": [{"anchor": 0, "fuse": [], "levels": [{"loop": "for", "tile_sizes": [k]}]}]} for k in (1, 2, 4, 8)]
        for number, (plan, latency, footprint) in enumerate(zip(plans, [4e-3, 2e-3, 1e-3, 3e-3], [1 << 10, 1 << 12, 1 << 14, 1 << 16])):
            s.add(Trial(decision_id=ids["measured"], number=number, plan=plan, plan_hash=f"h{number}",
                        cost=_cost(latency, footprint), latency_s=latency, feasible=True))
            measurements.save_measurement(s, plan_hash=f"h{number}", hardware_hash=_hash("host-cpu"), ok=True,
                                  median_s=latency * 1.5, decision_id=ids["measured"])
        s.add(Trial(decision_id=ids["measured"], number=4, plan=plans[0], plan_hash="bad", cost=None, latency_s=None,
                    feasible=False, reason="too big"))
    engine.dispose()
    return migrated_url, ids


def _row_ids(html: str) -> list[int]:
    return [int(i) for i in re.findall(r'<td><a href="/decisions/(\d+)">\d+</a></td>', html)]


def test_empty_store_says_how_to_make_a_first_decision(migrated_url):
    with _client(migrated_url) as client:
        page = client.get("/")
        assert page.status_code == 200 and "text/html" in page.headers["content-type"]
        assert "No decisions stored yet" in page.text
        assert "tilesearch tune model.mlir --hardware host-cpu --server http://127.0.0.1:8000" in page.text
        assert "curl -s -X POST http://127.0.0.1:8000/v1/tilings" in page.text
        filtered = client.get("/", params={"cache": "warm"})
        assert "No decision matches these filters" in filtered.text


def test_decisions_list_rows_filters_sorting_pagination(seeded):
    url, ids = seeded
    with _client(url) as client:
        page = client.get("/")
        assert page.status_code == 200
        assert _row_ids(page.text) == sorted(ids.values(), reverse=True)
        assert "5 decisions" in page.text and "vs super tiling" in page.text
        assert "mlp_chain" in page.text and "host-cpu" in page.text and "npu-sram-256k" in page.text
        # measured: 2.5 ms, 5 ms / 2.5 ms = 2x IREE's default; the others show a dash
        assert "2.500 ms" in page.text and "2.00×" in page.text and "—" in page.text
        assert "4.00×" in page.text  # 4 ms super tiling / 1 ms predicted

        assert _row_ids(client.get("/", params={"hardware": _hash("npu-sram-256k")}).text) == [ids["npu"]]
        assert _row_ids(client.get("/", params={"hardware": "npu-sram-256k"}).text) == [ids["npu"]]
        assert _row_ids(client.get("/", params={"module": "bb2"}).text) == [ids["evil"]]
        assert _row_ids(client.get("/", params={"module": "mlp_ch"}).text) == [ids["npu"], ids["measured"], ids["warm"], ids["old"]]
        assert _row_ids(client.get("/", params={"cache": "warm"}).text) == [ids["warm"]]
        today = datetime.now(UTC).date()
        recent = client.get("/", params={"from": (today - timedelta(days=1)).isoformat()}).text
        assert ids["old"] not in _row_ids(recent) and len(_row_ids(recent)) == 4
        old = client.get("/", params={"to": (today - timedelta(days=3)).isoformat()}).text
        assert _row_ids(old) == [ids["old"]]
        bad = client.get("/", params={"from": "yesterday", "cache": "sometimes"})
        assert bad.status_code == 200 and "is not a date" in bad.text and "is not one of" in bad.text

        by_latency = _row_ids(client.get("/", params={"sort": "predicted", "order": "asc"}).text)
        assert by_latency[:2] == sorted([ids["measured"], ids["evil"]]) or by_latency[:2] == sorted([ids["measured"], ids["evil"]], reverse=True)
        assert by_latency[2:] == [ids["warm"], ids["old"], ids["npu"]]
        by_speedup = _row_ids(client.get("/", params={"sort": "speedup", "order": "asc"}).text)
        assert by_speedup[0] == ids["npu"]  # 1.00x
        assert 'aria-sort="ascending"' in client.get("/", params={"sort": "speedup", "order": "asc"}).text

        first = client.get("/", params={"per_page": 2})
        second = client.get("/", params={"per_page": 2, "page": 2})
        third = client.get("/", params={"per_page": 2, "page": 3})
        seen = _row_ids(first.text) + _row_ids(second.text) + _row_ids(third.text)
        assert seen == sorted(ids.values(), reverse=True)
        assert "page 1 of 3" in first.text and 'rel="next"' in first.text and 'rel="prev"' not in first.text
        assert 'rel="prev"' in third.text and 'rel="next"' not in third.text
        assert "per_page=2" in re.search(r'href="([^"]*)" rel="next"', first.text).group(1)


def test_user_data_is_escaped_everywhere(seeded):
    url, ids = seeded
    with _client(url) as client:
        for path in ("/", f"/decisions/{ids['evil']}", "/?module=bb22"):
            html = client.get(path).text
            assert EVIL_NAME not in html, path
            assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html, path
        detail = client.get(f"/decisions/{ids['evil']}").text
        assert "// script 5 &lt;&amp;&gt;" in detail and "a &lt;b&gt;note&lt;/b&gt;" in detail
        # JSON embedded for the scripts cannot close its <script> element either
        for block in re.findall(r'<script type="application/json" id="[^"]+">(.*?)</script>', detail, re.S):
            assert "<" not in block


def test_decision_detail_shows_costs_trials_measurements_and_artifacts(seeded):
    url, ids = seeded
    with _client(url) as client:
        page = client.get(f"/decisions/{ids['measured']}")
        assert page.status_code == 200
        html = page.text
        for text in ("Predicted latency", "Super-tiling baseline", "Speedup vs super tiling", "bound by L2",
                     "Tile sizes per level", "forall", "footprint vs capacity", 'class="bar over"',
                     "Transform script", "IREE compilation_info", "Tiled IR", "Origin map", "g0.l0",
                     "#iree_codegen.compilation_info&lt;x&gt;", 'data-copy-target="tiled-ir"', "chosen",
                     "IREE tuning spec", "// spec ", " &lt;&amp;&gt; }", 'data-copy-target="tuning-spec"',
                     "5 trials stored, 4 feasible plotted, 1 infeasible",
                     "IREE's default config of the contraction (anchor\n0):"):
            assert text in html, text
        charts = json.loads(re.search(r'id="charts-data">(.*?)</script>', html, re.S).group(1))
        assert charts["scatter"]["footprint_kib"] == [1.0, 4.0, 16.0, 64.0]
        assert charts["scatter"]["pareto_ms"] == pytest.approx([4.0, 2.0, 1.0, None])
        assert charts["progress"]["best_ms"] == pytest.approx([4.0, 2.0, 1.0, 1.0])
        fidelity = json.loads(re.search(r'id="fidelity-data">(.*?)</script>', html, re.S).group(1))
        assert fidelity["measured_ms"] == pytest.approx([1.5, 3.0, 4.5, 6.0])
        # a module the graph cannot be rebuilt from says so instead of failing
        assert "The module has no tileable ops" in client.get(f"/decisions/{ids['evil']}").text
        unmeasured = client.get(f"/decisions/{ids['old']}").text
        assert "Not shown: the op graph could not be rebuilt" in unmeasured
        assert "Not measured" in unmeasured and "--measure-top" in unmeasured

        for missing in (999999, 0, 2**40):
            gone = client.get(f"/decisions/{missing}")
            assert gone.status_code == 404 and "no decision" in gone.text.lower()
        assert client.get("/decisions/abc").status_code == 422


def test_decision_detail_draws_the_op_graph_of_a_searched_module(migrated_url):
    with _client(migrated_url) as client:
        made = client.post("/v1/tilings", json={"module": workload("mlp_chain"), "hardware": "host-cpu",
                                                "budget": MLP_CHAIN_BUDGET})
        assert made.status_code == 200, made.text
        decision = made.json()
        html = client.get(f"/decisions/{decision['id']}").text
        dag = json.loads(re.search(r'id="dag-data">(.*?)</script>', html, re.S).group(1))
        names = {n["uid"]: n["label"] for n in dag["nodes"]}
        assert "linalg.matmul" in names.values() and len(dag["edges"]) >= len(dag["nodes"]) - 1
        anchors = {g["anchor"] for g in decision["plan"]["groups"]}
        assert {n["uid"] for n in dag["nodes"] if n["anchor"]} == anchors
        assert all(e["fused"] == (e["reason"] is None) for e in dag["edges"])
        assert "Not shown" not in html and "Group 0: anchor" in html
        listed = client.get("/").text
        assert "mlp_chain" in listed and "miss" in listed
        # A dynamic dim is "?", as MLIR writes it (the page showed Python's "None").
        dynamic = client.post("/v1/tilings", json={"module": workload("dynamic_matmul"), "hardware": "host-cpu",
                                                   "budget": 4, "shape_hints": {"arg0": [32, 1024]}}).json()
        page = client.get(f"/decisions/{dynamic['id']}").text
        assert "None" not in page and re.search(r"<td>\? × \d+ × \d+</td>", page)


def test_hardware_pages(seeded):
    url, ids = seeded
    with _client(url) as client:
        listing = client.get("/hardware")
        assert listing.status_code == 200
        for text in ("host-cpu", "npu-sram-256k", "builtin", "nominal figures", "SRAM"):
            assert text in listing.text, text
        host_hash = _hash("host-cpu")
        assert f'href="/?hardware={host_hash}">4<' in listing.text

        host = client.get("/hardware/host-cpu")
        assert host.status_code == 200 and "Memory levels" in host.text and "Calibration" in host.text
        assert "4 stored measurements" in host.text and "Spearman" in host.text and "1.000" in host.text
        assert client.get(f"/hardware/{_hash('host-cpu')}").status_code == 200
        npu = client.get("/hardware/npu-sram-256k").text
        assert "No measurements stored for this host" in npu and "scratchpad" in npu
        assert client.get("/hardware/no-such-thing").status_code == 404

        custom = {"name": "<b>npu</b>", "memory_levels": [{"name": "DRAM", "capacity_bytes": 1 << 30, "bandwidth_bytes_per_s": 1e10, "shared": True}],
                  "compute": {"peak_flops_per_s": {"f32": 1e12}, "cores": 2}}
        assert client.post("/v1/hardware", json=custom).status_code == 201
        listing = client.get("/hardware").text
        assert "&lt;b&gt;npu&lt;/b&gt;" in listing and "<b>npu</b>" not in listing and "stored" in listing


def test_pages_load_only_local_resources(seeded):
    url, ids = seeded
    with _client(url) as client:
        for path in ("/", f"/decisions/{ids['measured']}", "/hardware", "/hardware/host-cpu", "/login"):
            html = client.get(path).text
            for ref in re.findall(r'(?:src|href)="([^"]*)"', html):
                assert ref.startswith(("/", "#", "data:")), (path, ref)
            for asset in re.findall(r'(?:src|href)="(/static/[^"]*)"', html):
                assert client.get(asset).status_code == 200, asset
        js = client.get("/static/vendor/uplot/uPlot.iife.min.js")
        assert js.status_code == 200 and "uPlot" in js.text
        assert "dagre" in client.get("/static/vendor/dagre/dagre.min.js").text


def test_token_guards_pages_with_bearer_or_login_cookie(seeded):
    url, ids = seeded
    with _client(url, api_token="s3cret") as client:
        gate = client.get(f"/decisions/{ids['old']}?x=1", follow_redirects=False)
        assert gate.status_code == 303 and gate.headers["location"] == f"/login?next=/decisions/{ids['old']}%3Fx%3D1"
        for path in ("/", "/hardware", "/hardware/host-cpu"):
            assert client.get(path, follow_redirects=False).status_code == 303, path
        assert client.get("/", headers={"Authorization": "Bearer wrong"}, follow_redirects=False).status_code == 303
        assert client.get("/", headers={"Authorization": "Bearer s3cret"}).status_code == 200
        assert client.get("/v1/tilings").status_code == 401  # API reads need the token too (#22)
        assert client.get("/v1/tilings", headers={"Authorization": "Bearer s3cret"}).status_code == 200
        assert client.get("/static/dashboard.css").status_code == 200

        form = client.get("/login?next=/hardware")
        assert form.status_code == 200 and 'name="token"' in form.text and 'value="/hardware"' in form.text
        wrong = client.post("/login", data={"token": "nope", "next": "/hardware"}, follow_redirects=False)
        assert wrong.status_code == 401 and "wrong token" in wrong.text and COOKIE_NAME not in wrong.headers.get("set-cookie", "")
        ok = client.post("/login", data={"token": "s3cret", "next": "/hardware"}, follow_redirects=False)
        assert ok.status_code == 303 and ok.headers["location"] == "/hardware"
        cookie = ok.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict") and "s3cret" not in cookie
        assert client.get("/hardware").status_code == 200  # the client kept the cookie
        assert "Log out" in client.get("/").text
        client.post("/logout", follow_redirects=False)
        client.cookies.clear()
        assert client.get("/", follow_redirects=False).status_code == 303
        # no open redirect through ?next=
        for evil in ("https://example.org/", "//example.org/", "/\\example.org"):
            away = client.post("/login", data={"token": "s3cret", "next": evil}, follow_redirects=False)
            assert away.headers["location"] == "/", evil

    with _client(url) as client:  # no token configured: open pages, login is a no-op
        assert client.get("/").status_code == 200 and "Log out" not in client.get("/").text
        assert client.post("/login", data={"token": "x", "next": "/hardware"}, follow_redirects=False).headers["location"] == "/hardware"
