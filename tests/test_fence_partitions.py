"""Fences partitioned by day of expiry on PostgreSQL (issue 27): the key stays unique across
partitions — a duplicate whose first fence sits in another day is skipped, and parallel
deliveries of one job_id whose fences would expire on different days produce one fence —
the days ahead are created by the maintenance loop, and a fence never fails for want of a
partition."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from jobfence import App, Job, Tx
from jobfence.config import parse_database_url
from jobfence.core.fence import claim_tx
from jobfence.db import Database, connect
from jobfence.runtime.maintenance import Maintenance
from jobfence.runtime.partitions import add_days, days_for

from .helpers import RunningWorker, credit, eventually, query, scalar

DAY = timedelta(days=1)


@asynccontextmanager
async def opened(url: str, size: int = 4) -> AsyncIterator[Database]:
    db = connect(parse_database_url(url))
    await db.open(max_size=size)
    try:
        yield db
    finally:
        await db.close()


async def partition_of(url: str, job_id: str) -> list[str]:
    rows = await query(
        url,
        "SELECT tableoid::regclass::text FROM core.processed_jobs WHERE job_id = %s",
        (job_id,),
    )
    return [r[0] for r in rows]


async def day_partitions(url: str) -> list[str]:
    rows = await query(
        url, "SELECT name FROM core.fence_partitions() WHERE NOT is_default ORDER BY 1"
    )
    return [r[0] for r in rows]


async def fence_once(db: Database, job_id: str, ttl: timedelta) -> bool:
    async with db.transaction() as tx:
        return await claim_tx(tx, "points", job_id, ttl)


async def waiting_on_a_fence(url: str) -> bool:
    waiting = await scalar(
        url,
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = 27238 "
        "AND NOT granted",
    )
    return bool(waiting)


async def test_the_days_ahead_are_created_once_and_fences_land_in_their_day(
    pg_database: str,
) -> None:
    """add_days makes the partitions of the days fences written now expire on (a day before
    to two after), again nothing; a fence goes to its day, one beyond them to the default
    partition."""
    now = datetime.now(UTC)
    first, last = days_for(timedelta(days=7), now)
    async with opened(pg_database) as db:
        made = await add_days(db, timedelta(days=7), now)
        again = await add_days(db, timedelta(days=7), now)
        assert await fence_once(db, "week", timedelta(days=7))
        assert await fence_once(db, "month", timedelta(days=30))
    assert (made, again) == ((last - first).days + 1, 0)
    expected = [f"processed_jobs_p{(first + n * DAY):%Y%m%d}" for n in range(made)]
    assert await day_partitions(pg_database) == expected
    day = (now + timedelta(days=7)).astimezone(UTC)
    assert await partition_of(pg_database, "week") == [f"core.processed_jobs_p{day:%Y%m%d}"]
    assert await partition_of(pg_database, "month") == ["core.processed_jobs_default"]


async def test_a_new_day_takes_its_fences_out_of_the_default_partition(pg_database: str) -> None:
    """Fences written before their day existed wait in the default partition; creating the
    day moves them into it, and they still fence their keys."""
    async with opened(pg_database) as db:
        for n in range(5):
            assert await fence_once(db, f"early-{n}", timedelta(days=7))
        assert await partition_of(pg_database, "early-0") == ["core.processed_jobs_default"]
        await add_days(db, timedelta(days=7))
        assert not await fence_once(db, "early-3", timedelta(days=3))
    day = (datetime.now(UTC) + timedelta(days=7)).astimezone(UTC)
    assert await partition_of(pg_database, "early-0") == [f"core.processed_jobs_p{day:%Y%m%d}"]
    assert await scalar(pg_database, "SELECT count(*) FROM core.processed_jobs_default") == 0
    assert await scalar(pg_database, "SELECT count(*) FROM core.processed_jobs") == 5


async def test_a_duplicate_whose_fence_is_in_another_day_is_skipped(pg_database: str) -> None:
    """The first fence expires in 2 days, the duplicate would expire in 5 (another
    partition): it is skipped, and the key keeps its one fence."""
    async with opened(pg_database) as db:
        await add_days(db, timedelta(days=3))
        await add_days(db, timedelta(days=5))
        assert await fence_once(db, "j-1", timedelta(days=2))
        assert not await fence_once(db, "j-1", timedelta(days=5))
        assert not await fence_once(db, "j-1", timedelta(days=30))  # the default partition
    assert len(await partition_of(pg_database, "j-1")) == 1


@pytest.mark.parametrize("first_commits", [True, False])
async def test_a_parallel_delivery_waits_for_the_first_across_a_day_boundary(
    pg_database: str, first_commits: bool
) -> None:
    """Two deliveries of one job_id whose fences would expire on different days: the second
    waits for the first transaction; it is a duplicate if the first committed, and fences
    the key itself if the first rolled back."""
    async with opened(pg_database) as db:
        await add_days(db, timedelta(days=2))
        await add_days(db, timedelta(days=4))
        first = db.transaction()
        tx = await first.__aenter__()
        assert await claim_tx(tx, "points", "race", timedelta(days=1, hours=12))
        second = asyncio.create_task(fence_once(db, "race", timedelta(days=3, hours=12)))
        await eventually(lambda: waiting_on_a_fence(pg_database), what="the second waiting")
        assert not second.done()
        if first_commits:
            await first.__aexit__(None, None, None)
        else:
            await first.__aexit__(RuntimeError, RuntimeError("roll back"), None)
        assert await second is (not first_commits)
    assert len(await partition_of(pg_database, "race")) == 1


async def test_many_parallel_deliveries_spread_over_days_fence_each_key_once(
    pg_database: str,
) -> None:
    """12 deliveries at once of each of 20 job_ids, each with a TTL on another day (and some
    beyond the days created, in the default partition): one fence per key, one True per
    key."""
    rng = random.Random(27)
    async with opened(pg_database, size=12) as db:
        for days in range(1, 6):
            await add_days(db, timedelta(days=days))

        async def deliver(job_id: str) -> bool:
            ttl = timedelta(days=rng.choice([1, 2, 3, 4, 5, 40]), seconds=rng.random() * 3600)
            return await fence_once(db, job_id, ttl)

        for n in range(20):
            results = await asyncio.gather(*(deliver(f"k-{n}") for _ in range(12)))
            assert sum(results) == 1, results
    rows = await query(
        pg_database, "SELECT count(*), count(DISTINCT job_id) FROM core.processed_jobs"
    )
    assert rows == [(20, 20)]


async def test_group_commit_batches_and_single_fences_share_the_lock(pg_database: str) -> None:
    """A batch (core.fence_many) holding a key makes a single delivery of it wait, then
    skip; a batch meeting a key fenced on another day skips it and fences the rest."""
    async with opened(pg_database) as db:
        await add_days(db, timedelta(days=2))
        await add_days(db, timedelta(days=6))
        assert await fence_once(db, "old", timedelta(days=6))
        batch = db.transaction()
        tx = await batch.__aenter__()
        rows = await tx.fetchall(
            "SELECT fenced_job_id FROM core.fence_many(%s, %s, %s) ORDER BY 1",
            (["points"] * 4, ["a", "b", "old", "a"], timedelta(days=2).total_seconds()),
        )
        assert rows == [("a",), ("b",)]
        single = asyncio.create_task(fence_once(db, "b", timedelta(days=6)))
        await eventually(lambda: waiting_on_a_fence(pg_database), what="the single waiting")
        await batch.__aexit__(None, None, None)
        assert await single is False
    assert await scalar(pg_database, "SELECT count(*) FROM core.processed_jobs") == 3


async def test_a_repeatable_read_transaction_is_refused_with_the_reason(pg_database: str) -> None:
    """Its snapshot predates the wait for a parallel delivery: it could not see that
    delivery's fence, so it may not write one."""
    async with opened(pg_database) as db, db.transaction() as tx:
        await tx.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        with pytest.raises(psycopg.Error, match="REPEATABLE READ") as caught:
            await claim_tx(tx, "points", "rr", timedelta(days=7))
    assert "READ COMMITTED" in str(caught.value.diag.message_hint)


