"""The database queue's claim on a queue with a Limit, in one process on PostgreSQL and
SQLite: the concurrency per key is never exceeded, a saturated key does not hold up the
others, the rate is kept, deferred jobs keep their attempts, a BackOff holds its key, and a
job enqueued without its key is keyed by the worker."""

from __future__ import annotations

import asyncio
import collections
import time
from datetime import timedelta
from typing import Any

from jobfence import App, BackOff, Job, Limit, Rate, Tx
from jobfence.runtime.flow import status

from ..helpers import RunningWorker, eventually, query, table


class Meter:
    """What the handlers saw: running jobs per key now and at most, starts, attempts."""

    def __init__(self) -> None:
        self.running: collections.Counter[str] = collections.Counter()
        self.most: collections.Counter[str] = collections.Counter()
        self.starts: dict[str, list[float]] = collections.defaultdict(list)
        self.attempts: dict[str, int] = {}
        self.done: list[str] = []

    async def run(self, key: str, job: Job[Any], seconds: float) -> None:
        self.running[key] += 1
        self.most[key] = max(self.most[key], self.running[key])
        self.starts[key].append(time.monotonic())
        try:
            await asyncio.sleep(seconds)
        finally:
            self.running[key] -= 1
        self.attempts[job.job_id] = job.attempt
        self.done.append(job.job_id)


async def test_concurrency_per_key_is_never_exceeded_and_a_full_key_blocks_no_other(
    database_url: str,
) -> None:
    app = App(database_url)
    meter = Meter()

    @app.consumer("orders", limit=Limit(concurrency=2, key="partner"))
    async def handle(job: Job[Any], tx: Tx) -> None:
        await meter.run(job.payload["partner_id"], job, job.payload["seconds"])

    async with app:
        # 30 slow jobs of acme first, then 6 quick ones of globex: with 10 worker slots and
        # acme held to 2 at once, globex must not wait behind acme's backlog
        await app.enqueue_many(
            [app.job("orders", {"partner_id": "acme", "seconds": 0.1}, job_id=f"a{i}")
             for i in range(30)]
            + [app.job("orders", {"partner_id": "globex", "seconds": 0.01}, job_id=f"g{i}")
               for i in range(6)]
        )  # fmt: skip
        async with RunningWorker(app, concurrency=10, poll_interval=0.5):
            await eventually(lambda: len(meter.done) == 36, timeout=60, what="every job done")
    # SQLite runs one job transaction at a time (its one writer): the limit is not reached
    assert meter.most["acme"] == (2 if database_url.startswith("postgresql") else 1)
    assert meter.most["globex"] <= 2
    last_globex = max(meter.done.index(f"g{i}") for i in range(6))
    assert last_globex < 15  # globex ran while acme still had half of its jobs waiting
    assert set(meter.attempts.values()) == {1}  # jobs not claimed were never attempted


async def test_the_rate_per_key_is_kept_in_every_window(database_url: str) -> None:
    app = App(database_url)
    meter = Meter()
    per = 1.0

    @app.consumer("calls", limit=Limit(rate=Rate(3, per=per), key="partner"))
    async def handle(job: Job[Any], tx: Tx) -> None:
        await meter.run(job.payload["partner_id"], job, 0)

    async with app:
        await app.enqueue_many(
            [app.job("calls", {"partner_id": p}, job_id=f"{p}{i}")
             for i in range(9) for p in ("acme", "globex")]
        )  # fmt: skip
        async with RunningWorker(app, concurrency=4, poll_interval=5, prefetch=0):
            await eventually(lambda: len(meter.done) == 18, timeout=30, what="every job done")
        # the database's own log of starts: no window of `per` holds more than 3 per key
        rows = await query(
            database_url,
            f"SELECT key, started_at FROM {table(database_url, 'flow_starts')} ORDER BY 2",
        )
    for key in ("acme", "globex"):
        times = [_seconds(at) for k, at in rows if k == key]
        assert len(times) == 9
        assert _most_in_window(times, per) == 3
        # the handler's own clock: a job starts some time after its claim (a connection to
        # open, a loaded machine), and two claims' delays differ by up to that time, so
        # starts of two windows can come closer than `per`: allowing 200 ms of it, no window
        # of per - 200 ms holds more than 3
        assert _most_in_window(meter.starts[key], per - 0.2) <= 3
        # and the worker did not sleep past the windows: 9 starts take about 3 windows
        assert meter.starts[key][-1] - meter.starts[key][0] < per * 3 + 2
    assert set(meter.attempts.values()) == {1}


