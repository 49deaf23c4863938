"""Fence expiry (SPEC T1, T2): the TTL check at start-up, and cleanup that deletes expired
fences in bounded batches — never one still inside its retry window, of a job still
retrying, or of a job_id whose dead letter is pending review (or was just replayed)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from jobfence import App, ConfigurationError, Job, RetryPolicy, TemporaryError, Tx
from jobfence.app import DEFAULT_LEASE
from jobfence.core.fence import DEFAULT_FENCE_TTL
from jobfence.core.fence import exposure as fence_exposure
from jobfence.core.fence import ttl_problem as fence_ttl_problem
from jobfence.core.leases import Lease
from jobfence.core.retry import DEFAULT_POLICY
from jobfence.runtime.cleanup import LEASE_NAME, cleanup_fences
from jobfence.runtime.maintenance import Maintenance

from ..helpers import RunningWorker, credit, eventually, query, scalar, table
from .conftest import letter_params, opened, seed_letters

TTL = DEFAULT_FENCE_TTL
MIN_AGE = fence_exposure(DEFAULT_POLICY, DEFAULT_LEASE)  # 15m30s + 6 × 30s = 18m30s


def dialect(url: str) -> str:
    return "postgresql" if url.startswith("postgresql") else "sqlite"


def at(url: str, moment: datetime) -> Any:
    return moment if url.startswith("postgresql") else moment.timestamp()


async def add_fences(url: str, rows: list[tuple[str, str, datetime, datetime]]) -> None:
    """(consumer, job_id, processed_at, expires_at) fence rows, as the harness writes them."""
    p = "%s" if url.startswith("postgresql") else "?"
    async with opened(url) as db, db.transaction() as tx:
        for consumer, job_id, processed, expires in rows:
            await tx.execute(
                f"INSERT INTO {table(url, 'processed_jobs')} (consumer, job_id, processed_at, "
                f"expires_at) VALUES ({p}, {p}, {p}, {p})",
                (consumer, job_id, at(url, processed), at(url, expires)),
            )


async def fences(url: str) -> list[str]:
    rows = await query(url, f"SELECT job_id FROM {table(url, 'processed_jobs')} ORDER BY job_id")
    return [r[0] for r in rows]


async def review(url: str, letter: int, status: str, when: datetime) -> None:
    p = "%s" if url.startswith("postgresql") else "?"
    await query(
        url,
        f"UPDATE {table(url, 'dead_letters')} SET status = {p}, reviewed_at = {p}, "
        f"reviewed_by = 'ops', review_reason = 'test' WHERE id = {p}",
        (status, at(url, when), letter),
    )


def test_the_default_fence_ttl_is_seven_days_and_safe() -> None:
    """7 days against the default policy (retry window 15m30s, lease 30s): no problem."""
    assert timedelta(days=7) == DEFAULT_FENCE_TTL
    assert timedelta(minutes=18, seconds=30) == MIN_AGE
    assert fence_ttl_problem(TTL, DEFAULT_LEASE, [("q", DEFAULT_POLICY)]) is None
    App("sqlite:///unused.db")  # does not raise


def test_a_ttl_not_exceeding_retry_window_plus_lease_with_margin_is_refused() -> None:
    """The exact bound (exposure 18m30s + margin 1h = 1h18m30s) is refused, one second more
    passes; the message shows the arithmetic."""
    bound = timedelta(hours=1, minutes=18, seconds=30)
    problem = fence_ttl_problem(bound, DEFAULT_LEASE, [("orders", DEFAULT_POLICY)])
    assert problem == (
        "fence TTL 1h18m30s is too short for queue 'orders': retry window 15m30s (30s + 1m + 2m "
        "+ 4m + 8m) + 6 attempts × lease 30s = 18m30s during which a delivery can still arrive; "
        "plus a margin of 1h (as much again, at least 1h) the TTL must exceed 1h18m30s. A "
        "delivery after its fence expired would apply the work twice: use fence_ttl > 1h18m30s "
        "(the default is 7d)."
    )
    assert (
        fence_ttl_problem(bound + timedelta(seconds=1), DEFAULT_LEASE, [("orders", DEFAULT_POLICY)])
        is None
    )
    with pytest.raises(ConfigurationError, match="must exceed 1h18m30s"):
        App("sqlite:///unused.db", fence_ttl=bound)


def test_the_queue_with_the_longest_exposure_decides_and_its_margin_doubles_it() -> None:
    """A queue retrying for a day needs a TTL over twice its window; the message names it."""
    slow = RetryPolicy(max_retries=30, cap=timedelta(hours=1), justification="ERP nightly batch")
    exposure = fence_exposure(slow, DEFAULT_LEASE)
    assert exposure == slow.max_window() + 31 * DEFAULT_LEASE
    assert exposure > timedelta(days=1)
    problem = fence_ttl_problem(
        timedelta(days=2), DEFAULT_LEASE, [("fast", DEFAULT_POLICY), ("erp", slow)]
    )
    assert problem is not None
    assert problem.startswith("fence TTL 2d is too short for queue 'erp'")
    assert (
        fence_ttl_problem(
            exposure * 2 + timedelta(seconds=1),
            DEFAULT_LEASE,
            [("fast", DEFAULT_POLICY), ("erp", slow)],
        )
        is None
    )
    app = App("sqlite:///unused.db", fence_ttl=timedelta(days=2))
    with pytest.raises(ConfigurationError, match="queue 'erp'"):
        app.consumer("erp", retry=slow)(lambda job, tx: None)


async def test_ttl_cleanup_deletes_expired_fences_and_never_one_inside_its_retry_window(
    database_url: str,
) -> None:
    """Seed acceptance, with the clock pinned: fences at TTL−1 s stay, at TTL and TTL+1 s go;
    expired fences of a job still retrying, of a job_id with a letter pending review or
    replayed minutes ago, and one younger than the retry window stay; others go."""
    url = database_url
    app = App(url, auto_migrate=True)

    @app.consumer("points")
    async def handle(job: Job[Any], tx: Tx) -> None:
        raise TemporaryError("partner API timed out")

    async with app:  # a real job with a pending retry (its next attempt is 15–30 s away)
        await app.enqueue("points", {"member_id": "m"}, job_id="retrying")
        async with RunningWorker(app) as w:
            await eventually(lambda: w.stats.handled == 1, what="first attempt failed")
    history = await scalar(url, f"SELECT history FROM {table(url, 'jobs')}")
    assert len(json.loads(history) if isinstance(history, str) else history) == 1

    ref = datetime.now(UTC).replace(microsecond=0) + timedelta(days=30)
    old = ref - TTL - timedelta(hours=1)
    await add_fences(
        url,
        [
            (
                "points",
                "ttl-minus-1s",
                ref - TTL + timedelta(seconds=1),
                ref + timedelta(seconds=1),
            ),
            ("points", "ttl-exact", ref - TTL, ref),
            ("points", "ttl-plus-1s", ref - TTL - timedelta(seconds=1), ref - timedelta(seconds=1)),
            ("points", "retrying", old, old + TTL),
            ("points", "pending-letter", old, old + TTL),
            ("points", "replayed-minutes-ago", old, old + TTL),
            ("points", "replayed-long-ago", old, old + TTL),
            ("points", "discarded", old, old + TTL),
            ("points", "letter-of-another-consumer", old, old + TTL),
            (
                "points",
                "young-but-short-ttl",
                ref - timedelta(minutes=10),
                ref - timedelta(minutes=1),
            ),
        ],
    )
    d = dialect(url)
    _, recent, long_ago, discarded, _ = await seed_letters(
        url,
        [
            letter_params(d, "pending-letter", queue="points"),
            letter_params(d, "replayed-minutes-ago", queue="points"),
            letter_params(d, "replayed-long-ago", queue="points"),
            letter_params(d, "discarded", queue="points"),
            letter_params(d, "letter-of-another-consumer", queue="points", consumer="audit"),
        ],
    )
    await review(url, recent, "replayed", ref - timedelta(minutes=5))
    await review(url, long_ago, "replayed", ref - timedelta(days=1))
    await review(url, discarded, "discarded", ref - timedelta(days=1))

    async with opened(url) as db:
        result = await cleanup_fences(db, min_age=MIN_AGE, batch=2, now=ref)
        again = await cleanup_fences(db, min_age=MIN_AGE, batch=2, now=ref)
    assert await fences(url) == sorted(
        [
            "ttl-minus-1s",
            "retrying",
            "pending-letter",
            "replayed-minutes-ago",
            "young-but-short-ttl",
        ]
    )
    assert (result.deleted, result.batches, result.ran) == (5, 3, True)
    assert (again.deleted, again.batches) == (0, 1)
    leases = await scalar(url, f"SELECT count(*) FROM {table(url, 'leases')}")
    assert leases == 0  # released


async def test_only_one_cleaner_runs_at_a_time(database_url: str) -> None:
    """While another cleaner holds the lease nothing is done and its holder is named; when
    it lets go (or its lease runs out) the next cleaner runs."""
    ref = datetime.now(UTC) + timedelta(days=30)
    long_ago = ref - TTL - timedelta(days=1)
    await add_fences(database_url, [("c", f"j{i}", long_ago, long_ago + TTL) for i in range(10)])
    async with opened(database_url) as db:
        other = Lease(db, LEASE_NAME, "cleaner-A", timedelta(minutes=2))
        assert await other.acquire()
        busy = await cleanup_fences(db, min_age=MIN_AGE, now=ref, holder="cleaner-B")
        await other.release()
        stalled = Lease(db, LEASE_NAME, "cleaner-C", timedelta(milliseconds=50))
        assert await stalled.acquire()
        done = await eventually(
            lambda: _clean_if_free(db, ref), what="the stalled cleaner's lease to expire"
        )
    assert (busy.ran, busy.busy, busy.deleted) == (False, "cleaner-A", 0)
    assert done.deleted == 10
    assert await fences(database_url) == []


async def _clean_if_free(db: Any, ref: datetime) -> Any:
    result = await cleanup_fences(db, min_age=MIN_AGE, now=ref, holder="cleaner-B")
    return result if result.ran else None


async def test_cleanup_deletes_in_bounded_batches(database_url: str) -> None:
    """2 500 expired fences with batches of 1 000: three short transactions, all gone."""
    ref = datetime.now(UTC) + timedelta(days=30)
    long_ago = ref - TTL - timedelta(days=1)
    await add_fences(
        database_url, [("c", f"j{i:05d}", long_ago, long_ago + TTL) for i in range(2500)]
    )
    async with opened(database_url) as db:
        result = await cleanup_fences(db, min_age=MIN_AGE, batch=1000, now=ref)
        limited = await cleanup_fences(db, min_age=MIN_AGE, batch=1000, now=ref, max_batches=1)
    assert (result.deleted, result.batches) == (2500, 3)
    assert result.longest_batch <= result.seconds
    assert (limited.deleted, limited.batches) == (0, 0)  # nothing due: no batch, no lease
    assert await fences(database_url) == []


async def test_workers_clean_up_expired_fences_periodically(ledger: str) -> None:
    """A worker with a short cleanup interval deletes expired fences on its own, keeps the
    fences of the jobs it just processed, and keeps working."""
    long_ago = datetime.now(UTC) - TTL - timedelta(days=2)
    await add_fences(ledger, [("points", f"old-{i}", long_ago, long_ago + TTL) for i in range(50)])
    app = App(
        ledger, auto_migrate=True, maintenance=Maintenance(cleanup_interval=timedelta(seconds=0.2))
    )
    assert app.redelivery_exposure() == MIN_AGE

    @app.consumer("points")
    async def handle(job: Job[Any], tx: Tx) -> None:
        await credit(tx, job.job_id, "m", 1)

    async def only_fresh() -> bool:
        return await fences(ledger) == [f"new-{i}" for i in range(5)]

    async with app:
        await app.enqueue_many([app.job("points", {}, job_id=f"new-{i}") for i in range(5)])
        async with RunningWorker(app) as w:
            await eventually(only_fresh, what="expired fences gone, fresh ones kept")
            await app.enqueue("points", {}, job_id="new-5")
            await eventually(lambda: w.stats.handled == 6, what="still processing")
    assert await scalar(ledger, "SELECT count(*) FROM ledger") == 6


async def test_cleanup_of_many_expired_fences_does_not_stop_a_worker(pg_ledger: str) -> None:
    """200 000 expired fences deleted while a worker processes 1 000 jobs: every job is
    processed once, every expired fence is gone, the new fences stay (the 1 000 000-row
    figures are in bench/cleanup.py)."""
    url = pg_ledger
    await query(
        url,
        "INSERT INTO core.processed_jobs (consumer, job_id, processed_at, expires_at) "
        "SELECT 'points', 'old-' || g, now() - interval '30 days', now() - interval '23 days' "
        "FROM generate_series(1, 200000) AS g",
    )
    app = App(url, maintenance=Maintenance(cleanup=False))

    @app.consumer("points")
    async def handle(job: Job[Any], tx: Tx) -> None:
        await credit(tx, job.job_id, "m", 1)

    async with app:
        await app.enqueue_many([app.job("points", {}, job_id=f"new-{i}") for i in range(1000)])
        async with RunningWorker(app, concurrency=8) as w:
            result = await cleanup_fences(app.db, min_age=MIN_AGE, batch=5000)
            await eventually(lambda: w.stats.handled == 1000, timeout=120, what="1 000 jobs")
    assert result.deleted == 200_000
    assert result.batches == 41
    rows = await query(url, "SELECT count(*), count(DISTINCT job_id) FROM ledger")
    assert rows == [(1000, 1000)]
    assert await scalar(url, "SELECT count(*) FROM core.processed_jobs") == 1000


async def test_a_cleanup_batch_reads_its_rows_not_the_whole_table(pg_ledger: str) -> None:
    """A batch deletes the rows it locked by ctid (a TID scan), whatever the table's size:
    joined on the key, the planner hashed the whole fence table for every batch (a seq scan
    each), so cleanup slowed as the table grew (issue 16 §3: bench/run.py --only fences). And
    a batch's index scan starts at the previous batch's last expires_at."""
    url = pg_ledger
    await query(
        url,
        "INSERT INTO core.processed_jobs (consumer, job_id, processed_at, expires_at) "
        "SELECT 'points', md5(g::text), now() - interval '30 days', now() - interval '23 days' "
        "FROM generate_series(1, 100000) AS g",
    )
    await query(url, "ANALYZE core.processed_jobs")
    async with opened(url) as db:
        sql = db.sql["cleanup_fences"]  # type: ignore[attr-defined]
    params = {"now": None, "min_age": MIN_AGE.total_seconds(), "limit": 5000, "after": None}
    plan = "\n".join(row[0] for row in await query(url, f"EXPLAIN {sql}", params))
    assert "Tid Scan on processed_jobs" in plan, plan
    assert "Seq Scan on processed_jobs" not in plan, plan
    # the next batch's index scan starts where this one ended
    params["after"] = datetime.now(UTC) - timedelta(days=24)
    plan = "\n".join(row[0] for row in await query(url, f"EXPLAIN {sql}", params))
    assert "Index Scan using processed_jobs_default_expires_idx" in plan, plan
    assert "(expires_at >= " in plan, plan
