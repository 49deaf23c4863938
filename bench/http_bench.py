"""HTTP ingestion: wrk against the purchase-order API (see bench/systems/http_server.py)."""

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


def _ms(text: str) -> float:
    value, unit = re.fullmatch(r"([\d.]+)(us|ms|s)", text).groups()  # type: ignore[union-attr]
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


def wrk(
    url: str, seconds: float, script: str | None = None, env: dict[str, str] | None = None
) -> dict[str, Any]:
    if shutil.which("wrk") is None:
        raise BenchError("the HTTP workload needs wrk: apt-get install -y wrk")
    cmd = ["wrk", "-t2", f"-c{CONNECTIONS}", f"-d{seconds:.0f}s", "--latency", url]
    if script:
        cmd[1:1] = ["-s", script]
    out = subprocess.run(
        cmd, capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=seconds + 60
    ).stdout
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    p99 = re.search(r"\s99%\s+([\d.]+(?:us|ms|s))", out)
    total = re.search(r"(\d+) requests in", out)
    if not (rps and p99 and total):
        raise BenchError(f"could not read wrk's output:\n{out}")
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = re.search(r"Socket errors: (.*)", out)
    return {
        "rps": float(rps.group(1)),
        "p99": _ms(p99.group(1)),
        "requests": int(total.group(1)),
        "non_2xx": int(bad.group(1)) if bad else 0,
        "socket_errors": errors.group(1) if errors else "",
    }


def http_ingestion(seconds: float) -> dict[str, dict[str, Any]]:
    """Requests/s and p99 of POST /requests (a new Idempotency-Key each), next to GET
    /healthz of the same server (the framework's floor, no database). Verifies: no error
    response, and one request row per accepted POST."""
    with fresh_database() as url:
        server = Worker([python_for("jobfence"), str(BENCH / "systems" / "http_server.py"), url])
        try:
            ready = server.wait_ready()
            base = f"http://127.0.0.1:{ready['port']}"
            floor = wrk(f"{base}/healthz", seconds)
            post = wrk(
                f"{base}/requests",
                seconds,
                str(BENCH / "http_po.lua"),
                env={"BENCH_PO_TOKEN": ready["token"]},
            )
        finally:
            server.stop()
        for name, r in (("healthz", floor), ("POST", post)):
            if r["non_2xx"] or r["socket_errors"]:
                raise BenchError(
                    f"HTTP {name}: {r['non_2xx']} error responses, "
                    f"socket errors {r['socket_errors']!r}"
                )
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute("SELECT count(*) FROM purchase_orders.requests").fetchone()
        rows = int(row[0]) if row else 0
        if not post["requests"] <= rows <= post["requests"] + CONNECTIONS:
            raise BenchError(f"HTTP POST: {post['requests']} accepted but {rows} request rows")
    return {
        "baseline: GET /healthz (no database)": floor,
        "POST /requests with Idempotency-Key": post,
    }


if __name__ == "__main__":
    print(json.dumps(http_ingestion(3.0), indent=1))
