"""Jobs against `tilesearch tune` one item after another, at the same budget, on this machine.

    python benchmarks/jobs.py                 # 12 items, budget 64 each
    python benchmarks/jobs.py --items 20 --budget 128

Needs PostgreSQL (TILESEARCH_TEST_PG_URL, default the test server): each job run gets a
database of its own, an API process and 1 or 2 `tilesearch worker` processes (concurrency 1:
one evaluation process each). Items are distinct matmuls; jobs use reuse=false, so every item
searches. Prints items per minute for: `tilesearch tune --workers 1` run per item (process start
included, as a build would run it), a job on one worker, a job on two workers; and the time from
submit to the first finished item (both read off the items' finished_at), and how busy the
machine's cores were during each job (ours and any other work: two workers can only double one
where one leaves a core idle).
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

import httpx
from sqlalchemy import create_engine, text

ROOT = Path(__file__).resolve().parents[1]
TILESEARCH = str(Path(sys.executable).with_name("tilesearch"))
POLL_S = 1.0
PG = os.environ.get("TILESEARCH_TEST_PG_URL", "postgresql+psycopg://postgres:postgres@127.0.0.1:5432/tilesearch_test")


def matmul(m: int, n: int, k: int) -> str:
    return f"""func.func @mm(%a: tensor<{m}x{k}xf32>, %b: tensor<{k}x{n}xf32>, %c: tensor<{m}x{n}xf32>) -> tensor<{m}x{n}xf32> {{
  %0 = linalg.matmul ins(%a, %b : tensor<{m}x{k}xf32>, tensor<{k}x{n}xf32>) outs(%c : tensor<{m}x{n}xf32>) -> tensor<{m}x{n}xf32>
  return %0 : tensor<{m}x{n}xf32>
}}"""


def modules(n: int) -> list[str]:
    return [matmul(64 + 16 * i, 128 + 32 * (i % 3), 96 + 16 * (i % 4)) for i in range(n)]


def env(url: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "DATABASE_URL": url}


def sequential_tune(items: list[str], budget: int, tmp: Path) -> float:
    t0 = time.perf_counter()
    for i, module in enumerate(items):
        path = tmp / f"item{i}.mlir"
        path.write_text(module)
        subprocess.run([TILESEARCH, "tune", str(path), "--hardware", "host-cpu", "--budget", str(budget),
                        "--workers", "1", "--json"], env=env(PG), check=True, capture_output=True)
    return time.perf_counter() - t0


def cpu_busy_s() -> float:
    """CPU seconds the whole machine has spent busy since boot (all processes, all cores)."""
    user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in Path("/proc/stat").read_text().split()[1:8])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[str, int, float] | None:
    """(command name, parent pid, CPU seconds used) of a live process, from /proc/PID/stat: its
    own and its exited children's (IREE's tools run a moment each, counted once they are reaped)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    name, rest = raw[raw.index("(") + 1:raw.rindex(")")], raw[raw.rindex(")") + 2:].split()
    return name, int(rest[1]), sum(int(x) for x in rest[11:15]) / os.sysconf("SC_CLK_TCK")


def cpu_by_role(roles: dict[int, str]) -> dict[str, float]:
    """CPU seconds used so far by each role's processes: a started process's own (`ROLE main`)
    and its descendants' (`ROLE pool`, the sandbox evaluation processes), PostgreSQL's server
    processes (`postgres`). Live processes only, so read before any is stopped."""
    stats = {pid: st for pid in (int(d) for d in os.listdir("/proc") if d.isdigit()) if (st := _stat(pid))}
    out: dict[str, float] = {}
    for pid, (name, _ppid, cpu) in stats.items():
        role, walk = None, pid
        while walk in stats and role is None:  # up the parents to a started process
            role, walk = roles.get(walk), stats[walk][1]
        if role is not None:
            key = f"{role} {'main' if pid in roles else 'pool'}"
        elif name.startswith("postgres"):
            key = "postgres"
        else:
            continue
        out[key] = out.get(key, 0.0) + cpu
    return out


def epoch_s(t: datetime) -> float:
    return (t if t.tzinfo else t.replace(tzinfo=timezone.utc)).timestamp()


def busy_at(samples: list[tuple[float, float]], when: float) -> float:
    """The machine's busy CPU seconds at `when`, interpolated between (time, busy) samples."""
    for (t1, b1), (t2, b2) in zip(samples, samples[1:]):
        if t1 <= when <= t2:
            return b1 + (b2 - b1) * (when - t1) / (t2 - t1) if t2 > t1 else b2
    return samples[-1][1]


