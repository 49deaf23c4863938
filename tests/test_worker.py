"""Worker behaviour: wake-ups, leases and heartbeats, lost workers, several processes,
enqueue inside the caller's transaction, and refusing bad configuration."""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiosqlite
import psycopg
import pytest

from jobfence import (
    App,
    ConfigurationError,
    EnqueueError,
    Job,
    NonRetryableError,
    Observer,
    RetryPolicy,
    TemporaryError,
    Tx,
)
from jobfence.core.jobs import Delivery
from jobfence.review import deadletters
from jobfence.review.letters import get_letter

from .conftest import create_pg_database, drop_pg_database, pg_url
from .contract.support import wait_started
from .helpers import (
    RunningWorker,
    credit,
    eventually,
    query,
    scalar,
    start_worker,
    stop_processes,
    table,
)


async def test_idle_postgresql_worker_wakes_on_notify_not_on_polling(pg_ledger: str) -> None:
    """With a 60 s poll interval, only LISTEN/NOTIFY can make an idle worker pick up a job
    enqueued by another connection within the deadline."""
    app = App(pg_ledger)

    @app.consumer("q")
    async def handle(job: Job[Any], tx: Tx) -> None:
        await credit(tx, job.job_id, "m", 1)

    producer = App(pg_ledger)
    async with app, producer, RunningWorker(app, poll_interval=60) as w:
        await eventually(lambda: w.worker.app.transport._listener is not None, what="listening")
        await asyncio.sleep(0.2)  # let the idle worker settle into its 60 s wait
        await producer.enqueue("q", {}, job_id="wake")
        await eventually(lambda: w.stats.handled == 1, timeout=10, what="woken by NOTIFY")
    assert await query(pg_ledger, "SELECT job_id FROM ledger") == [("wake",)]


async def test_a_drained_postgresql_worker_still_sees_each_new_job_and_each_due_retry(
    pg_ledger: str,
) -> None:
    """After a claim drains the queue the next fetch skips its first claim unless woken; with
    a 60 s poll interval, jobs enqueued one at a time by another connection must still be
    picked up on their NOTIFY, and a retry that only becomes due by time (no notification)
    on its due time."""
    app = App(pg_ledger)
    fast = RetryPolicy(
        base=timedelta(seconds=0.2), cap=timedelta(seconds=1), justification="tests: fast"
    )

    @app.consumer("q", retry=fast)
    async def handle(job: Job[Any], tx: Tx) -> None:
        if job.payload.get("flaky") and job.attempt == 1:
            raise TemporaryError("first attempt fails")
        await credit(tx, job.job_id, "m", 1)

    producer = App(pg_ledger)
    async with app, producer, RunningWorker(app, poll_interval=60) as w:
        await eventually(lambda: w.worker.app.transport._listener is not None, what="listening")
        for i in range(5):
            await producer.enqueue("q", {}, job_id=f"one-{i}")
            await eventually(lambda i=i: w.stats.handled == i + 1, timeout=10, what=f"job {i}")
        await producer.enqueue("q", {"flaky": True}, job_id="flaky")
        await eventually(lambda: w.stats.handled == 7, timeout=10, what="the retry, by time")
    rows = await query(pg_ledger, "SELECT job_id FROM ledger ORDER BY job_id")
    assert rows == [("flaky",)] + [(f"one-{i}",) for i in range(5)]


class Lost(Observer):
    def __init__(self) -> None:
        self.lost = 0
        self.duplicates = 0

    def job_lost(self, delivery: Delivery, consumer: str) -> None:
        self.lost += 1

    def job_duplicate(self, delivery: Delivery, consumer: str) -> None:
        self.duplicates += 1


@pytest.fixture
def queue_database(database_url: str, tmp_path: Path) -> Any:
    if database_url.startswith("postgresql"):
        name = create_pg_database()
        yield pg_url(name)
        drop_pg_database(name)
    else:
        yield f"sqlite:///{tmp_path / 'queue.db'}"


async def test_heartbeats_keep_a_long_job_leased(ledger: str, queue_database: str) -> None:
    """A handler running 4x its lease (queue in another database, so only heartbeats hold
    the lease): no other worker takes the job over; it runs once."""
    lease = timedelta(seconds=0.6)
    observers = [Lost(), Lost()]
    apps = [
        App(ledger, transport=queue_database, lease=lease, observers=[o], auto_migrate=True)
        for o in observers
    ]
    runs: list[int] = []
    for app in apps:

        @app.consumer("q")
        async def handle(job: Job[Any], tx: Tx) -> None:
            runs.append(job.attempt)
            await asyncio.sleep(2.4)
            await credit(tx, job.job_id, "m", job.attempt)

    async with apps[0], apps[1]:
        await apps[0].enqueue("q", {}, job_id="long")
        async with RunningWorker(apps[0]) as w1, RunningWorker(apps[1]) as w2:
            await eventually(
                lambda: w1.stats.handled + w2.stats.handled >= 1, timeout=20, what="done"
            )
    assert runs == [1]
    assert [o.lost for o in observers] == [0, 0]
    assert await query(ledger, "SELECT job_id, points FROM ledger") == [("long", 1)]


