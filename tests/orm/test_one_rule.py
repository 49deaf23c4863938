"""Issue 28, points 2 and 3: one rule on every store and every integration.

What a handler does with a failed statement or with rolled-back work ends the same way on
PostgreSQL and SQLite, through jobfence's own ``tx`` (``async def`` and ``def``), a
SQLAlchemy ``AsyncSession`` and a synchronous ``Session`` (Django: tests/integrations):

- a failed statement the handler caught and carried on after (outside a savepoint it opened
  itself) → the job fails, ``TX_ABORTED``, naming the statement's error; neither effect nor
  fence;
- work the handler rolled back without having scoped it itself (``session.rollback()``) and a
  normal return → the job fails, ``TX_ROLLBACK_ONLY``; neither effect nor fence;
- a savepoint the handler opened itself (``tx.savepoint()``, ``session.begin_nested()``)
  rolled back, the error caught → "nothing to do, on purpose": the job succeeds, with its
  fence and the rest of its work.

The table of docs/concepts.md says the same.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from jobfence import App, Job, RetryPolicy, Tx
from jobfence.db import SyncTx

from ..helpers import RunningWorker, eventually, query, scalar, table
from .orm_app import Credit, build, build_sync, create_tables

ONE_RETRY = RetryPolicy(
    base=timedelta(seconds=0.05),
    cap=timedelta(seconds=0.2),
    limited_retries=1,
    justification="tests: a boundary failure retried once, quickly",
)

#: the failed statement, named in the error (PostgreSQL's words, SQLite's)
NAMED = ("duplicate key value violates unique constraint", "UNIQUE constraint failed")
#: what each way of handling a failure ends as: None = the job succeeds with its fence and
#: the row "<job>-kept"; else (error_code, words of the error)
EXPECTED: dict[str, tuple[str, str] | None] = {
    "caught-statement": ("TX_ABORTED", "caught the error and returned normally"),
    "caught-flush": ("TX_ABORTED", "caught the error and returned normally"),
    "caught-then-rollback": ("TX_ABORTED", "caught the error and returned normally"),
    "rollback": ("TX_ROLLBACK_ONLY", "session.rollback()"),
    "own-savepoint": None,
}
#: which ways each door has (jobfence's tx has no session to flush or roll back)
WAYS = {
    "tx": ["caught-statement", "own-savepoint"],
    "sync-tx": ["caught-statement", "own-savepoint"],
    "session": list(EXPECTED),
    "sync-session": list(EXPECTED),
}
DUPLICATE = "INSERT INTO orm_credits (job_id, member_id, points) VALUES ('taken', 'm', 0)"


def _insert(job_id: str) -> str:
    return f"INSERT INTO orm_credits (job_id, member_id, points) VALUES ('{job_id}', 'm', 1)"


async def _tx_handler(way: str, tx: Tx, job_id: str) -> None:
    await tx.execute(_insert(f"{job_id}-kept"))
    if way == "caught-statement":
        with contextlib.suppress(Exception):
            await tx.execute(DUPLICATE)
    else:
        try:
            async with tx.savepoint():
                await tx.execute(_insert(f"{job_id}-undone"))
                await tx.execute(DUPLICATE)
        except Exception:
            pass


def _sync_tx_handler(way: str, tx: SyncTx, job_id: str) -> None:
    tx.execute(_insert(f"{job_id}-kept"))
    if way == "caught-statement":
        with contextlib.suppress(Exception):
            tx.execute(DUPLICATE)
    else:
        try:
            with tx.savepoint():
                tx.execute(_insert(f"{job_id}-undone"))
                tx.execute(DUPLICATE)
        except Exception:
            pass


async def _session_handler(way: str, session: AsyncSession, job_id: str) -> None:
    session.add(Credit(job_id=f"{job_id}-kept", member_id="m", points=1))
    await session.flush()
    if way == "caught-statement":
        with contextlib.suppress(IntegrityError):
            await session.execute(text(DUPLICATE))
    elif way == "caught-flush":
        session.add(Credit(job_id="taken", member_id="m", points=0))
        with contextlib.suppress(IntegrityError):
            await session.flush()
    elif way == "caught-then-rollback":  # SQLAlchemy's own advice after an error
        try:
            await session.execute(text(DUPLICATE))
        except IntegrityError:
            await session.rollback()
    elif way == "rollback":
        await session.rollback()
    else:
        try:
            async with session.begin_nested():
                session.add(Credit(job_id=f"{job_id}-undone", member_id="m", points=1))
                session.add(Credit(job_id="taken", member_id="m", points=0))
        except IntegrityError:
            pass


def _sync_session_handler(way: str, session: Session, job_id: str) -> None:
    session.add(Credit(job_id=f"{job_id}-kept", member_id="m", points=1))
    session.flush()
    if way == "caught-statement":
        with contextlib.suppress(IntegrityError):
            session.execute(text(DUPLICATE))
    elif way == "caught-flush":
        session.add(Credit(job_id="taken", member_id="m", points=0))
        with contextlib.suppress(IntegrityError):
            session.flush()
    elif way == "caught-then-rollback":
        try:
            session.execute(text(DUPLICATE))
        except IntegrityError:
            session.rollback()
    elif way == "rollback":
        session.rollback()
    else:
        try:
            with session.begin_nested():
                session.add(Credit(job_id=f"{job_id}-undone", member_id="m", points=1))
                session.add(Credit(job_id="taken", member_id="m", points=0))
        except IntegrityError:
            pass


def _app(door: str, url: str) -> tuple[App, Callable[[], Any]]:
    """An app whose consumer "q" handles job ``<way>`` the ``<way>`` way, through ``door``;
    and what disposes of its engine."""
    if door == "session":
        app, engine = build(url)

        @app.consumer("q", retry=ONE_RETRY)
        async def handle(job: Job[Any], session: AsyncSession) -> None:
            await _session_handler(job.job_id, session, job.job_id)

        async def dispose_async() -> None:
            await engine.dispose()

        return app, dispose_async
    if door == "tx":
        raw = App(url)

        @raw.consumer("q", retry=ONE_RETRY)
        async def handle_tx(job: Job[Any], tx: Tx) -> None:
            await _tx_handler(job.job_id, tx, job.job_id)

        async def nothing_async() -> None:
            return None

        return raw, nothing_async
    if door == "sync-session":
        sync_app, sync_engine = build_sync(url)

        @sync_app.consumer("q", retry=ONE_RETRY)
        def handle_sync(job: Job[Any], session: Session) -> None:
            _sync_session_handler(job.job_id, session, job.job_id)

        async def dispose_sync() -> None:
            sync_engine.dispose()

        return sync_app, dispose_sync
    plain = App(url)

    @plain.consumer("q", retry=ONE_RETRY)
    def handle_sync_tx(job: Job[Any], tx: SyncTx) -> None:
        _sync_tx_handler(job.job_id, tx, job.job_id)

    async def nothing() -> None:
        return None

    return plain, nothing


async def _tables(url: str) -> None:
    _, engine = build(url)
    try:
        await create_tables(engine)
        async with AsyncSession(engine) as session:
            session.add(Credit(job_id="taken", member_id="m", points=0))
            await session.commit()
    finally:
        await engine.dispose()


@pytest.mark.parametrize("door", list(WAYS))
async def test_one_rule_for_caught_failures_and_rolled_back_work(
    database_url: str, door: str
) -> None:
    url = database_url
    await _tables(url)
    ways = WAYS[door]
    app, dispose = _app(door, url)
    failing = sum(1 for w in ways if EXPECTED[w] is not None)
    try:
        async with app:
            for way in ways:
                await app.enqueue("q", {}, job_id=way)
            async with RunningWorker(app, concurrency=1) as w:
                await eventually(
                    lambda: w.stats.handled >= len(ways) + failing, what="every attempt settled"
                )
    finally:
        await dispose()
    rows = {r[0] for r in await query(url, "SELECT job_id FROM orm_credits")}
    fenced = {r[0] for r in await query(url, f"SELECT job_id FROM {table(url, 'processed_jobs')}")}
    letters = {
        r[0]: (r[1], r[2], r[3])
        for r in await query(
            url,
            f"SELECT job_id, attempts, error_code, last_error FROM {table(url, 'dead_letters')}",
        )
    }
    problems = []
    for way in ways:
        expected = EXPECTED[way]
        if expected is None:
            if way in letters or f"{way}-kept" not in rows or way not in fenced:
                problems.append(f"{way}: should succeed: letter {letters.get(way)}")
            if f"{way}-undone" in rows:
                problems.append(f"{way}: its savepoint's work committed")
            continue
        code, words = expected
        got = letters.get(way)
        named = code != "TX_ABORTED" or (got is not None and any(n in got[2] for n in NAMED))
        if got is None or got[0] != 2 or got[1] != code or words not in got[2] or not named:
            problems.append(f"{way}: expected {code} ({words}) after 2 attempts, got {got}")
        if f"{way}-kept" in rows or way in fenced:
            problems.append(f"{way}: committed (effect {f'{way}-kept' in rows})")
    assert problems == []
    assert await scalar(url, "SELECT count(*) FROM orm_credits WHERE job_id = 'taken'") == 1
