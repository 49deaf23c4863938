"""Cleanup of fences partitioned by day of expiry (PostgreSQL, issue 27): a day goes whole
once every fence in it expired more than min_age ago — after the fences SPEC T2 keeps (a
letter pending review or replayed within min_age, a job still retrying) moved out of it — and
a day not yet due stays, whole."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from jobfence.core.fence import claim_tx
from jobfence.db import Database
from jobfence.runtime.cleanup import cleanup_fences
from jobfence.runtime.partitions import add_days, days_for, detach_days, purge

from ..helpers import query, scalar
from .conftest import letter_params, opened, seed_letters
from .test_cleanup import MIN_AGE, add_fences, fences, review

TTL = timedelta(days=7)
DAY = timedelta(days=1)


async def day_partitions(url: str) -> list[str]:
    rows = await query(url, "SELECT name FROM core.fence_partitions() WHERE NOT is_default")
    return sorted(r[0] for r in rows)


async def test_an_expired_day_is_dropped_whole_and_the_fences_cleanup_keeps_move_out(
    pg_database: str,
) -> None:
    """Four days of fences; the clock pinned so that the first three are due. They are
    dropped as tables (no row deleted one by one) but for the fences of a letter pending
    review, of one replayed minutes ago and of a job still retrying, which now expire a day
    after the clock; the last day stays with its fences."""
    url = pg_database
    now = datetime.now(UTC)
    first, last = days_for(TTL, now)
    async with opened(url) as db:
        await add_days(db, TTL, now)
    days = [datetime(d.year, d.month, d.day, 12, tzinfo=UTC) for d in (first, last)]
    days[1:1] = [days[0] + timedelta(days=n) for n in range(1, (last - first).days)]
    assert len(await day_partitions(url)) == len(days) == 4
    rows = []
    for n, noon in enumerate(days):
        rows += [("points", f"d{n}-{i}", noon - TTL, noon) for i in range(50)]
    keep = ["d0-pending", "d1-replayed-recently", "d2-retrying", "d0-replayed-long-ago"]
    rows += [
        ("points", job_id, days[int(job_id[1])] - TTL, days[int(job_id[1])]) for job_id in keep
    ]
    await add_fences(url, rows)
    await query(
        url,
        "INSERT INTO core.jobs (queue, job_id, payload, history) "
        "VALUES ('points', 'd2-retrying', '\\x7b7d', '[{\"attempt\": 1}]')",
    )
    clock = datetime(last.year, last.month, last.day, tzinfo=UTC) + MIN_AGE  # day 3 starts
    pending, recent, long_ago = await seed_letters(
        url,
        [
            letter_params("postgresql", "d0-pending", queue="points"),
            letter_params("postgresql", "d1-replayed-recently", queue="points"),
            letter_params("postgresql", "d0-replayed-long-ago", queue="points"),
        ],
    )
    await review(url, recent, "replayed", clock - timedelta(minutes=5))
    await review(url, long_ago, "replayed", clock - timedelta(days=2))

    async with opened(url) as db:
        early = await cleanup_fences(db, min_age=MIN_AGE, now=clock - timedelta(seconds=1))
        result = await cleanup_fences(db, min_age=MIN_AGE, now=clock)
        again = await cleanup_fences(db, min_age=MIN_AGE, now=clock)

    assert (early.days, early.deleted) == (2, 100 + 1)  # day 2 ends 1 s too late
    assert (result.days, result.deleted, result.batches) == (1, 50, 1)
    assert (again.days, again.deleted) == (0, 0)
    assert await day_partitions(url) == [f"processed_jobs_p{last:%Y%m%d}"]
    left = await fences(url)
    assert sorted(j for j in left if not j.startswith("d3-")) == sorted(keep[:3])
    assert len([j for j in left if j.startswith("d3-")]) == 50
    moved = await query(
        url,
        "SELECT job_id, tableoid::regclass::text, expires_at FROM core.processed_jobs "
        "WHERE job_id = ANY(%s) ORDER BY job_id",
        (keep[:3],),
    )
    assert {home for _, home, _ in moved} == {"core.processed_jobs_default"}
    assert {expires for _, _, expires in moved} == {
        clock - timedelta(seconds=1) + timedelta(days=1),  # days 0 and 1: the first round
        clock + timedelta(days=1),  # day 2: the second
    }
    assert pending


async def test_a_day_whose_locks_are_busy_stays_until_the_next_round(pg_database: str) -> None:
    """A transaction still reading the fences holds the table: the drop waits 1 s for its
    lock, gives up without an error, and the next round drops the day."""
    url = pg_database
    now = datetime.now(UTC)
    first, last = days_for(TTL, now)
    noon = datetime(first.year, first.month, first.day, 12, tzinfo=UTC)
    clock = datetime(last.year, last.month, last.day, tzinfo=UTC) + MIN_AGE
    async with opened(url) as db:
        await add_days(db, TTL, now)
        await add_fences(url, [("points", "old", noon - TTL, noon)])
        async with opened(url) as other, other.transaction() as reader:
            await reader.fetchall("SELECT count(*) FROM core.processed_jobs")
            busy = await cleanup_fences(db, min_age=MIN_AGE, now=clock)
        done = await cleanup_fences(db, min_age=MIN_AGE, now=clock)
    assert (busy.days, busy.ran) == (0, True)
    assert done.days == 3
    assert await scalar(url, "SELECT count(*) FROM core.processed_jobs") == 0


async def detached_tables(url: str) -> list[str]:
    rows = await query(url, "SELECT core.fence_partitions_detached()::text")
    return sorted(r[0] for r in rows)


async def test_the_days_are_dropped_in_a_transaction_a_fence_insert_does_not_wait_for(
    pg_database: str,
) -> None:
    """Detaching the due days holds the fence table for one short transaction; the drop of the
    detached tables (their files removed at its commit) comes after it, and while it is open
    a fence is written, committed and found by a duplicate without waiting."""
    url = pg_database
    now = datetime.now(UTC)
    first, last = days_for(TTL, now)
    noon = datetime(first.year, first.month, first.day, 12, tzinfo=UTC)
    clock = datetime(last.year, last.month, last.day, tzinfo=UTC) + MIN_AGE
    async with opened(url) as db:
        await add_days(db, TTL, now)
        await add_fences(url, [("points", f"old-{i}", noon - TTL, noon) for i in range(20)])
        async with db.transaction() as tx:
            days = await detach_days(tx, now=clock, min_age=MIN_AGE)
        assert [d.fences for d in days] == [20, 0, 0]
        assert await day_partitions(url) == [f"processed_jobs_p{last:%Y%m%d}"]
        assert len(await detached_tables(url)) == 3
        async with db.transaction() as dropping:
            assert await purge(dropping) == 3
            async with asyncio.timeout(5), opened(url) as other:
                assert await fence_once(other, "during-the-drop")
                assert not await fence_once(other, "during-the-drop")
        assert await detached_tables(url) == []
    assert await fences(url) == ["during-the-drop"]


async def test_a_day_left_detached_by_a_stopped_cleaner_is_dropped_next_round(
    pg_database: str,
) -> None:
    """A cleaner that stopped between the two transactions leaves its days detached (no
    longer fences: a duplicate of their keys is not found there any more than after a drop);
    the next round drops them, though no other fence is due."""
    url = pg_database
    now = datetime.now(UTC)
    first, last = days_for(TTL, now)
    noon = datetime(first.year, first.month, first.day, 12, tzinfo=UTC)
    clock = datetime(last.year, last.month, last.day, tzinfo=UTC) + MIN_AGE
    async with opened(url) as db:
        await add_days(db, TTL, now)
        await add_fences(url, [("points", "old", noon - TTL, noon)])
        async with db.transaction() as tx:
            assert len(await detach_days(tx, now=clock, min_age=MIN_AGE)) == 3
        left = await detached_tables(url)
        result = await cleanup_fences(db, min_age=MIN_AGE, now=clock)
    assert left == [f"core.processed_jobs_p{(first + n * DAY):%Y%m%d}_detached" for n in range(3)]
    assert (result.ran, result.days) == (True, 0)
    assert await detached_tables(url) == []


async def fence_once(db: Database, job_id: str) -> bool:
    async with db.transaction() as tx:
        return await claim_tx(tx, "points", job_id, TTL)
