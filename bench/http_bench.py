"""HTTP ingestion: wrk against the purchase-order API, the same keyed POST written by hand
(bench/systems/http_handwritten.py, issue 27), the bare idempotency middleware and a bare ASGI
app (the floor), each under uvicorn in its own process (bench/systems/http_server.py).

The keyed POST is held against the hand-written one at 16 and 64 connections; the replay of a
stored response (same key, same body) against a fresh POST; two server processes against one.

Every figure comes with its floor from the same run: the bare ASGI app's ``GET /healthz`` is
what uvicorn costs on this machine. A server whose one-connection keep-alive answer takes
more than a few ms (no TCP_NODELAY: ~40 ms per answer) stops the workload instead of
producing a floor that hides it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from typing import Any

import psycopg
from measure import BENCH, BenchError, Worker, fresh_database, python_for

CONNECTIONS = 16
#: a keep-alive answer on loopback slower than this means Nagle + delayed ACK (~40 ms)
NAGLE_MS = 20.0

BARE = "bare ASGI app under uvicorn: GET /healthz (floor)"
PO_HEALTHZ = "purchase-order API: GET /healthz (no database)"
PO_POST = "purchase-order API: POST /requests with Idempotency-Key"
PO_POST_64 = f"{PO_POST}, 64 connections"
PO_REPLAY = "purchase-order API: replay of a stored response (same key, same body)"
PO_POST_2P = f"{PO_POST}, 2 server processes"
HAND_POST = "hand-written (FastAPI + pydantic + psycopg pool): POST /requests, same work"
HAND_POST_64 = f"{HAND_POST}, 64 connections"
MW_POST = "IdempotencyMiddleware + trivial app: POST with Idempotency-Key"
MW_COMMIT_POST = "IdempotencyMiddleware(claim_at_commit=True) + trivial app: keyed POST"
BARE_POST = "bare ASGI app: POST (no middleware)"
#: uvicorn's httptools parser (``uvicorn[standard]``) instead of h11, the same servers
HTTPTOOLS = ", httptools parser"
BARE_HT = f"bare ASGI app under uvicorn{HTTPTOOLS}: GET /healthz"
PO_POST_HT = f"{PO_POST}{HTTPTOOLS}"
PO_REPLAY_HT = f"{PO_REPLAY}{HTTPTOOLS}"
#: each figure's baseline in the table: its floor, or what it is held against, in the same run
HTTP_BASELINES = {
    BARE_POST: BARE,
    PO_HEALTHZ: BARE,
    PO_POST: HAND_POST,
    PO_POST_64: HAND_POST_64,
    PO_REPLAY: PO_POST,
    PO_POST_2P: PO_POST,
    MW_POST: BARE_POST,
    MW_COMMIT_POST: BARE_POST,
    BARE_HT: BARE,
    PO_POST_HT: PO_POST,
    PO_REPLAY_HT: PO_REPLAY,
}
#: stored keys the replay run cycles through (stored first by one connection)
REPLAY_KEYS = 50


def _ms(text: str) -> float:
    value, unit = re.fullmatch(r"([\d.]+)(us|ms|s)", text).groups()  # type: ignore[union-attr]
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


def wrk(
    url: str,
    seconds: float,
    script: str | None = None,
    env: dict[str, str] | None = None,
    connections: int = CONNECTIONS,
) -> dict[str, Any]:
    if shutil.which("wrk") is None:
        raise BenchError("the HTTP workload needs wrk: apt-get install -y wrk")
    threads = min(2, connections)
    # a 30 s timeout: on a loaded machine a slow answer is a latency (in the p99), not an error
    cmd = ["wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds:.0f}s", "--timeout", "30s"]
    cmd += ["--latency", url]
    if script:
        cmd[1:1] = ["-s", script]
    out = subprocess.run(
        cmd, capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=seconds + 60
    ).stdout
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    p50 = re.search(r"\s50%\s+([\d.]+(?:us|ms|s))", out)
    p99 = re.search(r"\s99%\s+([\d.]+(?:us|ms|s))", out)
    total = re.search(r"(\d+) requests in", out)
    if not (rps and p50 and p99 and total):
        raise BenchError(f"could not read wrk's output:\n{out}")
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = re.search(r"Socket errors: (.*)", out)
    return {
        "rps": float(rps.group(1)),
        "p50": _ms(p50.group(1)),
        "p99": _ms(p99.group(1)),
        "requests": int(total.group(1)),
        "non_2xx": int(bad.group(1)) if bad else 0,
        "socket_errors": errors.group(1) if errors else "",
    }


def _cpu(server: Worker) -> float:
    """CPU seconds of the server process and the ones it forked (BENCH_HTTP_PROCESSES)."""
    total = 0.0
    for ps in [server.ps, *server.ps.children(recursive=True)]:
        times = ps.cpu_times()
        total += times.user + times.system
    return total


def _measured(server: Worker, url: str, seconds: float, **kw: Any) -> dict[str, Any]:
    """wrk against ``url``, with the server processes' CPU per request over the run."""
    before = _cpu(server)
    result = wrk(url, seconds, **kw)
    cpu = _cpu(server) - before
    result["cpu_ms_per_request"] = cpu / max(1, result["requests"]) * 1000
    return result


