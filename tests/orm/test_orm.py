"""Issue 13: the fence inside the user's own SQLAlchemy transaction — the seed's criteria
again, through the ORM, on PostgreSQL (psycopg 3) and SQLite (aiosqlite), real SQLAlchemy."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import create_engine, func, select, text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from sqlalchemy.orm import Session

from jobfence import App, BusinessError, Job, RetryPolicy, TemporaryError, Tx, outbox
from jobfence.review import deadletters
from jobfence.review.deadletters import Actor
from jobfence.runtime.harness import Outcome

from ..helpers import RunningWorker, eventually, query, scalar, table
from .orm_app import Credit, build, create_tables, engine_url

FAST = RetryPolicy(
    base=timedelta(seconds=0.05),
    cap=timedelta(seconds=1),
    justification="tests: compressed backoff so a full retry cycle takes about a second",
)
OPERATOR = Actor(name="alice")


@pytest.fixture
async def orm(database_url: str) -> AsyncIterator[tuple[App, AsyncEngine, str]]:
    app, engine = build(database_url)
    await create_tables(engine)
    try:
        yield app, engine, database_url
    finally:
        await app.close()
        await engine.dispose()


async def credits(engine: AsyncEngine) -> list[tuple[str, int]]:
    async with AsyncSession(engine) as session:
        rows = await session.execute(select(Credit.job_id, Credit.points).order_by(Credit.job_id))
        return [(r[0], r[1]) for r in rows]


async def fences(url: str) -> int:
    return int(await scalar(url, f"SELECT count(*) FROM {table(url, 'processed_jobs')}"))


async def test_parallel_deliveries_make_one_orm_row_and_one_fence(
    orm: tuple[App, AsyncEngine, str],
) -> None:
    """48 deliveries of one job_id, 32 at a time: the handler's ORM write happens once."""
    app, engine, url = orm
    calls: list[str] = []

    @app.consumer("orm.credit")
    async def handle(job: Job[dict[str, Any]], session: AsyncSession) -> None:
        calls.append(job.job_id)
        await asyncio.sleep(0.05)  # widen the race: duplicates pile up behind the fence
        session.add(Credit(job_id=job.job_id, member_id=job.payload["member_id"], points=10))

    async with app:
        jobs = [app.job("orm.credit", {"member_id": "m-1"}, job_id="order-42") for _ in range(48)]
        await app.enqueue_many(jobs)
        async with RunningWorker(app, concurrency=32) as w:
            await eventually(lambda: w.stats.handled == 48, what="48 deliveries settled")
    assert await credits(engine) == [("order-42", 10)]
    assert calls == ["order-42"]
    assert w.stats.outcomes[Outcome.PROCESSED] == 1
    assert w.stats.outcomes[Outcome.DUPLICATE] == 47
    assert await fences(url) == 1


async def test_a_handler_that_raises_after_orm_writes_leaves_neither(
    orm: tuple[App, AsyncEngine, str],
) -> None:
    app, engine, url = orm

    @app.consumer("orm.credit")
    async def handle(job: Job[dict[str, Any]], session: AsyncSession) -> None:
        session.add(Credit(job_id=job.job_id, member_id="m", points=1))
        await session.flush()  # the row is in the database, inside the job's transaction
        raise BusinessError("credit above the daily limit")

    async with app:
        await app.enqueue("orm.credit", {}, job_id="big-1")
        async with RunningWorker(app) as w:
            await eventually(lambda: w.stats.handled == 1, what="settled")
        letters = await deadletters.letters(app.db)
    assert [(x.job_id, x.error_category) for x in letters] == [("big-1", "BUSINESS_ERROR")]
    assert await credits(engine) == []
    assert await fences(url) == 0


async def test_transient_failures_retry_then_dead_letter_without_effect(
    orm: tuple[App, AsyncEngine, str],
) -> None:
    app, engine, url = orm
    attempts: list[int] = []

    @app.consumer("orm.credit", retry=FAST)
    async def handle(job: Job[dict[str, Any]], session: AsyncSession) -> None:
        attempts.append(job.attempt)
        session.add(Credit(job_id=job.job_id, member_id="m", points=job.attempt))
        await session.flush()
        raise TemporaryError("ERP answered 503")

    async with app:
        await app.enqueue("orm.credit", {}, job_id="t-1")
        async with RunningWorker(app, concurrency=2):
            letters = await eventually(
                lambda: deadletters.letters(app.db), timeout=30, what="a dead letter"
            )
    assert attempts == [1, 2, 3, 4, 5, 6]
    assert (letters[0].job_id, letters[0].error_category) == ("t-1", "TEMPORARY_ERROR")
    assert await credits(engine) == []
    assert await fences(url) == 0


