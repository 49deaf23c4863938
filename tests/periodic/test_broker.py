"""Periodic jobs on a broker (Redis Streams): the ticks are published before the schedule's
row commits, so a scheduler lost in between leaves them published and not recorded; the
next scheduler publishes them again, and the fence runs each tick once."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from datetime import timedelta
from typing import Any

import pytest

from jobfence import App, Job, Tx
from jobfence.core.jobs import OutgoingJob
from jobfence.db import Tx as DbTx
from jobfence.runtime.harness import Outcome
from jobfence.runtime.scheduler import Scheduler
from jobfence.transports.redis import RedisTransport

from ..conftest import make_ledger
from ..contract.support import Target, cleanup, make_target
from ..helpers import RunningWorker, credit, eventually, query
from .test_scheduler import move_back


class LostBeforeCommit(RedisTransport):
    """A scheduler's host lost right after the broker took the ticks, before its database
    commit: the publish reaches the real Redis, then the transaction fails."""

    async def publish_tx(self, tx: DbTx, jobs: Sequence[OutgoingJob]) -> bool:
        await super().publish_tx(tx, jobs)
        raise ConnectionResetError("the scheduler's host went away before its commit")


@pytest.fixture
def redis_target(request: pytest.FixtureRequest) -> Iterator[Target]:
    made = make_target("redis", request)
    yield made
    asyncio.run(cleanup(made))


def beat(app: App, queue: str) -> App:
    app.periodic("beat", cron="* * * * * *", queue=queue, missed="all")

    @app.consumer(queue)
    async def handle(job: Job[Any], tx: Tx) -> None:
        await credit(tx, job.job_id, "m", job.attempt)

    return app


async def test_ticks_published_twice_run_once(redis_target: Target) -> None:
    target = redis_target
    assert target.transport_url is not None
    await make_ledger(target.database_url)
    lost = LostBeforeCommit.from_url(
        target.transport_url, lease=timedelta(seconds=5), worker_id="lost"
    )
    first = beat(App(target.database_url, transport=lost), target.queue)
    second = beat(App(target.database_url, transport=target.transport_url), target.queue)
    async with first, second:
        doomed = Scheduler(first.runtime)
        await doomed.define()
        await move_back(target.database_url, 6)
        await doomed.tick()  # logged, and tried again a second later
        assert doomed.enqueued == 0
        rows = await query(target.database_url, "SELECT last_job_id FROM core.schedules")
        assert rows == [(None,)]  # rolled back: the ticks are published, not recorded
        survivor = Scheduler(second.runtime)
        await survivor.tick()
        assert survivor.enqueued >= 6
        async with RunningWorker(second, scheduler=False, poll_interval=0.2) as running:
            await eventually(
                lambda: _all_run(target.database_url, survivor.enqueued),
                timeout=30,
                what="every tick run",
            )
            await eventually(
                lambda: running.stats.outcomes[Outcome.DUPLICATE] >= 6,
                timeout=30,
                what="the ticks published twice met the fence",
            )
    counts = await query(target.database_url, "SELECT job_id, count(*) FROM ledger GROUP BY job_id")
    assert len(counts) == survivor.enqueued
    assert {n for _, n in counts} == {1}


async def _all_run(url: str, ticks: int) -> bool:
    rows = await query(url, "SELECT count(DISTINCT job_id) FROM ledger")
    return int(rows[0][0]) >= ticks
