"""Flow control on Redis Streams, in process: two workers (two apps, each its own connection
to Redis and to the database, as two processes would have) share one limit (issue 26).

The same measures as the RabbitMQ proofs (tests/flow_brokers/test_rabbitmq.py), on the
handler's records by the database's clock; and a handler's BackOff holding its whole key on
both workers, while another key runs on.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from contextlib import AsyncExitStack
from datetime import timedelta
from typing import Any

import pytest

from jobfence import (
    App,
    BackOff,
    BusinessError,
    Job,
    Limit,
    Observer,
    Rate,
    RetryPolicy,
    TemporaryError,
    Tx,
)
from jobfence.core.jobs import Delivery
from jobfence.review import deadletters
from jobfence.runtime.harness import Outcome

from ..contract.support import Target, cleanup, make_target
from ..helpers import RunningWorker, eventually, query
from .support import create_runs_table, most_at_once_per_key, most_in_window, runs

LATENESS = 0.25  # see tests/flow_brokers/test_rabbitmq.py
POLICY = RetryPolicy(
    base=timedelta(seconds=0.2),
    cap=timedelta(seconds=1),
    justification="flow proofs: no job is expected to fail",
)


@pytest.fixture
def redis(request: pytest.FixtureRequest) -> Iterator[Target]:
    made = make_target("redis", request)
    create_runs_table(made.database_url)
    yield made
    asyncio.run(cleanup(made))


class Deferrals(Observer):
    def __init__(self) -> None:
        self.seen: list[tuple[str, int, str, str, float]] = []

    def job_deferred(
        self, delivery: Delivery, consumer: str, reason: str, key: str, delay: timedelta
    ) -> None:
        self.seen.append((delivery.job_id, delivery.attempt, reason, key, delay.total_seconds()))


def _app(target: Target, limit: Limit, seen: Deferrals) -> App:
    app = App(
        target.database_url,
        transport=target.transport_url,
        lease=timedelta(seconds=3),
        auto_migrate=True,
        observers=[seen],
    )

    @app.consumer(target.queue, limit=limit, retry=POLICY)
    async def handle(job: Job[dict[str, Any]], tx: Tx) -> None:
        row = await tx.fetchone("SELECT clock_timestamp()")
        assert row is not None
        if job.payload.get("mode") == "backoff" and not job.history:
            raise BackOff(seconds=float(job.payload["seconds"]), reason="partner said 429")
        await asyncio.sleep(float(job.payload.get("seconds", 0)))
        await tx.execute(
            "INSERT INTO flow_runs (job_id, key, attempt, lost, pid, started, ended) "
            "VALUES (%s, %s, %s, %s, 0, %s, clock_timestamp())",
            (job.job_id, job.payload["key"], job.attempt, len(job.history), row[0]),
        )

    return app


async def test_two_workers_share_a_keys_concurrency_and_rate(redis: Target) -> None:
    """2 keys × 12 jobs of 0.1 s under Limit(concurrency=2, rate=4 per second) on two
    workers of 4 slots each: per key at most 2 at once (and 2 reached), at most 4 starts
    in any window of 1 s (less the allowance), each job once as attempt 1, deferred for
    both reasons (jobs wait for a slot; after 4 starts, for the window)."""
    limit = Limit(concurrency=2, rate=Rate(4, per=timedelta(seconds=1)), key=lambda p: p["key"])
    seen = Deferrals()
    jobs = {f"{key}-{n}": key for key in "xy" for n in range(12)}
    async with AsyncExitStack() as stack:
        apps = [_app(redis, limit, seen) for _ in range(2)]
        for app in apps:
            await stack.enter_async_context(app)
        for job_id, key in jobs.items():
            await apps[0].enqueue(redis.queue, {"key": key, "seconds": 0.1}, job_id=job_id)
        for app in apps:
            await stack.enter_async_context(RunningWorker(app, concurrency=4, poll_interval=0.2))
        await eventually(lambda: _count(redis, len(jobs)), timeout=60, what="all jobs ran")
        assert await deadletters.letters(apps[0].db) == []
    found = await runs(redis.database_url)
    assert Counter(r.job_id for r in found) == Counter(list(jobs))
    assert {(r.attempt, r.lost) for r in found} == {(1, 0)}  # lost: the history's length here
    at_once = most_at_once_per_key(found)
    assert max(at_once.values()) == 2, at_once
    for key in "xy":
        starts = [r.started for r in found if r.key == key]
        assert most_in_window(starts, 1.0 - LATENESS) <= 4, key
        # 12 starts at 4 per second: the 9th starts two windows after the 1st
        assert (starts[8] - starts[0]).total_seconds() >= 2 * (1.0 - LATENESS), starts
    reasons = Counter(reason for _, _, reason, _, _ in seen.seen)
    assert set(reasons) == {"concurrency", "rate"}, reasons
    assert {attempt for _, attempt, _, _, _ in seen.seen} == {1}


async def test_a_back_off_holds_the_whole_key_on_every_worker(redis: Target) -> None:
    """A job of key ``p`` raises BackOff(2 s): no other job of ``p`` starts on either worker
    until the hold ends, while key ``q`` runs on; the job that backed off runs again after
    the hold as attempt 1, the back-off in its history."""
    limit = Limit(concurrency=5, key=lambda p: p["key"])
    seen = Deferrals()
    async with AsyncExitStack() as stack:
        apps = [_app(redis, limit, seen) for _ in range(2)]
        for app in apps:
            await stack.enter_async_context(app)
        await apps[0].enqueue(
            redis.queue, {"key": "p", "mode": "backoff", "seconds": 2}, job_id="p-429"
        )
        for app in apps:
            await stack.enter_async_context(RunningWorker(app, concurrency=3, poll_interval=0.2))
        await eventually(lambda: any(s[2] == "backoff" for s in seen.seen), what="the back-off")
        held = await query(
            redis.database_url,
            "SELECT until, clock_timestamp() FROM core.flow_holds "
            "WHERE queue = %s AND key = 'p' AND kind = 'backoff'",
            (redis.queue,),
        )
        assert len(held) == 1, held
        until = held[0][0]
        for n in range(6):
            await apps[n % 2].enqueue(redis.queue, {"key": "p"}, job_id=f"p-{n}")
            await apps[n % 2].enqueue(redis.queue, {"key": "q"}, job_id=f"q-{n}")
        await eventually(lambda: _count(redis, 13), timeout=60, what="all jobs ran")
    found = {r.job_id: r for r in await runs(redis.database_url)}
    assert all(found[f"q-{n}"].started < until for n in range(6))  # q ran during the hold
    assert all(found[f"p-{n}"].started >= until for n in range(6))  # p waited for its end
    assert found["p-429"].started >= until
    assert (found["p-429"].attempt, found["p-429"].lost) == (1, 1)  # one entry: the back-off
    deferred_p = {s[0] for s in seen.seen if s[3] == "p" and s[2] == "backoff"}
    assert deferred_p >= {"p-429"}
    assert not any(s[3] == "q" for s in seen.seen)


async def _count(target: Target, expected: int) -> bool:
    rows = await query(target.database_url, "SELECT count(*) FROM flow_runs")
    return int(rows[0][0]) == expected


async def test_slots_come_back_after_every_outcome(redis: Target) -> None:
    """Limit(concurrency=1) and a lease of 60 s: a job that fails once (retried), one that is
    dead-lettered and one that succeeds all end, one after another on the one slot, and no
    live slot is left: each outcome gave its slot back (an expiry could not have, within a
    minute)."""
    app = App(redis.database_url, transport=redis.transport_url, lease=timedelta(seconds=60),
              auto_migrate=True)  # fmt: skip
    ran: list[tuple[str, int]] = []

    @app.consumer(redis.queue, limit=Limit(concurrency=1), retry=POLICY)
    async def handle(job: Job[dict[str, Any]], tx: Tx) -> None:
        ran.append((job.job_id, job.attempt))
        if job.job_id == "flaky" and job.attempt == 1:
            raise TemporaryError("once")
        if job.job_id == "bad":
            raise BusinessError("never")

    async with app:
        for job_id in ("flaky", "bad", "good"):
            await app.enqueue(redis.queue, {"n": 1}, job_id=job_id)
        async with RunningWorker(app, concurrency=3, poll_interval=0.2) as w:
            outcomes = w.stats.outcomes
            await eventually(
                lambda: (outcomes[Outcome.PROCESSED], outcomes[Outcome.DEAD]) == (2, 1),
                timeout=60,
                what="every job's outcome",
            )
            assert outcomes[Outcome.RETRY] == 1
            assert sorted(ran) == [("bad", 1), ("flaky", 1), ("flaky", 2), ("good", 1)]
            assert [letter.job_id for letter in await deadletters.letters(app.db)] == ["bad"]
            live = await query(
                redis.database_url,
                "SELECT count(*) FROM core.flow_slots WHERE queue = %s "
                "AND expires_at > clock_timestamp()",
                (redis.queue,),
            )
            assert live[0][0] == 0