def job_run(items: list[str], budget: int, workers: int, tmp: Path,
            port: int) -> tuple[float, float, float, dict[str, float]]:
    """(seconds from submit to the last item, seconds to the first finished item, the share of
    the machine's cores busy meanwhile, ours and any other work's, and the CPU seconds each role
    used from submit to the end: API, each worker's own process and its evaluation pool, PostgreSQL)."""
    admin = create_engine(PG, isolation_level="AUTOCOMMIT")
    name = f"tilesearch_bench_{uuid.uuid4().hex[:8]}"
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    url = admin.url.set(database=name).render_as_string(hide_password=False)
    procs = []
    client = None
    try:
        subprocess.run([TILESEARCH, "db", "upgrade"], env=env(url), check=True, capture_output=True)
        start = lambda *a: procs.append(subprocess.Popen([TILESEARCH, *a], env=env(url), cwd=tmp,  # noqa: E731
                                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                                         start_new_session=True))
        start("serve", "--port", str(port))
        roles = {procs[-1].pid: "api"}
        for w in range(workers):
            start("worker", "--concurrency", "1")
            roles[procs[-1].pid] = f"worker{w + 1}"
        # One client for every request: httpx.get builds an SSL context per call (18 ms of CPU on
        # a Zen 5), and ten polls a second took a fifth of a core from the workers measured.
        client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)
        for _ in range(120):
            try:
                client.get("/healthz", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.5)
        time.sleep(3)  # the workers' start (imports, sandbox): not part of a job's throughput
        body = {"items": [{"name": f"item{i}", "module": m} for i, m in enumerate(items)], "hardware": "host-cpu",
                "budget": budget, "reuse": False}
        t0, busy0, roles0 = time.time(), cpu_busy_s(), cpu_by_role(roles)
        job_id = client.post("/v1/jobs", json=body, timeout=60).json()["id"]
        # Polled as `job watch` does. When items finished is read off their finished_at, and the
        # cores' busy time at the last one interpolated between polls, so a faster poll would
        # only take CPU from the workers measured (ten a second took 5% of a core).
        busy = [(t0, busy0)]
        while (job := client.get(f"/v1/jobs/{job_id}").json())["state"] not in ("succeeded", "failed", "cancelled"):
            time.sleep(POLL_S)
            busy.append((time.time(), cpu_busy_s()))
        assert job["state"] == "succeeded", job
        busy.append((time.time(), cpu_busy_s()))
        roles1 = cpu_by_role(roles)
        engine = create_engine(url)
        with engine.connect() as c:
            first, last = (epoch_s(t) for t in c.execute(
                text("SELECT min(finished_at), max(finished_at) FROM job_items WHERE job_id = :j"), {"j": job_id}).one())
        engine.dispose()
        used = {role: roles1[role] - roles0.get(role, 0.0) for role in sorted(roles1)}
        return last - t0, first - t0, (busy_at(busy, last) - busy0) / ((last - t0) * (os.cpu_count() or 1)), used
    finally:
        if client is not None:
            client.close()
        for p in procs:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))
        admin.dispose()


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=12)
    parser.add_argument("--budget", type=int, default=64)
    args = parser.parse_args()
    items = modules(args.items)
    print(f"machine: {cpu_model()}, {os.cpu_count()} cpus; load before: {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory(prefix="tilesearch-bench-jobs-") as tmp:
        seq = sequential_tune(items, args.budget, Path(tmp))
        one, first1, busy1, used1 = job_run(items, args.budget, 1, Path(tmp), 8801)
        two, first2, busy2, used2 = job_run(items, args.budget, 2, Path(tmp), 8802)
    rate = lambda s: args.items / s * 60  # noqa: E731
    print(f"{args.items} items, budget {args.budget} each; load after: {os.getloadavg()[0]:.2f}\n")
    print("| path | seconds | items/min | vs tune | first item done (s) | cores busy (all work) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    print(f"| `tilesearch tune --workers 1`, one after another | {seq:.1f} | {rate(seq):.1f} | 1.00 | - | - |")
    print(f"| job, 1 worker | {one:.1f} | {rate(one):.1f} | {seq / one:.2f} | {first1:.2f} | {busy1:.0%} |")
    print(f"| job, 2 workers | {two:.1f} | {rate(two):.1f} | {seq / two:.2f} | {first2:.2f} | {busy2:.0%} |")
    print(f"\n2 workers / 1 worker: {one / two:.2f}x")
    print("\nCPU seconds from submit to the job's end, by role (main: the process itself; pool: its sandbox "
          "evaluation processes; postgres: every PostgreSQL server process):\n")
    print("| job | " + " | ".join(sorted(set(used1) | set(used2))) + " |")
    print("| --- |" + " ---: |" * len(set(used1) | set(used2)))
    for label, used in (("1 worker", used1), ("2 workers", used2)):
        print(f"| {label} | " + " | ".join(f"{used.get(r, 0.0):.1f}" for r in sorted(set(used1) | set(used2))) + " |")


if __name__ == "__main__":
    main()
