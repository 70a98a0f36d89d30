"""Issue #22 in process: effort-aware decisions, answers in the requester's IR, the bounded
queue, request bounds, byte-bounded caches and messages that say what to fix (SQLite and
PostgreSQL where the store is involved). The real-process parts are in
test_hardening_process.py."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError
from sqlalchemy import func, select

from _shared import MLP_CHAIN_BUDGET, matmul_module, needs_avx512, workload
from service.api.app import create_app
from service.config import Settings
from service.ir.errors import InvalidTextError, MLIRSyntaxError, ModuleTooLargeError, NestingTooDeepError
from service.ir.lexical import MAX_NESTING, check_text, normalised_key
from service.ir.parse import parse_module
from service.store import decisions
from service.store.models import Decision, Trial
from service.tiling.capacity import ByteBoundedCache, WorkQueue
from service.tiling.errors import PoolSaturated
from service.tiling.request import MAX_BUCKET_VALUES, MAX_DIM, TilingRequest
from service.tiling.service import TilingService

MATMUL = workload("matmul_1024")
# The same module for MLIR: another comment, other SSA names, other spacing.
MATMUL_RESPELLED = (MATMUL.replace("// Square", "// a comment of another user\n// Square")
                    .replace("%acc", "%accumulator").replace("%a", "%lhs").replace("  %", "    %"))
# The same structure under another function name: the same decision, answered in its own names.
MATMUL_RENAMED = MATMUL.replace("@matmul_1024", "@tenant_b_kernel")
# A module whose decision tiles (the reference host's search beats IREE's default on it: a 1024^2
# matmul is left to IREE's own config), for the tests of the tiled text answered per requester.
MLP = workload("mlp_chain")
MLP_RESPELLED = (MLP.replace("// Dense layer", "// a comment of another user\n// Dense layer")
                 .replace("%acc", "%accumulator").replace("%x", "%lhs").replace("  %", "    %"))
MLP_RENAMED = MLP.replace("@mlp_chain", "@tenant_b_kernel")


def _count(sessions, model) -> int:
    with sessions() as s:
        return s.scalar(select(func.count()).select_from(model))


# --------------------------------------------------------------------------- 1. effort


def test_request_fields_are_strict() -> None:
    for field, value in (("budget", True), ("budget", 3.0), ("seed", False), ("seconds", True), ("reuse", 1)):
        with pytest.raises(ValidationError):
            TilingRequest(module=MATMUL, hardware="host-cpu", **{field: value})
    with pytest.raises(ValidationError):
        TilingRequest(module=MATMUL, hardware="host-cpu", shape_hints={"arg0": [True, 1024]})


def test_more_effort_refines_the_stored_decision(service, sessions) -> None:
    small = TilingRequest(module=MATMUL, hardware="host-cpu", budget=2, seed=1)
    first = service.decide(small)
    assert first.cache == "miss"
    assert first.decision.effort == {"tpe": {"budget": 2, "seconds": 48.0, "complete": True}}
    # No more effort than stored: a hit.
    assert service.decide(small.model_copy(update={"budget": 1})).cache == "hit"
    trials = _count(sessions, Trial)

    # More effort: refined in place (same decision), warm-started from the stored plan.
    big = small.model_copy(update={"budget": 16})
    refined = service.decide(big)
    assert refined.cache == "refined" and refined.decision.id == first.decision.id
    assert refined.decision.effort["tpe"]["budget"] == 16
    assert refined.decision.predicted_cost["latency_s"] <= first.decision.predicted_cost["latency_s"]
    assert _count(sessions, Trial) > trials  # the refinement's trials follow the first ones
    assert _count(sessions, Decision) == 1
    # Now covered, in this process and through the store.
    assert service.decide(big).cache == "hit"
    with sessions() as s:
        claim = decisions.claim_decision(s, _parts(first.decision), "other", 5, effort=decisions.Effort("tpe", 16, 48.0))
    assert claim.outcome is decisions.ClaimOutcome.HIT
    # Another strategy is effort the stored decision has not had.
    assert service.decide(small.model_copy(update={"strategy": "random"})).cache == "refined"
    # A refinement that finds nothing better keeps the plan and its search's figures, and lists
    # itself beside them (the decision said "budget 2" next to every trial stored since).
    kept = service.decide(small.model_copy(update={"strategy": "supertiling", "seed": 7}))
    assert kept.cache == "refined" and kept.decision.search_stats["strategy"] != "supertiling"
    note = kept.decision.search_stats["refinements"][-1]
    assert (note["strategy"], note["budget"], note["seed"], note["replaced"]) == ("supertiling", 2, 7, False)
    assert note["evaluations"] >= 1


@needs_avx512  # real IREE on this CPU against the pinned AVX-512 profile's configs
def test_a_kept_default_refined_in_vain_says_so_in_its_reason(service) -> None:
    """IREE's default kept, then a refinement that finds nothing better: the reason counted the
    first search's plans only ("the best of 4 plans searched") beside every trial stored since."""
    small = TilingRequest(module=matmul_module("kn", 32, 32, 32), hardware="host-cpu", budget=4)
    first = service.decide(small)
    assert "IREE's default predicted as fast" in first.decision.search_stats["no_tuning_spec"]
    again = service.decide(small.model_copy(update={"strategy": "random"}))
    assert again.cache == "refined" and not again.decision.plan["groups"]
    note = again.decision.search_stats["refinements"][-1]
    assert again.decision.search_stats["no_tuning_spec"] == (
        first.decision.search_stats["no_tuning_spec"] + f"; then {note['evaluations']} more (random): nothing better")


