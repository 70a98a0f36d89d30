"""The HTTP API end to end (app factory + lifespan + real sandbox), on SQLite and PostgreSQL.

Budgets stay small (4-16 plans): these tests check the API's contract, not search quality.
`host-cpu` is the reference host conftest pins (workers inherit it), not the CI machine's CPU.
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from schemathesis import openapi
from schemathesis.core import NotSet

from service.api.app import create_app
from service.config import Settings
from service.store import migrate
from service.tiling.service import TilingService
from _shared import CORPUS, MATMUL_100, MLP_CHAIN_BUDGET, RESNET_SHARED_BIAS_INIT, THREE_REDUCTION_DIMS, workload

MLP = workload("mlp_chain")
MATMUL = workload("matmul_1024")
# mlp_chain with another activation: a new module whose matmul group was seen (warm start).
MLP_MIN = MLP.replace("arith.maximumf %v, %zero", "arith.minimumf %v, %zero")
BAD_MLIR = "module {\n  func.func @f() {\n    %0 = arith.constant 1 : i32 garbage\n  }\n}\n"
CUSTOM_HW = {
    "name": "test-npu",
    "memory_levels": [
        {"name": "DRAM", "capacity_bytes": 1 << 30, "bandwidth_bytes_per_s": 5e10, "shared": True},
        {"name": "SRAM", "capacity_bytes": 1 << 18, "bandwidth_bytes_per_s": 5e11, "scratchpad": True},
    ],
    "compute": {"peak_flops_per_s": {"f32": 1e12}, "cores": 4},
}


def _client(url: str, **overrides) -> TestClient:
    settings = Settings(**{"database_url": url, "request_timeout_s": 60, "pool_workers": 2, **overrides})
    return TestClient(create_app(settings))


def _tile(client: TestClient, module: str, **extra):
    return client.post("/v1/tilings", json={"module": module, "hardware": "host-cpu", "budget": MLP_CHAIN_BUDGET, **extra})


def _metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample in Prometheus text format (0 if absent)."""
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        match = re.fullmatch(rf"{name}(?:\{{(.*)\}})? (\S+)", line)
        if match and ",".join(sorted((match.group(1) or "").split(","))) == want:
            return float(match.group(2))
    return 0.0


