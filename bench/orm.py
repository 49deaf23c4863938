"""The durable workload (one INSERT per job) through SQLAlchemy's ORM next to the raw ``tx``.

    python bench/orm.py [--jobs 5000] [--concurrency 1,16] [--repeat 3] [--store postgresql]

Each run: a fresh database (PostgreSQL; or a SQLite file with ``--store sqlite``), N jobs
enqueued in bulk, one in-process worker drains them; every job's effect is one INSERT
committed with its fence before the job is acknowledged. Three ways, interleaved in the same
run so that drift hits them alike:

- ``raw tx``: ``App(url)``, the handler runs ``tx.execute("INSERT …")`` (jobfence's own pool);
- ``engine, raw tx``: ``App(engine=…)``, the same statement on the engine's connection (what
  running the job's transaction on SQLAlchemy costs, without the ORM);
- ``ORM``: ``App(engine=…)``, the handler does ``session.add(Effect(…))`` on the
  ``AsyncSession`` joined to the job's transaction.

Prints medians of ``--repeat`` runs with their spread, and each path's throughput as a ratio
of the raw path's.
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
from sqlalchemy import String
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from jobfence import App, Job, Observer, Tx

ADMIN = os.environ.get("JOBFENCE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
WAYS = ("raw tx", "engine, raw tx", "ORM")


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

    def job_processed(self, job: Job[Any], duration: float) -> None:
        self.left -= 1
        if self.left == 0:
            self.done.set()


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


async def one_run(store: str, way: str, jobs: int, concurrency: int) -> float:
    url, drop = _database(store)
    engine = create_async_engine(_engine_url(url), pool_size=concurrency + 2, max_overflow=0)
    try:
        async with engine.begin() as conn:
            await conn.run_sync(Base.metadata.create_all)
        done = asyncio.Event()
        observers = [_Counter(jobs, done)]
        if way == "raw tx":
            app = App(url, auto_migrate=True, observers=observers)
        else:
            app = App(engine=engine, auto_migrate=True, observers=observers)

        if way == "ORM":

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
            worker = app.worker(concurrency=concurrency, poll_interval=0.2)
            t0 = time.perf_counter()
            task = asyncio.create_task(worker.run())
            await done.wait()
            elapsed = time.perf_counter() - t0
            worker.request_stop()
            await task
            async with app.db.transaction() as tx:
                row = await tx.fetchone("SELECT count(*) FROM effects")
            if row is None or row[0] != jobs:
                raise RuntimeError(f"expected {jobs} effects, found {row}")
        return jobs / elapsed
    finally:
        await engine.dispose()
        drop()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=5_000)
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--store", choices=("postgresql", "sqlite"), default="postgresql")
    args = parser.parse_args()
    console = Console()
    table = Table(
        title=f"one INSERT per job through SQLAlchemy vs the raw tx, {args.jobs:,} jobs, "
        f"{args.store} (median of {args.repeat})"
    )
    for column in (
        "concurrency",
        *(f"{w} jobs/s" for w in WAYS),
        *(f"{w} / raw" for w in WAYS[1:]),
    ):
        table.add_column(column, justify="right")
    for level in (int(c) for c in args.concurrency.split(",")):
        runs: dict[str, list[float]] = {w: [] for w in WAYS}
        for _ in range(args.repeat):  # interleaved, so drift hits every way alike
            for way in WAYS:
                runs[way].append(await one_run(args.store, way, args.jobs, level))
            console.print(
                f"  c={level}: " + ", ".join(f"{w} {runs[w][-1]:,.0f}" for w in WAYS),
                style="dim",
            )
        median = {w: statistics.median(runs[w]) for w in WAYS}
        table.add_row(
            str(level),
            *(f"{median[w]:,.0f} ({min(runs[w]):,.0f}–{max(runs[w]):,.0f})" for w in WAYS),
            *(f"{median[w] / median['raw tx']:.2f}" for w in WAYS[1:]),
        )
    console.print(table)
    console.print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs")


if __name__ == "__main__":
    asyncio.run(main())
