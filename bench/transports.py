"""The same durable-effect workload through every transport, fence on PostgreSQL.

    python bench/transports.py [--jobs 20000] [--concurrency 32]
                               [--transports postgresql,sqlite,rabbitmq,nats,redis,pubsub]

For each transport: a fresh PostgreSQL database holds the fence, the dead letters and the
effects table; N jobs are published in bulk (timed: "publish jobs/s"), then one in-process
worker drains them (timed from its start to the last commit: "process jobs/s"). Each job's
effect is one INSERT committed with its fence row before the queue is acknowledged.

Transports: ``postgresql`` (the queue in the fence's database: the ack joins the commit),
``sqlite`` (the queue in a SQLite file, acked after the PostgreSQL commit), ``rabbitmq``
(quorum queue on the local server), ``nats`` (file-backed JetStream stream on the local
server), ``redis`` (a private redis-server started here with ``--appendonly yes
--appendfsync always``, the setting docs/transports.md recommends), ``pubsub`` (the Pub/Sub
emulator at ``$PUBSUB_EMULATOR_HOST``, default 127.0.0.1:8085, a project of the run's own; it
keeps messages in memory). Ratios are against the PostgreSQL transport measured in the same
run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import psycopg
from rich.console import Console
from rich.table import Table

from jobfence import App, Job, Observer, Tx

ADMIN = os.environ.get("JOBFENCE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
AMQP = os.environ.get("JOBFENCE_BENCH_AMQP", "amqp://guest:guest@127.0.0.1:5672/")
NATS = os.environ.get("JOBFENCE_BENCH_NATS", "nats://127.0.0.1:4222")
PUBSUB = os.environ.get("PUBSUB_EMULATOR_HOST") or "127.0.0.1:8085"
ALL = ["postgresql", "sqlite", "rabbitmq", "nats", "redis", "pubsub"]


@dataclass
class Result:
    transport: str
    publish_per_s: float
    process_per_s: float
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


@contextmanager
def pg_database() -> Iterator[str]:
    name = f"jf_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(ADMIN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')  # type: ignore[arg-type]
    try:
        yield ADMIN.rsplit("/", 1)[0] + "/" + name
    finally:
        with psycopg.connect(ADMIN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')  # type: ignore[arg-type]


@contextmanager
def redis_server() -> Iterator[str]:
    """A private redis-server that fsyncs its append-only file on every write."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    workdir = tempfile.mkdtemp(prefix="jf-bench-redis-")
    proc = subprocess.Popen(
        ["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--dir", workdir,
         "--appendonly", "yes", "--appendfsync", "always", "--save", ""],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("redis-server did not start")
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        shutil.rmtree(workdir, ignore_errors=True)


async def _cleanup(kind: str, url: str, queue: str) -> None:
    """Remove the broker objects this run created."""
    if kind == "rabbitmq":
        import aio_pika

        from jobfence.transports.rabbitmq import exhausted_name

        conn = await aio_pika.connect(url)
        channel = await conn.channel()
        for name in (queue, exhausted_name(queue)):
            await channel.queue_delete(name)
        await conn.close()
    elif kind == "nats":
        from jobfence.transports.nats import NatsTransport

        nats = NatsTransport.from_url(url, lease=timedelta(seconds=30), worker_id="bench")
        await nats.open()
        for stream in (nats.stream_name(queue), nats.state_stream, nats.exhausted_stream):
            await nats.js.delete_stream(stream)
        await nats.close()
    elif kind == "pubsub":
        from jobfence.transports.pubsub import PubSubTransport

        ps = PubSubTransport.from_url(url, lease=timedelta(seconds=30), worker_id="bench")
        await ps.open()
        project = f"projects/{ps.project}"
        async for sub in await ps.subscriber.list_subscriptions(project=project):
            await ps.subscriber.delete_subscription(subscription=sub.name)
        async for topic in await ps.publisher.list_topics(project=project):
            await ps.publisher.delete_topic(topic=topic.name)
        await ps.close()


async def one_run(kind: str, jobs: int, concurrency: int, redis_url: str | None) -> Result:
    token = uuid.uuid4().hex[:8]
    queue = f"bench.{token}"
    workdir = tempfile.mkdtemp(prefix="jf-bench-")
    transport = {
        "postgresql": None,
        "sqlite": f"sqlite:///{workdir}/queue.db",
        "rabbitmq": AMQP,
        "nats": f"{NATS}?prefix=jfbench_{token}",
        "redis": f"{redis_url}?prefix=jfbench:{token}",
        "pubsub": f"pubsub://jfbench-{token}?emulator={PUBSUB}",
    }[kind]
    try:
        with pg_database() as url:
            done = asyncio.Event()
            app = App(url, transport=transport, auto_migrate=True,
                      observers=[_Counter(jobs, done)])  # fmt: skip

            @app.consumer(queue)
            async def effect(job: Job[Any], tx: Tx) -> None:
                await tx.execute(
                    "INSERT INTO effects (job_id, amount) VALUES (%s, %s)", (job.job_id, 1)
                )

            try:
                async with app:
                    async with app.db.transaction() as tx:
                        await tx.execute(
                            "CREATE TABLE effects (job_id text NOT NULL, amount int NOT NULL)"
                        )
                    batch = [app.job(queue, {"n": i}, job_id=f"job-{i}") for i in range(jobs)]
                    t0 = time.perf_counter()
                    for start in range(0, jobs, 2000):
                        await app.enqueue_many(batch[start : start + 2000])
                    publish = jobs / (time.perf_counter() - t0)
                    worker = app.worker(concurrency=concurrency, poll_interval=0.2)
                    cpu0, t0 = time.process_time(), time.perf_counter()
                    task = asyncio.create_task(worker.run())
                    await done.wait()
                    elapsed = time.perf_counter() - t0
                    cpu = time.process_time() - cpu0
                    worker.request_stop()
                    await task
                    async with app.db.transaction() as tx:
                        row = await tx.fetchone("SELECT count(*) FROM effects")
                    if row is None or row[0] != jobs:
                        raise RuntimeError(f"{kind}: expected {jobs} effects, found {row}")
            finally:
                if transport is not None and kind in ("rabbitmq", "nats", "pubsub"):
                    await _cleanup(kind, transport, queue)
        return Result(kind, publish, jobs / elapsed, cpu / jobs * 1000)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


async def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--transports", default=",".join(ALL))
    args = parser.parse_args()
    kinds = [k.strip() for k in args.transports.split(",") if k.strip()]
    unknown = sorted(set(kinds) - set(ALL))
    if unknown:
        sys.exit(f"unknown transport(s): {', '.join(unknown)}; choose from {', '.join(ALL)}")
    if "postgresql" not in kinds:
        kinds.insert(0, "postgresql")  # the baseline of the ratios
    console = Console()
    results: list[Result] = []
    with redis_server() as redis_url:
        for kind in kinds:
            result = await one_run(kind, args.jobs, args.concurrency, redis_url)
            console.print(
                f"  {kind}: publish {result.publish_per_s:,.0f} jobs/s, "
                f"process {result.process_per_s:,.0f} jobs/s",
                style="dim",
            )
            results.append(result)
    base = next(r for r in results if r.transport == "postgresql")
    table = Table(
        title=f"{args.jobs:,} jobs, effect = one INSERT, fence on PostgreSQL, "
        f"concurrency {args.concurrency}"
    )
    for column in ("transport", "publish jobs/s", "process jobs/s", "vs PostgreSQL",
                   "CPU s / 1000 jobs"):  # fmt: skip
        table.add_column(column, justify="right")
    for r in results:
        table.add_row(
            r.transport,
            f"{r.publish_per_s:,.0f}",
            f"{r.process_per_s:,.0f}",
            f"{r.process_per_s / base.process_per_s:.2f}×",
            f"{r.cpu_per_1000:.2f}",
        )
    console.print(table)


if __name__ == "__main__":
    asyncio.run(main())
