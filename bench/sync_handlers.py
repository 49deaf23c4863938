"""Plain ``def`` handlers: the cost of jobfence's daemon-thread pool (issue 12 §7) against the
stdlib ``ThreadPoolExecutor`` it replaced, measured in the same run.

    .venv/bin/python bench/sync_handlers.py                  # PostgreSQL and SQLite
    .venv/bin/python bench/sync_handlers.py --jobs 5000 --repeat 5 --only sqlite

Each run: a fresh database, N jobs enqueued, one in-process worker (concurrency 8) whose
``def`` handler does one INSERT through ``SyncTx``, timed until the queue is empty. The pools
alternate run by run (so a burst of load from other processes hits both alike); the table has
the median CPU time of this process per job (the worker's own cost: its event loop, its
handler threads and the driver), the median wall-clock rate, the spread (min–max) of the
repeats, and the ratio of each figure to the stdlib pool's. The load average before and
after is printed: on a shared machine, compare ratios, not absolute figures.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg

import jobfence.runtime.worker as worker_module
from jobfence import App, Job, SyncTx
from jobfence.runtime.threads import DaemonThreadPool

PG = os.environ.get("JOBFENCE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
POOLS: dict[str, Any] = {
    "stdlib ThreadPoolExecutor": ThreadPoolExecutor,
    "DaemonThreadPool": DaemonThreadPool,
}


def fresh_database(store: str) -> tuple[str, Any]:
    """A URL of a new database of ``store`` and a function that drops it."""
    if store == "sqlite":
        folder = tempfile.TemporaryDirectory()
        return f"sqlite:///{folder.name}/bench.db", folder.cleanup
    name = f"jf_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    url = PG.rsplit("/", 1)[0] + f"/{name}"

    def drop() -> None:
        with psycopg.connect(PG, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE {name} WITH (FORCE)")

    return url, drop


async def one_run(store: str, pool: Any, jobs: int) -> tuple[float, float]:
    """(CPU seconds per job, jobs per wall-clock second) of one worker draining ``jobs``."""
    url, drop = fresh_database(store)
    try:
        app = App(url, auto_migrate=True)

        @app.consumer("bench.sync")
        def handle(job: Job[dict[str, Any]], tx: SyncTx) -> None:
            tx.execute("INSERT INTO effects (job_id) VALUES (%s)", (job.job_id,))

        async with app:
            async with app.db.transaction() as tx:
                await tx.execute("CREATE TABLE effects (job_id TEXT PRIMARY KEY)")
            for i in range(jobs):
                await app.enqueue("bench.sync", {"i": i}, job_id=f"j-{i}")
            worker_module.DaemonThreadPool = pool  # type: ignore[attr-defined]
            worker = app.worker(concurrency=8, summary_interval=0)
            cpu, wall = time.process_time(), time.perf_counter()
            task = asyncio.create_task(worker.run())
            while worker.stats.handled < jobs:  # noqa: ASYNC110 - polls the worker's count
                await asyncio.sleep(0.01)
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            worker.request_stop()
            await task
            async with app.db.transaction() as tx:
                done = await tx.fetchone("SELECT count(*) FROM effects")
            if done is None or done[0] != jobs:
                raise SystemExit(f"wrong result: {done} effects, not {jobs}")
        return cpu / jobs, jobs / wall
    finally:
        worker_module.DaemonThreadPool = DaemonThreadPool  # type: ignore[attr-defined]
        drop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", choices=["postgresql", "sqlite"])
    args = parser.parse_args()
    stores = [args.only] if args.only else ["postgresql", "sqlite"]
    print(f"load average before: {os.getloadavg()}; {os.cpu_count()} CPUs")
    results: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for _ in range(args.repeat):
        for store in stores:
            for name, pool in POOLS.items():
                results.setdefault((store, name), []).append(
                    asyncio.run(one_run(store, pool, args.jobs))
                )
    print(f"load average after:  {os.getloadavg()}")
    print(f"\n{args.jobs} jobs x {args.repeat} runs, def handler with one INSERT, concurrency 8")
    head = f"{'store':<11}{'pool':<27}{'CPU µs/job':>12}{'spread':>17}{'ratio':>7}"
    head += f"{'jobs/s':>9}{'spread':>15}{'ratio':>7}"
    print(head)
    for store in stores:
        base = results[(store, "stdlib ThreadPoolExecutor")]
        base_cpu = statistics.median(c for c, _ in base)
        base_rate = statistics.median(r for _, r in base)
        for name in POOLS:
            runs = results[(store, name)]
            cpus = [c * 1e6 for c, _ in runs]
            rates = [r for _, r in runs]
            cpu, rate = statistics.median(cpus), statistics.median(rates)
            print(
                f"{store:<11}{name:<27}{cpu:>12.0f}{f'{min(cpus):.0f}–{max(cpus):.0f}':>17}"
                f"{cpu / (base_cpu * 1e6):>7.2f}{rate:>9.0f}"
                f"{f'{min(rates):.0f}–{max(rates):.0f}':>15}{rate / base_rate:>7.2f}"
            )


if __name__ == "__main__":
    main()