def test_tiling_miss_hit_warm_reads_and_errors(migrated_url):
    with _client(migrated_url) as client:
        # miss, then an exact hit: same decision, no search, no new trials
        first = _tile(client, MLP)
        assert first.status_code == 200, first.text
        miss = first.json()
        assert miss["cache"] == "miss" and miss["status"] == "done"
        assert miss["plan"]["groups"] and miss["transform_script"] and miss["tiled_module"]
        assert miss["predicted_cost"]["latency_s"] > 0 and miss["baseline"]["latency_s"] > 0
        assert miss["complete"] is True and miss["search_stats"]["complete"] is True
        assert miss["compilation_info"] is not None and miss["origin_map"] is not None
        # the plan's matmul as an IREE tuning spec matcher: its dims and the config the search chose
        assert miss["tuning_spec"].count("transform.iree.match.contraction") == 1
        (info,) = [i for i in miss["compilation_info"].values() if i["op"] == "linalg.matmul"]
        assert info["compilation_info"].split("lowering_config = ")[1].split(">")[0] in miss["tuning_spec"]
        trials = client.get(f"/v1/tilings/{miss['id']}/trials", params={"limit": 500}).json()
        assert trials["items"] and trials["next_cursor"] is None

        hit = _tile(client, MLP).json()
        assert (hit["cache"], hit["id"], hit["plan"]) == ("hit", miss["id"], miss["plan"])
        assert "search_s" not in hit["request_timings"]
        assert client.get(f"/v1/tilings/{miss['id']}/trials", params={"limit": 500}).json() == trials

        # a structurally related module starts from the stored group best
        warm = _tile(client, MLP_MIN).json()
        assert warm["cache"] == "warm" and warm["id"] != miss["id"]
        assert warm["search_stats"]["warm_start_groups"]

        # reads
        got = client.get(f"/v1/tilings/{miss['id']}").json()
        assert got["id"] == miss["id"] and got["tiled_module"] == miss["tiled_module"] and got["cache"] is None
        assert got["tuning_spec"] == miss["tuning_spec"] and got["no_tuning_spec"] is None
        assert client.get("/v1/tilings/999999").status_code == 404
        assert client.get("/v1/tilings/99999999999999").status_code == 404

        # pagination: newest first, one per page, then the end
        page1 = client.get("/v1/tilings", params={"limit": 1}).json()
        assert [d["id"] for d in page1["items"]] == [warm["id"]] and page1["next_cursor"]
        page2 = client.get("/v1/tilings", params={"limit": 1, "cursor": page1["next_cursor"]}).json()
        assert [d["id"] for d in page2["items"]] == [miss["id"]] and page2["next_cursor"] is None
        assert "tiled_module" not in page1["items"][0]  # list pages carry summaries
        bad_cursor = client.get("/v1/tilings", params={"cursor": "not-a-cursor"})
        assert bad_cursor.status_code == 422 and bad_cursor.json()["detail"]["error"] == "InvalidCursor"
        assert client.get("/v1/tilings", params={"limit": 0}).status_code == 422

        # filters: hardware by name or by hash, module fingerprint
        by_name = client.get("/v1/tilings", params={"hardware": "host-cpu"}).json()["items"]
        assert {d["id"] for d in by_name} == {miss["id"], warm["id"]}
        by_hash = client.get("/v1/tilings", params={"hardware": miss["hardware_hash"]}).json()["items"]
        assert {d["id"] for d in by_hash} == {miss["id"], warm["id"]}
        assert client.get("/v1/tilings", params={"hardware": "gpu-h100"}).json()["items"] == []
        assert client.get("/v1/tilings", params={"hardware": "no-such-hw"}).status_code == 404
        by_fp = client.get("/v1/tilings", params={"fingerprint": miss["module_fingerprint"]}).json()["items"]
        assert [d["id"] for d in by_fp] == [miss["id"]]

        # trials pagination
        t1 = client.get(f"/v1/tilings/{miss['id']}/trials", params={"limit": 2}).json()
        t2 = client.get(f"/v1/tilings/{miss['id']}/trials", params={"limit": 2, "cursor": t1["next_cursor"]}).json()
        assert [t["number"] for t in t1["items"] + t2["items"]] == [t["number"] for t in trials["items"][:4]]
        assert client.get("/v1/tilings/999999/trials").status_code == 404

        # bad MLIR: 422 with located diagnostics; the server still answers afterwards
        bad = _tile(client, BAD_MLIR)
        assert bad.status_code == 422
        detail = bad.json()["detail"]
        assert detail["error"] == "MLIRSyntaxError" and detail["message"]
        assert detail["diagnostics"][0]["line"] == 3 and isinstance(detail["diagnostics"][0]["column"], int)
        assert client.get("/healthz").json() == {"status": "ok"}
        assert _tile(client, MLP).json()["cache"] == "hit"

        # unknown hardware: 404 listing the known names
        unknown = client.post("/v1/tilings", json={"module": MATMUL, "hardware": "tpu-v9"})
        assert unknown.status_code == 404
        assert "host-cpu" in unknown.json()["detail"]["known"] and "tpu-v9" in unknown.json()["detail"]["message"]
        # the search rejects parameters it cannot use: 422, not 500
        assert _tile(client, MATMUL, buckets={"a": [1, 2], "b": [3, 4]}).status_code == 422

        # a stored custom model is usable by name and filters the list
        hw = client.post("/v1/hardware", json=CUSTOM_HW)
        assert hw.status_code == 201
        on_custom = client.post("/v1/tilings", json={"module": MATMUL, "hardware": "test-npu", "budget": 4}).json()
        assert on_custom["hardware_hash"] == hw.json()["hash"]
        assert [d["id"] for d in client.get("/v1/tilings", params={"hardware": "test-npu"}).json()["items"]] == [on_custom["id"]]

        # metrics moved
        text = client.get("/metrics").text
        assert _metric(text, "tilesearch_tilings_total", cache="hit") == 2
        assert _metric(text, "tilesearch_tilings_total", cache="miss") == 2
        assert _metric(text, "tilesearch_tilings_total", cache="warm") == 1
        assert _metric(text, "tilesearch_searches_total") == 3
        assert _metric(text, "tilesearch_evaluations_total") >= 3
        assert _metric(text, "tilesearch_tiling_errors_total", error="MLIRSyntaxError") == 1
        assert _metric(text, "tilesearch_http_request_duration_seconds_count", method="POST", route="/v1/tilings") >= 8
        assert _metric(text, "tilesearch_http_requests_total", method="GET", route="/v1/tilings/{decision_id}", status="404") == 2

        assert client.get("/").status_code == 200 and str(miss["id"]) in client.get("/").text


