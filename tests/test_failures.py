"""Failure classification end to end (SPEC R4): real lost connections and real deadlocks are
TEMPORARY and retried; unknown exceptions are TECHNICAL with limited retries; never poison."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest

from jobfence import (
    App,
    AuthenticationError,
    Category,
    Job,
    NonRetryableError,
    Observer,
    Retry,
    RetryPolicy,
    Tx,
)
from jobfence.core.jobs import Delivery
from jobfence.review import deadletters

from .helpers import RunningWorker, credit, eventually, query

FAST = RetryPolicy(
    base=timedelta(seconds=0.05),
    cap=timedelta(seconds=1),
    justification="tests: compressed backoff",
)


class Retries(Observer):
    def __init__(self) -> None:
        self.seen: list[tuple[str, int, Category]] = []

    def job_retry(
        self, delivery: Delivery, consumer: str, category: Category, delay: timedelta, error: str
    ) -> None:
        self.seen.append((delivery.job_id, delivery.attempt, category))


async def test_connection_killed_mid_job_is_temporary_and_retried(pg_ledger: str) -> None:
    """pg_terminate_backend on the handler's own connection mid-transaction: classified
    TEMPORARY_ERROR, retried on a fresh connection, one effect, no dead letter."""
    ledger = pg_ledger
    retries = Retries()
    app = App(ledger, observers=[retries])

    @app.consumer("q", retry=FAST)
    async def handle(job: Job[Any], tx: Tx) -> None:
        await credit(tx, job.job_id, "m", job.attempt)
        if job.attempt == 1:
            pid = (await tx.fetchone("SELECT pg_backend_pid()"))[0]  # type: ignore[index]
            async with await psycopg.AsyncConnection.connect(ledger, autocommit=True) as admin:
                await admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
            await tx.execute("SELECT 1")  # the connection is gone: this raises

    async with app:
        await app.enqueue("q", {}, job_id="j-1")
        async with RunningWorker(app) as w:
            await eventually(lambda: w.stats.handled == 2, what="retry then success")
        assert await deadletters.letters(app.db) == []
    assert retries.seen == [("j-1", 1, Category.TEMPORARY_ERROR)]
    assert await query(ledger, "SELECT job_id, points FROM ledger") == [("j-1", 2)]


async def test_real_deadlock_is_temporary_and_both_jobs_succeed(pg_database: str) -> None:
    """Two jobs lock two rows in opposite order: PostgreSQL kills one with a deadlock error,
    which is retried; both effects end up applied exactly once."""
    retries = Retries()
    app = App(pg_database, observers=[retries])
    both_locked_first = asyncio.Barrier(2)

    @app.consumer("q", retry=FAST)
    async def handle(job: Job[dict[str, int]], tx: Tx) -> None:
        first, second = job.payload["first"], job.payload["second"]
        await tx.execute("UPDATE counters SET n = n + 1 WHERE id = %s", (first,))
        if job.attempt == 1:
            await asyncio.wait_for(both_locked_first.wait(), timeout=10)
        await tx.execute("UPDATE counters SET n = n + 1 WHERE id = %s", (second,))

    async with app:
        async with app.db.transaction() as tx:
            await tx.execute("CREATE TABLE counters (id int PRIMARY KEY, n int NOT NULL)")
            await tx.execute("INSERT INTO counters VALUES (1, 0), (2, 0)")
        await app.enqueue("q", {"first": 1, "second": 2}, job_id="a")
        await app.enqueue("q", {"first": 2, "second": 1}, job_id="b")
        async with RunningWorker(app, concurrency=2) as w:
            await eventually(lambda: w.stats.handled == 3, timeout=30, what="deadlock resolved")
        assert await deadletters.letters(app.db) == []
    assert [(c) for _, _, c in retries.seen] == [Category.TEMPORARY_ERROR]
    assert await query(pg_database, "SELECT id, n FROM counters ORDER BY id") == [(1, 2), (2, 2)]


async def test_unknown_exception_gets_limited_retries_then_dead_letter(database_url: str) -> None:
    """An exception jobfence does not know is TECHNICAL_ERROR: 1 + 2 attempts, then a dead
    letter that names the exception; the worker survives."""
    app = App(database_url, auto_migrate=True)
    attempts: list[int] = []

    @app.consumer("q", retry=FAST)
    async def handle(job: Job[Any], tx: Tx) -> None:
        attempts.append(job.attempt)
        raise KeyError("member not in cache")

    async with app:
        await app.enqueue("q", {}, job_id="j")
        async with RunningWorker(app):
            letters = await eventually(lambda: deadletters.letters(app.db), what="dead letter")
    assert attempts == [1, 2, 3]
    assert (letters[0].attempts, letters[0].error_category, letters[0].error_code) == (
        3,
        "TECHNICAL_ERROR",
        "KeyError",
    )
    assert letters[0].last_error == "KeyError: 'member not in cache'"


@pytest.mark.parametrize(
    ("exc", "expected_attempts", "category"),
    [
        (NonRetryableError("ledger closed", code="LEDGER_CLOSED"), [1], "NON_RETRYABLE_ERROR"),
        (AuthenticationError("token expired"), [1, 2], "AUTHENTICATION_ERROR"),
    ],
)
async def test_taxonomy_decides_the_number_of_attempts(
    database_url: str, exc: Exception, expected_attempts: list[int], category: str
) -> None:
    app = App(database_url, auto_migrate=True)
    attempts: list[int] = []

    @app.consumer("q", retry=FAST)
    async def handle(job: Job[Any], tx: Tx) -> None:
        attempts.append(job.attempt)
        raise exc

    async with app:
        await app.enqueue("q", {}, job_id="j")
        async with RunningWorker(app):
            letters = await eventually(lambda: deadletters.letters(app.db), what="dead letter")
    assert attempts == expected_attempts
    assert letters[0].error_category == category
    if isinstance(exc, NonRetryableError):
        assert letters[0].error_code == "LEDGER_CLOSED"


async def test_retry_control_flow_uses_the_requested_delay(database_url: str) -> None:
    """`raise Retry(delay)` retries after that delay (scheduled on the database clock) without
    an error; the next attempt sees the record in its history and succeeds."""
    app = App(database_url, auto_migrate=True)
    seen: list[Job[Any]] = []

    @app.consumer("q", retry=FAST)
    async def handle(job: Job[Any], tx: Tx) -> None:
        seen.append(job)
        if job.attempt == 1:
            raise Retry(delay=timedelta(milliseconds=300), reason="rate limited")

    async with app:
        await app.enqueue("q", {}, job_id="j")
        async with RunningWorker(app) as w:
            await eventually(lambda: w.stats.handled == 2, what="success after retry")
    assert [job.attempt for job in seen] == [1, 2]
    (record,) = seen[1].history
    assert record.retry_at is not None
    delay = (_parse(record.retry_at) - _parse(record.at)).total_seconds()
    assert abs(delay - 0.3) < 0.005
    assert (record.attempt, record.category, record.error) == (
        1,
        "TEMPORARY_ERROR",
        "Retry: rate limited",
    )


def _parse(iso: str) -> datetime:
    return datetime.fromisoformat(iso.replace("Z", "+00:00"))


async def test_a_sqlite_syntax_error_is_technical_not_temporary(sqlite_database: str) -> None:
    """sqlite3 raises OperationalError for SQL it cannot run as for a locked database; a
    handler's syntax error is a programming error: TECHNICAL_ERROR, 1 + 2 attempts, then a
    dead letter (not the 1 + 5 a transient lock would get)."""
    observer = Retries()
    app = App(sqlite_database, auto_migrate=True, observers=[observer])
    attempts: list[int] = []

    @app.consumer("q", retry=FAST)
    async def handle(job: Job[Any], tx: Tx) -> None:
        attempts.append(job.attempt)
        await tx.execute("SELEC 1")

    async with app:
        await app.enqueue("q", {}, job_id="j")
        async with RunningWorker(app):
            letters = await eventually(lambda: deadletters.letters(app.db), what="dead letter")
    assert attempts == [1, 2, 3]
    assert observer.seen == [("j", 1, Category.TECHNICAL_ERROR), ("j", 2, Category.TECHNICAL_ERROR)]
    assert (letters[0].error_category, letters[0].error_code) == (
        "TECHNICAL_ERROR",
        "OperationalError",
    )
    assert "syntax error" in letters[0].last_error