async def test_a_job_that_keeps_killing_its_worker_ends_as_a_dead_letter(
    database_url: str,
) -> None:
    """Every lost delivery counts as an attempt (R1): after max attempts the next delivery
    is dead-lettered without running, with the lost attempts in its history."""
    app = App(database_url, auto_migrate=True)

    @app.consumer("q")
    async def handle(job: Job[Any], tx: Tx) -> None:
        raise AssertionError("must not run")

    async with app:
        await app.enqueue("q", {}, job_id="killer")
        # simulate six deliveries whose workers died: claim and let the lease run out
        for _ in range(6):
            claimed = await app.transport.fetch(["q"], 1, 0)
            assert len(claimed) == 1
            await _expire_leases(database_url)
            await app.transport.maintenance()
        async with RunningWorker(app) as w:
            await eventually(lambda: w.stats.handled == 1, what="dead-lettered")
        (summary,) = await deadletters.letters(app.db)
        letter = await get_letter(app.db, summary.id)
    assert letter is not None
    assert (letter.attempts, letter.error_category, letter.error_code) == (
        7,
        "TECHNICAL_ERROR",
        "ATTEMPTS_EXHAUSTED",
    )
    assert [h.attempt for h in letter.history] == [1, 2, 3, 4, 5, 6, 7]
    assert all("lease expired" in h.error for h in letter.history[:6])


async def _expire_leases(url: str) -> None:
    if url.startswith("postgresql"):
        sql = "UPDATE core.jobs SET lease_expires_at = now() - interval '1 second'"
    else:
        sql = "UPDATE core_jobs SET lease_expires_at = lease_expires_at - 3600"
    await query(url, sql)


async def test_several_worker_processes_share_one_sqlite_file(
    sqlite_database: str, tmp_path: Path
) -> None:
    """Three worker processes on one SQLite file: 200 jobs, each 3 times → 200 effects, every
    process stopping cleanly. The jobs are enqueued once every worker runs, so all three
    compete for them."""
    from .conftest import make_ledger

    await make_ledger(sqlite_database)
    env = {"JF_DB": sqlite_database, "JF_MARKS": str(tmp_path), "JF_LEASE": "10"}
    logs = [tmp_path / f"w{i}.log" for i in range(3)]
    procs = [start_worker("tests.apps.crash_app:app", env, log) for log in logs]
    try:
        for log in logs:
            await wait_started(log)
        app = App(sqlite_database)
        async with app:
            # each job holds the write lock 20 ms: one worker's claims cannot win every race
            # for the lock (with instant jobs one worker took all 600 once, under load)
            slow = {"mode": "sleep", "seconds": 0.02}
            jobs = [app.job("crash", slow, job_id=f"j-{i}") for i in range(200)] * 3
            await app.enqueue_many(jobs)
        await eventually(lambda: _queue_is_empty(sqlite_database), timeout=90, what="queue drained")
    finally:
        codes = stop_processes(procs)
    assert codes == [0, 0, 0]
    rows = await query(sqlite_database, "SELECT count(*), count(DISTINCT job_id) FROM ledger")
    assert rows == [(200, 200)]
    # Not asserted: that more than one process ran jobs. SQLite has one writer and a job's
    # transaction holds it; a worker that commits asks for it again at once while the others
    # sleep in SQLite's busy handler, so one process can win every round (it did, in CI, even
    # with each job holding the lock 20 ms). What three processes on one file must never do
    # is run a job twice or lose one: the counts above.


async def _queue_is_empty(url: str) -> bool:
    return await scalar(url, f"SELECT count(*) FROM {table(url, 'jobs')}") == 0


async def test_enqueue_in_the_callers_transaction_commits_or_rolls_back_with_it(
    pg_database: str,
) -> None:
    app = App(pg_database)
    async with app:
        async with await psycopg.AsyncConnection.connect(pg_database) as conn:
            async with conn.transaction():
                await app.enqueue("q", {"n": 1}, job_id="kept", connection=conn)
            with pytest.raises(RuntimeError):  # noqa: PT012 - the rollback is what is tested
                async with conn.transaction():
                    await app.enqueue("q", {"n": 2}, job_id="dropped", connection=conn)
                    raise RuntimeError("business write failed")
        with psycopg.connect(pg_database) as sync_conn:
            app.enqueue_sync("q", {"n": 3}, job_id="sync-kept", connection=sync_conn)
    ids = await query(pg_database, "SELECT job_id FROM core.jobs ORDER BY job_id")
    assert ids == [("kept",), ("sync-kept",)]


