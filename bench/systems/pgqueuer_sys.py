"""PGQueuer as a peer under benchmark (runs in bench/.venv-peers).

Same commands as ``jobfence_sys.py``. PGQueuer's best settings per its docs: the asyncpg
driver, batched dequeue (``batch_size``; bench/run.py tries several and keeps the best), and
several queue managers in one process, each on its own connection, as its own benchmark tool
does. The durable effect is one INSERT committed (autocommit, on an asyncpg pool) before the
entrypoint returns, i.e. before PGQueuer records the job done.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import time
from typing import Any

import asyncpg
from pgqueuer import AsyncpgDriver, AsyncpgPoolDriver, Job, Queries, QueueManager

EFFECTS_DDL = (
    "CREATE TABLE IF NOT EXISTS bench_effects (id bigserial PRIMARY KEY, job_id text NOT NULL,"
    " t_enq float8, at timestamptz NOT NULL DEFAULT clock_timestamp())"
)
EFFECT = "INSERT INTO bench_effects (job_id, t_enq) VALUES ($1, $2)"


def say(**data: Any) -> None:
    print(json.dumps(data), flush=True)


async def setup(url: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        await Queries(AsyncpgDriver(conn)).install()
        await conn.execute(EFFECTS_DDL)
    finally:
        await conn.close()
    say(ok=True)


async def enqueue(url: str, n: int, mode: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        q = Queries(AsyncpgDriver(conn))
        t0 = time.perf_counter()
        for start in range(0, n, 5000):
            idx = range(start, min(n, start + 5000))
            await q.enqueue(
                [mode] * len(idx), [json.dumps({"n": i}).encode() for i in idx], [0] * len(idx)
            )
        say(seconds=time.perf_counter() - t0)
    finally:
        await conn.close()


async def worker(url: str, batch_size: int, managers: int, pool_size: int) -> None:
    pool = await asyncpg.create_pool(url, min_size=pool_size, max_size=pool_size)
    conns = [await asyncpg.connect(url) for _ in range(managers)]
    qms = [QueueManager(Queries(AsyncpgDriver(c))) for c in conns]
    for qm in qms:

        @qm.entrypoint("durable")
        async def effect(job: Job) -> None:
            data = json.loads(job.payload or b"{}")
            await pool.execute(EFFECT, f"job-{data['n']}", data.get("t"))

        @qm.entrypoint("noop")
        async def noop(job: Job) -> None:
            return None

    def stop() -> None:
        for qm in qms:
            qm.shutdown.set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)
    say(ready=True)
    await asyncio.gather(*(qm.run(batch_size=batch_size) for qm in qms))
    for c in conns:
        await c.close()
    await pool.close()
    say(stopped=True)


async def produce(url: str, rate: float, seconds: float) -> None:
    """Enqueue on a steady schedule (job i due at start + i / rate), eight concurrent
    producers on a pool, one job per enqueue."""
    pool = await asyncpg.create_pool(url, min_size=8, max_size=8)
    try:
        q = Queries(AsyncpgPoolDriver(pool))
        total = int(rate * seconds)
        todo = iter(range(total))
        start = time.perf_counter()

        async def lane() -> None:
            for i in todo:
                ahead = start + i / rate - time.perf_counter()
                if ahead > 0:
                    await asyncio.sleep(ahead)
                await q.enqueue("durable", json.dumps({"n": i, "t": time.time()}).encode())

        await asyncio.gather(*(lane() for _ in range(8)))
        say(sent=total, seconds=time.perf_counter() - start)
    finally:
        await pool.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["setup", "enqueue", "worker", "produce"])
    parser.add_argument("url")
    parser.add_argument("n", type=int, nargs="?", default=0)
    parser.add_argument("--mode", choices=["durable", "noop"], default="durable")
    parser.add_argument("--batch-size", type=int, default=10)
    parser.add_argument("--managers", type=int, default=2)
    parser.add_argument("--pool-size", type=int, default=16)
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    a = parser.parse_args()
    if a.command == "setup":
        asyncio.run(setup(a.url))
    elif a.command == "enqueue":
        asyncio.run(enqueue(a.url, a.n, a.mode))
    elif a.command == "worker":
        asyncio.run(worker(a.url, a.batch_size, a.managers, a.pool_size))
    else:
        asyncio.run(produce(a.url, a.rate, a.seconds))


if __name__ == "__main__":
    main()
