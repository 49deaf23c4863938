"""Procrastinate as a peer under benchmark (runs in bench/.venv-peers).

Same commands as ``jobfence_sys.py``. The durable effect is one INSERT committed on a
connection of the task's own pool *before* the task returns, i.e. before Procrastinate marks
the job done: the same guarantee of ordering as the others (effect committed, then ack), without
a fence. Best settings per its docs: an async task, ``concurrency`` > 1 on one worker, LISTEN/
NOTIFY on, and the job row deleted on success (as jobfence does).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import time
from typing import Any

import procrastinate
from psycopg_pool import AsyncConnectionPool

QUEUE = "bench"
EFFECTS_DDL = (
    "CREATE TABLE IF NOT EXISTS bench_effects (id bigserial PRIMARY KEY, job_id text NOT NULL,"
    " t_enq float8, at timestamptz NOT NULL DEFAULT clock_timestamp())"
)
EFFECT = "INSERT INTO bench_effects (job_id, t_enq) VALUES (%s, %s)"


def say(**data: Any) -> None:
    print(json.dumps(data), flush=True)


class Bench:
    def __init__(self, url: str, pool_size: int = 10) -> None:
        self.url = url
        self.app = procrastinate.App(
            connector=procrastinate.PsycopgConnector(conninfo=url, max_size=pool_size)
        )
        self.effects: AsyncConnectionPool | None = None

        @self.app.task(name="effect", queue=QUEUE)
        async def effect(n: int, t: float | None = None) -> None:
            assert self.effects is not None
            async with self.effects.connection() as conn:  # commits on exit
                await conn.execute(EFFECT, (f"job-{n}", t))

        @self.app.task(name="noop", queue=QUEUE)
        async def noop(n: int, t: float | None = None) -> None:
            return None

        self.tasks = {"durable": effect, "noop": noop}


async def setup(url: str) -> None:
    b = Bench(url)
    async with b.app.open_async():
        await b.app.schema_manager.apply_schema_async()
        async with b.app.connector.pool.connection() as conn:
            await conn.execute(EFFECTS_DDL)
    say(ok=True)


async def enqueue(url: str, n: int, mode: str) -> None:
    b = Bench(url)
    async with b.app.open_async():
        t0 = time.perf_counter()
        task = b.tasks[mode]
        for start in range(0, n, 5000):
            await task.batch_defer_async(*({"n": i} for i in range(start, min(n, start + 5000))))
        say(seconds=time.perf_counter() - t0)


async def worker(url: str, mode: str, concurrency: int) -> None:
    # connections are capped (a shared server has max_connections = 100): jobs wait for one
    b = Bench(url, pool_size=min(concurrency + 4, 12))
    size = min(concurrency, 10)
    b.effects = AsyncConnectionPool(url, min_size=size, max_size=size, open=False)
    await b.effects.open(wait=True)
    async with b.app.open_async():
        say(ready=True)
        await b.app.run_worker_async(
            queues=[QUEUE],
            concurrency=concurrency,
            delete_jobs="successful",
            listen_notify=True,
            install_signal_handlers=True,
            shutdown_graceful_timeout=10,
        )
    await b.effects.close()
    say(stopped=True)


async def produce(url: str, rate: float, seconds: float) -> None:
    """Defer on a steady schedule (job i due at start + i / rate), eight concurrent
    producers, one job per defer."""
    b = Bench(url)
    async with b.app.open_async():
        task = b.tasks["durable"]
        total = int(rate * seconds)
        todo = iter(range(total))
        start = time.perf_counter()

        async def lane() -> None:
            for i in todo:
                ahead = start + i / rate - time.perf_counter()
                if ahead > 0:
                    await asyncio.sleep(ahead)
                await task.defer_async(n=i, t=time.time())

        await asyncio.gather(*(lane() for _ in range(8)))
        say(sent=total, seconds=time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["setup", "enqueue", "worker", "produce"])
    parser.add_argument("url")
    parser.add_argument("n", type=int, nargs="?", default=0)
    parser.add_argument("--mode", choices=["durable", "noop"], default="durable")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    a = parser.parse_args()
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    if a.command == "setup":
        asyncio.run(setup(a.url))
    elif a.command == "enqueue":
        asyncio.run(enqueue(a.url, a.n, a.mode))
    elif a.command == "worker":
        asyncio.run(worker(a.url, a.mode, a.concurrency))
    else:
        asyncio.run(produce(a.url, a.rate, a.seconds))


if __name__ == "__main__":
    main()