def test_a_decision_without_a_spec_says_why(migrated_url):
    """A dynamic matmul's plan has no tuning spec (IREE's matcher checks every dim); the answer
    said nothing, and `tune --server --spec-out` then blamed the plan (a new user's trial)."""
    with _client(migrated_url) as client:
        miss = _tile(client, workload("dynamic_matmul"), shape_hints={"arg0": [32, 1024]}).json()
        assert miss["plan"]["groups"] and miss["tuning_spec"] is None
        assert "dynamic dims" in miss["no_tuning_spec"]
        assert client.get(f"/v1/tilings/{miss['id']}").json()["no_tuning_spec"] == miss["no_tuning_spec"]
        hit = _tile(client, workload("dynamic_matmul"), shape_hints={"arg0": [32, 1024]}).json()
        assert hit["cache"] == "hit" and hit["no_tuning_spec"] == miss["no_tuning_spec"]


def test_a_gpu_or_npu_decision_has_no_cpu_config(migrated_url):
    """compilation_info and tuning specs are IREE llvm-cpu configs: a GPU profile's decision once
    carried an `#iree_cpu.lowering_config` spec that IREE's GPU backends would never take."""
    with _client(migrated_url) as client:
        for hardware in ("gpu-h100", "npu-sram-256k"):
            miss = _tile(client, workload("matmul_1024"), hardware=hardware).json()
            assert miss["plan"]["groups"], miss
            assert miss["tuning_spec"] is None and miss["compilation_info"] == {}
            assert f"{hardware} is not a CPU profile" in miss["no_tuning_spec"]
            hit = _tile(client, workload("matmul_1024"), hardware=hardware).json()
            assert hit["cache"] == "hit" and hit["tuning_spec"] is None and hit["compilation_info"] == {}
        cpu = _tile(client, MATMUL_100).json()
        assert "iree_cpu.lowering_config" in cpu["tuning_spec"]
        model = client.post("/v1/jobs", json={"model": MATMUL_100, "hardware": "gpu-h100"})
        assert model.status_code == 422 and "not a CPU profile" in model.json()["detail"]["message"]


def test_a_model_job_from_dispatches_formed_on_the_client(migrated_url):
    """`tilesearch job submit MODEL` forms the dispatches where the model is and sends them, not
    the model: a model job with its weights and its dispatches left to IREE, as the server's own."""
    tunable = [{"name": "main_dispatch_0_matmul_100x100x100_f32", "module": MATMUL_100, "weight": 3}]
    left = [{"name": "main_dispatch_1_elementwise_100x100_f32", "weight": 2, "root_op": "linalg.generic",
             "reason": "no contraction root"}]
    with _client(migrated_url) as client:
        body = {"dispatches": {"tunable": tunable, "left_to_iree": left}, "hardware": "host-cpu", "budget": 2}
        accepted = client.post("/v1/jobs", json=body)
        assert accepted.status_code == 202, accepted.text
        job = client.get(f"/v1/jobs/{accepted.json()['id']}").json()
        assert job["kind"] == "model" and job["notes"] == {"left_to_iree": left}
        assert [(i["name"], i["weight"]) for i in job["items_detail"]] == [(tunable[0]["name"], 3)]

        def refused(**change) -> str:
            answer = client.post("/v1/jobs", json={**body, **change})
            assert answer.status_code == 422, (change, answer.text)
            return answer.text

        assert "exactly one" in refused(model=MATMUL_100)
        nothing = refused(dispatches={"tunable": [], "left_to_iree": left})
        assert "no dispatch tilesearch tunes" in nothing and "no contraction root" in nothing
        assert "unique" in refused(dispatches={"tunable": tunable * 2})
        refused(dispatches={"tunable": [{**tunable[0], "weight": 0}]})
        assert "not a CPU profile" in refused(hardware="gpu-h100")


