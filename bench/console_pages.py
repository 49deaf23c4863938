"""The operators' console at scale: server time of its list pages, and its page weight.

    python bench/console_pages.py [--letters 100000] [--jobs 1000000] [--runs 15]

A fresh PostgreSQL database gets ``--letters`` dead letters (10 queues, 4 categories, every
tenth one of partner "acme") and ``--jobs`` waiting jobs (10 queues, one in a thousand
retrying), seeded with ``generate_series``. The ops server (API + console) runs in this process
on a free loopback port; a client signs in like a browser and fetches each page ``--runs``
times. Reported: the median and the worst time from request to the last byte over loopback
(server time plus a loopback round trip), for the first page and a deep page (a cursor near
the far end: keyset pages cost what the first does), with and without filters; then the
weight of what a browser downloads (HTML of each page, CSS, JavaScript), raw and gzipped.
The ops API's twins of the list pages (``/v1/dead-letters``, ``/v1/jobs``) are timed the same
way. "server ms" is measured inside the server (an ASGI wrapper around the app: from the
request's arrival to its last body byte), "round trip ms" by the client; "× baseline" divides
the server median by that of ``/healthz`` (one ``SELECT now()`` through the same stack) timed
in the same run, so that a busy machine shifts both. The load average is printed before and
after: on a shared 2-core machine the absolute figures are noisy, the ratios less so.
Prints tables; nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import os
import socket
import statistics
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
import uvicorn
from rich.console import Console
from rich.table import Table

from jobfence import App
from jobfence.config import parse_database_url
from jobfence.db import connect
from jobfence.ops.app import create_app
from jobfence.ops.auth import create_token
from jobfence.store import Store

ADMIN = os.environ.get("JOBFENCE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
STATIC = Path(__file__).resolve().parents[1] / "src" / "jobfence" / "ops" / "ui" / "static"

SEED_LETTERS = """
INSERT INTO core.dead_letters (queue, consumer, job_id, correlation_id, payload, payload_size,
    attempts, error_category, error_code, last_error, history, partner, failed_at)
SELECT 'queue-' || (g %% 10), 'queue-' || (g %% 10), 'letter-' || g, 'corr-' || g,
       convert_to('{"n": ' || g || '}', 'UTF8'), length('{"n": ' || g || '}'), 6,
       (ARRAY['TEMPORARY_ERROR', 'VALIDATION_ERROR', 'INTEGRATION_ERROR',
              'TECHNICAL_ERROR'])[1 + g %% 4],
       'E' || (g %% 4), 'upstream answered ' || (500 + g %% 7) || ' for order ' || g, '[]',
       CASE WHEN g %% 10 = 0 THEN 'acme' END,
       now() - (%(n)s - g) * interval '1 second'
FROM generate_series(1, %(n)s) AS g
"""
SEED_JOBS = """
INSERT INTO core.jobs (queue, job_id, correlation_id, payload, attempts, run_at, history)
SELECT 'queue-' || (g %% 10), 'job-' || g, 'corr-' || g,
       convert_to('{"n": ' || g || '}', 'UTF8'),
       CASE WHEN g %% 1000 = 0 THEN 1 ELSE 0 END,
       CASE WHEN g %% 1000 = 0 THEN now() + interval '1 hour' ELSE now() END,
       CASE WHEN g %% 1000 = 0 THEN jsonb_build_array(jsonb_build_object('attempt', 1,
         'at', '2026-01-01T00:00:00Z', 'category', 'TEMPORARY_ERROR', 'error', 'SMTP 451'))
       ELSE '[]' END
FROM generate_series(1, %(n)s) AS g
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def fresh_database() -> tuple[str, str]:
    name = f"jf_bench_console_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(ADMIN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')  # type: ignore[arg-type]
    return ADMIN.rsplit("/", 1)[0] + "/" + name, name