def _parts(row: Decision) -> decisions.DecisionKeyParts:
    return decisions.DecisionKeyParts(**{name: getattr(row, name) for name in decisions.DecisionKeyParts.__slots__})


def test_refinement_lease_is_single_flight_and_keeps_the_done_row(sessions) -> None:
    parts = decisions.DecisionKeyParts("fp", "hw", "s1", "c1", "latency", "{}", "p1")
    little, more = decisions.Effort("tpe", 2, 10.0), decisions.Effort("tpe", 50, 10.0)
    with sessions() as s:
        owned = decisions.claim_decision(s, parts, "a", 5, effort=little)
        decisions.complete_decision(s, owned.decision.id, "a", decisions.DecisionResult(plan={"groups": []}),
                                    effort=decisions.merged_effort(None, little, complete=True))
        refine = decisions.claim_decision(s, parts, "b", 5, effort=more)
        assert refine.outcome is decisions.ClaimOutcome.REFINE and refine.decision.status == "done"
        assert decisions.claim_decision(s, parts, "c", 5, effort=more).outcome is decisions.ClaimOutcome.BUSY
        # While b refines, a request for no more than the stored effort is served at once.
        assert decisions.claim_decision(s, parts, "c", 5, effort=little).outcome is decisions.ClaimOutcome.HIT
        assert decisions.renew_lease(s, owned.decision.id, "b", 5)
        assert not decisions.renew_lease(s, owned.decision.id, "c", 5)
        # Nothing better found: the plan stays, the effort is recorded, the lease released.
        done = decisions.complete_decision(s, owned.decision.id, "b", None,
                                           effort=decisions.merged_effort(refine.decision.effort, more, complete=True))
        assert done is not None and done.status == "done" and done.lease_owner is None
        assert decisions.claim_decision(s, parts, "c", 5, effort=more).outcome is decisions.ClaimOutcome.HIT
        # A refinement that fails only releases its lease: the row stays done.
        refine = decisions.claim_decision(s, parts, "d", 5, effort=decisions.Effort("random", 4, 10.0))
        failed = decisions.fail_decision(s, refine.decision.id, "d", "boom")
        assert failed is not None and failed.status == "done" and failed.plan == {"groups": []}


# --------------------------------------------------------------------------- 2. the requester's IR