async def test_back_off_holds_the_whole_key_and_refunds_the_attempt(database_url: str) -> None:
    app = App(database_url)
    meter = Meter()
    backed_off: list[float] = []

    @app.consumer("orders", limit=Limit(concurrency=5, key="partner"))
    async def handle(job: Job[Any], tx: Tx) -> None:
        if job.job_id == "a0" and not backed_off:
            backed_off.append(time.monotonic())
            raise BackOff(1.0, reason="partner 429")
        await meter.run(job.payload["partner_id"], job, 0)

    async with app:
        await app.enqueue("orders", {"partner_id": "acme"}, job_id="a0")
        async with RunningWorker(app, concurrency=4, poll_interval=5):
            await eventually(lambda: backed_off, what="the back-off")
            await app.enqueue_many(
                [app.job("orders", {"partner_id": "acme"}, job_id=f"a{i}") for i in range(1, 4)]
                + [app.job("orders", {"partner_id": "globex"}, job_id=f"g{i}") for i in range(3)]
            )
            await eventually(lambda: len(meter.done) == 7, timeout=20, what="every job done")
            limit = app.consumers["orders"].limit
            assert limit is not None
            flow = await status(app.transport.job_control(), "orders", limit)
    held_until = backed_off[0] + 1.0
    # acme started nothing until the hold ended (the database's clock and ours: 50 ms apart
    # at most); globex went on meanwhile
    assert min(meter.starts["acme"]) >= held_until - 0.05
    assert max(meter.starts["globex"]) < held_until
    assert meter.attempts["a0"] == 1  # the back-off consumed no attempt
    assert flow.holds == []


async def test_a_backed_off_job_keeps_its_history(database_url: str) -> None:
    app = App(database_url)
    seen: list[Job[Any]] = []

    @app.consumer("orders", limit=Limit(concurrency=1))
    async def handle(job: Job[Any], tx: Tx) -> None:
        seen.append(job)
        if len(seen) == 1:
            raise BackOff(0.2, reason="partner 429")

    async with app:
        await app.enqueue("orders", {}, job_id="j")
        async with RunningWorker(app, concurrency=1, poll_interval=5):
            await eventually(lambda: len(seen) == 2, what="the job run again")
    assert [j.attempt for j in seen] == [1, 1]
    [record] = seen[1].history
    assert (record.category, record.error) == ("DEFERRED", "back-off: partner 429")
    assert record.retry_at is not None


async def test_jobs_enqueued_without_their_key_are_keyed_by_the_worker(
    database_url: str,
) -> None:
    producer = App(database_url)  # knows nothing of the limit
    app = App(database_url)
    meter = Meter()

    @producer.consumer("orders")
    async def unused(job: Job[Any], tx: Tx) -> None:
        raise AssertionError("the producer runs no worker")

    @app.consumer("orders", limit=Limit(concurrency=1, key=lambda p: p["region"]))
    async def handle(job: Job[Any], tx: Tx) -> None:
        await meter.run(job.payload["region"], job, 0.05)

    async with producer, app:
        await producer.enqueue_many(
            [producer.job("orders", {"region": r}, job_id=f"{r}{i}")
             for i in range(5) for r in ("eu", "us")]
        )  # fmt: skip
        keys = await query(database_url, f"SELECT flow_key FROM {table(database_url, 'jobs')}")
        assert {k for (k,) in keys} == {None}
        async with RunningWorker(app, concurrency=4, poll_interval=0.5):
            await eventually(lambda: len(meter.done) == 10, timeout=30, what="every job done")
    assert meter.most == {"eu": 1, "us": 1}


async def test_a_job_enqueued_by_the_app_with_the_limit_carries_its_key(
    database_url: str,
) -> None:
    app = App(database_url)

    @app.consumer("orders", limit=Limit(concurrency=1, key="partner"))
    async def handle(job: Job[Any], tx: Tx) -> None:
        pass

    async with app:
        await app.enqueue("orders", {"partner_id": "acme"})
        await app.enqueue("orders", {"other": 1}, delay=timedelta(hours=1))
    keys = await query(database_url, f"SELECT flow_key FROM {table(database_url, 'jobs')}")
    assert sorted(k for (k,) in keys) == ["", "acme"]


def _seconds(value: Any) -> float:
    return value.timestamp() if hasattr(value, "timestamp") else float(value)


def _most_in_window(times: list[float], per: float) -> int:
    """The most of ``times`` in any half-open window (t - per, t]."""
    times = sorted(times)
    most = start = 0
    for end, t in enumerate(times):
        while times[start] <= t - per:
            start += 1
        most = max(most, end - start + 1)
    return most
