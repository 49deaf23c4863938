"""The durable workload (one INSERT per job) through Django's ORM next to the raw ``tx``.

    python bench/django_orm.py [--jobs 3000] [--concurrency 16] [--repeat 3] [--store postgresql]

Each run: a fresh database (PostgreSQL; or a SQLite file with ``--store sqlite``), N jobs
enqueued in bulk, one in-process worker drains them; every job's effect is one INSERT
committed with its fence. Two ways, interleaved in the same run so that drift hits both:

- ``raw tx``: ``App(url)``, an ``async def`` handler runs ``tx.execute("INSERT …")`` on
  jobfence's own pool (the baseline);
- ``Django ORM``: a ``DjangoApp``, a ``def`` handler does ``Effect.objects.create(…)`` inside
  ``transaction.atomic()`` on the thread's Django connection (``CONN_MAX_AGE = 60``, as
  docs/integrations/django.md advises for workers).

Prints medians of ``--repeat`` runs with their spread: throughput and the worker process's
CPU time per job (all threads; the database server's CPU is not in it), each as a ratio of
the raw path's.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import django
from django.conf import settings

sys.path.insert(0, str(Path(__file__).resolve().parent))
from orm import ADMIN, _Counter, _database

settings.configure(
    DATABASES={
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": "/nonexistent",  # set per run
            "CONN_MAX_AGE": 60,
        }
    },
    INSTALLED_APPS=["jobfence.integrations.django"],
    USE_TZ=True,
)
django.setup()

from django.db import connections, models  # noqa: E402

from jobfence import App, Job, Tx  # noqa: E402
from jobfence.integrations.django import DjangoApp, DjangoTx  # noqa: E402

WAYS = ("raw tx", "Django ORM")


class Effect(models.Model):
    job_id = models.CharField(max_length=100, primary_key=True)
    amount = models.IntegerField()

    class Meta:
        app_label = "jobfence_bench"
        db_table = "effects"


def _point_django_at(url: str) -> None:
    """Django's ``default`` database := ``url`` (new threads' connections read this dict)."""
    config = connections.settings["default"]
    if url.startswith("sqlite:///"):
        config.update(ENGINE="django.db.backends.sqlite3", NAME=url.removeprefix("sqlite:///"))
        config["OPTIONS"] = {"timeout": 60}
        return
    base = ADMIN.rsplit("/", 1)[0]  # postgresql://user@host:port
    user_host = base.removeprefix("postgresql://")
    user, _, host_port = user_host.rpartition("@")
    host, _, port = host_port.partition(":")
    config.update(
        ENGINE="django.db.backends.postgresql",
        NAME=url.rsplit("/", 1)[1],
        USER=user,
        HOST=host,
        PORT=port or "5432",
        OPTIONS={},
    )


def _prepare(url: str) -> None:
    _point_django_at(url)
    with connections["default"].schema_editor() as editor:
        editor.create_model(Effect)
    connections.close_all()


async def one_run(store: str, way: str, jobs: int, concurrency: int) -> tuple[float, float]:
    """(jobs per second, CPU microseconds per job) of one drain."""
    url, drop = _database(store)
    try:
        await asyncio.to_thread(_prepare, url)  # Django's connections are per thread, sync
        done = asyncio.Event()
        counter = _Counter(jobs, done)
        app: App
        if way == "raw tx":
            app = App(url, auto_migrate=True, observers=[counter])

            @app.consumer("bench")
            async def raw(job: Job[Any], tx: Tx) -> None:
                await tx.execute(
                    "INSERT INTO effects (job_id, amount) VALUES (%s, %s)", (job.job_id, 1)
                )

        else:
            app = DjangoApp(auto_migrate=True, observers=[counter])

            @app.consumer("bench")
            def orm(job: Job[Any], tx: DjangoTx) -> None:
                Effect.objects.create(job_id=job.job_id, amount=1)

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
            if counter.extra:
                print(f"  ({way}: {counter.extra} deliveries did no work)", file=sys.stderr)
        return jobs / elapsed, cpu / jobs * 1e6
    finally:
        await asyncio.to_thread(connections.close_all)
        drop()  # PostgreSQL: WITH (FORCE) ends the worker threads' connections


async def main() -> None:
    from rich.console import Console
    from rich.table import Table

    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--jobs", type=int, default=3_000)
    parser.add_argument("--concurrency", default="16")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--store", choices=("postgresql", "sqlite"), default="postgresql")
    args = parser.parse_args()
    console = Console()
    table = Table(
        title=f"one INSERT per job through Django's ORM vs the raw tx, {args.jobs:,} jobs, "
        f"{args.store} (median of {args.repeat})"
    )
    for column in ("concurrency", "way", "jobs/s (min–max)", "÷ raw", "CPU µs/job", "× raw"):
        table.add_column(column, justify="right")
    for level in (int(c) for c in args.concurrency.split(",")):
        rate: dict[str, list[float]] = {w: [] for w in WAYS}
        cpu: dict[str, list[float]] = {w: [] for w in WAYS}
        for _ in range(args.repeat):  # interleaved, so drift hits both ways alike
            for way in WAYS:
                jobs_per_s, cpu_us = await one_run(args.store, way, args.jobs, level)
                rate[way].append(jobs_per_s)
                cpu[way].append(cpu_us)
            console.print(
                f"  c={level}: "
                + ", ".join(f"{w} {rate[w][-1]:,.0f}/s {cpu[w][-1]:,.0f}µs" for w in WAYS),
                style="dim",
            )
        median = {w: statistics.median(rate[w]) for w in WAYS}
        cost = {w: statistics.median(cpu[w]) for w in WAYS}
        for way in WAYS:
            table.add_row(
                str(level),
                way,
                f"{median[way]:,.0f} ({min(rate[way]):,.0f}–{max(rate[way]):,.0f})",
                f"{median[way] / median['raw tx']:.2f}",
                f"{cost[way]:,.0f} ({min(cpu[way]):,.0f}–{max(cpu[way]):,.0f})",
                f"{cost[way] / cost['raw tx']:.2f}",
            )
    console.print(table)
    console.print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, django {django.__version__}"
    )


if __name__ == "__main__":
    asyncio.run(main())
