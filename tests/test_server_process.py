"""The real `tilesearch serve` process (uvicorn, httptools + uvloop, two workers) driven by the
typed client and by `tilesearch tune --server`: what a build system actually talks to.

One server for the module (it takes a few seconds to start its MLIR pools), SQLite file store.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from service.cli import app
from service.client import TilesearchClient, TilesearchError
from _shared import MATMUL_100, WORKLOADS, matmul_module, workload

TILESEARCH = str(Path(sys.executable).with_name("tilesearch"))
MATMUL = workload("matmul_1024")
BAD_MLIR = "module {\n  func.func @f() {\n    %0 = arith.constant 1 : i32 garbage\n  }\n}\n"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("serve")
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{root / 'store.db'}",
           "TILESEARCH_HARDWARE_DIR": str(root / "hardware"), "TILESEARCH_POOL_WORKERS": "1"}
    subprocess.run([TILESEARCH, "db", "upgrade"], env=env, check=True, capture_output=True)
    port = _free_port()
    proc = subprocess.Popen([TILESEARCH, "serve", "--port", str(port), "--workers", "2", "--log-level", "warning"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, f"serve exited: {proc.stderr.read().decode()[-2000:]}"
            try:
                if httpx.get(f"{base}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "serve did not become ready in 90 s"
            time.sleep(0.3)
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_client_miss_then_hit_on_the_same_decision(server: str) -> None:
    with TilesearchClient(server) as client:
        first = client.tile(MATMUL_100, "host-cpu", budget=6, seed=3)
        assert first.cache in ("miss", "warm") and first.status == "done"
        assert first.plan["groups"] and first.tiled_module and "scf." in first.tiled_module
        # Many hits: the two workers each answer some; all return the stored decision.
        again = [client.tile(MATMUL_100, "host-cpu", budget=6, seed=3) for _ in range(8)]
        assert {d.cache for d in again} == {"hit"}
        assert {d.id for d in again} == {first.id}
        assert client.get(first.id).plan == first.plan
        trials = client.all_trials(first.id)
        # Every distinct plan the search evaluated is stored (repeats are stored as trials too).
        distinct = {json.dumps(t.plan, sort_keys=True) for t in trials if t.plan is not None}
        assert len(distinct) == first.search_stats["evaluations"] == 6
        assert first.id in [d.id for d in client.iter_decisions(fingerprint=first.module_fingerprint)]
        assert "host-cpu" in [h.name for h in client.hardware()]


def test_client_raises_with_the_servers_diagnostics(server: str) -> None:
    with TilesearchClient(server) as client:
        with pytest.raises(TilesearchError) as bad:
            client.tile(BAD_MLIR, "host-cpu", budget=2)
        assert bad.value.status_code == 422
        diagnostic = bad.value.detail["diagnostics"][0]
        assert diagnostic["line"] == 3 and diagnostic["column"] > 1
        with pytest.raises(TilesearchError) as unknown:
            client.tile(MATMUL, "no-such-chip", budget=2)
        assert unknown.value.status_code == 404
        # The server is still answering after both.
        assert httpx.get(f"{server}/healthz").status_code == 200


def test_tune_via_server_writes_the_decision(server: str, tmp_path: Path) -> None:
    """On another profile than host-cpu (no guard against IREE's default there, so the
    decision always tiles: on host-cpu, whether 6 plans beat IREE's config depends on the CPU,
    and a Zen 4 kept IREE's and wrote no tiled.mlir)."""
    out = tmp_path / "out"
    runner = CliRunner()
    args = ["tune", str(WORKLOADS / "mlp_chain.mlir"), "--server", server, "--budget", "6", "--json", "--out", str(out),
            "--hardware", "npu-sram-256k"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    decision = json.loads(result.output)
    assert decision["cache"] in ("miss", "warm")
    assert json.loads((out / "plan.json").read_text()) == decision["plan"]
    assert (out / "tiled.mlir").read_text() == decision["tiled_module"]
    assert "transform.named_sequence" in (out / "transform.mlir").read_text()
    # The same request again is answered from the store.
    assert json.loads(runner.invoke(app, args).output)["cache"] == "hit"


def test_tune_via_server_writes_the_decisions_spec(server: str, tmp_path: Path) -> None:
    """`--spec-out` was ignored with `--server` (exit 0, no file): a new user's trial."""
    spec, module = tmp_path / "spec.mlir", tmp_path / "matmul_100.mlir"
    module.write_text(MATMUL_100)
    args = ["tune", str(module), "--server", server, "--budget", "6", "--spec-out", str(spec)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    decision = json.loads(CliRunner().invoke(app, [*args[:-2], "--json"]).output)
    assert decision["tuning_spec"] and spec.read_text() == decision["tuning_spec"]
    assert f"wrote {spec}" in result.output


def test_tune_via_server_says_why_it_writes_no_spec(server: str, tmp_path: Path) -> None:
    """A decision that keeps IREE's own config: `--server --spec-out` removed the old file and
    said only that IREE keeps its configs, not why (a new user's trial)."""
    spec, module = tmp_path / "spec.mlir", tmp_path / "small.mlir"
    module.write_text(matmul_module("kn", 32, 32, 32))  # the search finds nothing 5% faster than IREE's
    spec.write_text("// an older answer")
    result = CliRunner().invoke(app, ["tune", str(module), "--server", server, "--budget", "10", "--spec-out", str(spec)])
    assert result.exit_code == 0, result.output
    assert not spec.exists()
    assert "no tuning spec: IREE's default predicted as fast: " in result.output
    assert "no tuning spec written to" in result.output and "(IREE's default predicted as fast: " in result.output


def test_tune_via_server_reports_bad_mlir_and_unreachable_servers(server: str, tmp_path: Path) -> None:
    bad = tmp_path / "bad.mlir"
    bad.write_text(BAD_MLIR)
    result = CliRunner().invoke(app, ["tune", str(bad), "--server", server, "--budget", "2"])
    assert result.exit_code != 0
    assert "3:" in result.output or "line 3" in result.output
    unreachable = CliRunner().invoke(app, ["tune", str(WORKLOADS / "matmul_1024.mlir"), "--server",
                                           f"http://127.0.0.1:{_free_port()}", "--budget", "2"])
    assert unreachable.exit_code == 1
    assert "cannot reach" in unreachable.output