async def test_a_worker_creates_the_days_ahead_and_fences_its_jobs_there(pg_ledger: str) -> None:
    """With the defaults, a worker's maintenance makes the days before its jobs' fences
    need them; every fence is in its day, none in the default partition."""
    app = App(pg_ledger, maintenance=Maintenance(cleanup_interval=timedelta(seconds=0.2)))

    @app.consumer("points")
    async def handle(job: Job[Any], tx: Tx) -> None:
        await credit(tx, job.job_id, "m", 1)

    async def days_made() -> bool:
        return len(await day_partitions(pg_ledger)) >= 4

    async with app, RunningWorker(app) as w:
        await eventually(days_made, what="the days ahead")
        await app.enqueue_many([app.job("points", {}, job_id=f"j-{i}") for i in range(20)])
        await eventually(lambda: w.stats.handled == 20, what="20 jobs")
    homes = {p for i in range(20) for p in await partition_of(pg_ledger, f"j-{i}")}
    day = datetime.now(UTC) + app.fence_ttl
    assert homes <= {
        f"core.processed_jobs_p{day:%Y%m%d}",
        f"core.processed_jobs_p{(day + timedelta(minutes=1)):%Y%m%d}",  # around midnight
    }


async def test_parallel_deliveries_racing_the_creation_of_their_day_fence_once(
    pg_database: str,
) -> None:
    """The day new fences expire on is created while 16 deliveries of one job_id fence it
    (the first ones land in the default partition and move): one fence, one True, each of 15
    rounds. (With the new day attached under a lock on the default partition only, a
    delivery planned without the day missed the moved fence: two fences every round.)"""
    rng = random.Random(2027)
    async with opened(pg_database, size=17) as db:
        for n in range(15):
            ttl = timedelta(days=100 + n, hours=1)

            async def deliver() -> bool:
                await asyncio.sleep(rng.random() * 0.05)
                return await fence_once(db, f"race-{n}", ttl)  # noqa: B023

            async def make_day() -> int:
                await asyncio.sleep(rng.random() * 0.05)
                return await add_days(db, ttl)  # noqa: B023

            *fenced, made = await asyncio.gather(*(deliver() for _ in range(16)), make_day())
            assert (sum(fenced), made > 0) == (1, True)
    rows = await query(
        pg_database, "SELECT count(*), count(DISTINCT job_id) FROM core.processed_jobs"
    )
    assert rows == [(15, 15)]


async def test_workers_making_the_same_days_at_once_make_each_once(pg_database: str) -> None:
    """Every worker's maintenance makes the days ahead: four at once make each day once, and
    none fails (the one that waited for the lock finds the day made)."""
    async with opened(pg_database, size=4) as db:
        made = await asyncio.gather(*(add_days(db, timedelta(days=7)) for _ in range(4)))
    first, last = days_for(timedelta(days=7), datetime.now(UTC))
    assert sum(made) == (last - first).days + 1
    assert len(await day_partitions(pg_database)) == (last - first).days + 1
