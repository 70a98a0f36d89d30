"""API load benchmark on loopback: cache-hit throughput and latency, cold latency per workload,
back-pressure (distinct cold requests at once) and probe latency while requests wait on a search.

    .venv/bin/python benchmarks/api_load.py [--workers 1 2] [--clients 1 2 4 8] [--seconds 10] [--budget 32]
                                            [--cold-parallel 20] [--waiters 50] [--readme]

Targets (issue #22): cache-hit p99 <= 10 ms at >= 500 req/s; probe p99 < 100 ms while 50
requests wait on one search; 20 distinct cold requests all answered (no 503), queued.

For each `--workers` count, starts `tilesearch serve --workers N` (uvicorn with httptools and
uvloop) on 127.0.0.1 with a fresh SQLite database, stores one decision (matmul_1024), warms up
for a few seconds, then holds `--clients` keep-alive connections sending identical
POST /v1/tilings (closed loop) until `--requests` or `--seconds`, timing each request at the
client. Then, on a one-worker server, one cold POST per workload in ../shared/workloads.
The load generator shares the machine's 2 cores with the server: numbers are a lower bound.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests._shared import WORKLOADS  # noqa: E402

README_HEADING = "## API benchmarks"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(db_url: str, port: int, workers: int = 1) -> subprocess.Popen:
    env = {**os.environ, "DATABASE_URL": db_url, "TILESEARCH_HARDWARE_DIR": tempfile.mkdtemp()}
    tilesearch = str(Path(sys.executable).with_name("tilesearch"))
    subprocess.run([tilesearch, "db", "upgrade"], env=env, check=True, capture_output=True)
    server = subprocess.Popen(
        [tilesearch, "serve", "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning",
         "--workers", str(workers)], env=env
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                return server
        except httpx.HTTPError:
            time.sleep(0.2)
    server.terminate()
    raise RuntimeError("server did not become ready in 60 s")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def hit_load(port: int, body: dict, clients: int, total: int, seconds: float) -> dict:
    """`clients` keep-alive connections, each sending the same POST as soon as its previous
    answer is in (closed loop), from one asyncio event loop. Raw HTTP/1.1 over asyncio streams:
    a Python HTTP client costs more CPU per request than the server's cache hit, and would
    measure itself on these 2 shared cores."""
    payload = json.dumps(body).encode()
    request = (
        f"POST /v1/tilings HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    ).encode() + payload
    latencies: list[float] = []
    errors = 0

    async def connection(deadline: float, remaining: list[int]) -> None:
        nonlocal errors
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while remaining[0] > 0 and time.monotonic() < deadline:
                remaining[0] -= 1
                t0 = time.perf_counter()
                writer.write(request)
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))
                answer = await reader.readexactly(length)
                latencies.append(time.perf_counter() - t0)
                if not head.startswith(b"HTTP/1.1 200") or b'"cache":"hit"' not in answer:
                    errors += 1
        finally:
            writer.close()

    async def run() -> float:
        deadline = time.monotonic() + seconds
        remaining = [total]
        t0 = time.perf_counter()
        await asyncio.gather(*(connection(deadline, remaining) for _ in range(clients)))
        return time.perf_counter() - t0

    wall = asyncio.run(run())
    return {
        "clients": clients,
        "requests": len(latencies),
        "errors": errors,
        "req_per_s": len(latencies) / wall,
        "p50_ms": percentile(latencies, 50) * 1e3,
        "p99_ms": percentile(latencies, 99) * 1e3,
        "max_ms": max(latencies) * 1e3,
    }


def cold_requests(base: str, budget: int) -> list[dict]:
    cold = []
    for path in sorted(WORKLOADS.glob("*.mlir")):
        body = {"module": path.read_text(), "hardware": "host-cpu", "budget": budget, "reuse": False}
        t0 = time.perf_counter()
        response = httpx.post(f"{base}/v1/tilings", json=body, timeout=300)
        elapsed = time.perf_counter() - t0
        out = response.json()
        timings = out.get("request_timings") or {}
        cold.append({
            "workload": path.stem,
            "status": response.status_code,
            "total_s": elapsed,
            "analyse_s": timings.get("analyse_s"),
            "search_s": timings.get("search_s"),
            "evaluations": (out.get("search_stats") or {}).get("evaluations"),
            "complete": out.get("complete"),
        })
    return cold


def cold_parallel(base: str, n: int, budget: int) -> dict:
    """`n` distinct cold modules (matmuls of different sizes) posted at once: how long until all
    are answered, and how many were refused (503) instead of queued."""
    matmul = (WORKLOADS / "matmul_1024.mlir").read_text()
    bodies = [{"module": matmul.replace("1024", str(64 * (i + 1))), "hardware": "host-cpu", "budget": budget}
              for i in range(n)]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(n) as pool:
        responses = list(pool.map(lambda b: httpx.post(f"{base}/v1/tilings", json=b, timeout=600), bodies))
    return {
        "requests": n,
        "drain_s": time.perf_counter() - t0,
        "ok": sum(r.status_code == 200 for r in responses),
        "503": sum(r.status_code == 503 for r in responses),
        "retry_after": sorted({r.headers.get("retry-after") for r in responses if r.status_code == 503}),
    }


def probes_while_waiting(base: str, waiters: int, search_s: float = 10.0) -> dict:
    """One search running for `search_s` and `waiters` identical requests waiting on it; probe
    latency (/healthz, /readyz, /metrics, GET /v1/tilings) measured meanwhile."""
    body = {"module": (WORKLOADS / "mlp_chain.mlir").read_text(), "hardware": "host-cpu", "budget": 5000,
            "seconds": search_s}
    statuses: list[int] = []

    def post() -> None:
        statuses.append(httpx.post(f"{base}/v1/tilings", json=body, timeout=600).status_code)

    threads = [threading.Thread(target=post) for _ in range(waiters + 1)]
    threads[0].start()
    time.sleep(0.5)
    for t in threads[1:]:
        t.start()
    time.sleep(1.0)
    latencies: list[float] = []
    with httpx.Client(base_url=base, timeout=60) as client:
        deadline = time.monotonic() + search_s - 3
        while time.monotonic() < deadline and not statuses:
            for path in ("/healthz", "/readyz", "/metrics", "/v1/tilings"):
                t0 = time.perf_counter()
                client.get(path)
                latencies.append(time.perf_counter() - t0)
    measured_while_waiting = not statuses
    for t in threads:
        t.join()
    return {
        "waiters": waiters,
        "probes": len(latencies),
        "while_waiting": measured_while_waiting,
        "p50_ms": percentile(latencies, 50) * 1e3,
        "p99_ms": percentile(latencies, 99) * 1e3,
        "max_ms": max(latencies) * 1e3,
        "answered_200": sum(s == 200 for s in statuses),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="uvicorn worker processes")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--requests", type=int, default=20000, help="per client-count run")
    parser.add_argument("--seconds", type=float, default=10, help="per client-count run")
    parser.add_argument("--budget", type=int, default=32, help="plans per cold search")
    parser.add_argument("--cold-parallel", type=int, default=20, help="distinct cold requests posted at once")
    parser.add_argument("--waiters", type=int, default=50, help="requests waiting on one search during the probes")
    parser.add_argument("--skip-hits", action="store_true", help="only the back-pressure and probe runs")
    parser.add_argument("--readme", action="store_true", help="append the tables to README.md")
    args = parser.parse_args()

    matmul = {"module": (WORKLOADS / "matmul_1024.mlir").read_text(), "hardware": "host-cpu", "budget": args.budget}
    hits = []
    cold = []
    for workers in ([] if args.skip_hits else args.workers):
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        server = start_server(f"sqlite:///{tempfile.mkdtemp()}/bench.db", port, workers)
        try:
            first = httpx.post(f"{base}/v1/tilings", json=matmul, timeout=120).json()
            assert first["cache"] in ("miss", "warm"), first
            # Warm every worker's code paths and let the sandbox pools finish starting.
            hit_load(port, matmul, 4, 10**9, 3.0)
            hits += [{"workers": workers, **hit_load(port, matmul, c, args.requests, args.seconds)}
                     for c in args.clients]
            if workers == 1:
                cold = cold_requests(base, args.budget)
        finally:
            server.terminate()
            server.wait(timeout=30)

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = start_server(f"sqlite:///{tempfile.mkdtemp()}/bench.db", port, 1)
    try:
        drained = cold_parallel(base, args.cold_parallel, 4)
        probes = probes_while_waiting(base, args.waiters)
    finally:
        server.terminate()
        server.wait(timeout=30)

    lines = [
        f"Cache hits: identical `POST /v1/tilings` (matmul_1024, stored decision), SQLite, "
        f"{os.cpu_count()} cores shared by the server and the load generator.",
        "",
        "| workers | clients | requests | errors | req/s | p50 ms | p99 ms | max ms |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for h in hits:
        lines.append(f"| {h['workers']} | {h['clients']} | {h['requests']} | {h['errors']} | {h['req_per_s']:.0f} | "
                     f"{h['p50_ms']:.2f} | {h['p99_ms']:.2f} | {h['max_ms']:.1f} |")
    lines += [
        "",
        f"Cold requests (`reuse: false`, budget {args.budget}, host-cpu): client wall time; analyse/search from the response.",
        "",
        "| workload | status | total s | analyse s | search s | evaluations | complete |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    fmt = lambda v: "" if v is None else f"{v:.2f}"  # noqa: E731
    for c in cold:
        lines.append(f"| {c['workload']} | {c['status']} | {c['total_s']:.2f} | {fmt(c['analyse_s'])} | "
                     f"{fmt(c['search_s'])} | {c['evaluations'] if c['evaluations'] is not None else ''} | {c['complete']} |")
    lines += [
        "",
        f"Back-pressure: {drained['requests']} distinct cold requests at once (budget 4, one API process, "
        f"2 MLIR workers): all answered in {drained['drain_s']:.1f} s; {drained['ok']} x 200, {drained['503']} x 503"
        + (f" (Retry-After {', '.join(drained['retry_after'])})" if drained["503"] else "") + ".",
        "",
        f"Probes while {probes['waiters']} requests wait on one search ({probes['probes']} probes of /healthz, /readyz, "
        f"/metrics, GET /v1/tilings{'' if probes['while_waiting'] else '; the search ended during the run'}): "
        f"p50 {probes['p50_ms']:.1f} ms, p99 {probes['p99_ms']:.1f} ms (target < 100 ms), max {probes['max_ms']:.1f} ms; "
        f"{probes['answered_200']} of {probes['waiters'] + 1} waiting requests answered 200.",
    ]
    if hits:
        best = max(hits, key=lambda h: h["req_per_s"])
        lines += ["", f"Cache-hit target (p99 <= 10 ms at >= 500 req/s): best run {best['req_per_s']:.0f} req/s, "
                      f"p99 {best['p99_ms']:.2f} ms."]
    table = "\n".join(lines)
    print(table)
    if args.readme:
        write_readme_section(table)


def write_readme_section(table: str) -> None:
    """Replace this benchmark's README section (up to the next `## ` heading), keeping the rest."""
    readme = ROOT / "README.md"
    text = readme.read_text()
    section = (f"{README_HEADING}\n\nReproduce: `.venv/bin/python benchmarks/api_load.py --readme` "
               f"({time.strftime('%Y-%m-%d')}).\n\n{table}\n")
    if README_HEADING not in text:
        readme.write_text(text.rstrip() + "\n\n" + section)
        return
    before, after = text.split(README_HEADING, 1)
    rest = after.split("\n## ", 1)
    tail = "\n## " + rest[1] if len(rest) == 2 else ""
    readme.write_text(before + section + tail)

if __name__ == "__main__":
    main()