# Two dynamic inputs; a hint for the first makes the matmul static, the second's add stays dynamic.
HALF_HINTED = """
func.func @main(%x: tensor<?x64xf32>, %w: tensor<64x128xf32>, %y: tensor<?x128xf32>) -> (tensor<?x128xf32>, tensor<?x128xf32>) {
  %c0 = arith.constant 0 : index
  %zero = arith.constant 0.0 : f32
  %rows = tensor.dim %x, %c0 : tensor<?x64xf32>
  %e = tensor.empty(%rows) : tensor<?x128xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<?x128xf32>) -> tensor<?x128xf32>
  %h = linalg.matmul ins(%x, %w : tensor<?x64xf32>, tensor<64x128xf32>) outs(%f : tensor<?x128xf32>) -> tensor<?x128xf32>
  %z = arith.addf %y, %y : tensor<?x128xf32>
  return %h, %z : tensor<?x128xf32>, tensor<?x128xf32>
}
"""


def test_a_model_job_with_dynamic_inputs_names_the_hints_and_with_them_tunes_the_sized_dispatches(migrated_url):
    from test_model_static_shapes import DYNAMIC_MLP

    with _client(migrated_url) as client:
        body = {"model": DYNAMIC_MLP, "hardware": "host-cpu", "budget": 2}
        plain = client.post("/v1/jobs", json=body)
        assert plain.status_code == 422, plain.text
        message = plain.json()["detail"]["message"]
        assert "every dispatch IREE formed from the model has dynamic shapes" in message
        assert 'arg0 (tensor<?x64xf32>); give them sizes, e.g. "shape_hints": {"arg0": [1, 64]}' in message
        accepted = client.post("/v1/jobs", json={**body, "shape_hints": {"arg0": [16, 64]}})
        assert accepted.status_code == 202, accepted.text
        job = client.get(f"/v1/jobs/{accepted.json()['id']}").json()
        names = sorted(i["name"].rsplit("_", 2)[-2] for i in job["items_detail"])
        assert names == ["16x128x64", "16x64x128"], names  # IREE formed static dispatches of the sized rows
        assert job["options"]["shape_hints"] == {"arg0": [16, 64]}
        bad = client.post("/v1/jobs", json={**body, "shape_hints": {"arg0": [16]}})
        assert bad.status_code == 422 and "give 2 dims" in bad.text
        items = client.post("/v1/jobs", json={"items": [{"name": "a", "module": MATMUL_100}], "hardware": "host-cpu",
                                               "shape_hints": {"arg0": [16, 64]}})
        assert items.status_code == 422 and "give each item its own" in items.text
        unsized = client.post("/v1/jobs", json={**body, "sized_model": "mlp.sized.mlir"})
        assert unsized.status_code == 422 and 'give "shape_hints" too' in unsized.json()["detail"][0]["msg"]
        # An input the hints leave open is kept with the job, for its spec's header to name.
        half = client.post("/v1/jobs", json={"model": HALF_HINTED, "hardware": "host-cpu", "budget": 2,
                                             "shape_hints": {"arg0": [16, 64]}})
        assert half.status_code == 202, half.text
        options = client.get(f"/v1/jobs/{half.json()['id']}").json()["options"]
        assert options["still_dynamic"] == ["arg2 (tensor<?x128xf32>)"], options
        forged = client.post("/v1/jobs", json={"dispatches": {"tunable": [], "still_dynamic": ["arg0\n}"]},
                                               "hardware": "host-cpu"})
        assert forged.status_code == 422 and "one printable line" in forged.text, forged.text
        # The name goes into the spec's header comment: one printable line naming an MLIR file.
        for name, says in (("x.mlir\nbroken {", "on one line"), ("", "on one line"), ("x.txt", "*.mlir or *.onnx"),
                           ("x.onnx", "the server sizes MLIR text")):
            wrong = client.post("/v1/jobs", json={**body, "shape_hints": {"arg0": [16, 64]}, "sized_model": name})
            assert wrong.status_code == 422 and says in wrong.text, (name, wrong.text)