def test_hit_answers_in_the_requesters_own_ir(service) -> None:
    request = TilingRequest(module=MLP, hardware="host-cpu", budget=MLP_CHAIN_BUDGET)
    first = service.decide(request)
    assert first.realisation is None and "@mlp_chain" in first.decision.tiled_module

    other = service.decide(request.model_copy(update={"module": MLP_RENAMED}))
    assert other.cache == "hit" and other.decision.id == first.decision.id
    tiled = other.realisation.realised.tiled_module
    assert "@tenant_b_kernel" in tiled and "mlp_chain" not in tiled
    assert other.realisation.tuning_spec == first.decision.tuning_spec  # matchers name no function

    # Only comments, spacing and SSA names differ: MLIR prints it the same, the stored text is its own.
    respelled = service.decide(request.model_copy(update={"module": MLP_RESPELLED}))
    assert respelled.cache == "hit" and respelled.realisation is None


def test_token_guards_reads_and_a_second_tenant_gets_its_own_text(migrated_url) -> None:
    settings = Settings(database_url=migrated_url, api_token="t0ken", pool_workers=1)
    auth = {"Authorization": "Bearer t0ken"}
    with TestClient(create_app(settings)) as client:
        body = {"module": MLP, "hardware": "host-cpu", "budget": MLP_CHAIN_BUDGET}
        first = client.post("/v1/tilings", json=body, headers=auth).json()
        for path in (f"/v1/tilings/{first['id']}", f"/v1/tilings/{first['id']}/trials", "/v1/tilings", "/v1/hardware"):
            denied = client.get(path)
            assert denied.status_code == 401 and "Bearer" in denied.json()["detail"]["message"]
        second = client.post("/v1/tilings", json={**body, "module": MLP_RENAMED}, headers=auth).json()
        assert second["cache"] == "hit" and second["id"] == first["id"]
        assert "@tenant_b_kernel" in second["tiled_module"] and "mlp_chain" not in second["tiled_module"]


# --------------------------------------------------------------------------- 5. back-pressure


def test_work_queue_waits_in_line_and_computes_retry_after() -> None:
    queue = WorkQueue(workers=1, depth=8, max_wait_s=30)
    order: list[int] = []

    def task(i: int) -> None:
        with queue.slot():
            order.append(i)
            time.sleep(0.05)

    with ThreadPoolExecutor(6) as pool:
        list(pool.map(task, range(6)))
    assert sorted(order) == list(range(6))  # all six ran, none refused

    full = WorkQueue(workers=1, depth=1, max_wait_s=30)
    release = threading.Event()

    def hold() -> None:
        with full.slot():
            release.wait(10)

    with ThreadPoolExecutor(2) as pool:
        pool.submit(hold)
        pool.submit(hold)  # waits in the one place of the line
        deadline = time.monotonic() + 5
        while full.waiting < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        with pytest.raises(PoolSaturated) as refused:
            with full.slot():
                pass
        release.set()
    assert refused.value.retry_after_s >= 2  # one running and one waiting ahead, ~1 s each


def test_respelled_module_is_a_hit_without_a_worker(service, monkeypatch) -> None:
    request = TilingRequest(module=MATMUL, hardware="host-cpu", budget=4)
    first = service.decide(request)

    def no_worker(*_args, **_kwargs):
        raise AssertionError("a worker was used")

    monkeypatch.setattr(service, "_run", no_worker)
    again = service.decide(request.model_copy(update={"module": MATMUL_RESPELLED}))
    assert again.cache == "hit" and again.decision.id == first.decision.id


def test_distinct_cold_requests_queue_instead_of_503(migrated_url) -> None:
    modules = [MATMUL.replace("1024", str(n)) for n in (64, 96, 128, 160, 192, 224)]
    with TestClient(create_app(Settings(database_url=migrated_url, pool_workers=1))) as client:
        with ThreadPoolExecutor(len(modules)) as pool:
            responses = list(pool.map(
                lambda m: client.post("/v1/tilings", json={"module": m, "hardware": "host-cpu", "budget": 2}), modules))
    assert [r.status_code for r in responses] == [200] * len(modules), [r.text for r in responses]


# --------------------------------------------------------------------------- 6. bounds