def drop_database(name: str) -> None:
    with psycopg.connect(ADMIN, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')  # type: ignore[arg-type]


def seed(url: str, letters: int, jobs: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        started = time.perf_counter()
        conn.execute(SEED_LETTERS, {"n": letters})  # type: ignore[arg-type]
        conn.execute(SEED_JOBS, {"n": jobs})  # type: ignore[arg-type]
        conn.execute("ANALYZE")
        print(f"seeded {letters} letters and {jobs} jobs in {time.perf_counter() - started:.1f}s")


class ServerTimer:
    """ASGI wrapper: the server time of each HTTP request (arrival → last body byte), in ms."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.last = 0.0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()

        async def timed_send(message: Any) -> None:
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                self.last = (time.perf_counter() - started) * 1000

        await self.app(scope, receive, timed_send)


@dataclass
class Timing:
    server: float  # median server ms
    server_max: float
    trip: float  # median round trip ms
    size: int  # bytes of the body


async def timed(client: httpx.AsyncClient, timer: ServerTimer, path: str, runs: int) -> Timing:
    await client.get(path)  # warm (plans, caches)
    server, trips = [], []
    size = 0
    for _ in range(runs):
        started = time.perf_counter()
        r = await client.get(path)
        trips.append((time.perf_counter() - started) * 1000)
        server.append(timer.last)
        if r.status_code != 200:
            raise SystemExit(f"{path}: {r.status_code} {r.text[:300]}")
        size = len(r.content)
    return Timing(statistics.median(server), max(server), statistics.median(trips), size)


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


async def main(args: argparse.Namespace) -> None:
    url, name = fresh_database()
    try:
        db = connect(parse_database_url(url))
        await db.open(max_size=1)
        await Store(db).migrate()
        await db.close()
        app = App(url)
        await app.open()
        seed(url, args.letters, args.jobs)
        operator = await create_token(app.db, name="bench", role="operator")
        acme = await create_token(app.db, name="bench-acme", role="viewer", partner="acme")
        port = free_port()
        timer = ServerTimer(create_app(jobfence_app=app))
        server = uvicorn.Server(
            uvicorn.Config(timer, host="127.0.0.1", port=port, log_level="warning")
        )
        task = asyncio.create_task(server.serve())
        for _ in range(600):
            if server.started:
                break
            await asyncio.sleep(0.05)
        base = f"http://127.0.0.1:{port}"
        deep_letter = max(args.letters // 50, 60)
        deep_job = args.jobs - max(args.jobs // 50, 60)
        pages = [
            ("overview", "/ui/"),
            ("dead letters, first page", "/ui/dead-letters"),
            ("dead letters, deep page", f"/ui/dead-letters?before={deep_letter}"),
            (
                "dead letters, queue + category",
                "/ui/dead-letters?queue=queue-3&category=TECHNICAL_ERROR",
            ),
            (
                "dead letters, queue + category, deep",
                f"/ui/dead-letters?queue=queue-3&category=TECHNICAL_ERROR&before={deep_letter}",
            ),
            ("dead letters, error text", "/ui/dead-letters?error=answered+503"),
            ("dead letters, job_id", f"/ui/dead-letters?job_id=letter-{args.letters // 2}"),
            ("dead letters, all statuses", "/ui/dead-letters?status=all"),
            ("jobs, first page", "/ui/jobs"),
            ("jobs, deep page", f"/ui/jobs?after={deep_job}"),
            ("jobs, queue", "/ui/jobs?queue=queue-7"),
            ("jobs, queue, deep", f"/ui/jobs?queue=queue-7&after={deep_job}"),
            ("jobs, retrying", "/ui/jobs?state=retrying"),
            ("jobs, job_id", f"/ui/jobs?job_id=job-{args.jobs // 2}"),
            ("jobs, error text", "/ui/jobs?error=smtp+451"),
            ("queues", "/ui/queues"),
            ("audit log", "/ui/audit"),
        ]
        api = [
            ("API: dead letters, first page", "/v1/dead-letters"),
            ("API: dead letters, deep page", f"/v1/dead-letters?before={deep_letter}"),
            (
                "API: dead letters, queue + category, deep",
                f"/v1/dead-letters?queue=queue-3&category=TECHNICAL_ERROR&before={deep_letter}",
            ),
            ("API: dead letters, error text", "/v1/dead-letters?error=answered+503"),
            ("API: jobs, first page", "/v1/jobs"),
            ("API: jobs, deep page", f"/v1/jobs?after={deep_job}"),
            ("API: jobs, queue, deep", f"/v1/jobs?queue=queue-7&after={deep_job}"),
            ("API: jobs, retrying", "/v1/jobs?state=retrying"),
            ("API: jobs, error text", "/v1/jobs?error=smtp+451"),
        ]
        sizes: dict[str, int] = {}
        console = Console(width=130)
        console.print(f"load average before: {load()} (2 cores, shared)")
        table = Table(
            title=f"console pages and API: {args.letters:,} dead letters, {args.jobs:,} "
            f"waiting jobs (PostgreSQL, {args.runs} runs each)"
        )
        for column in ("request", "server ms", "max", "× baseline", "round trip ms", "bytes"):
            table.add_column(column, justify="left" if column == "request" else "right")
        async with httpx.AsyncClient(
            base_url=base, headers={"Authorization": f"Bearer {operator}"}, timeout=120
        ) as bearer:
            base_ms = (await timed(bearer, timer, "/healthz", args.runs)).server

            def row(label: str, t: Timing) -> None:
                table.add_row(
                    label,
                    f"{t.server:.1f}",
                    f"{t.server_max:.1f}",
                    f"{t.server / base_ms:.1f}",
                    f"{t.trip:.1f}",
                    f"{t.size:,}",
                )

            table.add_row("baseline: /healthz (SELECT now())", f"{base_ms:.1f}", "", "1.0", "", "")
            for label, path in api:
                row(label, await timed(bearer, timer, path, args.runs))
        async with httpx.AsyncClient(
            base_url=base, headers={"Origin": base}, timeout=120
        ) as client:
            signed = await client.post("/ui/login", data={"token": operator})
            assert signed.status_code == 303, signed.text
            for label, path in pages:
                t = await timed(client, timer, path, args.runs)
                sizes[label] = t.size
                row(label, t)
            wire = await static_wire(client)
        async with httpx.AsyncClient(
            base_url=base, headers={"Origin": base}, timeout=120
        ) as client:
            await client.post("/ui/login", data={"token": acme})
            for label, path in (
                ("partner acme: overview", "/ui/"),
                ("partner acme: dead letters", "/ui/dead-letters"),
                ("partner acme: dead letters, deep", f"/ui/dead-letters?before={deep_letter}"),
                ("partner acme: jobs", "/ui/jobs"),
            ):
                row(label, await timed(client, timer, path, args.runs))
        console.print(table)
        console.print(f"load average after: {load()}")
        weight(console, sizes, wire)
        server.should_exit = True
        await task
        await app.close()
    finally:
        drop_database(name)


STATICS = {
    "console.css": "console.css",
    "console.js": "console.js",
    "htmx.min.js (vendored)": "vendor/htmx.min.js",
}


async def static_wire(client: httpx.AsyncClient) -> dict[str, int]:
    """Bytes the server sends for each static file to a browser accepting gzip."""
    wire = {}
    for label, path in STATICS.items():
        r = await client.get(f"/ui/static/{path}", headers={"Accept-Encoding": "gzip"})
        wire[label] = int(r.headers["content-length"])
    return wire


def weight(console: Console, sizes: dict[str, int], wire: dict[str, int]) -> None:
    """Bytes a browser downloads: the static files (cached after the first page) and HTML."""
    table = Table(title="page weight (bytes)")
    for column in ("what", "raw", "gzip", "sent by the server"):
        table.add_column(column, justify="left" if column == "what" else "right")
    total_raw = total_gz = total_wire = 0
    for label, path in STATICS.items():
        data = (STATIC / path).read_bytes()
        raw, gz = len(data), len(gzip.compress(data))
        total_raw, total_gz, total_wire = total_raw + raw, total_gz + gz, total_wire + wire[label]
        table.add_row(label, f"{raw:,}", f"{gz:,}", f"{wire[label]:,}")
    table.add_row("CSS + JS of every page", f"{total_raw:,}", f"{total_gz:,}", f"{total_wire:,}")
    for label in ("overview", "dead letters, first page", "jobs, first page"):
        table.add_row(f"HTML: {label}", f"{sizes[label]:,}", "", f"{sizes[label]:,} (not gzipped)")
    swagger = STATIC / "vendor" / "swagger-ui"
    data = (swagger / "swagger-ui-bundle.js").read_bytes() + (
        swagger / "swagger-ui.css"
    ).read_bytes()
    table.add_row(
        "Swagger UI page only (bundle + CSS)", f"{len(data):,}", f"{len(gzip.compress(data)):,}"
    )
    console.print(table)


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--letters", type=int, default=100_000)
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=15)
    return parser.parse_args()


if __name__ == "__main__":
    asyncio.run(main(parse()))
