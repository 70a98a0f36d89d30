"""The client commands (`tilesearch job ...`, `tune --server`) against a real `tilesearch serve`
process that says no: each error is one `error: ...` line on stderr with the server's message and
what to do, and a non-zero exit (2: the caller's mistake, 1: the server's or the network's); never
a traceback. Run as a user runs them: the console script in a subprocess."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from _shared import WORKLOADS

pytestmark = pytest.mark.slow

TILESEARCH = str(Path(sys.executable).with_name("tilesearch"))
ROOT = Path(__file__).resolve().parents[1]
TOKEN = "s3cret"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TILESEARCH_API_TOKEN"}
    return {**env, "PYTHONPATH": str(ROOT), **extra}


@contextmanager
def _serve(tmp: Path, *, migrated: bool, **env: str) -> Iterator[str]:
    env = _env(DATABASE_URL=f"sqlite:///{tmp / 'store.db'}", TILESEARCH_POOL_WORKERS="1", **env)
    if migrated:
        subprocess.run([TILESEARCH, "db", "upgrade"], env=env, check=True, capture_output=True)
    port = _free_port()
    proc = subprocess.Popen([TILESEARCH, "serve", "--port", str(port), "--log-level", "warning"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, "serve exited"
            try:
                httpx.get(f"{base}/healthz", timeout=2)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, "serve did not answer in 90 s"
                time.sleep(0.3)
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A migrated server that wants a bearer token."""
    with _serve(tmp_path_factory.mktemp("serve"), migrated=True, TILESEARCH_API_TOKEN=TOKEN) as base:
        yield base


def cli(*args: str, cwd: Path) -> tuple[int, str]:
    """(exit code, stderr) of the console script."""
    proc = subprocess.run([TILESEARCH, *args], env=_env(), cwd=cwd, capture_output=True, text=True, timeout=120)
    return proc.returncode, proc.stderr


def one_error_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    return lines[0]


@pytest.fixture
def items(tmp_path: Path) -> Path:
    directory = tmp_path / "items"
    directory.mkdir()
    (directory / "mm.mlir").write_text((WORKLOADS / "matmul_1024.mlir").read_text())
    return directory


def test_an_unreachable_server_is_one_line_for_every_client_command(tmp_path: Path, items: Path) -> None:
    nobody = f"http://127.0.0.1:{_free_port()}"
    for args in (["job", "submit", str(items), "--hardware", "host-cpu"], ["job", "watch", "1"],
                 ["job", "spec", "1", "-o", str(tmp_path / "spec.mlir")],
                 ["tune", str(items / "mm.mlir"), "--budget", "2"]):
        code, stderr = cli(*args, "--server", nobody, cwd=tmp_path)
        line = one_error_line(stderr)
        assert code == 1, (args, stderr)
        assert f"cannot reach {nobody}" in line and "tilesearch serve" in line, line
    assert not (tmp_path / "spec.mlir").exists()


def test_without_the_token_the_line_says_how_to_give_it(server: str, tmp_path: Path, items: Path) -> None:
    for args in (["job", "submit", str(items), "--hardware", "host-cpu"], ["job", "watch", "1"],
                 ["tune", str(items / "mm.mlir"), "--budget", "2"]):
        code, stderr = cli(*args, "--server", server, cwd=tmp_path)
        line = one_error_line(stderr)
        assert code == 2
        assert "requires 'Authorization: Bearer <token>'" in line and "HTTP 401" in line
        assert "--token or set TILESEARCH_API_TOKEN" in line


def test_an_unknown_job_or_hardware_and_a_bad_request_are_the_servers_message(server: str, tmp_path: Path,
                                                                              items: Path) -> None:
    auth = ("--server", server, "--token", TOKEN)
    for args in (["job", "watch", "999"], ["job", "spec", "999", "-o", str(tmp_path / "spec.mlir")], ["job", "spec", "999"]):
        code, stderr = cli(*args, *auth, cwd=tmp_path)
        assert code == 2 and "error: no job 999 (HTTP 404" in one_error_line(stderr)
    assert not (tmp_path / "spec.mlir").exists()

    code, stderr = cli("job", "submit", str(items), "--hardware", "no-such-chip", *auth, cwd=tmp_path)
    assert code == 2 and "no-such-chip" in one_error_line(stderr) and "HTTP 404" in stderr

    code, stderr = cli("job", "submit", str(items), "--hardware", "host-cpu", "--measure-top", "99", *auth,
                       cwd=tmp_path)
    line = one_error_line(stderr)
    assert code == 2 and "measure_top" in line and "16" in line and "HTTP 422" in line  # FastAPI's list, as one line
    empty = tmp_path / "empty"
    empty.mkdir()
    code, stderr = cli("job", "submit", str(empty), "--hardware", "host-cpu", *auth, cwd=tmp_path)
    assert code == 2 and "holds no *.mlir file" in one_error_line(stderr)  # said before any request

    code, stderr = cli("tune", str(items / "mm.mlir"), "--hardware", "no-such-chip", "--budget", "2", *auth,
                       cwd=tmp_path)
    assert code == 2 and "no-such-chip" in one_error_line(stderr)

    big = tmp_path / "big"
    big.mkdir()
    (big / "mm.mlir").write_text((items / "mm.mlir").read_text() + ("// " + "w" * 1021 + "\n") * 9 * 1024)
    code, stderr = cli("job", "submit", str(big), "--hardware", "host-cpu", *auth, cwd=tmp_path)
    line = one_error_line(stderr)
    assert code == 2 and "HTTP 413" in line and "TILESEARCH_MAX_BODY_BYTES" in line and "model tune" in line

    # And the same server takes a good job from the same command.
    code, stderr = cli("job", "submit", str(items), "--hardware", "host-cpu", "--budget", "2", *auth, cwd=tmp_path)
    assert code == 0, stderr


def test_a_server_on_a_database_never_migrated_answers_503_saying_so(tmp_path: Path, items: Path) -> None:
    with _serve(tmp_path, migrated=False) as base:
        answer = httpx.post(f"{base}/v1/jobs", json={"items": [{"name": "a", "module": "func.func @f() {\n}"}],
                                                     "hardware": "host-cpu"}, timeout=30)
        assert answer.status_code == 503
        assert answer.json()["detail"]["message"] == "database not migrated: run `tilesearch db upgrade`"
        code, stderr = cli("job", "submit", str(items), "--hardware", "host-cpu", "--server", base, cwd=tmp_path)
        line = one_error_line(stderr)
        assert code == 1 and "database not migrated: run `tilesearch db upgrade` (HTTP 503" in line