def test_an_items_bad_shape_hint_is_refused_on_submit_and_a_good_one_stored_as_lists(migrated_url):
    with _client(migrated_url) as client:
        def submit(hints):
            return client.post("/v1/jobs", json={"items": [{"name": "ok", "module": MATMUL_100},
                                                           {"name": "hinted", "module": workload("dynamic_matmul"),
                                                            "shape_hints": hints}],
                                                 "hardware": "host-cpu", "budget": 2})

        for hints, says in (({"arg0": "32xten"}, "'ten' is not a whole number"), ({"arg0": [0, 8]}, "dim 0 is 0"),
                            ({"weights": [4]}, "name a function argument as argN")):
            refused = submit(hints)
            assert refused.status_code == 422, refused.text
            assert refused.json()["detail"][0]["loc"][-3:] == ["items", 1, "shape_hints"] and says in refused.text
        assert client.get("/v1/jobs").json()["items"] == []  # nothing was queued
        accepted = submit({"arg0": "32x1024"})
        assert accepted.status_code == 202, accepted.text
        job_id = accepted.json()["id"]
        from service.store import jobs
        from service.store.db import make_engine, make_sessionmaker, session_scope

        with session_scope(make_sessionmaker(make_engine(migrated_url))) as session:
            stored = {i.name: i.shape_hints for i in jobs.list_items(session, job_id, limit=10)[0]}
        assert stored == {"ok": None, "hinted": {"arg0": [32, 1024]}}  # one spelling, as a tiling request's


def test_hardware_endpoints(migrated_url):
    with _client(migrated_url) as client:
        names = [h["name"] for h in client.get("/v1/hardware").json()["items"]]
        assert {"host-cpu", "gpu-h100", "npu-sram-256k"} <= set(names)
        assert client.get("/v1/hardware/gpu-h100").json()["source"] == "builtin"
        missing = client.get("/v1/hardware/tpu-v9")
        assert missing.status_code == 404 and "gpu-h100" in missing.json()["detail"]["known"]

        created = client.post("/v1/hardware", json=CUSTOM_HW)
        assert created.status_code == 201 and created.json()["source"] == "stored"
        assert client.post("/v1/hardware", json=CUSTOM_HW).json()["hash"] == created.json()["hash"]  # idempotent
        detail = client.get("/v1/hardware/test-npu").json()
        assert {key: detail[key] for key in created.json()} == created.json()
        assert detail["fidelity"]["n_measurements"] == 0 and "another machine" in detail["fidelity"]["note"]
        assert "test-npu" in [h["name"] for h in client.get("/v1/hardware").json()["items"]]

        inverted = {**CUSTOM_HW, "memory_levels": list(reversed(CUSTOM_HW["memory_levels"]))}
        invalid = client.post("/v1/hardware", json=inverted)
        assert invalid.status_code == 422 and "capacities grow inward" in json.dumps(invalid.json())
        assert client.post("/v1/hardware", json={**CUSTOM_HW, "bogus": 1}).status_code == 422

        # The detected host is not a name a client can take over (a new user's trial stored a
        # 64-core "host-cpu" for everyone, and measured under it).
        host = client.get("/v1/hardware/host-cpu").json()
        taken = client.post("/v1/hardware", json={**host["spec"], "compute": {**host["spec"]["compute"], "cores": 64}})
        assert taken.status_code == 409 and taken.json()["detail"]["error"] == "ReservedHardwareName"
        assert "another name" in taken.json()["detail"]["message"]
        assert client.get("/v1/hardware/host-cpu").json()["hash"] == host["hash"]


