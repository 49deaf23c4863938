"""Periodic jobs (issue 26 §4): what one scheduler round costs with many schedules due.

    .venv/bin/python bench/periodic_bench.py                      # 100 and 1 000, both stores
    .venv/bin/python bench/periodic_bench.py --schedules 100 --rounds 5 --store postgresql
    .venv/bin/python bench/periodic_bench.py --catch-up 10000     # one schedule, missed="all"

Each mode runs on a fresh store (a PostgreSQL database on $JOBFENCE_BENCH_PG, dropped after;
a SQLite file in a temporary folder): an app declaring N schedules due every second
(``* * * * * *``) on the database queue, and one in-process scheduler. Before each round every
schedule's row is put at the second before the database clock's current one, so the round
finds exactly one tick due per schedule (N ticks), and the queue is emptied. The round is
:meth:`Scheduler.tick` of a scheduler that has read nothing yet; measured: its wall time and
this process' CPU time (the scheduler's side; the database server's is not counted), per
round and per tick. Every round checks that it enqueued at least N ticks (a round longer
than a second finds a second tick due on the schedules it reaches after the second turned).

``--catch-up T``: ``--catch-up-schedules`` (10) per-second ``missed="all"`` schedules whose
schedulers were down for T seconds (``MAX_CATCH_UP`` caps what each runs: 1 000, so 10 000
ticks from T = 1 000 on): the round's time, the ticks it enqueued, the transactions it took
and the most ticks one of them enqueued.

Prints one line per mode; the last line is the result as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import psycopg

PG = os.environ.get("JOBFENCE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


@contextlib.asynccontextmanager
async def fresh_store(store: str) -> AsyncIterator[str]:
    if store == "sqlite":
        with tempfile.TemporaryDirectory() as folder:
            yield f"sqlite:///{folder}/periodic-bench.db"
        return
    name = f"jf_bench_periodic_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")  # type: ignore[arg-type]
    try:
        yield PG.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with psycopg.connect(PG, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")  # type: ignore[arg-type]


def rewind_sql(store: str, seconds: int) -> str:
    """Every schedule's row at ``seconds`` before the database clock's current second."""
    if store == "postgresql":
        return (
            "UPDATE core.schedules SET last_slot = "
            f"date_trunc('second', now()) - interval '{seconds} seconds'"
        )
    return (
        "UPDATE core_schedules SET last_slot = "
        f"CAST((julianday('now') - 2440587.5) * 86400.0 AS INTEGER) - {seconds}"
    )


def jobs_table(store: str) -> str:
    return "core.jobs" if store == "postgresql" else "core_jobs"


async def _rounds(store: str, schedules: int, rounds: int) -> dict[str, Any]:
    from jobfence import App
    from jobfence.runtime.scheduler import Scheduler

    async with fresh_store(store) as url:
        app = App(url, auto_migrate=True)
        for i in range(schedules):
            app.periodic(f"every-second-{i:05d}", cron="* * * * * *", queue="bench.periodic")
        walls: list[float] = []
        cpus: list[float] = []
        ticks: list[int] = []
        async with app:
            await Scheduler(app.runtime).define()
            for _ in range(rounds + 1):  # the first round warms up, and is not counted
                async with app.db.transaction() as tx:
                    await tx.execute(f"DELETE FROM {jobs_table(store)}")
                    await tx.execute(rewind_sql(store, 1))
                scheduler = Scheduler(app.runtime)
                await scheduler.define()
                cpu, wall = time.process_time(), time.perf_counter()
                await scheduler.tick()
                walls.append(time.perf_counter() - wall)
                cpus.append(time.process_time() - cpu)
                ticks.append(scheduler.enqueued)
                # a round longer than the clock's second finds a second tick due on the
                # schedules it reaches after the second turned
                if scheduler.enqueued < schedules:
                    raise SystemExit(
                        f"a round enqueued {scheduler.enqueued} ticks, not {schedules}"
                    )
        wall_s = statistics.median(walls[1:])
        cpu_s = statistics.median(cpus[1:])
        per_round = statistics.median(ticks[1:])
        return {
            "store": store,
            "schedules": schedules,
            "rounds": rounds,
            "round_s": round(wall_s, 4),
            "round_s_max": round(max(walls[1:]), 4),
            "ticks_per_round": per_round,
            "cpu_per_tick_ms": round(cpu_s / per_round * 1000, 3),
            "wall_per_tick_ms": round(wall_s / per_round * 1000, 3),
        }


async def _catch_up(store: str, seconds: int, schedules: int) -> dict[str, Any]:
    from jobfence import App
    from jobfence.runtime.scheduler import Scheduler

    async with fresh_store(store) as url:
        app = App(url, auto_migrate=True)
        for i in range(schedules):
            app.periodic(
                f"catch-up-{i:03d}",
                cron="* * * * * *",
                queue="bench.periodic",
                missed="all",
                grace=timedelta(0),
            )
        async with app:
            scheduler = Scheduler(app.runtime)
            await scheduler.define()
            async with app.db.transaction() as tx:
                await tx.execute(rewind_sql(store, seconds))
            cpu, wall = time.process_time(), time.perf_counter()
            await scheduler.tick()
            wall_s, cpu_s = time.perf_counter() - wall, time.process_time() - cpu
            return {
                "store": store,
                "catch_up_s": seconds,
                "schedules": schedules,
                "ticks": scheduler.enqueued,
                "transactions": scheduler.transactions,
                "largest_transaction": scheduler.largest,
                "round_s": round(wall_s, 4),
                "cpu_per_tick_ms": round(cpu_s / max(1, scheduler.enqueued) * 1000, 3),
            }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedules", type=int, nargs="*", default=[100, 1000])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--store", choices=["postgresql", "sqlite"], nargs="*")
    parser.add_argument("--catch-up", type=int, default=0, metavar="SECONDS")
    parser.add_argument("--catch-up-schedules", type=int, default=10)
    args = parser.parse_args()
    stores = args.store or ["postgresql", "sqlite"]
    results: list[dict[str, Any]] = []
    for store in stores:
        if args.catch_up:
            found = asyncio.run(_catch_up(store, args.catch_up, args.catch_up_schedules))
            results.append(found)
            print(
                f"{store:10} catch-up {found['catch_up_s']} s, {found['schedules']} schedules: "
                f"{found['ticks']} ticks in {found['transactions']} transaction(s) (largest "
                f"{found['largest_transaction']}), {found['round_s']:.3f} s, "
                f"{found['cpu_per_tick_ms']:.3f} ms CPU/tick"
            )
            continue
        for n in args.schedules:
            found = asyncio.run(_rounds(store, n, args.rounds))
            results.append(found)
            print(
                f"{store:10} {n:6} schedules: round {found['round_s']:.3f} s "
                f"(max {found['round_s_max']:.3f}), {found['ticks_per_round']} ticks, "
                f"{found['cpu_per_tick_ms']:.3f} ms CPU/tick, "
                f"{found['wall_per_tick_ms']:.3f} ms wall/tick"
            )
    print(f"load average {os.getloadavg()[0]:.2f}")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
