"""jobfence as a system under benchmark (runs in the project's virtualenv).

    python bench/systems/jobfence_sys.py setup    URL
    python bench/systems/jobfence_sys.py enqueue  URL N [--dup 0.5] [--queues Q]
    python bench/systems/jobfence_sys.py worker   URL --mode durable|noop [--concurrency N]
                                                  [--batch-size N] [--no-fence] [--transport URL]
                                                  [--queues Q] [--processes P] [--claim-log F]
    python bench/systems/jobfence_sys.py produce  URL --rate 1000 --seconds 10

``--queues Q`` spreads the jobs over Q queues (round robin) and gives the worker a consumer
on each; ``--processes P`` starts P worker processes (children of this one, which only waits);
``--claim-log F`` writes the time of each of the worker's claims to F at exit (bench/growth.py).

The durable effect is one INSERT into ``bench_effects`` inside the handler's transaction, so
it commits with the fence and the ack. ``bench/run.py`` drives these commands; they print
JSON lines on stdout (``{"ready": …}``, results) and nothing else.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

from jobfence import App, Job, Tx

QUEUE = "bench"
LANES = 8  # concurrent producers in `produce`
EFFECTS_DDL = (
    "CREATE TABLE IF NOT EXISTS bench_effects (id bigserial PRIMARY KEY, job_id text NOT NULL,"
    " t_enq float8, at timestamptz NOT NULL DEFAULT clock_timestamp())"
)
EFFECT = "INSERT INTO bench_effects (job_id, t_enq) VALUES (%s, %s)"


def say(**data: Any) -> None:
    print(json.dumps(data), flush=True)


def queue_names(queues: int) -> list[str]:
    """The queues of a run: ``bench`` alone, or ``bench-000`` … for several."""
    return [QUEUE] if queues <= 1 else [f"{QUEUE}-{i:03d}" for i in range(queues)]


def make_app(url: str, mode: str = "durable", transport: str | None = None, queues: int = 1) -> App:
    app = App(url, auto_migrate=True, transport=transport)

    async def effect(job: Job[Any], tx: Tx) -> None:
        await tx.execute(EFFECT, (job.job_id, job.payload.get("t")))

    async def noop(job: Job[Any], tx: Tx) -> None:
        return None

    for name in queue_names(queues):
        app.consumer(name)(effect if mode == "durable" else noop)
    return app


def job_ids(n: int, dup: float) -> list[str]:
    """``n`` job ids of which a fraction ``dup`` repeat an earlier one (interleaved)."""
    unique = max(1, round(n * (1 - dup)))
    return [f"job-{i % unique}" for i in range(n)]


async def setup(url: str) -> None:
    app = make_app(url)
    async with app, app.db.transaction() as tx:
        await tx.execute(EFFECTS_DDL)
    say(ok=True)


async def enqueue(url: str, n: int, dup: float, transport: str | None, queues: int = 1) -> None:
    app = make_app(url, transport=transport, queues=queues)
    names = queue_names(queues)
    async with app:
        t0 = time.perf_counter()
        ids = job_ids(n, dup)
        for start in range(0, n, 5000):
            batch = [
                app.job(names[i % len(names)], {"n": i}, job_id=ids[i])
                for i in range(start, min(n, start + 5000))
            ]
            await app.enqueue_many(batch)
        say(seconds=time.perf_counter() - t0)


async def worker(
    url: str,
    mode: str,
    concurrency: int | None,
    batch: int | None,
    fence: bool,
    transport: str | None,
    queues: int = 1,
    claim_log: str | None = None,
) -> None:
    """A worker with the library's defaults except what is given (None: the default, as a
    user who passes no flag gets it)."""
    app = make_app(url, mode, transport, queues)
    app._fence_enabled = fence
    settings: dict[str, Any] = {}
    if concurrency is not None:
        settings["concurrency"] = concurrency
    if batch is not None:
        settings["batch_size"] = batch
    w = app.worker(poll_interval=2.0, **settings)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, w.request_stop)
    await app.open(pool_size=w.concurrency + 4)
    claims = time_claims(app) if claim_log else []
    say(ready=True)
    stats = await w.run()
    await app.close()
    if claim_log:
        await asyncio.to_thread(Path(claim_log).write_text, json.dumps(claims))
    say(handled=stats.handled, outcomes={k.value: v for k, v in stats.outcomes.items() if v})


def time_claims(app: App) -> list[tuple[float, float, int]]:
    """Time each claim the worker makes (the claim statement's round trip and its rows):
    (wall-clock end, seconds, rows) per call, in the returned list (bench only)."""
    transport: Any = app.transport
    claim = transport._claim
    out: list[tuple[float, float, int]] = []

    async def timed(queues: Any, limit: int) -> Any:
        t0 = time.perf_counter()
        found = await claim(queues, limit)
        out.append((time.time(), time.perf_counter() - t0, len(found)))
        return found

    transport._claim = timed
    return out


def processes(argv: list[str], count: int) -> None:
    """``count`` worker processes (this command without ``--processes``); ready when all
    are; waits for them all (SIGTERM reaches them through the process group)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the children stop, then this returns
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    children = [
        subprocess.Popen([sys.executable, __file__, *argv], stdout=subprocess.PIPE, text=True)
        for _ in range(count)
    ]
    for child in children:
        assert child.stdout is not None
        for line in child.stdout:
            if '"ready"' in line:
                break
    say(ready=True, processes=count)
    codes = [child.wait() for child in children]
    say(exit_codes=codes)
    sys.exit(max(codes, default=0))


async def produce(url: str, rate: float, seconds: float, transport: str | None) -> None:
    """Enqueue one job per call (each its own transaction) on a steady schedule: job i is
    due at start + i / rate; eight concurrent producers keep to it when one enqueue takes
    longer than 1 / rate. The payload carries the wall-clock time of the enqueue call, the
    effect row the time it was written."""
    app = make_app(url, transport=transport)
    async with app:
        total = int(rate * seconds)
        todo = iter(range(total))
        start = time.perf_counter()

        async def lane() -> None:
            for i in todo:
                ahead = start + i / rate - time.perf_counter()
                if ahead > 0:
                    await asyncio.sleep(ahead)
                await app.enqueue(QUEUE, {"n": i, "t": time.time()}, job_id=f"job-{i}")

        await asyncio.gather(*(lane() for _ in range(LANES)))
        say(sent=total, seconds=time.perf_counter() - start)


async def bulk(url: str, n: int) -> None:
    """Enqueue ``n`` jobs in one caller transaction (``enqueue_many(connection=conn)``), then
    the same rows with COPY (the physical baseline), each timed from building the rows to the
    commit. Verifies the row counts."""
    app = make_app(url)
    async with app:
        pass  # migrate
    async with await psycopg.AsyncConnection.connect(url) as conn:
        t0 = time.perf_counter()
        async with conn.transaction():
            jobs = [app.job(QUEUE, {"n": i}, job_id=f"job-{i}") for i in range(n)]
            await app.enqueue_many(jobs, connection=conn)
        jobfence_s = time.perf_counter() - t0
        cur = await conn.execute("SELECT count(*) FROM core.jobs")
        row = await cur.fetchone()
        assert row is not None
        assert row[0] == n, row
        await conn.execute("TRUNCATE core.jobs")
        await conn.commit()
        t0 = time.perf_counter()
        async with conn.transaction():
            cur = conn.cursor()
            async with cur.copy("COPY core.jobs (queue, job_id, payload) FROM STDIN") as copy:
                for i in range(n):
                    await copy.write_row((QUEUE, f"job-{i}", json.dumps({"n": i}).encode()))
        copy_s = time.perf_counter() - t0
        cur = await conn.execute("SELECT count(*) FROM core.jobs")
        row = await cur.fetchone()
        assert row is not None
        assert row[0] == n, row
    say(jobfence=n / jobfence_s, copy=n / copy_s)


async def _enqueue_baseline(app: App, n: int) -> float:
    """The baseline of the replay and relay paths: ``enqueue_many`` of ``n`` jobs in one
    transaction (what each of them does at its core); jobs/s."""
    async with app.db.transaction() as tx:
        await tx.execute("TRUNCATE core.jobs")
    t0 = time.perf_counter()
    await app.enqueue_many([app.job(QUEUE, {"n": i}, job_id=f"job-{i}") for i in range(n)])
    return n / (time.perf_counter() - t0)


async def _count(app: App, sql: str) -> int:
    async with app.db.transaction() as tx:
        row = await tx.fetchone(sql)
    assert row is not None
    return int(row[0])


async def deadletters(url: str, n: int) -> None:
    """Bulk replay of ``n`` pending dead letters with the service functions the CLI and the
    ops API use (preview, then run), timed from confirming to done; verifies that ``n`` jobs
    were republished and every letter is marked replayed."""
    from jobfence.review import deadletters as dl
    from jobfence.review import replays

    app = make_app(url)
    async with app:
        letters = [
            {
                "queue": QUEUE, "consumer": QUEUE, "job_id": f"job-{i}", "correlation_id": None,
                "payload": json.dumps({"n": i}).encode(),
                "payload_size": len(json.dumps({"n": i}).encode()),
                "payload_truncated": False, "attempts": 1, "category": "TECHNICAL_ERROR",
                "error_code": None, "error": "bench: the ERP timed out", "history": "[]",
                "enqueued_at": None, "partner": None, "trace": None, "trace_context": None,
            }
            for i in range(n)
        ]  # fmt: skip
        async with app.db.transaction() as tx:
            await tx.qmany("insert_dead_letter", letters)
        actor = dl.Actor("bench")
        preview = await replays.preview_replay(app.db, dl.Filter(queue=QUEUE), actor=actor)
        assert preview.total == n, preview.total
        t0 = time.perf_counter()
        status = await replays.run_replay(
            app.db, app.transport, preview.replay_id, actor=actor, expected_total=n
        )
        replay_s = time.perf_counter() - t0
        assert status.counts.get("published") == n, status.counts
        assert await _count(app, "SELECT count(*) FROM core.jobs") == n
        replayed = "SELECT count(*) FROM core.dead_letters WHERE status = 'replayed'"
        assert await _count(app, replayed) == n
        say(replay=n / replay_s, enqueue=await _enqueue_baseline(app, n))


async def outbox_relay(url: str, n: int, batch: int | None) -> None:
    """``n`` outbox events written in one transaction, then one relay publishes them to the
    database queue; timed from the relay's start to the last event marked published;
    verifies ``n`` jobs in the queue."""
    from jobfence import outbox
    from jobfence.outbox.relay import Relay

    app = make_app(url)
    async with app:
        async with app.db.transaction() as tx:
            for i in range(n):
                await outbox.write(tx, QUEUE, {"n": i}, event_id=f"event-{i}")
        async with app.db.transaction() as tx:  # fresh statistics, as autovacuum keeps them
            await tx.execute("ANALYZE core.outbox")
        relay = Relay(app, batch_size=batch)
        t0 = time.perf_counter()
        relay.start()
        while relay.stats.published < n:  # noqa: ASYNC110
            await asyncio.sleep(0.002)  # in-process: no query competes with the relay
        relay_s = time.perf_counter() - t0
        await relay.stop()
        assert (await outbox.counts(app.db))[outbox.PUBLISHED] == n  # the database agrees
        assert await _count(app, "SELECT count(*) FROM core.jobs") == n
        say(relay=n / relay_s, enqueue=await _enqueue_baseline(app, n))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "command",
        choices=["setup", "enqueue", "worker", "produce", "bulk", "deadletters", "outbox"],
    )
    parser.add_argument("url")
    parser.add_argument("n", type=int, nargs="?", default=0)
    parser.add_argument("--dup", type=float, default=0.0)
    parser.add_argument("--mode", choices=["durable", "noop"], default="durable")
    parser.add_argument("--concurrency", type=int, default=None, help="default: the library's")
    parser.add_argument("--no-fence", action="store_true")
    parser.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="group commit: jobs per tx (default: the library's)",
    )
    parser.add_argument("--transport", default=None)
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--batch", type=int, default=None, help="relay: default the library's")
    parser.add_argument("--queues", type=int, default=1, help="spread over this many queues")
    parser.add_argument("--processes", type=int, default=1, help="worker processes")
    parser.add_argument("--claim-log", default=None, help="worker: claim times to this file")
    a = parser.parse_args()
    if a.command == "worker" and a.processes > 1:
        argv = sys.argv[1:]
        i = argv.index("--processes")
        processes(argv[:i] + argv[i + 2 :], a.processes)
    if a.command == "setup":
        coro: Any = setup(a.url)
    elif a.command == "enqueue":
        coro = enqueue(a.url, a.n, a.dup, a.transport, a.queues)
    elif a.command == "worker":
        coro = worker(
            a.url,
            a.mode,
            a.concurrency,
            a.batch_size,
            not a.no_fence,
            a.transport,
            a.queues,
            a.claim_log,
        )
    elif a.command == "produce":
        coro = produce(a.url, a.rate, a.seconds, a.transport)
    elif a.command == "bulk":
        coro = bulk(a.url, a.n)
    elif a.command == "deadletters":
        coro = deadletters(a.url, a.n)
    else:
        coro = outbox_relay(a.url, a.n, a.batch)
    asyncio.run(coro)
    sys.exit(0)


if __name__ == "__main__":
    main()
