"""Throughput of the durable-effect workload on PostgreSQL, with and without the fence.

    python bench/throughput.py [--jobs 20000] [--concurrency 1,8,32] [--batch-sizes 1,10]
                               [--repeat 3]

Each run: a fresh database, N jobs enqueued in bulk, then one in-process worker drains them;
every job's effect is one INSERT committed before the job is acknowledged. "without fence"
is a benchmark-only switch that removes the fence row (and with it the guarantee), so the
ratio is the fence's cost measured in the same run on the same machine. Prints medians of
``--repeat`` runs with their spread (min–max), and CPU seconds per 1 000 jobs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
import uuid
from dataclasses import dataclass
from typing import Any

import psycopg
from rich.console import Console
from rich.table import Table

from jobfence import App, Job, Observer, Tx

ADMIN = os.environ.get("JOBFENCE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


@dataclass
class Run:
    jobs_per_s: float
    cpu_per_1000: float


class _Counter(Observer):
    """Sets ``done`` when ``target`` jobs have committed (no polling)."""

    def __init__(self, target: int, done: asyncio.Event) -> None:
        self.left = target
        self.done = done

    def job_processed(self, job: Job[Any], duration: float) -> None:
        self.left -= 1
        if self.left == 0:
            self.done.set()


def _url(name: str) -> str:
    return ADMIN.rsplit("/", 1)[0] + "/" + name


async def one_run(
    jobs: int, concurrency: int, fence: bool, batch_size: int = 1, noop: bool = False
) -> Run:
    name = f"jf_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(ADMIN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')  # type: ignore[arg-type]
    try:
        url = _url(name)
        done = asyncio.Event()
        app = App(url, auto_migrate=True, observers=[_Counter(jobs, done)])
        app._fence_enabled = fence

        @app.consumer("bench")
        async def effect(job: Job[Any], tx: Tx) -> None:
            if noop:
                return
            await tx.execute(
                "INSERT INTO effects (job_id, amount) VALUES (%s, %s)", (job.job_id, 1)
            )

        async with app:
            async with app.db.transaction() as tx:
                await tx.execute("CREATE TABLE effects (job_id text NOT NULL, amount int NOT NULL)")
            batch = [app.job("bench", {"n": i}, job_id=f"job-{i}") for i in range(jobs)]
            for start in range(0, jobs, 5000):
                await app.enqueue_many(batch[start : start + 5000])
            worker = app.worker(concurrency=concurrency, poll_interval=0.2, batch_size=batch_size)
            cpu0, t0 = time.process_time(), time.perf_counter()
            task = asyncio.create_task(worker.run())
            await done.wait()
            elapsed = time.perf_counter() - t0
            cpu = time.process_time() - cpu0
            worker.request_stop()
            await task
            async with app.db.transaction() as tx:
                row = await tx.fetchone("SELECT count(*) FROM effects")
            if row is None or row[0] != (0 if noop else jobs):
                raise RuntimeError(f"expected {jobs} effects, found {row}")
        return Run(jobs / elapsed, cpu / jobs * 1000)
    finally:
        with psycopg.connect(ADMIN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')  # type: ignore[arg-type]


def _spread(values: list[float]) -> str:
    return f"{min(values):,.0f}–{max(values):,.0f}"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--concurrency", default="1,8,32")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--noop", action="store_true", help="empty handler (fence only)")
    parser.add_argument(
        "--batch-sizes", default="1,10", help="group-commit sizes to measure (1 = off)"
    )
    args = parser.parse_args()
    levels = [
        (int(c), int(b)) for b in args.batch_sizes.split(",") for c in args.concurrency.split(",")
    ]
    console = Console()
    table = Table(
        title=f"durable-effect throughput, {args.jobs:,} jobs, PostgreSQL (median of {args.repeat})"
    )
    for column in (
        "concurrency × batch",
        "with fence jobs/s",
        "spread",
        "without fence jobs/s",
        "spread",
        "fence cost",
        "CPU s / 1000 jobs (fence)",
    ):
        table.add_column(column, justify="right")
    for level, batch in levels:
        with_fence: list[Run] = []
        without: list[Run] = []
        for _ in range(args.repeat):  # interleave so drift hits both sides alike
            with_fence.append(
                await one_run(args.jobs, level, fence=True, batch_size=batch, noop=args.noop)
            )
            without.append(
                await one_run(args.jobs, level, fence=False, batch_size=batch, noop=args.noop)
            )
            console.print(
                f"  c={level} b={batch}: fence {with_fence[-1].jobs_per_s:,.0f} jobs/s, "
                f"no fence {without[-1].jobs_per_s:,.0f} jobs/s",
                style="dim",
            )
        a = [r.jobs_per_s for r in with_fence]
        b = [r.jobs_per_s for r in without]
        cost = 1 - statistics.median(a) / statistics.median(b)
        table.add_row(
            f"{level} × {batch}",
            f"{statistics.median(a):,.0f}",
            _spread(a),
            f"{statistics.median(b):,.0f}",
            _spread(b),
            f"{cost:+.1%}",
            f"{statistics.median(r.cpu_per_1000 for r in with_fence):.2f}",
        )
    console.print(table)
    console.print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs")


if __name__ == "__main__":
    asyncio.run(main())