def test_hints_and_buckets_are_bounded_at_validation(migrated_url) -> None:
    dynamic = workload("dynamic_matmul")
    with TestClient(create_app(Settings(database_url=migrated_url, pool_workers=1))) as client:
        huge = client.post("/v1/tilings", json={"module": dynamic, "hardware": "host-cpu",
                                                "shape_hints": {"arg0": [2**62, 1024]}})
        assert huge.status_code == 422 and f"1..{MAX_DIM}" in huge.text
        many = client.post("/v1/tilings", json={"module": dynamic, "hardware": "host-cpu", "shape_hints": {"arg0": [8, 1024]},
                                                "buckets": {"arg0.0": list(range(1, 2001))}})
        assert many.status_code == 422 and f"at most {MAX_BUCKET_VALUES}" in many.text


def test_a_static_dim_of_a_billion_is_answered_not_timed_out(migrated_url) -> None:
    """The space lists each dim's divisors; scanning every number below a 10^9 extent took a
    minute, so the request hit its time limit (422) and identical requests queued behind it."""
    module = matmul_module("kn", 10**9, 2, 1)  # 12 GB of tensors: within the GPU's 80 GB
    with TestClient(create_app(Settings(database_url=migrated_url, pool_workers=1))) as client:
        r = client.post("/v1/tilings", json={"module": module, "hardware": "gpu-h100", "budget": 8})
        assert r.status_code == 200, r.text
        assert r.json()["plan"]["groups"]
        # Tensors no memory holds were answered "feasible" at ~1e6 s (2^62 dims: ~1e45 s), with a spec.
        huge = client.post("/v1/tilings", json={"module": matmul_module("kn", 10**9, 10**9, 10**9),
                                                "hardware": "host-cpu", "budget": 8})
        assert huge.status_code == 422, huge.text
        message = huge.json()["detail"]["message"]
        assert "more than host-cpu's main memory (DRAM" in message and "1000000000x1000000000" in message
        # ... and tensors a shape hint makes that large (within the hints' own bound of 2^24 a dim).
        hinted = client.post("/v1/tilings", json={"module": workload("dynamic_matmul"), "hardware": "host-cpu",
                                                  "budget": 8, "shape_hints": {"arg0": [2**24, 1024]}})
        assert hinted.status_code == 422 and "with the shape hints" in hinted.json()["detail"]["message"], hinted.text


# --------------------------------------------------------------------------- 7. caches by bytes


def test_caches_are_bounded_by_bytes() -> None:
    cache: ByteBoundedCache[int, str] = ByteBoundedCache(1000, len)
    for i in range(50):
        cache.put(i, "x" * 300)
    assert cache.bytes <= 1000 and len(cache) == 3 and cache.get(49) is not None and cache.get(0) is None
    cache.put(99, "y" * 5000)  # larger than the whole bound: not kept
    assert cache.get(99) is None and cache.bytes <= 1000


def test_decision_cache_of_the_service_counts_bytes(sessions, migrated_url, sandbox) -> None:
    settings = Settings(database_url=migrated_url, decision_cache_bytes=4096)
    service = TilingService(sessions, sandbox, settings)
    decided = service.decide(TilingRequest(module=MLP, hardware="host-cpu", budget=MLP_CHAIN_BUDGET))
    assert decided.decision.tiled_module
    assert len(service._done) == 0  # one decision with its tiled module is more than 4 KiB
    assert service._done.max_bytes == 4096


# --------------------------------------------------------------------------- 8. messages


def test_text_guards_say_what_to_fix() -> None:
    with pytest.raises(InvalidTextError, match="not valid UTF-8 text.*lone surrogate.*line 2"):
        check_text("func.func @f() {\n\udc80}")
    deep = "func.func @f() {\n" + "(" * 5000 + ")" * 5000 + "\n}"
    with pytest.raises(NestingTooDeepError, match=f"too deeply nested.*limit of {MAX_NESTING}"):
        parse_module(deep)
    check_text(MATMUL)  # real modules pass
    # It said "at least one func", and `module {}` was then answered 200 (a new user's trial).
    with pytest.raises(MLIRSyntaxError, match="holds nothing but whitespace"):
        parse_module(" \n\t")
    assert normalised_key(MATMUL) == normalised_key(MATMUL_RESPELLED) != normalised_key(MATMUL_RENAMED)


