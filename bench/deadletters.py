"""Dead-letter operations at scale: bulk replay and fence cleanup, on PostgreSQL and SQLite.

    python bench/deadletters.py [--letters 10000] [--fences 1000000] [--stores postgresql,sqlite]

1. Bulk replay of ``--letters`` dead letters (preview + run, no rate limit), against the
   baseline of enqueuing the same number of jobs with ``enqueue_many`` in the same run.
2. Cleanup of ``--fences`` expired fence rows while a worker processes jobs and 4 writers
   keep inserting fence rows the way the harness does (one short transaction each): fence
   insert latency (p50/p99/max) and worker jobs/s before (baseline) and during cleanup, the
   longest batch transaction of the cleaner (the longest any lock was held by it), its total
   time and rows/s.

Each store gets a fresh database. Prints tables; nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import psycopg
from growth_tables import seed_fences
from rich.console import Console
from rich.table import Table

from jobfence import App, Job, Observer, Tx
from jobfence.core.fence import DEFAULT_FENCE_TTL, claim_tx
from jobfence.review import deadletters as dl
from jobfence.review import replays
from jobfence.runtime.cleanup import cleanup_fences
from jobfence.runtime.maintenance import Maintenance
from jobfence.store import Store

ADMIN = os.environ.get("JOBFENCE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
OPS = dl.Actor("bench", "library")


def _fresh(store: str) -> tuple[str, Any]:
    if store == "postgresql":
        name = f"jf_bench_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(ADMIN, autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{name}"')  # type: ignore[arg-type]

        def drop() -> None:
            with psycopg.connect(ADMIN, autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')  # type: ignore[arg-type]

        return ADMIN.rsplit("/", 1)[0] + "/" + name, drop
    folder = tempfile.mkdtemp(prefix="jf-bench-")
    return f"sqlite:///{folder}/bench.db", lambda: None


def _letter(dialect: str, i: int) -> dict[str, Any]:
    payload = json.dumps({"member_id": f"m-{i}", "points": 1}).encode()
    return {
        "queue": "credits",
        "consumer": "credits",
        "job_id": f"c-{i:07d}",
        "correlation_id": None,
        "payload": payload,
        "payload_size": len(payload),
        "payload_truncated": False,
        "attempts": 6,
        "category": "TEMPORARY_ERROR",
        "error_code": "TemporaryError",
        "error": "TemporaryError: partner API answered 503",
        "history": "[]",
        "enqueued_at": None,
        "partner": None,
        "trace": None,
        "trace_context": None,
    }


@dataclass
class ReplayRun:
    store: str
    letters: int
    enqueue_s: float
    preview_s: float
    replay_s: float
    counts: dict[str, int]


async def bench_replay(store: str, letters: int) -> ReplayRun:
    url, drop = _fresh(store)
    try:
        app = App(url, auto_migrate=True)
        async with app:
            started = time.perf_counter()
            await app.enqueue_many(
                [app.job("baseline", {"i": i}, job_id=f"b-{i}") for i in range(letters)]
            )
            enqueue_s = time.perf_counter() - started
            async with app.db.transaction() as tx:
                await tx.qmany("insert_dead_letter", [_letter(store, i) for i in range(letters)])
            started = time.perf_counter()
            preview = await replays.preview_replay(app.db, dl.Filter(queue="credits"), actor=OPS)
            preview_s = time.perf_counter() - started
            started = time.perf_counter()
            status = await replays.run_replay(
                app.db, app.transport, preview.replay_id, actor=OPS, expected_total=letters
            )
            replay_s = time.perf_counter() - started
        return ReplayRun(store, letters, enqueue_s, preview_s, replay_s, status.counts)
    finally:
        drop()


@dataclass
class Phase:
    latencies: list[float] = field(default_factory=list)
    jobs: int = 0
    seconds: float = 0.0

    def pct(self, q: float) -> float:
        if not self.latencies:
            return float("nan")
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000

    @property
    def jobs_per_s(self) -> float:
        return self.jobs / self.seconds if self.seconds else 0.0


class _Count(Observer):
    def __init__(self) -> None:
        self.n = 0

    def job_processed(self, job: Job[Any], duration: float) -> None:
        self.n += 1


@dataclass
class CleanupRun:
    store: str
    fences: int
    deleted: int
    batches: int
    seconds: float
    longest_batch_ms: float
    before: Phase
    during: Phase


async def _fill_expired(app: App, url: str, store: str, fences: int) -> None:
    if store == "postgresql":
        with psycopg.connect(url, autocommit=True) as conn:
            seed_fences(conn, fences, expired=fences)
        return
    async with app.db.transaction() as tx:
        await tx.execute(
            "WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < ?) "
            "INSERT INTO core_processed_jobs (consumer, job_id, processed_at, expires_at) "
            "SELECT 'old', 'old-' || n, 0, 1 FROM g",
            (fences,),
        )


async def fencer(app: App, phase: Phase, stop: asyncio.Event, tag: str) -> None:
    """Insert fence rows the way the harness does: one short transaction each."""
    i = 0
    while not stop.is_set():
        i += 1
        job_id = f"{tag}-{uuid.uuid4().hex}"
        started = time.perf_counter()
        async with app.db.transaction() as tx:
            await claim_tx(tx, "probe", job_id, DEFAULT_FENCE_TTL)
        phase.latencies.append(time.perf_counter() - started)
        await asyncio.sleep(0.001)


async def _measure(app: App, counter: _Count, seconds: float | None, until: Any, tag: str) -> Phase:
    phase = Phase()
    stop = asyncio.Event()
    fencers = [asyncio.create_task(fencer(app, phase, stop, f"{tag}{k}")) for k in range(4)]
    start_jobs, started = counter.n, time.perf_counter()
    try:
        if until is not None:
            await until
        else:
            await asyncio.sleep(seconds or 0)
    finally:
        stop.set()
        await asyncio.gather(*fencers)
    phase.seconds = time.perf_counter() - started
    phase.jobs = counter.n - start_jobs
    return phase


async def bench_cleanup(store: str, fences: int, batch: int) -> CleanupRun:
    url, drop = _fresh(store)
    try:
        counter = _Count()
        app = App(
            url,
            auto_migrate=True,
            observers=[counter],
            maintenance=Maintenance(cleanup=False, alerts=False),
        )

        @app.consumer("work")
        async def handle(job: Job[Any], tx: Tx) -> None:
            p = "%s" if tx.dialect == "postgresql" else "?"
            await tx.execute(f"INSERT INTO effects (job_id) VALUES ({p})", (job.job_id,))

        async with app:
            async with app.db.transaction() as tx:
                await tx.execute("CREATE TABLE effects (job_id TEXT NOT NULL)")
            await Store(app.db).migrate()
            started = time.perf_counter()
            await _fill_expired(app, url, store, fences)
            print(
                f"  {store}: {fences} expired fences written in "
                f"{time.perf_counter() - started:.1f}s",
                file=sys.stderr,
            )
            # enough work for the whole measurement, not a deep backlog (that is another bench)
            await app.enqueue_many([app.job("work", {}, job_id=f"w-{i}") for i in range(30_000)])
            worker = app.worker(concurrency=8)
            running = asyncio.create_task(worker.run())
            try:
                await asyncio.sleep(2)  # warm up
                before = await _measure(app, counter, 5.0, None, "b")
                cleaning = asyncio.create_task(
                    cleanup_fences(app.db, min_age=timedelta(minutes=18, seconds=30), batch=batch)
                )
                during = await _measure(app, counter, None, asyncio.shield(cleaning), "d")
                result = await cleaning
            finally:
                worker.request_stop()
                await running
        return CleanupRun(
            store,
            fences,
            result.deleted,
            result.batches,
            result.seconds,
            result.longest_batch * 1000,
            before,
            during,
        )
    finally:
        drop()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--letters", type=int, default=10_000)
    parser.add_argument("--fences", type=int, default=1_000_000)
    parser.add_argument("--stores", default="postgresql,sqlite")
    parser.add_argument("--batch", type=int, default=5000, help="cleanup batch size")
    parser.add_argument("--skip-replay", action="store_true")
    args = parser.parse_args()
    stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    console = Console(width=max(Console().width, 150))

    replays = [] if args.skip_replay else [await bench_replay(s, args.letters) for s in stores]
    table = Table(title=f"bulk replay of {args.letters} dead letters (no rate limit)")
    for column in (
        "store",
        "enqueue_many (baseline)",
        "preview",
        "replay",
        "letters/s",
        "replay ÷ baseline",
        "outcomes",
    ):
        table.add_column(column, justify="right")
    for r in replays:
        table.add_row(
            r.store,
            f"{r.enqueue_s:.2f}s",
            f"{r.preview_s:.2f}s",
            f"{r.replay_s:.2f}s",
            f"{r.letters / r.replay_s:,.0f}",
            f"{r.replay_s / r.enqueue_s:.1f}×",
            ", ".join(f"{k} {v}" for k, v in sorted(r.counts.items())),
        )
    if replays:
        console.print(table)

    cleanups = [await bench_cleanup(store, args.fences, args.batch) for store in stores]
    table = Table(
        title=f"cleanup of {args.fences:,} expired fences, batches of {args.batch}, "
        "while a worker runs"
    )
    for column in (
        "store",
        "phase",
        "fence insert p50",
        "p99",
        "max",
        "worker jobs/s",
        "cleanup",
        "rows/s",
        "batches",
        "longest batch (lock held)",
    ):
        table.add_column(column, justify="right")
    for c in cleanups:
        for name, phase in (("before (baseline)", c.before), ("during cleanup", c.during)):
            extra = ["", "", "", ""]
            if phase is c.during:
                extra = [
                    f"{c.seconds:.1f}s",
                    f"{c.deleted / c.seconds:,.0f}" if c.seconds else "-",
                    str(c.batches),
                    f"{c.longest_batch_ms:.0f} ms",
                ]
            table.add_row(
                c.store,
                name,
                f"{phase.pct(0.5):.1f} ms",
                f"{phase.pct(0.99):.1f} ms",
                f"{max(phase.latencies) * 1000:.1f} ms" if phase.latencies else "-",
                f"{phase.jobs_per_s:,.0f}",
                *extra,
            )
        ratio = c.during.pct(0.99) / c.before.pct(0.99)
        console.print(f"{c.store}: fence-insert p99 during cleanup ÷ before = {ratio:.1f}×")
    console.print(table)


if __name__ == "__main__":
    asyncio.run(main())
