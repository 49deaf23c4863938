"""The durable workload (one INSERT per job) through SQLAlchemy's ORM next to the raw ``tx``.

    python bench/orm.py [--jobs 5000] [--concurrency 1,16] [--repeat 3] [--store postgresql]
                        [--ways "raw tx,engine tx,ORM,sync ORM"]

Each run: a fresh database (PostgreSQL; or a SQLite file with ``--store sqlite``), N jobs
enqueued in bulk, one in-process worker drains them; every job's effect is one INSERT
committed with its fence before the job is acknowledged. Four ways, interleaved in the same
run so that drift hits them alike:

- ``raw tx``: ``App(url)``, the handler runs ``tx.execute("INSERT …")`` (jobfence's own pool);
- ``engine tx``: ``App(engine=…)``, the same statement on the engine's connection (what
  running the job's transaction on SQLAlchemy costs, without the ORM);
- ``ORM``: ``App(engine=…)``, the handler does ``session.add(Effect(…))`` on the
  ``AsyncSession`` joined to the job's transaction;
- ``sync ORM``: ``App(engine=create_engine(…))``, a ``def`` handler does the same on a
  ``Session``, in a worker thread (psycopg / sqlite3 underneath).

Prints medians of ``--repeat`` runs with their spread, each path's throughput as a ratio of
the raw path's, and the worker process's CPU time per job (all threads; the database
server's CPU is not in it) — steadier than wall-clock throughput on a shared machine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from rich.console import Console
from rich.table import Table
from sqlalchemy import String, create_engine
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from jobfence import App, Job, Observer, Tx

ADMIN = os.environ.get("JOBFENCE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
WAYS = ("raw tx", "engine tx", "ORM", "sync ORM")


class Base(DeclarativeBase):
    pass


class Effect(Base):
    __tablename__ = "effects"

    job_id: Mapped[str] = mapped_column(String(100), primary_key=True)
    amount: Mapped[int]


class _Counter(Observer):
    def __init__(self, target: int, done: asyncio.Event) -> None:
        self.left = target
        self.done = done

        self.extra = 0  # deliveries that did no work (duplicates, lost leases): a fair run has 0

    def job_processed(self, job: Job[Any], duration: float) -> None:
        self.left -= 1
        if self.left == 0:
            self.done.set()

    def job_duplicate(self, delivery: Any, consumer: str) -> None:
        self.extra += 1

    def job_lost(self, delivery: Any, consumer: str) -> None:
        self.extra += 1


def _database(store: str) -> tuple[str, Callable[[], None]]:
    """A fresh database's jobfence URL, and how to drop it."""
    if store == "sqlite":
        folder = tempfile.mkdtemp(prefix="jf-bench-")
        path = Path(folder) / "bench.db"

        def drop_file() -> None:
            for file in Path(folder).iterdir():
                file.unlink()
            Path(folder).rmdir()

        return f"sqlite:///{path}", drop_file
    name = f"jf_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(ADMIN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')  # type: ignore[arg-type]

    def drop() -> None:
        with psycopg.connect(ADMIN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')  # type: ignore[arg-type]

    return ADMIN.rsplit("/", 1)[0] + "/" + name, drop


def _engine_url(url: str) -> str:
    if url.startswith("postgresql://"):
        return "postgresql+psycopg://" + url.removeprefix("postgresql://")
    return "sqlite+aiosqlite:///" + url.removeprefix("sqlite:///")


def _sync_engine(url: str, concurrency: int) -> Any:
    if url.startswith("postgresql://"):
        return create_engine(
            "postgresql+psycopg://" + url.removeprefix("postgresql://"),
            pool_size=concurrency + 2,
            max_overflow=0,
        )
    return create_engine(url, connect_args={"timeout": 60})


async def one_run(store: str, way: str, jobs: int, concurrency: int) -> tuple[float, float]:
    """(jobs per second, CPU microseconds per job) of one drain."""
    url, drop = _database(store)
    engine = create_async_engine(_engine_url(url), pool_size=concurrency + 2, max_overflow=0)
    sync_engine = _sync_engine(url, concurrency)
    try:
        async with engine.begin() as conn:
            await conn.run_sync(Base.metadata.create_all)
        done = asyncio.Event()
        observers = [_Counter(jobs, done)]
        if way == "raw tx":
            app = App(url, auto_migrate=True, observers=observers)
        elif way == "sync ORM":
            app = App(engine=sync_engine, auto_migrate=True, observers=observers)
        else:
            app = App(engine=engine, auto_migrate=True, observers=observers)

        if way == "sync ORM":

            @app.consumer("bench")
            def sync_orm(job: Job[Any], session: Session) -> None:
                session.add(Effect(job_id=job.job_id, amount=1))

        elif way == "ORM":

            @app.consumer("bench")
            async def orm(job: Job[Any], session: AsyncSession) -> None:
                session.add(Effect(job_id=job.job_id, amount=1))

        else:

            @app.consumer("bench")
            async def raw(job: Job[Any], tx: Tx) -> None:
                await tx.execute(
                    "INSERT INTO effects (job_id, amount) VALUES (%s, %s)", (job.job_id, 1)
                )

        async with app:
            batch = [app.job("bench", {"n": i}, job_id=f"job-{i}") for i in range(jobs)]
            for start in range(0, jobs, 5000):
                await app.enqueue_many(batch[start : start + 5000])
            # one transaction per job on every path (group commit is what an ORM path cannot do)
            worker = app.worker(concurrency=concurrency, poll_interval=0.2, batch_size=1)
            t0, cpu0 = time.perf_counter(), time.process_time()
            task = asyncio.create_task(worker.run())
            await done.wait()
            elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
            worker.request_stop()
            await task
            async with app.db.transaction() as tx:
                row = await tx.fetchone("SELECT count(*) FROM effects")
            if row is None or row[0] != jobs:
                raise RuntimeError(f"expected {jobs} effects, found {row}")
            if observers[0].extra:
                print(f"  ({way}: {observers[0].extra} deliveries did no work)", file=sys.stderr)
        return jobs / elapsed, cpu / jobs * 1e6
    finally:
        await engine.dispose()
        sync_engine.dispose()
        drop()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=5_000)
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--store", choices=("postgresql", "sqlite"), default="postgresql")
    parser.add_argument(
        "--ways", default=",".join(WAYS), help="comma-separated, of: " + ", ".join(WAYS)
    )
    args = parser.parse_args()
    ways = tuple(w for w in WAYS if w in args.ways.split(","))
    if not ways or ways[0] != "raw tx":
        parser.error("--ways must include 'raw tx' (the baseline)")
    console = Console()
    table = Table(
        title=f"one INSERT per job through SQLAlchemy vs the raw tx, {args.jobs:,} jobs, "
        f"{args.store} (median of {args.repeat})"
    )
    for column in (
        "concurrency",
        "way",
        "jobs/s (min–max)",
        "÷ raw",
        "CPU µs/job (min–max)",
        "× raw",
    ):
        table.add_column(column, justify="right")
    for level in (int(c) for c in args.concurrency.split(",")):
        rate: dict[str, list[float]] = {w: [] for w in ways}
        cpu: dict[str, list[float]] = {w: [] for w in ways}
        for _ in range(args.repeat):  # interleaved, so drift hits every way alike
            for way in ways:
                jobs_per_s, cpu_us = await one_run(args.store, way, args.jobs, level)
                rate[way].append(jobs_per_s)
                cpu[way].append(cpu_us)
            console.print(
                f"  c={level}: "
                + ", ".join(f"{w} {rate[w][-1]:,.0f}/s {cpu[w][-1]:,.0f}µs" for w in ways),
                style="dim",
            )
        median = {w: statistics.median(rate[w]) for w in ways}
        cost = {w: statistics.median(cpu[w]) for w in ways}
        for way in ways:
            table.add_row(
                str(level),
                way,
                f"{median[way]:,.0f} ({min(rate[way]):,.0f}–{max(rate[way]):,.0f})",
                f"{median[way] / median['raw tx']:.2f}",
                f"{cost[way]:,.0f} ({min(cpu[way]):,.0f}–{max(cpu[way]):,.0f})",
                f"{cost[way] / cost['raw tx']:.2f}",
            )
    console.print(table)
    console.print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs")


if __name__ == "__main__":
    asyncio.run(main())