def test_op_limit_counts_function_body_ops_and_says_so() -> None:
    generic = """
  %{i} = linalg.generic {{indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>],
      iterator_types = ["parallel"]}} ins(%{p} : tensor<8xf32>) outs(%{p} : tensor<8xf32>) {{
  ^bb0(%x: f32, %y: f32):
    %s = arith.addf %x, %y : f32
    linalg.yield %s : f32
  }} -> tensor<8xf32>"""
    ops = "".join(generic.format(i=f"v{i}", p="arg0" if i == 0 else f"v{i - 1}") for i in range(6))
    module = f"func.func @f(%arg0: tensor<8xf32>) -> tensor<8xf32> {{{ops}\n  return %v5 : tensor<8xf32>\n}}"
    parse_module(module, max_ops=7)  # 6 generics + return; their bodies (18 ops) do not count
    with pytest.raises(ModuleTooLargeError) as err:
        parse_module(module, max_ops=6)
    assert err.value.ops == 7 and "7 operations in function bodies" in str(err.value)


def test_invalid_text_and_body_get_the_error_shape(migrated_url) -> None:
    with TestClient(create_app(Settings(database_url=migrated_url, pool_workers=1))) as client:
        surrogate = client.post("/v1/tilings", headers={"content-type": "application/json"},
                                content=b'{"module": "func.func @f() {\\udc80}", "hardware": "host-cpu"}')
        assert surrogate.status_code == 422
        assert surrogate.json()["detail"]["error"] == "InvalidTextError"
        assert "not valid UTF-8 text" in surrogate.json()["detail"]["message"]
        raw = client.post("/v1/tilings", headers={"content-type": "application/json"},
                          content=b'{"module": "\xff\xfe", "hardware": "host-cpu"}')
        assert raw.status_code == 400 and "not valid UTF-8" in raw.json()["detail"]["message"]
        deep = client.post("/v1/tilings", json={"module": "func.func @f() {" + "[" * 3000 + "}", "hardware": "host-cpu"})
        assert deep.status_code == 422 and "too deeply nested" in deep.json()["detail"]["message"]
        # A linalg op on buffers was searched as a 0-flop op, and its spec (matched by shape) broke
        # IREE's build of tensor matmuls of that shape (a new user's trial).
        buffers = client.post("/v1/tilings", json={"module": MEMREF_MATMUL, "hardware": "host-cpu", "budget": 4})
        assert buffers.status_code == 422 and buffers.json()["detail"]["error"] == "BufferSemanticsError"
        assert "linalg.matmul at line 2, column 3 works on memrefs" in buffers.json()["detail"]["message"]
        # iree-import-onnx's output was answered 200 with an empty plan, with no word of model tuning
        # (a new user's trial): a torch-dialect program is refused with where to send it.
        torch_program = client.post("/v1/tilings", json={"module": TORCH_PROGRAM, "hardware": "host-cpu", "budget": 4})
        assert torch_program.status_code == 422 and torch_program.json()["detail"]["error"] == "FrontendDialectError"
        message = torch_program.json()["detail"]["message"]
        assert "torch.operator at line 2, column 8 is torch dialect" in message and "tilesearch model tune" in message


# What iree-import-onnx writes for an ONNX Relu.
TORCH_PROGRAM = """func.func @main_graph(%arg0: !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32> {
  %0 = torch.operator "onnx.Relu"(%arg0) : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  return %0 : !torch.vtensor<[4],f32>
}"""


MEMREF_MATMUL = """func.func @mm(%a: memref<256x512xf32>, %b: memref<512x256xf32>, %c: memref<256x256xf32>) {
  linalg.matmul ins(%a, %b : memref<256x512xf32>, memref<512x256xf32>) outs(%c : memref<256x256xf32>)
  return
}
"""



