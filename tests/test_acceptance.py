"""The seed's acceptance criteria (000 §Criterios de aceptación), each on PostgreSQL and SQLite."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timedelta

import pydantic
import pytest

from jobfence import App, Job, RetryPolicy, TemporaryError, Tx
from jobfence.review import deadletters
from jobfence.review.letters import get_letter
from jobfence.runtime.harness import Outcome

from .helpers import RunningWorker, credit, eventually, query, scalar, table

FAST = RetryPolicy(
    base=timedelta(seconds=0.05),
    cap=timedelta(seconds=5),
    justification="tests: compressed backoff so a full retry cycle takes about a second",
)


class Credit(pydantic.BaseModel):
    member_id: str
    points: int


async def test_parallel_duplicates_make_exactly_one_effect(ledger: str) -> None:
    """64 deliveries of one job_id processed 32 at a time: one ledger row, handler ran once."""
    app = App(ledger, auto_migrate=True)
    calls: list[str] = []
    entered = asyncio.Event()

    @app.consumer("points.credit", schema=Credit)
    async def handle(job: Job[Credit], tx: Tx) -> None:
        calls.append(job.job_id)
        entered.set()
        await asyncio.sleep(0.05)  # widen the race: duplicates pile up behind the fence
        await credit(tx, job.job_id, job.payload.member_id, job.payload.points)

    async with app:
        jobs = [
            app.job("points.credit", {"member_id": "m-1", "points": 10}, job_id="order-42")
            for _ in range(64)
        ]
        await app.enqueue_many(jobs)
        async with RunningWorker(app, concurrency=32) as w:
            await eventually(lambda: w.stats.handled == 64, what="64 deliveries settled")
    rows = await query(ledger, "SELECT job_id, points FROM ledger")
    assert rows == [("order-42", 10)]
    assert calls == ["order-42"]
    assert w.stats.outcomes[Outcome.PROCESSED] == 1
    assert w.stats.outcomes[Outcome.DUPLICATE] == 63
    fences = await scalar(ledger, f"SELECT count(*) FROM {table(ledger, 'processed_jobs')}")
    assert fences == 1
    assert await scalar(ledger, f"SELECT count(*) FROM {table(ledger, 'jobs')}") == 0


async def test_transient_failure_retries_five_times_with_growing_intervals(
    database_url: str,
) -> None:
    """A job that always fails transiently: 6 attempts, growing intervals, one dead letter."""
    app = App(database_url, auto_migrate=True)
    attempts: list[int] = []

    @app.consumer("erp.send", retry=FAST)
    async def handle(job: Job[object], tx: Tx) -> None:
        attempts.append(job.attempt)
        raise TemporaryError("ERP answered 503")

    async with app:
        await app.enqueue("erp.send", {"po": 1}, job_id="po-1", correlation_id="req-7")
        async with RunningWorker(app, concurrency=2):
            letters = await eventually(
                lambda: deadletters.letters(app.db), timeout=30, what="a dead letter"
            )
        letter = await get_letter(app.db, letters[0].id)
    assert attempts == [1, 2, 3, 4, 5, 6]
    assert letter is not None
    assert (letter.job_id, letter.attempts, letter.error_category, letter.correlation_id) == (
        "po-1",
        6,
        "TEMPORARY_ERROR",
        "req-7",
    )
    assert letter.payload == b'{"po":1}'
    assert [h.attempt for h in letter.history] == [1, 2, 3, 4, 5, 6]
    assert all(h.error == "TemporaryError: ERP answered 503" for h in letter.history)
    # the scheduled delays, from the database clock, sit in [d/2, d] and grow
    delays = []
    for n, record in enumerate(letter.history[:5], start=1):
        assert record.retry_at is not None
        delay = _ts(record.retry_at) - _ts(record.at)
        ceiling = FAST.ceiling(n).total_seconds()
        assert ceiling / 2 - 0.002 <= delay <= ceiling + 0.002, (n, delay)
        delays.append(delay)
    assert delays == sorted(delays)
    assert letter.history[5].retry_at is None
    # and no attempt ran before its scheduled time
    for earlier, later in zip(letter.history, letter.history[1:], strict=False):
        assert earlier.retry_at is not None
        assert _ts(later.at) >= _ts(earlier.retry_at) - 0.002
    assert len(letters) == 1


def _ts(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


async def test_schema_invalid_payload_goes_straight_to_dead_letters(database_url: str) -> None:
    """Poison: one dead letter with zero retries; the handler is never called."""
    app = App(database_url, auto_migrate=True)
    called = False

    @app.consumer("points.credit", schema=Credit)
    async def handle(job: Job[Credit], tx: Tx) -> None:
        nonlocal called
        called = True

    async with app:
        await app.enqueue("points.credit", {"member_id": "m-1", "points": "lots"}, job_id="bad-1")
        async with RunningWorker(app) as w:
            letters = await eventually(lambda: deadletters.letters(app.db), what="dead letter")
            await eventually(lambda: w.stats.handled == 1, what="settled")
        letter = await get_letter(app.db, letters[0].id)
    assert called is False
    assert letter is not None
    assert (letter.attempts, letter.error_category, letter.error_code) == (
        1,
        "VALIDATION_ERROR",
        "POISON",
    )
    assert json.loads(letter.payload or b"") == {"member_id": "m-1", "points": "lots"}
    assert "points" in letter.last_error
    assert [h.attempt for h in letter.history] == [1]
    assert w.stats.outcomes[Outcome.RETRY] == 0
    assert w.stats.outcomes[Outcome.DEAD] == 1


async def test_replaying_a_processed_job_id_makes_no_second_effect(ledger: str) -> None:
    """What a replay does — the same job_id enqueued again later — is skipped by the fence."""
    app = App(ledger, auto_migrate=True)
    calls = 0

    @app.consumer("points.credit", schema=Credit)
    async def handle(job: Job[Credit], tx: Tx) -> None:
        nonlocal calls
        calls += 1
        await credit(tx, job.job_id, job.payload.member_id, job.payload.points)

    async with app, RunningWorker(app) as w:
        await app.enqueue("points.credit", {"member_id": "m", "points": 5}, job_id="order-9")
        await eventually(lambda: w.stats.handled == 1, what="first delivery")
        await app.enqueue("points.credit", {"member_id": "m", "points": 5}, job_id="order-9")
        await eventually(lambda: w.stats.handled == 2, what="replayed delivery")
    assert calls == 1
    assert await query(ledger, "SELECT job_id, points FROM ledger") == [("order-9", 5)]


async def test_successful_job_writes_no_row_beyond_its_fence(database_url: str) -> None:
    """Negative criterion: success leaves exactly one new row (the fence) in every table,
    and on PostgreSQL the insert counters of every user table agree."""
    app = App(database_url, auto_migrate=True)

    @app.consumer("noop")
    async def handle(job: Job[object], tx: Tx) -> None:
        return None

    async with app:
        await app.enqueue("noop", {"x": 1}, job_id="only-one")
    before_rows = await _row_counts(database_url)
    pg = database_url.startswith("postgresql")
    before_ins = await _insert_counters(database_url) if pg else {}
    async with app, RunningWorker(app) as w:
        await eventually(lambda: w.stats.handled == 1, what="processed")
    after_rows = await _row_counts(database_url)
    changed = {
        t: after_rows[t] - before_rows[t] for t in after_rows if after_rows[t] != before_rows[t]
    }
    assert changed == {table(database_url, "processed_jobs"): 1, table(database_url, "jobs"): -1}
    if pg:
        inserted = await eventually(
            lambda: _settled_inserts(database_url, before_ins), what="statistics flushed"
        )
        assert inserted == {"core.processed_jobs": 1}


async def _row_counts(url: str) -> dict[str, int]:
    if url.startswith("postgresql"):
        names = [
            f"{s}.{t}"
            for s, t in await query(
                url,
                # a partition's rows count as its table's (the fences: by day)
                "SELECT s.schemaname, s.relname FROM pg_stat_user_tables AS s "
                "JOIN pg_class AS c ON c.oid = s.relid WHERE NOT c.relispartition ORDER BY 1, 2",
            )
        ]
    else:
        names = [
            r[0]
            for r in await query(
                url,
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'",
            )
        ]
    return {name: await scalar(url, f"SELECT count(*) FROM {name}") for name in names}


async def _insert_counters(url: str) -> dict[str, int]:
    rows = await query(
        url,
        "SELECT pg_stat_clear_snapshot() IS NULL, s.schemaname || '.' || coalesce(p.relname, "
        "s.relname), sum(s.n_tup_ins) FROM pg_stat_user_tables AS s "
        "LEFT JOIN pg_inherits AS i ON i.inhrelid = s.relid "
        "LEFT JOIN pg_class AS p ON p.oid = i.inhparent GROUP BY 1, 2",
    )  # a partition's inserts count as its table's
    return {name: int(ins) for _, name, ins in rows}


async def _settled_inserts(url: str, before: dict[str, int]) -> dict[str, int] | None:
    after = await _insert_counters(url)
    delta = {t: after[t] - before.get(t, 0) for t in after if after[t] != before.get(t, 0)}
    # stats are flushed by each backend shortly after its transaction; wait for the fence's
    return delta if delta.get("core.processed_jobs") else None


@pytest.mark.parametrize("handler_kind", ["async", "sync"])
async def test_sync_and_async_handlers_share_the_transaction(
    ledger: str, handler_kind: str
) -> None:
    """A plain `def` handler gets a sync tx on the same transaction as the fence."""
    app = App(ledger, auto_migrate=True)

    if handler_kind == "sync":

        @app.consumer("points.credit", schema=Credit)
        def handle_sync(job: Job[Credit], tx: object) -> None:
            p = "%s" if tx.dialect == "postgresql" else "?"  # type: ignore[attr-defined]
            tx.execute(  # type: ignore[attr-defined]
                f"INSERT INTO ledger (job_id, member_id, points) VALUES ({p}, {p}, {p})",
                (job.job_id, job.payload.member_id, job.payload.points),
            )
            if job.payload.points < 0:
                raise TemporaryError("negative")

    else:

        @app.consumer("points.credit", schema=Credit)
        async def handle_async(job: Job[Credit], tx: Tx) -> None:
            await credit(tx, job.job_id, job.payload.member_id, job.payload.points)
            if job.payload.points < 0:
                raise TemporaryError("negative")

    async with app:
        await app.enqueue("points.credit", {"member_id": "a", "points": 3}, job_id="ok")
        await app.enqueue("points.credit", {"member_id": "b", "points": -1}, job_id="rolls-back")
        async with RunningWorker(app) as w:
            await eventually(lambda: w.stats.handled == 2, what="both handled")
    # the failing job's insert rolled back with its fence
    assert await query(ledger, "SELECT job_id FROM ledger") == [("ok",)]
    fenced = await query(ledger, f"SELECT job_id FROM {table(ledger, 'processed_jobs')}")
    assert fenced == [("ok",)]
