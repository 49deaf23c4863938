"""What the database gauges cost (docs/metrics.md), against the gauges before issue 17.

    python bench/gauges.py [--fences 1000000] [--published 500000] [--jobs 200000] [--runs 30]

A fresh PostgreSQL database gets ``--fences`` fence rows, ``--published`` published outbox
events (kept for the retention) plus 1 000 PENDING and 100 PUBLISH_FAILED_RETRY ones,
``--jobs`` waiting jobs over 10 queues (one in ten due in an hour) and 10 000 dead letters
(fences and letters seeded as bench/growth_tables.py does), then ANALYZE. Each variant runs
``--runs`` times after a warm-up, on one connection of this process; reported: median,
fastest and slowest wall time per refresh (client to PostgreSQL on loopback), the spread
(slowest / fastest: the machine's noise), and the ratio of medians against the baseline
measured in the same run:

- ``baseline``: the three queries the gauges ran before (pending letters, queue depth,
  undelivered alerts);
- ``refresh_gauges``: everything a worker now reads every ``gauges_interval``;
- ``naive``: what the new gauges would cost without partial indexes and the catalogue
  (``count(*)`` of the fence table, the outbox grouped over every row) — why they are
  written the way they are.

Then the per-job cost the worker gained, in CPU time per job against the per-job path it
already had (the processed counter and the handler histogram): nothing on the job path
itself; the health tick (heartbeat, readiness, jobs in flight) once a second, shown as its
share at 1 000 jobs/s. Prints tables; nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
import uuid

import psycopg
from growth_tables import seed_fences, seed_letters
from rich.console import Console
from rich.table import Table

from jobfence.config import parse_database_url
from jobfence.db import Database, connect
from jobfence.metrics import HANDLER_SECONDS, HEARTBEAT, PROCESSED, READY, WORKER_INFLIGHT
from jobfence.review.stats import refresh_gauges
from jobfence.runtime.health import Health
from jobfence.store import Store

ADMIN = os.environ.get("JOBFENCE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")

SEED = [
    """INSERT INTO core.outbox (event_id, queue, payload, state, published_at, created_at)
       SELECT 'ev-' || g, 'out-' || (g %% 5), '\\x7b7d', 'PUBLISHED', now(), now()
       FROM generate_series(1, %(published)s) AS g""",
    """INSERT INTO core.outbox (event_id, queue, payload, state, created_at)
       SELECT 'pend-' || g, 'out-' || (g %% 5), '\\x7b7d',
              CASE WHEN g <= 100 THEN 'PUBLISH_FAILED_RETRY' ELSE 'PENDING' END,
              now() - g * interval '1 second'
       FROM generate_series(1, 1100) AS g""",
    """INSERT INTO core.jobs (queue, job_id, payload, run_at)
       SELECT 'queue-' || (g %% 10), 'wait-' || g, '\\x7b7d',
              CASE WHEN g %% 10 = 0 THEN now() + interval '1 hour'
                   ELSE now() - g * interval '1 millisecond' END
       FROM generate_series(1, %(jobs)s) AS g""",
]  # and the fences and dead letters of bench/growth_tables.py
QUERIES = [
    "dl_pending_counts",
    "queue_depth",
    "gauge_queue_lag",
    "queue_pauses",
    "gauge_outbox_backlog",
    "gauge_fences",
    "alerts_undelivered",
]
NAIVE = [
    "SELECT count(*) FROM core.processed_jobs",
    "SELECT queue, state, count(*), min(created_at) FROM core.outbox GROUP BY queue, state",
    "SELECT queue, count(*), min(run_at) FROM core.jobs WHERE state = 'available' "
    "AND run_at <= now() GROUP BY queue",
]


async def baseline(db: Database) -> None:
    await db.run("dl_pending_counts")
    await db.run("queue_depth")
    await db.run("alerts_undelivered")


async def naive(db: Database) -> None:
    await baseline(db)
    async with db.transaction() as tx:
        for sql in NAIVE:
            await tx.execute(sql)  # type: ignore[arg-type]


async def timed(variant: str, db: Database, runs: int) -> list[float]:
    call = {
        "baseline": lambda: baseline(db),
        "refresh_gauges": lambda: refresh_gauges(db),
        "naive": lambda: naive(db),
    }[variant]
    await call()  # warm: plans, caches
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        await call()
        times.append((time.perf_counter() - started) * 1000)
    return times


def per_job_cpu(jobs: int, with_tick: bool) -> float:
    """CPU µs per job of the worker's per-job metric calls, plus (``with_tick``) the health
    tick's share: one heartbeat, readiness and in-flight update per second, spread over the
    jobs of that second at 1 000 jobs/s."""
    processed, histogram = PROCESSED.labels("bench", "bench"), HANDLER_SECONDS.labels("bench")
    health = Health("worker")
    started = time.process_time()
    for n in range(jobs):
        processed.inc()
        histogram.observe(0.002)
        if with_tick and n % 1000 == 0:
            HEARTBEAT.labels("worker").set_to_current_time()
            READY.labels("worker").set(1 if health.ready()[0] else 0)
            WORKER_INFLIGHT.inc(0)
    return (time.process_time() - started) / jobs * 1e6


async def main(args: argparse.Namespace) -> None:
    name = f"jf_bench_gauges_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(ADMIN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')  # type: ignore[arg-type]
    url = ADMIN.rsplit("/", 1)[0] + "/" + name
    console = Console()
    try:
        db = connect(parse_database_url(url))
        await db.open(max_size=2)
        await Store(db).migrate()
        started = time.perf_counter()
        with psycopg.connect(url, autocommit=True) as conn:
            seed_fences(conn, args.fences)
            seed_letters(conn, 10_000)
            for sql in SEED:
                conn.execute(sql, vars(args))  # type: ignore[arg-type]
            conn.execute("ANALYZE")
        console.print(
            f"seeded {args.fences} fences, {args.published} published outbox events, "
            f"{args.jobs} jobs in {time.perf_counter() - started:.1f}s"
        )
        results = {}
        for round_ in range(2):  # interleaved rounds, so drift hits every variant alike
            for variant in ("baseline", "refresh_gauges", "naive"):
                results.setdefault(variant, []).extend(await timed(variant, db, args.runs // 2))
            del round_
        base = statistics.median(results["baseline"])
        table = Table(title=f"one refresh of the database gauges ({args.runs} runs each)")
        for col in ("variant", "median ms", "fastest", "slowest", "spread", "× baseline"):
            table.add_column(col, justify="right" if col != "variant" else "left")
        for variant, times in results.items():
            med = statistics.median(times)
            table.add_row(
                variant,
                f"{med:.2f}",
                f"{min(times):.2f}",
                f"{max(times):.2f}",
                f"{max(times) / min(times):.1f}×",
                f"{med / base:.2f}",
            )
        console.print(table)
        table = Table(title="each query of refresh_gauges (median ms)")
        table.add_column("query")
        table.add_column("median ms", justify="right")
        table.add_column("fastest", justify="right")
        for query in QUERIES:
            times = []
            for _ in range(args.runs // 2):
                started = time.perf_counter()
                await db.run(query)
                times.append((time.perf_counter() - started) * 1000)
            table.add_row(query, f"{statistics.median(times):.2f}", f"{min(times):.2f}")
        console.print(table)
        await db.close()
    finally:
        with psycopg.connect(ADMIN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')  # type: ignore[arg-type]

    rows = {False: [], True: []}  # type: dict[bool, list[float]]
    for _ in range(5):
        for inflight in (False, True):
            rows[inflight].append(per_job_cpu(args.metric_jobs, inflight))
    table = Table(title=f"per-job metric CPU, µs ({args.metric_jobs} jobs × 5 interleaved runs)")
    for col in ("per-job path", "median µs", "fastest", "slowest", "× before"):
        table.add_column(col, justify="right" if col != "per-job path" else "left")
    before = statistics.median(rows[False])
    labels = ((False, "before (counter + histogram)"), (True, "+ the health tick's share"))
    for inflight, label in labels:
        times = rows[inflight]
        med = statistics.median(times)
        table.add_row(
            label, f"{med:.2f}", f"{min(times):.2f}", f"{max(times):.2f}", f"{med / before:.2f}"
        )
    console.print(table)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fences", type=int, default=1_000_000)
    parser.add_argument("--published", type=int, default=500_000)
    parser.add_argument("--jobs", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--metric-jobs", type=int, default=200_000)
    asyncio.run(main(parser.parse_args()))