def test_a_body_that_is_not_json_or_not_sent_as_json_says_so(migrated_url) -> None:
    """A new user's trial: broken JSON was a 422 "JSON decode error" (the README says 400), and a
    body sent as text/plain "should be a valid dictionary"."""
    with TestClient(create_app(Settings(database_url=migrated_url, pool_workers=1))) as client:
        broken = client.post("/v1/tilings", content=b'{"module": "x", "hardware": ', headers={"content-type": "application/json"})
        assert broken.status_code == 400 and broken.json()["detail"]["error"] == "InvalidJSON"
        assert "not valid JSON" in broken.json()["detail"]["message"]
        text = client.post("/v1/tilings", content=b'{"module": "x", "hardware": "host-cpu"}', headers={"content-type": "text/plain"})
        assert text.status_code == 415 and "application/json" in text.json()["detail"]["message"]


def test_a_refusal_names_what_to_fix_first_and_echoes_little(migrated_url) -> None:
    """An inline model's real error came second, after "hardware: not a string"; a 10,000-item
    job came back whole in its 422; a long unknown name was echoed in full."""
    bad_model = {"name": "h", "memory_levels": [], "compute": {"peak_flops_per_s": {"f32": 1e12}, "cores": 0}}
    with TestClient(create_app(Settings(database_url=migrated_url, pool_workers=1))) as client:
        inline = client.post("/v1/tilings", json={"module": "x", "hardware": bad_model})
        assert inline.status_code == 422
        assert [e["msg"] for e in inline.json()["detail"]] == ["Value error, cores must be >= 1, got 0"]
        for not_a_model in (None, 5):  # said "a valid dictionary", never that a name is what to send
            named = client.post("/v1/tilings", json={"module": "x", "hardware": not_a_model}).json()["detail"]
            assert [(e["loc"][-2:], e["msg"]) for e in named] == [(["hardware", "str"], "Input should be a valid string")]
        many = client.post("/v1/jobs", json={"items": [{"name": "x", "module": "m"}] * 10_000, "hardware": "host-cpu"})
        assert many.status_code == 422 and len(many.content) < 10_000
        unknown = client.post("/v1/tilings", json={"module": "x", "hardware": "h" * 100_000})
        assert unknown.status_code == 404 and len(unknown.content) < 2_000


# --------------------------------------------------------------------------- 9. docs offline


def test_docs_load_nothing_from_another_host(migrated_url) -> None:
    with TestClient(create_app(Settings(database_url=migrated_url, pool_workers=1))) as client:
        page = client.get("/docs")
        assert page.status_code == 200 and "http://" not in page.text and "https://" not in page.text
        for asset in ("swagger-ui-bundle.js", "swagger-ui.css"):
            assert client.get(f"/static/vendor/swagger-ui/{asset}").status_code == 200
        assert client.get("/redoc").status_code == 404


def test_non_finite_numbers_in_a_body_are_a_422_not_a_500(migrated_url) -> None:
    """Python's JSON parser takes NaN, Infinity and 1e999; FastAPI's 422 echoed them back and
    could not be written (a new user's trial found the 500)."""
    with TestClient(create_app(Settings(database_url=migrated_url, pool_workers=1)), raise_server_exceptions=False) as client:
        for path, body in (("/v1/tilings", '{"module": "x", "hardware": "host-cpu", "seconds": NaN}'),
                           ("/v1/tilings", '{"module": "x", "hardware": "host-cpu", "budget": Infinity}'),
                           ("/v1/tilings", '{"module": "x", "hardware": "host-cpu", "shape_hints": {"arg0": [1e999, 4]}}'),
                           ("/v1/tilings", '{"module": "x", "hardware": "host-cpu", "extra": -Infinity}'),
                           ("/v1/jobs", '{"items": [], "hardware": "host-cpu", "seconds": NaN}')):
            r = client.post(path, content=body, headers={"content-type": "application/json"})
            assert r.status_code == 422, (path, body, r.status_code)
            assert r.json()["detail"] and all("loc" in e and "msg" in e for e in r.json()["detail"])
