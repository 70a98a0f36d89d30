"""`tilesearch inspect/apply` end to end, and the sandbox that isolates MLIR crashes and hangs."""

from __future__ import annotations

import json
import os
import time

import pytest
from typer.testing import CliRunner

from _shared import WORKLOADS
from service.cli import app
from service.ir.sandbox import IRCrashError, IRTimeoutError, Sandbox
from service.ir.tasks import inspect_module

runner = CliRunner()


def test_inspect_json() -> None:
    result = runner.invoke(app, ["inspect", str(WORKLOADS / "mlp_chain.mlir"), "--json"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    assert len(info["fingerprint"]) == 64
    ops = {op["uid"]: op for op in info["ops"]}
    assert ops[1]["name"] == "linalg.matmul" and ops[1]["loop_ranges"] == [256, 2048, 512]
    assert ops[1]["iterator_types"] == ["parallel", "parallel", "reduction"]
    assert ops[3]["producers"] == [1, 2] and ops[3]["consumers"] == [4]


def test_inspect_table_lists_ops() -> None:
    result = runner.invoke(app, ["inspect", str(WORKLOADS / "conv_relu.mlir")])
    assert result.exit_code == 0, result.output
    assert "linalg.conv_2d_nhwc_hwcf" in result.output and "1x56x56x64x3x3x64" in result.output


def test_apply_writes_script_and_origin(tmp_path) -> None:
    plan = {"groups": [{"anchor": 1, "fuse": [0, 2, 3, 4], "levels": [{"tile_sizes": [64, 128, 0], "loop": "forall"}]}]}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    script = tmp_path / "script.mlir"
    result = runner.invoke(
        app,
        ["apply", str(WORKLOADS / "mlp_chain.mlir"), "--plan", str(tmp_path / "plan.json"), "--script-out", str(script), "--origin-json"],
    )
    assert result.exit_code == 0, result.output
    assert "scf.forall" in result.output
    assert "@__transform_main" in script.read_text()
    origin = json.loads(result.output[result.output.index("\n{") + 1 :])
    assert origin["4"]["fused"] and origin["4"]["copies"][0]["loops"] == ["g0.l0"]


def test_bad_input_exit_code_and_location(tmp_path) -> None:
    bad = tmp_path / "bad.mlir"
    bad.write_text("func.func @f() {\n  %x = linalg.exp\n}\n")
    result = runner.invoke(app, ["inspect", str(bad)])
    assert result.exit_code == 2
    assert "2:8" in result.output and "linalg.exp" in result.output


@pytest.mark.parametrize("command", [["tune", "{m}"], ["model", "tune", "{m}", "--spec-out", "{d}/s.mlir"],
                                     ["job", "submit", "{m}", "--hardware", "host-cpu"]])
@pytest.mark.parametrize("seconds", ["0", "-5", "inf"])
def test_a_time_limit_must_be_positive(tmp_path, command, seconds) -> None:
    """0 ran with no limit, -5 with no search at all, and inf crashed the client of a server (a
    new user's trials): all are refused before any work, as the API refuses them."""
    module = WORKLOADS / "matmul_1024.mlir"
    args = [a.format(m=module, d=tmp_path) for a in command] + ["--seconds", seconds]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "seconds more than 0" in " ".join(result.output.replace("│", " ").split())  # rich wraps it in a box


def test_bytes_that_are_not_utf8_are_named_by_line_and_column(tmp_path) -> None:
    bad = tmp_path / "latin1.mlir"
    bad.write_bytes(b"func.func @f() {\n  // caf\xe9\n  return\n}\n")
    for args in (["inspect", str(bad)], ["tune", str(bad), "--server", "http://127.0.0.1:9"],
                 ["job", "submit", str(bad), "--hardware", "host-cpu", "--server", "http://127.0.0.1:9"]):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        assert "contains byte 0xe9 (invalid continuation byte) at line 2, column 9" in result.output, result.output


def test_job_commands_turn_server_answers_into_messages(tmp_path) -> None:
    (tmp_path / "empty").mkdir()
    result = runner.invoke(app, ["job", "submit", str(tmp_path / "empty"), "--hardware", "host-cpu"])
    assert result.exit_code == 2 and "holds no *.mlir file" in result.output
    result = runner.invoke(app, ["job", "watch", "7", "--server", "http://127.0.0.1:9"])
    assert result.exit_code == 1 and "cannot reach http://127.0.0.1:9" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_rejected_plan_exit_code(tmp_path) -> None:
    (tmp_path / "plan.json").write_text(json.dumps({"groups": [{"anchor": 1, "fuse": [0], "levels": [{"tile_sizes": [64, 64, 0]}]}]}))
    result = runner.invoke(app, ["apply", str(WORKLOADS / "fuse_group.mlir"), "--plan", str(tmp_path / "plan.json")])
    assert result.exit_code == 2
    assert "fuse group 1 is split" in result.output
    # A plan that fails validation names the field, without pydantic's documentation link (a new user's trial).
    (tmp_path / "plan.json").write_text(json.dumps({"groups": [{"anchor": 1, "fuse": [0], "levels": [{"tile_sizes": [-2, 64, 0]}]}]}))
    result = runner.invoke(app, ["apply", str(WORKLOADS / "fuse_group.mlir"), "--plan", str(tmp_path / "plan.json")])
    assert result.exit_code == 2 and "errors.pydantic.dev" not in result.output
    assert "Plan is not valid: groups.0.levels.0.tile_sizes.0: Input should be greater than or equal to 0 (got -2)" in result.output


def _sleep(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def _abort() -> None:
    os.abort()


def test_sandbox_survives_crash_and_hang() -> None:
    with Sandbox(workers=1) as sandbox:
        with pytest.raises(IRTimeoutError):
            sandbox.run(_sleep, 5, timeout=0.5)
        with pytest.raises(IRCrashError):
            sandbox.run(_abort, timeout=10)
        info = sandbox.run(inspect_module, (WORKLOADS / "matmul_1024.mlir").read_text(), timeout=30)
        assert [op["name"] for op in info.ops] == ["linalg.fill", "linalg.matmul"]


def test_typed_errors_cross_the_process_boundary() -> None:
    from service.ir.errors import MLIRSyntaxError

    with Sandbox(workers=1) as sandbox, pytest.raises(MLIRSyntaxError) as err:
        sandbox.run(inspect_module, "func.func @f( {", timeout=30)
    assert err.value.diagnostics and err.value.diagnostics[0].line == 1


def test_plan_that_aborts_mlir_is_rejected_before_mlir_sees_it() -> None:
    """Fusing a multi-use producer into ONE scf.for aborts MLIR 3.13 (run in a sandbox so that,
    if the check regressed, this test fails with IRCrashError instead of killing pytest)."""
    from service.ir.errors import PlanError
    from service.ir.tasks import apply_plan_to_text

    source = (WORKLOADS / "multi_consumer.mlir").read_text()
    plan = {"groups": [{"anchor": 1, "fuse": [0], "levels": [{"tile_sizes": [0, 64], "loop": "for"}]}]}
    with Sandbox(workers=1) as sandbox:
        with pytest.raises(PlanError, match="MLIR aborts"):
            sandbox.run(apply_plan_to_text, source, plan, timeout=30)
        forall = {"groups": [{"anchor": 1, "fuse": [0], "levels": [{"tile_sizes": [0, 64], "loop": "forall"}]}]}
        assert "scf.forall" in sandbox.run(apply_plan_to_text, source, forall, timeout=30).tiled_module