async def test_a_replay_has_no_second_effect(orm: tuple[App, AsyncEngine, str]) -> None:
    """A dead letter replayed after the fix applies once; delivering the same job_id again
    (another replay, a redelivery) meets the fence."""
    app, engine, url = orm
    broken = True

    @app.consumer("orm.credit")
    async def handle(job: Job[dict[str, Any]], session: AsyncSession) -> None:
        session.add(Credit(job_id=job.job_id, member_id="m", points=7))
        if broken:
            raise BusinessError("member unknown")

    async with app:
        await app.enqueue("orm.credit", {}, job_id="r-1")
        async with RunningWorker(app) as w:
            letters = await eventually(lambda: deadletters.letters(app.db), what="dead letter")
            broken = False
            await deadletters.replay(app.db, app.transport, letters[0].id, actor=OPERATOR)
            await eventually(lambda: w.stats.outcomes[Outcome.PROCESSED] == 1, what="replayed")
            await app.enqueue("orm.credit", {}, job_id="r-1")
            await eventually(lambda: w.stats.outcomes[Outcome.DUPLICATE] == 1, what="duplicate")
    assert await credits(engine) == [("r-1", 7)]
    assert await fences(url) == 1


async def test_enqueue_and_outbox_in_the_callers_session(
    orm: tuple[App, AsyncEngine, str],
) -> None:
    """The job and the event exist only if the session commits."""
    app, engine, url = orm
    async with app:
        async with AsyncSession(engine) as session:
            session.add(Credit(job_id="kept", member_id="m", points=1))
            await app.enqueue("orm.credit", {}, job_id="kept", session=session)
            await outbox.write(session, "orm.events", {"id": "kept"}, event_id="ev-kept")
            await session.commit()
        async with AsyncSession(engine) as session, session.begin():
            session.add(Credit(job_id="dropped", member_id="m", points=1))
            await app.enqueue("orm.credit", {}, job_id="dropped", session=session)
            await outbox.write(session, "orm.events", {"id": "dropped"}, event_id="ev-dropped")
            await session.rollback()
        jobs = table(url, "jobs")
        assert await scalar(url, f"SELECT count(*) FROM {jobs} WHERE job_id = 'kept'") == 1
        assert await scalar(url, f"SELECT count(*) FROM {jobs} WHERE job_id = 'dropped'") == 0
        events = table(url, "outbox")
        assert await scalar(url, f"SELECT count(*) FROM {events}") == 1
    assert await credits(engine) == [("kept", 1)]


async def test_session_commit_and_rollback_in_a_handler_are_savepoints(
    orm: tuple[App, AsyncEngine, str],
) -> None:
    """``session.commit()`` keeps the work so far but does not end the job's transaction (a
    later raise undoes it, fence included); ``session.rollback()`` undoes the work since the
    last commit and the handler carries on."""
    app, engine, url = orm

    @app.consumer("orm.credit")
    async def handle(job: Job[dict[str, Any]], session: AsyncSession) -> None:
        session.add(Credit(job_id=f"{job.job_id}-a", member_id="m", points=1))
        await session.commit()
        session.add(Credit(job_id=f"{job.job_id}-b", member_id="m", points=2))
        await session.rollback()
        session.add(Credit(job_id=f"{job.job_id}-c", member_id="m", points=3))
        if job.payload.get("fail"):
            raise BusinessError("after session.commit()")

    async with app:
        await app.enqueue("orm.credit", {}, job_id="ok")
        await app.enqueue("orm.credit", {"fail": True}, job_id="bad")
        async with RunningWorker(app) as w:
            await eventually(lambda: w.stats.handled == 2, what="settled")
    assert await credits(engine) == [("ok-a", 1), ("ok-c", 3)]
    assert await fences(url) == 1