async def test_enqueue_in_the_callers_sqlite_transaction(sqlite_database: str) -> None:
    path = sqlite_database.removeprefix("sqlite:///")
    app = App(sqlite_database)
    async with aiosqlite.connect(path) as conn:
        await app.enqueue("q", {}, job_id="async-rolled-back", connection=conn)
        await conn.rollback()
        await app.enqueue("q", {}, job_id="async-kept", connection=conn)
        await conn.commit()
    with sqlite3.connect(path) as sync_conn:
        app.enqueue_sync("q", {}, job_id="sync-kept", connection=sync_conn)
    sync_conn.close()
    app.enqueue_sync("q", {}, job_id="own-connection")
    ids = await query(sqlite_database, "SELECT job_id FROM core_jobs ORDER BY job_id")
    assert ids == [("async-kept",), ("own-connection",), ("sync-kept",)]


async def test_a_handler_enqueues_follow_up_work_in_its_own_transaction(ledger: str) -> None:
    """Jobs enqueued with connection=tx exist only if the handler's transaction commits."""
    app = App(ledger, auto_migrate=True)

    @app.consumer("first")
    async def first(job: Job[Any], tx: Tx) -> None:
        await app.enqueue("second", {}, job_id=f"{job.job_id}-next", connection=tx)
        if job.job_id == "fails":
            raise NonRetryableError("rolled back: its follow-up must not exist")

    @app.consumer("second")
    async def second(job: Job[Any], tx: Tx) -> None:
        await credit(tx, job.job_id, "m", 1)

    async with app:
        await app.enqueue("first", {}, job_id="works")
        await app.enqueue("first", {}, job_id="fails")
        async with RunningWorker(app, queues=["first", "second"]):
            await eventually(
                lambda: query(ledger, "SELECT job_id FROM ledger"), what="follow-up processed"
            )
            await eventually(lambda: deadletters.letters(app.db), what="failing job dead")
    assert await query(ledger, "SELECT job_id FROM ledger") == [("works-next",)]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"job_id": ""}, "job_id must not be empty"),
        ({"job_id": "x" * 256}, "maximum is 255"),
        ({"job_id": "a\x00b"}, "NUL"),
        ({"correlation_id": "c" * 256}, "longer than 255"),
        ({"delay": -1}, "must not be negative"),
    ],
)
async def test_bad_enqueue_input_is_refused_clearly(
    sqlite_database: str, kwargs: dict[str, Any], message: str
) -> None:
    app = App(sqlite_database)
    with pytest.raises(EnqueueError, match=message):
        await app.enqueue("q", {}, **kwargs)
    with pytest.raises(EnqueueError, match="not JSON-serialisable"):
        await app.enqueue("q", {"when": object()})
    await app.close()


def test_a_fence_ttl_shorter_than_the_retry_window_is_refused_with_the_arithmetic() -> None:
    with pytest.raises(ConfigurationError) as info:
        App("sqlite:///x.db", fence_ttl=timedelta(minutes=30))
    message = str(info.value)
    assert "retry window 15m30s (30s + 1m + 2m + 4m + 8m) + 6 attempts × lease 30s = 18m30s" in (
        message
    )
    assert "margin of 1h (as much again, at least 1h) the TTL must exceed 1h18m30s" in message


def test_a_worker_for_an_unknown_queue_is_refused() -> None:
    app = App(f"sqlite:///{uuid.uuid4().hex}.db")

    @app.consumer("known")
    async def handle(job: Job[Any], tx: Tx) -> None:
        return None

    with pytest.raises(ConfigurationError, match="no consumer for queue\\(s\\) nope"):
        app.worker(queues=["nope"])


async def test_bulk_enqueue_uses_copy_inside_the_callers_transaction(pg_database: str) -> None:
    """A bulk enqueue (COPY on PostgreSQL) joins the caller's transaction: rolled back, no
    job exists; committed, every job exists with its exact payload and correlation id."""
    from jobfence.transports.database import COPY_THRESHOLD

    app = App(pg_database)
    n = COPY_THRESHOLD * 4
    jobs = [
        app.job("bulk", {"n": i, "text": "ünïcode\\n\t"}, job_id=f"b-{i}", correlation_id=f"c-{i}")
        for i in range(n)
    ]
    jobs.append(app.job("bulk", b"\x00raw bytes\xff", job_id="raw"))
    async with app, await psycopg.AsyncConnection.connect(pg_database) as conn:
        with pytest.raises(RuntimeError):  # noqa: PT012 - the rollback is what is tested
            async with conn.transaction():
                await app.enqueue_many(jobs, connection=conn)
                raise RuntimeError("business write failed")
        assert await scalar(pg_database, "SELECT count(*) FROM core.jobs") == 0
        async with conn.transaction():
            await app.enqueue_many(jobs, connection=conn)
    rows = await query(
        pg_database,
        "SELECT job_id, payload, correlation_id, state, run_at <= now() FROM core.jobs ORDER BY id",
    )
    assert [(r[0], bytes(r[1]), r[2], r[3], r[4]) for r in rows] == [
        (j.job_id, j.payload, j.correlation_id, "available", True) for j in jobs
    ]
