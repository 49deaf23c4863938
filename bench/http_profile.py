"""Where a keyed POST's time goes: per request of the HTTP ingestion workload, the server's CPU
(the uvicorn process and the PostgreSQL backends serving it), round trips to PostgreSQL,
commits, asyncio tasks created and connection-pool waits.

    .venv/bin/python bench/http_profile.py [SECONDS]
    .venv/bin/python bench/http_profile.py --py-spy [SECONDS] [MODE…]  # sampled stacks

With ``--py-spy`` it samples the server process instead (py-spy, installed with the peers;
attaching needs root or ptrace rights) while wrk drives it at 16 connections, and prints the
share of the process's samples in each group of frames (:data:`GROUPS`: the innermost
frame that belongs to a group names it; the event loop's own frames count as the loop), and
those shares of the CPU per request measured over the same window. py-spy samples the
stack of a thread that is running *or runnable*: on a loaded machine a process woken from
epoll, or preempted by the peer its send woke, is counted where it stands — the shares are
of wall-clock samples, not of CPU (the sends most of all); the raw stacks are left in
bench/results/py-spy-MODE-PARSER.txt;
``--http httptools`` runs uvicorn with that parser.

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
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from http_bench import wrk
from measure import BENCH, BenchError, ServerCPU, Worker, fresh_database, python_for, scalar
from roundtrips import COMMITS, round_trips

SCRIPT = str(BENCH / "http_key.lua")
#: where the py-spy pass leaves its raw stacks (py-spy-MODE-PARSER.txt), for a flame graph
RESULTS = BENCH / "results"


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
    if mode in ("po", "hand", "replay"):
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


#: the innermost frames that are a socket send (the line calling into the kernel: libpq's
#: send of a statement, asyncio's write of an HTTP answer): their own group, whoever called
SENDS = ("_SelectorSocketTransport.write ", "_execute_send ", "_send_query_prepared ",
         "_send_prepare ", "sock_sendall ")  # fmt: skip
#: the innermost frame of a process waiting in epoll: not CPU, left out of the shares
WAITING = "select (selectors.py"
#: frame groups of the py-spy pass, matched in order against a frame's file: the innermost
#: frame of a sample that matches one names the group (standard-library frames such as
#: json or uuid count for the caller that matched)
GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("jobfence: idempotency middleware", ("jobfence/http/",)),
    ("jobfence: tracing, database layer, outbox", ("jobfence/",)),
    ("the route (purchase-order service, hand-written code)",
     ("jobfence_examples/", "http_handwritten")),
    ("pydantic", ("pydantic/", "pydantic_core/")),
    ("psycopg (+ pool): binding, results", ("psycopg/", "psycopg_pool/", "psycopg_binary/")),
    ("FastAPI / starlette", ("fastapi/", "starlette/", "opentelemetry/")),
    ("uvicorn / h11 / httptools", ("uvicorn/", "h11/", "httptools/")),
    ("the event loop (asyncio: tasks, futures, callbacks)", ("asyncio/", "selectors.py")),
)  # fmt: skip
SEND_GROUP = "socket sends (into the kernel, waking the peer)"


def frame_group(stack: list[str]) -> str:
    """The group of one sampled stack (outermost frame first, py-spy's raw format)."""
    if stack and any(send in stack[-1] for send in SENDS):
        return SEND_GROUP
    for frame in reversed(stack):
        for name, needles in GROUPS:
            if any(needle in frame for needle in needles):
                return name
    return "other (interpreter, standard library outside a group)"


def summarise(raw: str) -> tuple[dict[str, float], float]:
    """Shares (%) of the sampled stacks by :func:`frame_group`, from py-spy's ``raw``
    (collapsed stacks: ``frame;frame;… count``) output, without the samples waiting in
    epoll; and the share (%) of those among all samples."""
    counts: dict[str, int] = {}
    waiting = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        if WAITING in frames[-1]:
            waiting += int(count)
            continue
        group = frame_group(frames)
        counts[group] = counts.get(group, 0) + int(count)
    busy = sum(counts.values()) or 1
    shares = {k: v / busy * 100 for k, v in sorted(counts.items(), key=lambda kv: -kv[1])}
    return shares, waiting / max(1, busy + waiting) * 100


def pyspy_pass(mode: str, seconds: float, http: str = "h11") -> dict[str, Any]:
    """py-spy on the server process under wrk at 16 connections: the shares of its busy
    samples by frame group, and its CPU per request over the same window."""
    py_spy = shutil.which("py-spy") or str(Path(python_for("peers")).parent / "py-spy")
    if not Path(py_spy).exists():
        raise BenchError("py-spy is needed: pip install py-spy")
    with fresh_database() as url, tempfile.TemporaryDirectory() as tmp:
        args = [] if mode == "bare" else [url]
        script = str(BENCH / "systems" / "http_server.py")
        served = "po" if mode == "replay" else mode
        server = Worker([python_for("jobfence"), script, served, *args], env={"BENCH_HTTP": http})
        try:
            ready = server.wait_ready()
            target, env = _target(mode, ready)
            if mode == "replay":
                env["BENCH_REPLAY_KEYS"] = "50"
                for _ in range(10):  # one connection stores the keys
                    wrk(target, 1, script=SCRIPT, env=env, connections=1)
            wrk(target, 1, script=SCRIPT, env=env)  # warm up (pool, caches, plans)
            raw = Path(tmp) / "raw.txt"
            spy = subprocess.Popen(
                [py_spy, "record", "--format", "raw", "--rate", "250", "--duration",
                 str(int(seconds)), "--pid", str(server.proc.pid), "--output", str(raw)],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
            cpu = server.ps.cpu_times()
            result = wrk(target, seconds + 1, script=SCRIPT, env=env)
            after = server.ps.cpu_times()
            _, err = spy.communicate(timeout=seconds + 60)
            if spy.returncode:
                raise BenchError(f"py-spy failed: {err}")
            text = raw.read_text()
            RESULTS.mkdir(exist_ok=True)
            (RESULTS / f"py-spy-{mode}-{http}.txt").write_text(text)
        finally:
            server.stop()
    n = max(1, result["requests"])
    cpu_ms = (after.user + after.system - cpu.user - cpu.system) / n * 1000
    shares, waiting = summarise(text)
    return {
        "req/s": round(result["rps"]),
        "p99 ms": result["p99"],
        "server CPU ms/req": round(cpu_ms, 3),
        "samples": sum(int(line.rpartition(" ")[2]) for line in text.splitlines() if line),
        "waiting in epoll, % of samples (left out)": round(waiting, 1),
        "shares %": {k: round(v, 1) for k, v in shares.items()},
        "ms/req": {k: round(v / 100 * cpu_ms, 3) for k, v in shares.items()},
    }


def main(seconds: float) -> None:
    for mode in ("bare", "middleware", "po"):
        got = timed_pass(mode, seconds)
        if mode != "bare":
            got.update(strace_pass(mode, seconds))
        print(mode, json.dumps({k: round(v, 3) for k, v in got.items()}), flush=True)


if __name__ == "__main__":
    import sys

    argv = sys.argv[1:]
    http = "h11"
    if "--http" in argv:
        at = argv.index("--http")
        http = argv[at + 1]
        del argv[at : at + 2]
    if argv and argv[0] == "--py-spy":
        secs = float(argv[1]) if len(argv) > 1 else 10.0
        for mode in argv[2:] or ["po"]:
            print(mode, http, json.dumps(pyspy_pass(mode, secs, http), indent=1), flush=True)
    else:
        main(float(argv[0]) if argv else 5.0)