@pytest.mark.parametrize(
    "how",
    ["connection.commit", "connection.rollback", "COMMIT text", "driver.commit"],
)
async def test_ending_the_jobs_transaction_is_refused(
    orm: tuple[App, AsyncEngine, str], how: str
) -> None:
    """Committing or rolling back the connection under the session — through SQLAlchemy, as
    SQL text, or on the driver's own connection — never commits the work without its fence:
    the job fails even though the handler swallows the error, nothing of it commits, and its
    dead letter says why."""
    app, engine, url = orm
    seen: list[str] = []

    @app.consumer("orm.credit", retry=FAST)
    async def handle(job: Job[dict[str, Any]], session: AsyncSession) -> None:
        session.add(Credit(job_id=job.job_id, member_id="m", points=job.attempt))
        await session.flush()
        conn = await session.connection()
        try:
            if how == "connection.commit":
                await conn.commit()
            elif how == "connection.rollback":
                await conn.rollback()
            elif how == "COMMIT text":
                await session.execute(text("COMMIT"))
            else:
                raw = await conn.get_raw_connection()
                await raw.driver_connection.commit()  # type: ignore[union-attr]
        except Exception as exc:  # the handler swallows it: the job must fail all the same
            seen.append(type(exc).__name__)

    async with app:
        await app.enqueue("orm.credit", {}, job_id="c-1")
        async with RunningWorker(app):
            letters = await eventually(
                lambda: deadletters.letters(app.db), timeout=30, what="a dead letter"
            )
    assert seen, "the handler saw its statement refused"
    assert letters[0].error_category == "TECHNICAL_ERROR"
    assert letters[0].error_code in ("TX_CONTROL_REFUSED", "TX_ENDED")
    assert await credits(engine) == []
    assert await fences(url) == 0


async def test_a_raw_tx_handler_gets_the_session_too(orm: tuple[App, AsyncEngine, str]) -> None:
    """``tx.session`` is the session joined to the job's transaction; ``tx`` statements and
    ORM writes commit together."""
    app, engine, _url = orm

    @app.consumer("orm.credit")
    async def handle(job: Job[dict[str, Any]], tx: Tx) -> None:
        assert isinstance(tx.session, AsyncSession)
        tx.session.add(Credit(job_id=job.job_id, member_id="orm", points=1))
        await tx.session.flush()
        await tx.execute(
            "UPDATE orm_credits SET points = points + %(n)s WHERE job_id = %(id)s",
            {"n": 41, "id": job.job_id},
        )

    async with app:
        await app.enqueue("orm.credit", {}, job_id="raw-1")
        async with RunningWorker(app) as w:
            await eventually(lambda: w.stats.handled == 1, what="settled")
    assert await credits(engine) == [("raw-1", 42)]
    async with AsyncSession(engine) as session:
        assert await session.scalar(select(func.count()).select_from(Credit)) == 1


def test_a_session_handler_needs_an_engine_app(tmp_path: Any) -> None:
    app = App(f"sqlite:///{tmp_path / 'x.db'}")
    with pytest.raises(Exception, match=r"App\(engine=engine\)"):

        @app.consumer("q")
        async def handle(job: Job[Any], session: AsyncSession) -> None: ...


def test_importing_jobfence_does_not_need_sqlalchemy() -> None:
    """The integration is optional: jobfence imports without SQLAlchemy, and an app built
    from an engine without the extra says what to install, in one line."""
    script = (
        "import sys; sys.modules['sqlalchemy'] = None\n"
        "import jobfence\n"
        "try:\n"
        "    jobfence.App(engine=object())\n"
        "except jobfence.JobfenceError as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.startswith("App(engine=…) needs jobfence[sqlalchemy]: pip install")
    assert len(done.stdout.strip().splitlines()) == 1


def test_enqueue_sync_and_outbox_in_a_sync_session(database_url: str) -> None:
    """Synchronous code: a SQLAlchemy ``Session`` on psycopg or sqlite3 — the job and the
    event exist only if the session commits."""
    url = database_url
    engine = create_engine(engine_url(url).replace("+aiosqlite", ""))
    app = App(url)
    try:
        for job_id, keep in (("sync-kept", True), ("sync-dropped", False)):
            with Session(engine) as session:
                session.execute(text("SELECT 1"))
                app.enqueue_sync("orm.credit", {}, job_id=job_id, session=session)
                outbox.write_sync(session, "orm.events", {}, event_id=f"ev-{job_id}")
                if keep:
                    session.commit()
                else:
                    session.rollback()
    finally:
        engine.dispose()
    jobs, events = table(url, "jobs"), table(url, "outbox")
    assert asyncio.run(query(url, f"SELECT job_id FROM {jobs}")) == [("sync-kept",)]
    assert asyncio.run(query(url, f"SELECT event_id FROM {events}")) == [("ev-sync-kept",)]
