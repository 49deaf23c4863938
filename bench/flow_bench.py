"""Flow control's cost and accuracy on the PostgreSQL queue (issue 26).

    .venv/bin/python bench/flow_bench.py cost [--jobs 20000] [--repeat 3]
    .venv/bin/python bench/flow_bench.py cost --transport redis|rabbitmq [--jobs 5000]
    .venv/bin/python bench/flow_bench.py rate [--rate 400] [--per 2] [--windows 6] [--repeat 3]

``cost``: the durable-effect workload (one INSERT per job) drained by one in-process worker
at its defaults, with a Limit on the queue that is never reached (concurrency 10 000 and
1 000 000 starts a second per partner, 10 partners: every claim goes through the limited
claim and records its starts) against the same workload without a Limit, in pairs, each on
a fresh database. CPU per job is the worker's process time plus the PostgreSQL backends'
(read from /proc), over the drain. Target: the limit costs <= 10 % CPU per job.
With ``--transport redis`` or ``rabbitmq`` the same pairs run on that broker (the fence's
database on PostgreSQL, a queue of its own per run): every delivery of the limited queue is
admitted before its handler (a slot and a start) and gives its slot back with its outcome,
so the difference is the brokers' admission. The brokers' own CPU is not counted (the same
with and without a limit).

``rate``: one key with ``Rate(rate, per)`` and ``rate × windows`` jobs waiting (a saturated
limit): the rate of the starts the claims recorded, from the first to the last, against the
configured rate. A sliding window lets each start's successor go `per` after it, so every
window's delay in claiming (a worker's wake-up and its claim, some milliseconds) slows the
rate by that delay over `per`. Target: within 2 %. Prints one JSON line per mode (what
bench/run.py's ``flow`` workload reads) after a readable summary.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

from jobfence import App, Job, Limit, Observer, Rate, Tx

ADMIN = os.environ.get("JOBFENCE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
BROKERS = {
    "redis": os.environ.get("JOBFENCE_BENCH_REDIS", "redis://127.0.0.1:6379/0"),
    "rabbitmq": os.environ.get("JOBFENCE_BENCH_RABBITMQ", "amqp://guest:guest@127.0.0.1:5672/"),
}
#: clock ticks a second (/proc/<pid>/stat counts CPU time in them)
TICKS = os.sysconf("SC_CLK_TCK")
PARTNERS = 10


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
def fresh_database() -> Iterator[str]:
    name = f"jf_bench_flow_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(ADMIN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')  # type: ignore[arg-type]
    try:
        yield ADMIN.rsplit("/", 1)[0] + "/" + name
    finally:
        with psycopg.connect(ADMIN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')  # type: ignore[arg-type]


class ServerCPU:
    """CPU seconds of the PostgreSQL backends serving one database, from /proc (the server
    and the benchmark share the machine): each backend's last seen total minus its first."""

    def __init__(self, url: str) -> None:
        self.conn = psycopg.connect(url, autocommit=True)
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}

    def sample(self) -> None:
        rows = self.conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid()"
        ).fetchall()
        for (pid,) in rows:
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            seconds = (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime
            self.first.setdefault(pid, seconds)
            self.last[pid] = seconds

    def spent(self) -> float:
        return sum(v - self.first[pid] for pid, v in self.last.items())

    def close(self) -> None:
        self.conn.close()


@contextmanager
def broker_queue(transport: str) -> Iterator[tuple[str | None, str]]:
    """The transport URL (None: the database queue) and a queue name private to one run;
    the broker's streams or queues of the run are removed after it."""
    token = uuid.uuid4().hex[:8]
    if transport == "database":
        yield None, "bench"
        return
    url = BROKERS[transport]
    if transport == "redis":  # RabbitMQ's queue name is the run's own already
        url = f"{url}{'&' if '?' in url else '?'}prefix=jfbench:{token}"
    queue = f"bench_{token}"
    try:
        yield url, queue
    finally:
        asyncio.run(_remove_broker_queue(transport, url, queue))


async def _remove_broker_queue(transport: str, url: str, queue: str) -> None:
    if transport == "rabbitmq":
        import aio_pika

        from jobfence.transports.rabbitmq import exhausted_name

        conn = await aio_pika.connect(url)
        try:
            channel = await conn.channel()
            for name in (queue, exhausted_name(queue)):
                await channel.queue_delete(name)
        finally:
            await conn.close()
        return
    from datetime import timedelta

    from jobfence.transports.redis import RedisTransport

    red = RedisTransport.from_url(url, lease=timedelta(seconds=5), worker_id="bench-cleanup")
    await red.open()
    try:
        keys = [k async for k in red.redis.scan_iter(match=f"{red.prefix}:*")]
        if keys:
            await red.redis.delete(*keys)
    finally:
        await red.close()


async def cost_run(
    jobs: int, limited: bool, transport_url: str | None, queue: str
) -> dict[str, float]:
    """One drain of ``jobs`` durable jobs of ``queue`` (on the broker at ``transport_url``;
    None: the database queue); CPU ms per job (worker, server) and jobs/s."""
    with fresh_database() as url:
        done = asyncio.Event()
        app = App(url, transport=transport_url, auto_migrate=True, observers=[_Counter(jobs, done)])
        limit = Limit(concurrency=10_000, rate=Rate(1_000_000, per=1), key="partner")

        @app.consumer(queue, limit=limit if limited else None)
        async def effect(job: Job[Any], tx: Tx) -> None:
            await tx.execute(
                "INSERT INTO effects (job_id, amount) VALUES (%s, %s)", (job.job_id, 1)
            )

        async with app:
            async with app.db.transaction() as tx:
                await tx.execute("CREATE TABLE effects (job_id text NOT NULL, amount int NOT NULL)")
            batch = [
                app.job(queue, {"partner_id": f"p{i % PARTNERS}"}, job_id=f"job-{i}")
                for i in range(jobs)
            ]
            for start in range(0, jobs, 5000):
                await app.enqueue_many(batch[start : start + 5000])
            async with app.db.transaction() as tx:
                await tx.execute("ANALYZE")
            server = ServerCPU(url)
            worker = app.worker(poll_interval=0.2)
            task = asyncio.create_task(worker.run())
            await asyncio.sleep(0)
            server.sample()
            cpu0, t0 = time.process_time(), time.perf_counter()
            sampler = asyncio.create_task(_sample(server))
            await done.wait()
            elapsed = time.perf_counter() - t0
            cpu = time.process_time() - cpu0
            server.sample()
            sampler.cancel()
            worker.request_stop()
            await task
            server.close()
            async with app.db.transaction() as tx:
                row = await tx.fetchone("SELECT count(*), count(DISTINCT job_id) FROM effects")
            if row is None or tuple(row) != (jobs, jobs):
                raise RuntimeError(f"expected {jobs} distinct effects, found {row}")
        return {
            "jobs_per_s": jobs / elapsed,
            "worker_ms": cpu / jobs * 1000,
            "server_ms": server.spent() / jobs * 1000,
        }


async def _sample(server: ServerCPU) -> None:
    while True:
        await asyncio.sleep(0.5)
        server.sample()


async def rate_run(rate: int, per: float, windows: int) -> dict[str, float]:
    """``rate × windows`` jobs of one key under ``Rate(rate, per)``: the starts' rate."""
    jobs = rate * windows
    with fresh_database() as url:
        done = asyncio.Event()
        app = App(url, auto_migrate=True, observers=[_Counter(jobs, done)])

        @app.consumer("bench", limit=Limit(rate=Rate(rate, per=per)))
        async def effect(job: Job[Any], tx: Tx) -> None:
            await tx.execute(
                "INSERT INTO effects (job_id, amount) VALUES (%s, %s)", (job.job_id, 1)
            )

        async with app:
            async with app.db.transaction() as tx:
                await tx.execute("CREATE TABLE effects (job_id text NOT NULL, amount int NOT NULL)")
                # the worker prunes the log of starts as it ages: a trigger keeps a copy
                await tx.execute("CREATE TABLE starts_log (started_at timestamptz NOT NULL)")
                await tx.execute(
                    "CREATE FUNCTION log_start() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                    "INSERT INTO starts_log VALUES (NEW.started_at); RETURN NEW; END $$"
                )
                await tx.execute(
                    "CREATE TRIGGER log_start AFTER INSERT ON core.flow_starts "
                    "FOR EACH ROW EXECUTE FUNCTION log_start()"
                )
            batch = [app.job("bench", {}, job_id=f"job-{i}") for i in range(jobs)]
            for start in range(0, jobs, 5000):
                await app.enqueue_many(batch[start : start + 5000])
            worker = app.worker(poll_interval=2.0)
            task = asyncio.create_task(worker.run())
            await done.wait()
            worker.request_stop()
            await task
            async with app.db.transaction() as tx:
                row = await tx.fetchone(
                    "SELECT count(*), extract(epoch FROM max(started_at) - min(started_at)) "
                    "FROM starts_log"
                )
    if row is None or row[0] != jobs:
        raise RuntimeError(f"expected {jobs} starts logged, found {row}")
    # the first window's starts go at once; each later window's follow the window before's
    # by `per`: (jobs - rate) starts over the span from the first start to the last
    achieved = (jobs - rate) / float(row[1])
    configured = rate / per
    return {"configured": configured, "achieved": achieved, "ratio": achieved / configured}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["cost", "rate"])
    parser.add_argument("--jobs", type=int, default=None, help="20000; 5000 on a broker")
    parser.add_argument("--transport", choices=["database", *BROKERS], default="database")
    parser.add_argument("--rate", type=int, default=400)
    parser.add_argument("--per", type=float, default=2.0)
    parser.add_argument("--windows", type=int, default=6)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    if args.jobs is None:
        args.jobs = 20_000 if args.transport == "database" else 5_000
    if args.mode == "cost":
        pairs = []
        for _ in range(args.repeat):
            # the pair's order alternates: drift hits both alike
            first, second = (True, False) if len(pairs) % 2 else (False, True)
            with broker_queue(args.transport) as (transport_url, queue):
                a = asyncio.run(cost_run(args.jobs, first, transport_url, queue))
            with broker_queue(args.transport) as (transport_url, queue):
                b = asyncio.run(cost_run(args.jobs, second, transport_url, queue))
            limited, plain = (a, b) if first else (b, a)
            pairs.append((limited, plain))

        def total(r: dict[str, float]) -> float:
            return r["worker_ms"] + r["server_ms"]

        ratios = [total(lim) / total(pl) - 1 for lim, pl in pairs]
        out = {
            "mode": "cost",
            "transport": args.transport,
            "jobs": args.jobs,
            "limited_cpu_ms": statistics.median(total(lim) for lim, _ in pairs),
            "plain_cpu_ms": statistics.median(total(pl) for _, pl in pairs),
            "limited_worker_ms": statistics.median(lim["worker_ms"] for lim, _ in pairs),
            "limited_server_ms": statistics.median(lim["server_ms"] for lim, _ in pairs),
            "plain_worker_ms": statistics.median(pl["worker_ms"] for _, pl in pairs),
            "plain_server_ms": statistics.median(pl["server_ms"] for _, pl in pairs),
            "limited_jobs_per_s": statistics.median(lim["jobs_per_s"] for lim, _ in pairs),
            "plain_jobs_per_s": statistics.median(pl["jobs_per_s"] for _, pl in pairs),
            "cost": statistics.median(ratios),
            "costs": ratios,
        }
        print(
            f"{args.transport}: CPU per job: {out['limited_cpu_ms']:.3f} ms with a Limit "
            "(not reached), "
            f"{out['plain_cpu_ms']:.3f} ms without: {out['cost']:+.1%} "
            f"(pairs {', '.join(f'{r:+.1%}' for r in ratios)}); "
            f"{out['limited_jobs_per_s']:,.0f} vs {out['plain_jobs_per_s']:,.0f} jobs/s",
            file=sys.stderr,
        )
    else:
        runs = [
            asyncio.run(rate_run(args.rate, args.per, args.windows)) for _ in range(args.repeat)
        ]
        out = {
            "mode": "rate",
            "configured": args.rate / args.per,
            "achieved": statistics.median(r["achieved"] for r in runs),
            "ratio": statistics.median(r["ratio"] for r in runs),
            "ratios": [r["ratio"] for r in runs],
        }
        print(
            f"saturated rate: {out['achieved']:.1f} starts/s for {out['configured']:.1f}/s "
            "configured "
            f"({out['ratio'] - 1:+.2%}; runs {', '.join(f'{r - 1:+.2%}' for r in out['ratios'])})",
            file=sys.stderr,
        )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
