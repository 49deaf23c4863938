"""Where a keyed POST's time goes: per request of the HTTP ingestion workload, the server's CPU
(the uvicorn process and the PostgreSQL backends serving it), round trips to PostgreSQL,
commits, asyncio tasks created and connection-pool waits.

    .venv/bin/python bench/http_profile.py [SECONDS]

Two passes per server (bench/systems/http_server.py, ``middleware`` and ``po``; ``bare`` for
the CPU floor): one under wrk at 16 connections, as bench/http_bench.py runs it, for CPU,
commits (``pg_stat_database.xact_commit``), tasks and the pool's statistics (printed by the
server when ``BENCH_HTTP_STATS=1``); one under ``strace -e trace=sendto`` for round trips
(counted as bench/roundtrips.py counts them: sends the client then waits on). Not timed:
bench/run.py --only http times.
"""

from __future__ import annotations

if __name__ == "__main__":  # run with the project's virtualenv; re-runs itself with the peers'
    from run import _bootstrap

    _bootstrap(__file__)

import json
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

from http_bench import wrk
from measure import BENCH, BenchError, ServerCPU, Worker, fresh_database, python_for, scalar
from roundtrips import COMMITS, round_trips

SCRIPT = str(BENCH / "http_key.lua")


def _stats(server: Worker) -> dict[str, Any]:
    """The server's counters so far (SIGUSR1: it prints them as one JSON line)."""
    assert server.proc.stdout is not None
    os.kill(server.proc.pid, signal.SIGUSR1)
    while True:
        line = server.proc.stdout.readline()
        if not line:
            raise BenchError(f"the server died:\n{server.stderr()}")
        if '"stats"' in line:
            stats: dict[str, Any] = json.loads(line)
            return stats


def _target(mode: str, ready: dict[str, Any]) -> tuple[str, dict[str, str]]:
    base = f"http://127.0.0.1:{ready['port']}"
    if mode == "po":
        return f"{base}/requests", {"BENCH_PO_TOKEN": ready["token"], "BENCH_PATH": "/requests"}
    return f"{base}/post", {"BENCH_PATH": "/post"}


def timed_pass(mode: str, seconds: float) -> dict[str, float]:
    with fresh_database() as url:
        args = [] if mode == "bare" else [url]
        script = str(BENCH / "systems" / "http_server.py")
        server = Worker(
            [python_for("jobfence"), script, mode, *args], env={"BENCH_HTTP_STATS": "1"}
        )
        try:
            ready = server.wait_ready()
            target, env = _target(mode, ready)
            wrk(target, 1, script=SCRIPT, env=env)  # warm up (pool, caches, plans)
            time.sleep(0.5)
            pg = ServerCPU(url)
            pg.start()
            start = _stats(server)
            commits = int(scalar(url, COMMITS))
            cpu = server.ps.cpu_times()
            result = wrk(target, seconds, script=SCRIPT, env=env)
            after = server.ps.cpu_times()
            pg.sample()
            time.sleep(0.7)  # the statistics collector
            commits = int(scalar(url, COMMITS)) - commits - 1
            stats = _stats(server)
        finally:
            server.stop()
        n = max(1, result["requests"])
        pool = {k: v - start["pool"].get(k, 0) for k, v in stats["pool"].items()}
        out = {
            "req/s": result["rps"],
            "p50 ms": result["p50"],
            "p99 ms": result["p99"],
            "uvicorn CPU ms/req": (after.user + after.system - cpu.user - cpu.system) / n * 1000,
            "PostgreSQL CPU ms/req": pg.spent() / n * 1000,
            "commits/req": commits / n,
            "tasks/req": (stats["tasks"] - start["tasks"]) / n,
        }
        pg.close()
        if pool:
            checkouts = pool.get("requests_num", 0)
            out["pool checkouts/req"] = checkouts / n
            out["pool waits/req"] = pool.get("requests_queued", 0) / n
            out["pool wait ms/req"] = pool.get("requests_wait_ms", 0) / n
        return out


def strace_pass(mode: str, seconds: float) -> dict[str, float]:
    strace = shutil.which("strace")
    if strace is None:
        raise BenchError("strace is needed: apt-get install -y strace")
    with fresh_database() as url, tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace"
        script = str(BENCH / "systems" / "http_server.py")
        strace_args = ["-f", "-qq", "-xx", "-s", "1000000", "-e", "trace=sendto", "-o", str(trace)]
        server = Worker([strace, *strace_args, python_for("jobfence"), script, mode, url])
        try:
            ready = server.wait_ready(timeout=120)
            target, env = _target(mode, ready)
            time.sleep(0.5)
            skip = len(trace.read_text().splitlines())
            result = wrk(target, seconds, script=SCRIPT, env=env)
            time.sleep(0.5)
        finally:
            server.stop()
        http = '"\\x48\\x54\\x54\\x50'  # the server's answers to wrk ("HTTP…") are not PostgreSQL's
        lines = [line for line in trace.read_text().splitlines()[skip:] if http not in line]
        return {"round trips/req": round_trips("\n".join(lines)) / max(1, result["requests"])}


def main(seconds: float) -> None:
    for mode in ("bare", "middleware", "po"):
        got = timed_pass(mode, seconds)
        if mode != "bare":
            got.update(strace_pass(mode, seconds))
        print(mode, json.dumps({k: round(v, 3) for k, v in got.items()}), flush=True)


if __name__ == "__main__":
    import sys

    main(float(sys.argv[1]) if len(sys.argv) > 1 else 5.0)
