"""API load benchmark on loopback: cache-hit throughput and latency, cold latency per workload.

    .venv/bin/python benchmarks/api_load.py [--clients 8] [--requests 4000] [--seconds 20] [--budget 32] [--readme]

Starts `tilesearch serve` (uvicorn, one process) on 127.0.0.1 with a fresh SQLite database,
stores one decision (matmul_1024), then sends identical POST /v1/tilings from `--clients`
threads (one keep-alive httpx client each) until `--requests` or `--seconds`, and measures
each request's wall time at the client. Then one cold POST per workload in ../shared/workloads.
The load generator shares the machine's cores with the server: numbers are a lower bound.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
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


def start_server(db_url: str, port: int) -> subprocess.Popen:
    env = {**os.environ, "DATABASE_URL": db_url, "TILESEARCH_HARDWARE_DIR": tempfile.mkdtemp()}
    tilesearch = str(Path(sys.executable).with_name("tilesearch"))
    subprocess.run([tilesearch, "db", "upgrade"], env=env, check=True, capture_output=True)
    server = subprocess.Popen(
        [tilesearch, "serve", "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"], env=env
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


def hit_load(base: str, body: dict, clients: int, total: int, seconds: float) -> dict:
    latencies: list[float] = []
    errors = 0
    lock = threading.Lock()
    remaining = [total]
    deadline = time.monotonic() + seconds

    def worker() -> None:
        nonlocal errors
        with httpx.Client(base_url=base, timeout=30) as client:
            payload = json.dumps(body).encode()
            headers = {"Content-Type": "application/json"}
            while time.monotonic() < deadline:
                with lock:
                    if remaining[0] <= 0:
                        return
                    remaining[0] -= 1
                t0 = time.perf_counter()
                response = client.post("/v1/tilings", content=payload, headers=headers)
                elapsed = time.perf_counter() - t0
                with lock:
                    latencies.append(elapsed)
                    if response.status_code != 200 or response.json()["cache"] != "hit":
                        errors += 1

    threads = [threading.Thread(target=worker) for _ in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return {
        "clients": clients,
        "requests": len(latencies),
        "errors": errors,
        "req_per_s": len(latencies) / wall,
        "p50_ms": percentile(latencies, 50) * 1e3,
        "p99_ms": percentile(latencies, 99) * 1e3,
        "max_ms": max(latencies) * 1e3,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--requests", type=int, default=3000, help="per client-count run")
    parser.add_argument("--seconds", type=float, default=15, help="per client-count run")
    parser.add_argument("--budget", type=int, default=32, help="plans per cold search")
    parser.add_argument("--readme", action="store_true", help="append the tables to README.md")
    args = parser.parse_args()

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    db_url = f"sqlite:///{tempfile.mkdtemp()}/bench.db"
    server = start_server(db_url, port)
    try:
        matmul = {"module": (WORKLOADS / "matmul_1024.mlir").read_text(), "hardware": "host-cpu", "budget": args.budget}
        first = httpx.post(f"{base}/v1/tilings", json=matmul, timeout=120).json()
        assert first["cache"] in ("miss", "warm"), first
        for _ in range(50):  # warm the connection pool and code paths
            httpx.post(f"{base}/v1/tilings", json=matmul, timeout=30)
        hits = [hit_load(base, matmul, c, args.requests, args.seconds) for c in args.clients]

        cold = []
        for path in sorted(WORKLOADS.glob("*.mlir")):
            body = {"module": path.read_text(), "hardware": "host-cpu", "budget": args.budget, "reuse": False}
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
    finally:
        server.terminate()
        server.wait(timeout=30)

    lines = [
        f"Cache hits: identical `POST /v1/tilings` (matmul_1024, stored decision), one uvicorn process, "
        f"SQLite, {os.cpu_count()} cores shared by server and load threads.",
        "",
        "| clients | requests | errors | req/s | p50 ms | p99 ms | max ms |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for h in hits:
        lines.append(f"| {h['clients']} | {h['requests']} | {h['errors']} | {h['req_per_s']:.0f} | "
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
    table = "\n".join(lines)
    print(table)
    if args.readme:
        readme = ROOT / "README.md"
        command = "Reproduce: `.venv/bin/python benchmarks/api_load.py --readme`"
        stamp = time.strftime("%Y-%m-%d")
        text = readme.read_text()
        section = f"\n{README_HEADING}\n\n{command} ({stamp}).\n\n{table}\n"
        if README_HEADING in text:
            text = text.split(README_HEADING)[0].rstrip() + "\n" + section
        else:
            text = text.rstrip() + "\n" + section
        readme.write_text(text)


if __name__ == "__main__":
    main()
