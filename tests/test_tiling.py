"""The tiling use case over a real store (SQLite and PostgreSQL) and a real MLIR sandbox.

`host-cpu` is the reference host conftest pins (workers inherit it), not the CI machine's CPU."""

from __future__ import annotations

import pytest
from sqlalchemy import event, func, select

from _shared import MATMUL_100, MLP_CHAIN_BUDGET, workload
from service.ir.errors import MLIRSyntaxError
from service.measure.tools import host_translation_info
from service.store.models import Decision, DecisionStatus, GroupRecord, Trial
from service.tiling.service import TilingRequest


def _count(sessions, model) -> int:
    with sessions() as s:
        return s.scalar(select(func.count()).select_from(model))


def test_miss_then_hit_serves_the_stored_decision(service, sessions) -> None:
    request = TilingRequest(module=MATMUL_100, hardware="host-cpu", budget=12, seed=3)
    first = service.decide(request)
    assert first.cache == "miss"
    assert first.decision.status == DecisionStatus.DONE
    assert first.decision.plan["groups"] and first.decision.tiled_module and "scf.forall" in first.decision.tiled_module
    assert "@__transform_main" in first.decision.transform_script
    info = first.decision.compilation_info["1"]["compilation_info"]
    # IREE's own pipeline options on this machine (loop peeling on AVX2), only the tiles differ.
    assert info.startswith("#iree_codegen.compilation_info<") and info.endswith(f"translation_info = {host_translation_info()}>")
    trials = _count(sessions, Trial)
    # every evaluated plan is stored, plus the super-tiling baseline and rejected candidates
    assert trials >= first.decision.search_stats["evaluations"] > 0

    renamed = MATMUL_100.replace("@f(", "@other_name(").replace("%a", "%lhs")
    second = service.decide(request.model_copy(update={"module": renamed}))
    assert second.cache == "hit" and second.decision.id == first.decision.id
    assert "search_s" not in second.timings
    assert _count(sessions, Trial) == trials and _count(sessions, Decision) == 1


def test_reuse_false_searches_again(service, sessions) -> None:
    request = TilingRequest(module=workload("matmul_1024"), hardware="host-cpu", budget=6)
    a = service.decide(request)
    b = service.decide(request.model_copy(update={"reuse": False}))
    assert b.cache == "miss" and b.decision.id != a.decision.id
    assert service.decide(request).decision.id == a.decision.id  # the cached one is untouched


def test_related_module_starts_warm_from_group_records(service, sessions) -> None:
    base = workload("mlp_chain")
    first = service.decide(TilingRequest(module=base, hardware="host-cpu", budget=MLP_CHAIN_BUDGET))
    assert first.cache == "miss"
    assert _count(sessions, GroupRecord) >= 1
    # same matmul group, a different op at the end of the chain: not a hit, but warm
    related = base.replace("arith.maximumf %v, %zero", "arith.minimumf %v, %zero")
    second = service.decide(TilingRequest(module=related, hardware="host-cpu", budget=MLP_CHAIN_BUDGET))
    assert second.cache == "warm" and second.decision.id != first.decision.id
    assert second.decision.search_stats["warm_start_groups"]


def test_bad_module_is_a_typed_error_and_stores_nothing(service, sessions) -> None:
    with pytest.raises(MLIRSyntaxError) as err:
        service.decide(TilingRequest(module="func.func @f( {", hardware="host-cpu"))
    assert err.value.diagnostics[0].line == 1
    assert _count(sessions, Decision) == 0


def test_hardware_changes_the_decision(service) -> None:
    module = workload("matmul_1024")
    cpu = service.decide(TilingRequest(module=module, hardware="host-cpu", budget=8))
    npu = service.decide(TilingRequest(module=module, hardware="npu-sram-256k", budget=8))
    assert cpu.decision.id != npu.decision.id
    assert npu.decision.hardware_hash != cpu.decision.hardware_hash


def test_repeat_hit_makes_no_database_query(service, engine) -> None:
    request = TilingRequest(module=workload("matmul_1024"), hardware="host-cpu", budget=6)
    first = service.decide(request)
    service.decide(request)  # a hit; the hardware name is now cached for HARDWARE_TTL_S
    statements: list[str] = []
    listener = lambda *args: statements.append(args[2])  # noqa: E731  (conn, cursor, statement, ...)
    event.listen(engine, "before_cursor_execute", listener)
    try:
        again = service.decide(request)
    finally:
        event.remove(engine, "before_cursor_execute", listener)
    assert again.cache == "hit" and again.decision.id == first.decision.id
    assert statements == []