def test_health_and_readiness(database_url):
    # not migrated: alive, not ready
    with _client(database_url) as client:
        assert client.get("/healthz").status_code == 200
        not_ready = client.get("/readyz")
        assert not_ready.status_code == 503 and not not_ready.json()["ready"]
    migrate.upgrade(database_url)
    with _client(database_url) as client:
        assert client.get("/readyz").json()["ready"] is True


def test_token_required_on_reads_and_writes(migrated_url):
    with _client(migrated_url, api_token="s3cret") as client:
        missing = client.post("/v1/hardware", json=CUSTOM_HW)
        assert missing.status_code == 401 and missing.headers["WWW-Authenticate"].startswith("Bearer")
        wrong = client.post("/v1/hardware", json=CUSTOM_HW, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        assert client.post("/v1/tilings", json={"module": MATMUL, "hardware": "host-cpu"}).status_code == 401
        ok = client.post("/v1/hardware", json=CUSTOM_HW, headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 201
        auth = {"Authorization": "Bearer s3cret"}
        for path in ("/v1/hardware/test-npu", "/v1/hardware", "/v1/tilings", "/v1/tilings/1", "/v1/tilings/1/trials"):
            assert client.get(path).status_code == 401, path  # reads need the token too
        assert client.get("/v1/hardware/test-npu", headers=auth).status_code == 200
        assert client.get("/v1/tilings", headers=auth).status_code == 200
        assert client.get("/v1/tilings/1", headers=auth).status_code == 404
        for probe in ("/healthz", "/readyz", "/metrics", "/docs"):
            assert client.get(probe).status_code == 200, probe  # probes and docs stay open


def test_limits_body_size_and_op_count(migrated_url):
    with _client(migrated_url, max_body_bytes=4096, max_ops=5, pool_workers=1) as client:
        big = {"module": MLP * 5, "hardware": "host-cpu"}
        declared = client.post("/v1/tilings", json=big)
        assert declared.status_code == 413 and declared.json()["detail"]["error"] == "BodyTooLarge"
        payload = json.dumps(big).encode()
        chunks = (payload[i : i + 1000] for i in range(0, len(payload), 1000))  # chunked: no Content-Length
        streamed = client.post("/v1/tilings", content=chunks, headers={"Content-Type": "application/json"})
        assert streamed.status_code == 413

        too_many = _tile(client, MLP)
        assert too_many.status_code == 422
        assert too_many.json()["detail"]["error"] == "ModuleTooLargeError"
        assert "limit of 5" in too_many.json()["detail"]["message"]
        assert client.get("/healthz").status_code == 200


def test_concurrent_identical_requests_make_one_decision(migrated_url):
    module = workload("fuse_group")
    with _client(migrated_url) as client:
        with ThreadPoolExecutor(50) as pool:
            responses = list(pool.map(lambda _: _tile(client, module), range(50)))
        assert [r.status_code for r in responses] == [200] * 50, {r.status_code: r.text for r in responses}
        ids = {r.json()["id"] for r in responses}
        assert len(ids) == 1
        assert sorted(r.json()["cache"] for r in responses).count("miss") == 1
        page = client.get("/v1/tilings", params={"limit": 100}).json()
        assert [d["id"] for d in page["items"]] == list(ids)
        text = client.get("/metrics").text
        assert _metric(text, "tilesearch_searches_total") == 1


def test_a_plan_that_crashes_mlir_costs_that_plan_not_the_request(migrated_url):
    """The super-tiling baseline's plan crashes MLIR (segfault) on a ResNet block whose convs
    share one bias-broadcast init. Plans are evaluated in a worker the search job keeps, so the
    crash costs that plan: the answer is a decision whose warnings say the baseline could not
    be applied."""
    module = RESNET_SHARED_BIAS_INIT
    with _client(migrated_url) as client:
        response = client.post("/v1/tilings", json={"module": module, "hardware": "npu-sram-256k", "budget": 16})
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["plan"]["groups"]
        assert any("super-tiling baseline could not be applied" in w for w in body["search_stats"]["warnings"])


def test_corpus_never_server_error(tmp_path):
    url = f"sqlite:///{tmp_path / 'corpus.db'}"
    migrate.upgrade(url)
    files = sorted(CORPUS.glob("*.mlir"))
    assert files
    statuses = {}
    with _client(url) as client:
        for path in files:
            response = client.post("/v1/tilings", json={"module": path.read_text(), "hardware": "host-cpu", "budget": 4})
            statuses[path.name] = response.status_code
            assert response.status_code < 500, (path.name, response.text[:500])
            if response.status_code >= 400:
                detail = response.json()["detail"]
                assert detail["message"], path.name
                statuses[path.name] = detail.get("error", response.status_code)
    assert any(s == 200 for s in statuses.values())
    # Worker-side exceptions are tilesearch bugs (answered as 422 TilingFailed so a client
    # never sees a 500): the upstream corpus must not hit any.
    failed = sorted(name for name, s in statuses.items() if s == "TilingFailed")
    assert not failed, f"corpus files hit internal failures: {failed}"
    answered = sum(1 for s in statuses.values() if s == 200)
    assert answered >= len(files) * 0.8, statuses


def test_schemathesis_no_server_errors(migrated_url):
    """Schema-generated requests (bounded: a few examples per operation) never get a 5xx."""
    with _client(migrated_url, request_timeout_s=20) as client:
        schema = openapi.from_dict(client.get("/openapi.json").json())
        failures = []
        for result in schema.get_all_operations():
            operation = result.ok()

            @given(case=operation.as_strategy())
            @settings(max_examples=12, deadline=None, database=None,
                      suppress_health_check=list(HealthCheck))
            def check(case):
                body = None if isinstance(case.body, NotSet) else case.body
                if operation.method.upper() == "POST" and operation.path == "/v1/tilings" and isinstance(body, dict):
                    body = {**body, "budget": 2, "seconds": 2}  # keep any search that parses tiny
                response = client.request(case.method, case.formatted_path, params=case.query or None,
                                          json=body, headers={k: v for k, v in (case.headers or {}).items()
                                                              if k.lower() not in ("content-length", "host")})
                if response.status_code >= 500:
                    failures.append((case.method, case.formatted_path, case.query, body, response.text[:300]))
                    raise AssertionError(failures[-1])

            check()
        assert not failures


def test_a_search_bug_is_a_500_not_a_bad_input_422(migrated_url, monkeypatch):
    """Only SearchInputError (hints, buckets, strategy) is the caller's fault; an internal
    ValueError (e.g. Optuna refusing a starting value outside a knob) is ours."""
    def broken(self, request):
        raise ValueError("'0' not in (1,).")

    monkeypatch.setattr(TilingService, "decide", broken)
    with TestClient(create_app(Settings(database_url=migrated_url, pool_workers=1)), raise_server_exceptions=False) as client:
        assert _tile(client, MATMUL).status_code == 500


def test_a_decisions_spec_is_proved_and_no_hit_gets_one_it_did_not(migrated_url):
    """The API answered a spec whose matcher matched nothing once IREE collapsed the op's three
    reduction dims (a new user's trial). A host-cpu decision's spec is now proved with IREE when
    it is searched, and a hit from another text of the module does not regain one."""
    with _client(migrated_url) as client:
        miss = client.post("/v1/tilings", json={"module": THREE_REDUCTION_DIMS, "hardware": "host-cpu", "budget": 64}).json()
        assert miss["cache"] == "miss" and miss["plan"]["groups"], miss
        assert miss["tuning_spec"] is None and "its matcher matches nothing as IREE forms the op" in miss["no_tuning_spec"]
        renamed = THREE_REDUCTION_DIMS.replace("%x", "%input").replace("%w", "%weight")
        hit = client.post("/v1/tilings", json={"module": renamed, "hardware": "host-cpu", "budget": 64}).json()
        assert hit["cache"] == "hit" and hit["tuning_spec"] is None and hit["no_tuning_spec"] == miss["no_tuning_spec"]