def _rows(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM purchase_orders.requests").fetchone()
    return int(row[0]) if row else 0


def _replay_keys(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM core.idempotency_keys WHERE key LIKE 'replay-%%' "
            "AND state = 'completed'"
        ).fetchone()
    return int(row[0]) if row else 0


def _check_rows(name: str, url: str, accepted: int, slack: int) -> None:
    """Every accepted POST left its request row (a few more: answers wrk did not count)."""
    rows = _rows(url)
    if not accepted <= rows <= accepted + slack:
        raise BenchError(f"HTTP {name}: {accepted} accepted but {rows} request rows")


def _keepalive_check(name: str, url: str) -> float:
    """One connection, one request at a time: the answer's p50 must be a few ms."""
    r = wrk(url, 2, connections=1)
    if r["p50"] > NAGLE_MS:
        raise BenchError(
            f"HTTP {name}: a keep-alive answer takes {r['p50']:.1f} ms on one connection — "
            "the server's socket has no TCP_NODELAY (open it with jobfence.http."
            "tcp_listen_socket, not socket.socket())"
        )
    return float(r["p50"])


def has_httptools() -> bool:
    """Whether the servers' interpreter has uvicorn's httptools parser (``uvicorn[standard]``)."""
    probe = subprocess.run([python_for("jobfence"), "-c", "import httptools"], capture_output=True)
    return probe.returncode == 0


def _start(
    mode: str, *args: str, processes: int = 1, http: str = "h11"
) -> tuple[Worker, dict[str, Any]]:
    script = str(BENCH / "systems" / "http_server.py")
    env = {"BENCH_HTTP_PROCESSES": str(processes), "BENCH_HTTP": http}
    server = Worker([python_for("jobfence"), script, mode, *args], env=env)
    try:
        return server, server.wait_ready()
    except BaseException:
        server.stop()
        raise


def http_ingestion(seconds: float, httptools: bool | None = None) -> dict[str, dict[str, Any]]:
    """Requests/s, p50/p99 and server CPU per request of: the bare ASGI app (the floor), the
    purchase-order API's GET /healthz and its POST /requests (a new Idempotency-Key each),
    and the bare middleware in front of a trivial app. Verifies: no error response, one
    request row per accepted POST, one stored key per middleware POST. With ``httptools``
    (default: when the servers' interpreter has it) the bare app, the keyed POST and its
    replay again under uvicorn's httptools parser."""
    if httptools is None:
        httptools = has_httptools()
    script = str(BENCH / "http_key.lua")
    out: dict[str, dict[str, Any]] = {}
    server, ready = _start("bare")
    try:
        base = f"http://127.0.0.1:{ready['port']}"
        _keepalive_check("bare ASGI app", f"{base}/healthz")
        out[BARE] = _measured(server, f"{base}/healthz", seconds)
        out[BARE_POST] = _measured(
            server, f"{base}/post", seconds, script=script, env={"BENCH_PATH": "/post"}
        )
    finally:
        server.stop()
    if httptools:
        server, ready = _start("bare", http="httptools")
        try:
            base = f"http://127.0.0.1:{ready['port']}"
            _keepalive_check("bare ASGI app (httptools)", f"{base}/healthz")
            out[BARE_HT] = _measured(server, f"{base}/healthz", seconds)
        finally:
            server.stop()
    with fresh_database() as url:
        server, ready = _start("po", url)
        try:
            base = f"http://127.0.0.1:{ready['port']}"
            one = _keepalive_check("purchase-order API", f"{base}/healthz")
            out[PO_HEALTHZ] = _measured(server, f"{base}/healthz", seconds)
            out[PO_HEALTHZ]["keepalive_p50"] = one
            env = {"BENCH_PO_TOKEN": ready["token"], "BENCH_PATH": "/requests"}
            out[PO_POST] = _measured(server, f"{base}/requests", seconds, script=script, env=env)
            out[PO_POST_64] = _measured(
                server, f"{base}/requests", seconds, script=script, env=env, connections=64
            )
            accepted = out[PO_POST]["requests"] + out[PO_POST_64]["requests"]
            _check_rows("POST", url, accepted, CONNECTIONS + 64)
            replay = {**env, "BENCH_REPLAY_KEYS": str(REPLAY_KEYS)}
            for _ in range(30):  # one connection stores each key once
                wrk(f"{base}/requests", 1, script=script, env=replay, connections=1)
                if _replay_keys(url) == REPLAY_KEYS:
                    break
            stored = _rows(url)
            out[PO_REPLAY] = _measured(
                server, f"{base}/requests", seconds, script=script, env=replay
            )
            if _rows(url) != stored:
                raise BenchError("HTTP replay: a replayed POST wrote a request row")
        finally:
            server.stop()
        if httptools:  # the same database: its replay keys are stored
            server, ready = _start("po", url, http="httptools")
            try:
                base = f"http://127.0.0.1:{ready['port']}"
                # the partner re-keyed by this server's setup: the same partner, keys and scope;
                # the replay first (the fresh POSTs' last commits would land in its count)
                env = {"BENCH_PO_TOKEN": ready["token"], "BENCH_PATH": "/requests"}
                stored = _rows(url)
                out[PO_REPLAY_HT] = _measured(
                    server,
                    f"{base}/requests",
                    seconds,
                    script=script,
                    env={**env, "BENCH_REPLAY_KEYS": str(REPLAY_KEYS)},
                )
                if _rows(url) != stored:
                    raise BenchError("HTTP replay (httptools): a replayed POST wrote a row")
                out[PO_POST_HT] = _measured(
                    server, f"{base}/requests", seconds, script=script, env=env
                )
            finally:
                server.stop()
            _check_rows("POST (httptools)", url, stored + out[PO_POST_HT]["requests"], CONNECTIONS)
    with fresh_database() as url:
        server, ready = _start("po", url, processes=2)
        try:
            base = f"http://127.0.0.1:{ready['port']}"
            env = {"BENCH_PO_TOKEN": ready["token"], "BENCH_PATH": "/requests"}
            out[PO_POST_2P] = _measured(server, f"{base}/requests", seconds, script=script, env=env)
        finally:
            server.stop()
        _check_rows("POST, 2 processes", url, out[PO_POST_2P]["requests"], CONNECTIONS)
    with fresh_database() as url:
        server, ready = _start("hand", url)
        try:
            base = f"http://127.0.0.1:{ready['port']}"
            env = {"BENCH_PO_TOKEN": ready["token"], "BENCH_PATH": "/requests"}
            out[HAND_POST] = _measured(server, f"{base}/requests", seconds, script=script, env=env)
            out[HAND_POST_64] = _measured(
                server, f"{base}/requests", seconds, script=script, env=env, connections=64
            )
        finally:
            server.stop()
        accepted = out[HAND_POST]["requests"] + out[HAND_POST_64]["requests"]
        _check_rows("hand-written POST", url, accepted, CONNECTIONS + 64)
    for mode, label in (("middleware", MW_POST), ("middleware-commit", MW_COMMIT_POST)):
        with fresh_database() as url:
            server, ready = _start(mode, url)
            try:
                base = f"http://127.0.0.1:{ready['port']}"
                out[label] = _measured(
                    server, f"{base}/post", seconds, script=script, env={"BENCH_PATH": "/post"}
                )
            finally:
                server.stop()
            with psycopg.connect(url, autocommit=True) as conn:
                row = conn.execute(
                    "SELECT count(*) FROM core.idempotency_keys WHERE state = 'completed'"
                ).fetchone()
            keys = int(row[0]) if row else 0
            accepted = out[label]["requests"]
            if not accepted <= keys <= accepted + CONNECTIONS:
                raise BenchError(f"HTTP {mode}: {accepted} accepted but {keys} stored keys")
    for name, r in out.items():
        if r["non_2xx"] or r["socket_errors"]:
            raise BenchError(
                f"HTTP {name}: {r['non_2xx']} error responses, socket errors {r['socket_errors']!r}"
            )
    return out


if __name__ == "__main__":
    import sys

    print(json.dumps(http_ingestion(float(sys.argv[1]) if len(sys.argv) > 1 else 3.0), indent=1))


#: the verdict of a target whose figures this run did not measure (--only, no httptools)
NOT_MEASURED = "not measured in this run"


def issue27_targets(results: Any, verdict: Any) -> list[tuple[str, str, str]]:
    """Issue 27 §1: the keyed POST against the same work written by hand, at 16 and 64
    connections; the replay of a stored response; two server processes; the middleware's
    own CPU. Each against its baseline from the same run; every target has a row, "not
    measured" when this run has no figure for it. Then uvicorn's httptools parser against
    h11 (information: what a user gets from ``uvicorn[standard]``)."""
    out: list[tuple[str, str, str]] = []
    if not any(w.startswith("HTTP") for w, _ in results.rows):
        return out  # the HTTP workload did not run

    def median(workload: str, label: str) -> float | None:
        row = results.get(workload, label)
        return float(row.median) if row is not None and row.values else None

    def ratio(workload: str, a: str, b: str) -> float | None:
        x, y = median(workload, a), median(workload, b)
        return x / y if x is not None and y else None

    rps, cpu, p99 = "HTTP requests/s", "HTTP server CPU", "HTTP p99"
    checks = [
        (rps, PO_POST, HAND_POST, "keyed POST ≥ 1.2× the hand-written one's requests/s", 1.2, True),
        (cpu, PO_POST, HAND_POST, "keyed POST ≤ 0.8× the hand-written one's CPU/req", 0.8, False),
        (rps, PO_REPLAY, PO_POST, "replay of a stored response ≥ 3× a fresh POST", 3.0, True),
        (rps, PO_REPLAY_HT, PO_POST_HT,
         "replay of a stored response ≥ 3× a fresh POST (httptools parser)", 3.0, True),
        (rps, PO_POST_2P, PO_POST, "two server processes ≥ 1.6× one", 1.6, True),
        (cpu, MW_COMMIT_POST, BARE_POST, "middleware, claim_at_commit ≤ +25 % CPU", 1.25, False),
        (cpu, MW_POST, BARE_POST, "middleware, default mode ≤ +25 % CPU", 1.25, False),
    ]  # fmt: skip
    for workload, a, b, target, limit, higher in checks:
        x = ratio(workload, a, b)
        if x is None:
            out.append((f"HTTP: {target}", "—", NOT_MEASURED))
            continue
        ok = x >= limit if higher else x <= limit
        out.append((f"HTTP: {target}", f"{x:.2f}×", verdict(ok)))
    for label, conns in ((PO_POST, 16), (PO_POST_64, 64)):
        value = median(p99, label)
        target = f"HTTP: keyed POST p99 < 50 ms at {conns} connections"
        if value is None:
            out.append((target, "—", NOT_MEASURED))
        else:
            out.append((target, f"{value:.1f} ms", verdict(value < 50)))
    for label, h11 in ((BARE_HT, BARE), (PO_POST_HT, PO_POST), (PO_REPLAY_HT, PO_REPLAY)):
        x, c = ratio(rps, label, h11), ratio(cpu, label, h11)
        if x is not None and c is not None:
            what = h11.split(":", 1)[1].strip() if ":" in h11 else h11
            out.append(
                (
                    f"HTTP: httptools parser / h11, {what}",
                    f"{x:.2f}× req/s, {c:.2f}× CPU/req",
                    "info: the httptools parser",
                )
            )
    return out
