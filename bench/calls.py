"""The call ledger's cost per call (issue 25): a handler that makes one HTTP call to a local
stub, bare and as a recorded step (``job.call``), measured in the same run.

    .venv/bin/python bench/calls.py                      # 2 000 jobs, 3 timed runs per mode
    .venv/bin/python bench/calls.py --jobs 500 --repeat 1

Each run: a fresh PostgreSQL database on $JOBFENCE_BENCH_PG, N jobs enqueued, one worker
process (in-process worker, ``concurrency`` 8, the defaults otherwise: group commit) draining
them. Its handler POSTs to a stub (a separate process on loopback, keep-alive, answering 201
with a small JSON body) and INSERTs one effect row with the answer in the job's transaction:

- ``bare``: the POST as it is, with an idempotency key built by hand;
- ``bare, 1 job/tx``: the same, each job in a transaction of its own (``batch_size=1``) — what
  the ledger's consumers do: a consumer that calls out leaves group commit, since a call
  would hold a shared transaction open for a network round trip;
- ``ledger``: the same POST as ``await job.call("stub.create", send)`` — the intent
  committed before the request leaves, the outcome recorded after it.

Per job: the wall-clock rate; the worker's CPU; the server's CPU (the run database's backends,
read from /proc); commits (``pg_stat_database.xact_commit``); and the round trips to
PostgreSQL, from a separate run of the worker under ``strace`` (sends to the PostgreSQL port
that end in ``Sync`` or a simple ``Query``: what the client waits on — bench/roundtrips.py's
count, restricted to PostgreSQL's connections so the stub's HTTP is not counted). Timed runs
alternate the modes; medians, their spread, and each figure against ``bare``'s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from roundtrips import round_trips  # noqa: E402

PG = os.environ.get("JOBFENCE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
PG_PORT = int(re.search(r":(\d+)/", PG).group(1)) if re.search(r":(\d+)/", PG) else 5432  # type: ignore[union-attr]
MODES = ("bare", "bare, 1 job/tx", "ledger")
COMMITS = "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
TICKS = os.sysconf("SC_CLK_TCK")


# -- the stub ---------------------------------------------------------------------------------


async def _serve_stub() -> None:
    """Answer every request ``201 {"id": n}`` (keep-alive); print the port."""
    counter = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal counter
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                if length:
                    await reader.readexactly(length)
                counter += 1
                body = json.dumps({"id": f"S{counter}"}).encode()
                writer.write(
                    b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\n"
                    + f"Content-Length: {len(body)}\r\n\r\n".encode()
                    + body
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


@contextmanager
def stub() -> Iterator[str]:
    proc = subprocess.Popen([sys.executable, __file__, "stub"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        port = proc.stdout.readline().strip()
        yield f"http://127.0.0.1:{port}/orders"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


# -- one worker run (a subprocess) ------------------------------------------------------------


def _backend_cpu(conn: psycopg.Connection[Any], dbname: str) -> dict[int, float]:
    """CPU seconds of each backend serving ``dbname`` (but this connection), from /proc."""
    found: dict[int, float] = {}
    rows = conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
        (dbname,),
    ).fetchall()
    for (pid,) in rows:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        found[pid] = (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime
    return found


async def _work(mode: str, url: str, jobs: int, stub_url: str) -> dict[str, float]:
    import httpx

    from jobfence import App, Job, Tx

    app = App(url)
    http = httpx.AsyncClient(timeout=10, limits=httpx.Limits(max_keepalive_connections=16))

    @app.consumer("bench.calls")
    async def handle(job: Job[dict[str, Any]], tx: Tx) -> None:
        async def send(key: str) -> dict[str, Any]:
            answer = await http.post(
                stub_url, json={"job": job.job_id}, headers={"Idempotency-Key": key}
            )
            answer.raise_for_status()
            data: dict[str, Any] = answer.json()
            return data

        if mode == "ledger":
            result = await job.call("stub.create", send)
        else:
            result = await send(f"{job.job_id}:stub.create")
        await tx.execute(
            "INSERT INTO bench_effects (job_id, ref) VALUES (%s, %s)", (job.job_id, result["id"])
        )

    dbname = url.rsplit("/", 1)[1]
    with psycopg.connect(url, autocommit=True) as probe:
        async with app:
            batch = {"batch_size": 1} if mode == "bare, 1 job/tx" else {}
            worker = app.worker(concurrency=8, summary_interval=0, **batch)
            task = asyncio.create_task(worker.run())
            await asyncio.sleep(0.2)  # the pool's connections open
            base = _backend_cpu(probe, dbname)
            cpu, wall = time.process_time(), time.perf_counter()
            while worker.stats.handled < jobs:  # noqa: ASYNC110 - polls the worker's count
                await asyncio.sleep(0.01)
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            last = _backend_cpu(probe, dbname)
            worker.request_stop()
            await task
        await http.aclose()
    server = sum(v - base.get(pid, 0.0) for pid, v in last.items())
    return {"cpu": cpu, "wall": wall, "server_cpu": server}


# -- the orchestration ------------------------------------------------------------------------


@contextmanager
def fresh_database() -> Iterator[str]:
    name = f"jf_bench_calls_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")  # type: ignore[arg-type]
    try:
        yield PG.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with psycopg.connect(PG, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")  # type: ignore[arg-type]


async def _prepare(url: str, jobs: int) -> None:
    from jobfence import App

    async with App(url, auto_migrate=True) as app:
        async with app.db.transaction() as tx:
            await tx.execute("CREATE TABLE bench_effects (job_id text PRIMARY KEY, ref text)")
        for i in range(jobs):
            await app.enqueue("bench.calls", {"i": i}, job_id=f"j-{i}")


def _scalar(url: str, sql: str) -> Any:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(sql).fetchone()  # type: ignore[arg-type]
    return None if row is None else row[0]


def one_run(mode: str, jobs: int, stub_url: str, *, traced: bool) -> dict[str, float]:
    """Drain ``jobs`` in a worker subprocess (under strace when ``traced``); its figures."""
    with fresh_database() as url, tempfile.TemporaryDirectory() as tmp:
        asyncio.run(_prepare(url, jobs))
        time.sleep(1.0)  # the statistics of the enqueue settle
        before = int(_scalar(url, COMMITS))
        cmd = [sys.executable, __file__, "work", mode, url, str(jobs), stub_url]
        trace = Path(tmp) / "trace"
        if traced:
            strace = shutil.which("strace")
            if strace is None:
                raise SystemExit("strace is needed for the round trips: apt-get install -y strace")
            cmd = [strace, "-f", "-qq", "-xx", "-s", "1000000", "-e", "trace=connect,sendto",
                   "-o", str(trace), *cmd]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            raise SystemExit(f"the {mode} worker failed:\n{done.stderr[-3000:]}")
        result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
        time.sleep(1.0)
        result["commits"] = (int(_scalar(url, COMMITS)) - before) / jobs
        effects = int(_scalar(url, "SELECT count(DISTINCT job_id) FROM bench_effects"))
        if effects != jobs:
            raise SystemExit(f"{mode}: {effects} effects, not {jobs}")
        if mode == "ledger":
            calls = _scalar(url, "SELECT count(*) FROM core.calls WHERE state = 'succeeded'")
            if calls != jobs:
                raise SystemExit(f"ledger: {calls} succeeded calls recorded, not {jobs}")
        if traced:
            result["round_trips"] = round_trips(_postgres_only(trace.read_text())) / jobs
    return result


CONNECT = re.compile(r"^(?P<pid>\d+)\s+connect\((?P<fd>\d+), .*?sin6?_port=htons\((?P<port>\d+)\)")
SENDTO = re.compile(r"^(?P<pid>\d+)\s+sendto\((?P<fd>\d+),")


def _postgres_only(trace: str) -> str:
    """The trace's sends on connections to PostgreSQL's port (the stub's HTTP left out)."""
    ports: dict[tuple[str, str], int] = {}
    kept = []
    for line in trace.splitlines():
        m = CONNECT.match(line)
        if m is not None:
            ports[(m["pid"], m["fd"])] = int(m["port"])
            continue
        m = SENDTO.match(line)
        if m is not None and ports.get((m["pid"], m["fd"])) == PG_PORT:
            kept.append(line)
    return "\n".join(kept)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()}; {os.cpu_count()} CPUs")
    timed: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    counted: dict[str, dict[str, float]] = {}
    with stub() as stub_url:
        for _ in range(args.repeat):
            for mode in MODES:
                timed[mode].append(one_run(mode, args.jobs, stub_url, traced=False))
        for mode in MODES:
            counted[mode] = one_run(mode, args.jobs, stub_url, traced=True)
    print(f"load average after:  {os.getloadavg()}")
    print(
        f"\n{args.jobs} jobs x {args.repeat} timed runs per mode (+1 under strace), one POST "
        "to a local stub and one INSERT per job, concurrency 8, PostgreSQL queue"
    )

    def figure(mode: str, name: str, scale: float) -> tuple[float, float, float]:
        values = [r[name] * scale for r in timed[mode]]
        return statistics.median(values), min(values), max(values)

    rows = [
        ("jobs/s", lambda m: figure(m, "wall", 1.0), True),
        ("worker CPU µs/job", lambda m: figure(m, "cpu", 1e6 / args.jobs), False),
        ("server CPU µs/job", lambda m: figure(m, "server_cpu", 1e6 / args.jobs), False),
    ]
    head = "".join(f"{m:>22}" for m in MODES)
    print(f"{'figure':<28}{head}{'ledger / bare':>15}{'/ bare 1/tx':>13}")
    for label, get, is_rate in rows:
        cells, medians = [], []
        for mode in MODES:
            med, low, high = get(mode)
            if is_rate:  # wall seconds → jobs per second
                med, low, high = args.jobs / med, args.jobs / high, args.jobs / low
            medians.append(med)
            cells.append(f"{med:>9.0f} ({low:.0f}–{high:.0f})")
        print(
            f"{label:<28}"
            + "".join(f"{c:>22}" for c in cells)
            + f"{medians[2] / medians[0]:>15.2f}{medians[2] / medians[1]:>13.2f}"
        )
    for label, name, source in (
        ("commits / job", "commits", "timed"),
        ("PG round trips / job", "round_trips", "strace"),
    ):
        values = [
            statistics.median(r[name] for r in timed[m]) if source == "timed" else counted[m][name]
            for m in MODES
        ]
        print(
            f"{label:<28}"
            + "".join(f"{v:>22.2f}" for v in values)
            + f"{values[2] - values[0]:>+15.2f}{values[2] - values[1]:>+13.2f}"
        )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "stub":
        asyncio.run(_serve_stub())
    elif len(sys.argv) > 1 and sys.argv[1] == "work":
        mode, url, jobs, stub_url = sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
        print(json.dumps(asyncio.run(_work(mode, url, jobs, stub_url))))
    else:
        main()
