"""Cleanup of fences partitioned by day of expiry (PostgreSQL, issue 27): a day goes whole
once every fence in it expired more than min_age ago — after the fences SPEC T2 keeps (a
letter pending review or replayed within min_age, a job still retrying) moved out of it — and
a day not yet due stays, whole."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from jobfence.runtime.cleanup import cleanup_fences
from jobfence.runtime.partitions import add_days, days_for

from ..helpers import query, scalar
from .conftest import letter_params, opened, seed_letters
from .test_cleanup import MIN_AGE, add_fences, fences, review

TTL = timedelta(days=7)


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
