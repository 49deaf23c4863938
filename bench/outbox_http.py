"""Outbox relay throughput and the cost of HTTP idempotency keys, each with a baseline from
the same run.

    python bench/outbox_http.py [--events 20000] [--posts 2000] [--admin-url postgresql://…]

1. Relay: N outbox events (written 500 per transaction) drained by 1 and by 4 relays into the
   PostgreSQL database queue; baseline: the same N jobs enqueued directly (enqueue_many, 500
   per transaction). Prints events/s and the ratio to the baseline.
2. HTTP: POST /orders to a uvicorn server (its own process) with IdempotencyMiddleware, a new
   key per request; baseline: the same app without the middleware. 32 requests in flight.

Every figure comes with what was verified (events published once, rows written once).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psycopg
from psycopg import sql
from rich.console import Console
from rich.table import Table

from jobfence import App, outbox
from jobfence.config import parse_database_url
from jobfence.db import connect
from jobfence.outbox.relay import Relay, RelayObserver
from jobfence.store import Store

ADMIN = os.environ.get("JOBFENCE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


@contextmanager
def fresh_database(admin: str) -> Iterator[str]:
    name = f"jf_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield admin.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


async def migrate(url: str) -> None:
    db = connect(parse_database_url(url))
    await db.open(max_size=1)
    try:
        await Store(db).migrate()
    finally:
        await db.close()


async def bench_direct(url: str, n: int) -> float:
    app = App(url)
    async with app:
        started = time.perf_counter()
        for start in range(0, n, 500):
            jobs = [app.job("bench", {"n": i}) for i in range(start, min(n, start + 500))]
            await app.enqueue_many(jobs)
        elapsed = time.perf_counter() - started
        rows = await app.db.run("queue_depth")
    assert sum(int(r["jobs"]) for r in rows) == n
    return n / elapsed


class Countdown(RelayObserver):
    """Sets ``finished`` once ``n`` events went out (published, about to be marked)."""

    def __init__(self, n: int) -> None:
        self.left = n
        self.finished = asyncio.Event()

    async def published(self, events: Any) -> None:
        self.left -= len(events)
        if self.left <= 0:
            self.finished.set()


async def bench_relay(url: str, n: int, relays: int) -> float:
    app = App(url)
    async with app:
        for start in range(0, n, 500):
            async with app.db.transaction() as tx:
                for i in range(start, min(n, start + 500)):
                    await outbox.write(tx, "bench", {"n": i})
        done = Countdown(n)
        running = [
            Relay(app, batch_size=500, poll_interval=0.05, observers=[done]) for _ in range(relays)
        ]
        started = time.perf_counter()
        for relay in running:
            relay.start()
        await asyncio.wait_for(done.finished.wait(), timeout=600)
        elapsed = time.perf_counter() - started
        for relay in running:
            await relay.stop()
        rows = await app.db.run("queue_depth")
        counts = await outbox.counts(app.db)
    assert sum(int(r["jobs"]) for r in rows) == n, "every event published exactly once"
    assert counts["PUBLISHED"] == n
    return n / elapsed


SERVER = textwrap.dedent(
    """
    import asyncio, socket, sys
    import uvicorn
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse
    from jobfence.config import parse_database_url
    from jobfence.db import connect
    from jobfence.http import IdempotencyMiddleware

    url, with_keys = sys.argv[1], sys.argv[2] == "1"
    db = connect(parse_database_url(url))
    app = FastAPI()

    @app.post("/orders")
    async def create(request: Request):
        body = await request.body()
        async with db.transaction() as tx:
            row = await tx.fetchone(
                "INSERT INTO orders (body) VALUES (%s) RETURNING id", (body.decode(),))
        return JSONResponse({"order_id": row[0]}, status_code=201)

    if with_keys:
        app.add_middleware(IdempotencyMiddleware, database=lambda: db, partner=lambda r: "p")

    async def main():
        await db.open(max_size=20)
        async with db.transaction() as tx:
            await tx.execute("CREATE TABLE IF NOT EXISTS orders "
                             "(id bigint GENERATED ALWAYS AS IDENTITY, body text)")
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.bind(("127.0.0.1", 0))
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started:
            await asyncio.sleep(0.01)
        print(sock.getsockname()[1], flush=True)
        await task

    asyncio.run(main())
    """
)


def start_server(script: Path, url: str, with_keys: bool) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(script), url, "1" if with_keys else "0"],
        stdout=subprocess.PIPE,
        text=True,
    )


async def bench_http(url: str, n: int, with_keys: bool, script: Path) -> float:
    proc = start_server(script, url, with_keys)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        base = f"http://127.0.0.1:{port}"
        clients = [
            httpx.AsyncClient(base_url=base, limits=httpx.Limits(max_connections=4), timeout=120)
            for _ in range(8)
        ]
        gate = asyncio.Semaphore(32)
        statuses: list[int] = []

        async def post(i: int) -> None:
            async with gate:
                response = await clients[i % 8].post(
                    "/orders", json={"n": i}, headers={"Idempotency-Key": f"k-{i}"}
                )
                statuses.append(response.status_code)

        await asyncio.gather(*(post(i) for i in range(50)))  # warm-up
        statuses.clear()
        started = time.perf_counter()
        await asyncio.gather(*(post(i) for i in range(50, 50 + n)))
        elapsed = time.perf_counter() - started
        for client in clients:
            await client.aclose()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert statuses == [201] * n, "every POST answered 201"
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*), count(DISTINCT body) FROM orders").fetchone()
        conn.execute("TRUNCATE orders")
        if with_keys:
            keys = conn.execute("SELECT count(*) FROM core.idempotency_keys").fetchone()
            assert keys is not None
            assert keys[0] == n + 50, "one key per POST"
            conn.execute("TRUNCATE core.idempotency_keys")
    assert row is not None
    assert row[0] == row[1] == n + 50, "one row per POST"
    return n / elapsed


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--posts", type=int, default=2_000)
    parser.add_argument("--admin-url", default=ADMIN)
    args = parser.parse_args()
    console = Console()
    table = Table(title="outbox relay and HTTP idempotency (PostgreSQL, loopback)")
    for column in ("workload", "rate", "vs baseline", "verified"):
        table.add_column(column)
    with fresh_database(args.admin_url) as url:
        await migrate(url)
        direct = await bench_direct(url, args.events)
    with fresh_database(args.admin_url) as url:
        await migrate(url)
        one = await bench_relay(url, args.events, 1)
    with fresh_database(args.admin_url) as url:
        await migrate(url)
        four = await bench_relay(url, args.events, 4)
    table.add_row("enqueue_many directly (baseline)", f"{direct:,.0f} jobs/s", "1.00", "")
    table.add_row("1 relay", f"{one:,.0f} events/s", f"{one / direct:.2f}", "each once")
    table.add_row("4 relays", f"{four:,.0f} events/s", f"{four / direct:.2f}", "each once")
    script = Path(__file__).with_name(".outbox_http_server.py")
    script.write_text(SERVER)
    try:
        with fresh_database(args.admin_url) as url:
            await migrate(url)
            plain = await bench_http(url, args.posts, False, script)
            keyed = await bench_http(url, args.posts, True, script)
    finally:
        script.unlink()
    table.add_row("POST without keys (baseline)", f"{plain:,.0f} req/s", "1.00", "1 row each")
    table.add_row(
        "POST with Idempotency-Key",
        f"{keyed:,.0f} req/s",
        f"{keyed / plain:.2f}",
        "1 row + 1 key each",
    )
    console.print(table)


if __name__ == "__main__":
    asyncio.run(main())
