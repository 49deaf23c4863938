"""Issue 13, synchronous SQLAlchemy: an app built from an ``Engine`` (``create_engine``) runs
``def handle(job, session: Session)`` in a worker thread, the ``Session`` joined to the
transaction that holds the fence — the seed's criteria again, on PostgreSQL (psycopg 3) and
SQLite (sqlite3), real SQLAlchemy. (SIGKILL: tests/orm/test_orm_crash.py.)"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, select, text
from sqlalchemy.orm import Session

from jobfence import App, BusinessError, ConfigurationError, Job, TemporaryError
from jobfence.review import deadletters
from jobfence.review.deadletters import Actor
from jobfence.runtime.harness import Outcome

from ..helpers import RunningWorker, eventually, scalar, table
from .orm_app import Base, Credit, build_sync
from .test_orm import FAST

OPERATOR = Actor(name="alice")


@pytest.fixture
def orm(database_url: str) -> Iterator[tuple[App, Engine, str]]:
    app, engine = build_sync(database_url, auto_migrate=True)
    Base.metadata.create_all(engine)
    try:
        yield app, engine, database_url
    finally:
        engine.dispose()


def credits(engine: Engine) -> list[tuple[str, int]]:
    with Session(engine) as session:
        rows = session.execute(select(Credit.job_id, Credit.points).order_by(Credit.job_id))
        return [(r[0], r[1]) for r in rows]


async def fences(url: str) -> int:
    return int(await scalar(url, f"SELECT count(*) FROM {table(url, 'processed_jobs')}"))


async def test_parallel_deliveries_make_one_orm_row_and_one_fence(
    orm: tuple[App, Engine, str],
) -> None:
    """48 deliveries of one job_id, 32 handler threads at a time: one ORM write."""
    app, engine, url = orm
    calls: list[str] = []

    @app.consumer("orm.credit")
    def handle(job: Job[dict[str, Any]], session: Session) -> None:
        calls.append(job.job_id)
        time.sleep(0.05)  # widen the race: duplicates pile up behind the fence
        session.add(Credit(job_id=job.job_id, member_id=job.payload["member_id"], points=10))

    async with app:
        jobs = [app.job("orm.credit", {"member_id": "m-1"}, job_id="order-42") for _ in range(48)]
        await app.enqueue_many(jobs)
        async with RunningWorker(app, concurrency=32) as w:
            await eventually(lambda: w.stats.handled == 48, timeout=60, what="48 settled")
    assert credits(engine) == [("order-42", 10)]
    assert calls == ["order-42"]
    assert w.stats.outcomes[Outcome.PROCESSED] == 1
    assert w.stats.outcomes[Outcome.DUPLICATE] == 47
    assert await fences(url) == 1


async def test_raise_transient_and_replay(orm: tuple[App, Engine, str]) -> None:
    """A handler that raises after its ORM writes leaves neither; a transient failure retries
    and is dead-lettered, still without effect; the fixed handler's replay applies once, and
    the same job_id again meets the fence."""
    app, engine, url = orm
    attempts: dict[str, list[int]] = {"bad": [], "flaky": []}
    broken = True

    @app.consumer("orm.credit", retry=FAST)
    def handle(job: Job[dict[str, Any]], session: Session) -> None:
        attempts[job.job_id].append(job.attempt)
        session.add(Credit(job_id=job.job_id, member_id="m", points=7))
        session.flush()  # the row is in the database, inside the job's transaction
        if job.job_id == "flaky":
            raise TemporaryError("ERP answered 503")
        if broken:
            raise BusinessError("member unknown")

    async with app:
        await app.enqueue("orm.credit", {}, job_id="bad")
        await app.enqueue("orm.credit", {}, job_id="flaky")
        async with RunningWorker(app, concurrency=2) as w:

            async def two_letters() -> list[Any] | None:
                found = await deadletters.letters(app.db)
                return found if len(found) == 2 else None

            letters = await eventually(two_letters, timeout=30, what="two dead letters")
            assert credits(engine) == []
            assert await fences(url) == 0
            got = {x.job_id: x.error_category for x in letters}
            assert got == {"bad": "BUSINESS_ERROR", "flaky": "TEMPORARY_ERROR"}
            assert attempts == {"bad": [1], "flaky": [1, 2, 3, 4, 5, 6]}

            broken = False
            bad = next(x for x in letters if x.job_id == "bad")
            await deadletters.replay(app.db, app.transport, bad.id, actor=OPERATOR)
            await eventually(lambda: w.stats.outcomes[Outcome.PROCESSED] == 1, what="replayed")
            await app.enqueue("orm.credit", {}, job_id="bad")
            await eventually(lambda: w.stats.outcomes[Outcome.DUPLICATE] == 1, what="duplicate")
    assert credits(engine) == [("bad", 7)]
    assert await fences(url) == 1


async def test_session_commit_and_rollback_in_a_handler_are_savepoints(
    orm: tuple[App, Engine, str],
) -> None:
    """``session.commit()`` keeps the work so far inside the job's transaction (a later raise
    still undoes it, fence included); ``session.rollback()`` undoes the work since then."""
    app, engine, url = orm

    @app.consumer("orm.credit")
    def handle(job: Job[dict[str, Any]], session: Session) -> None:
        session.add(Credit(job_id=f"{job.job_id}-a", member_id="m", points=1))
        session.commit()
        session.add(Credit(job_id=f"{job.job_id}-b", member_id="m", points=2))
        session.rollback()
        session.add(Credit(job_id=f"{job.job_id}-c", member_id="m", points=3))
        if job.payload.get("fail"):
            raise BusinessError("after session.commit()")

    async with app:
        await app.enqueue("orm.credit", {}, job_id="ok")
        await app.enqueue("orm.credit", {"fail": True}, job_id="bad")
        async with RunningWorker(app) as w:
            await eventually(lambda: w.stats.handled == 2, what="settled")
    assert credits(engine) == [("ok-a", 1), ("ok-c", 3)]
    assert await fences(url) == 1


@pytest.mark.parametrize(
    "how", ["connection.commit", "connection.rollback", "COMMIT text", "driver.commit"]
)
async def test_ending_the_jobs_transaction_is_refused(
    orm: tuple[App, Engine, str], how: str
) -> None:
    """Committing or rolling back the connection under the session — through SQLAlchemy, as
    SQL text, or on the driver's own connection — never commits the work without its fence:
    the job fails although the handler swallows the error, and nothing of it commits."""
    app, engine, url = orm
    seen: list[str] = []

    @app.consumer("orm.credit", retry=FAST)
    def handle(job: Job[dict[str, Any]], session: Session) -> None:
        session.add(Credit(job_id=job.job_id, member_id="m", points=job.attempt))
        session.flush()
        conn = session.connection()
        try:
            if how == "connection.commit":
                conn.commit()
            elif how == "connection.rollback":
                conn.rollback()
            elif how == "COMMIT text":
                session.execute(text("COMMIT"))
            else:
                conn.connection.driver_connection.commit()  # type: ignore[union-attr]
        except Exception as exc:  # the handler swallows it: the job must fail all the same
            seen.append(type(exc).__name__)

    async with app:
        await app.enqueue("orm.credit", {}, job_id="c-1")
        async with RunningWorker(app):
            letters = await eventually(
                lambda: deadletters.letters(app.db), timeout=30, what="a dead letter"
            )
    if how != "driver.commit" or url.startswith("sqlite"):
        assert seen, "the handler saw its statement refused"
    assert letters[0].error_category == "TECHNICAL_ERROR"
    assert letters[0].error_code in ("TX_CONTROL_REFUSED", "TX_ENDED")
    assert credits(engine) == []
    assert await fences(url) == 0


async def test_a_handler_enqueues_in_its_own_transaction(orm: tuple[App, Engine, str]) -> None:
    """``app.enqueue_sync(..., session=session)`` inside a handler joins the job's transaction:
    the follow-up exists only if the handler's work commits."""
    app, engine, _url = orm

    @app.consumer("orm.credit")
    def handle(job: Job[dict[str, Any]], session: Session) -> None:
        session.add(Credit(job_id=job.job_id, member_id="m", points=1))
        if not job.job_id.startswith("follow-"):
            app.enqueue_sync("orm.credit", {}, job_id=f"follow-{job.job_id}", session=session)
        if job.payload.get("fail"):
            raise BusinessError("no")

    async with app:
        await app.enqueue("orm.credit", {}, job_id="a")
        await app.enqueue("orm.credit", {"fail": True}, job_id="b")
        async with RunningWorker(app) as w:
            await eventually(lambda: w.stats.handled == 3, what="settled")
    assert credits(engine) == [("a", 1), ("follow-a", 1)]


def test_handlers_of_a_sync_engine_app_are_def_with_a_session(tmp_path: Any) -> None:
    app, engine = build_sync(f"sqlite:///{tmp_path / 'x.db'}")
    try:
        with pytest.raises(ConfigurationError, match=r"is `async def`, but the app's engine"):

            @app.consumer("a")
            async def handle_async(job: Job[Any], session: Session) -> None: ...

        with pytest.raises(ConfigurationError, match=r"def handle\(job, session: Session\)"):

            @app.consumer("b")
            def handle_tx(job: Job[Any], tx: Any) -> None: ...

        with pytest.raises(ConfigurationError, match=r"not object"):
            App(engine=object())
    finally:
        engine.dispose()


async def test_other_connections_of_the_engine_commit_while_a_job_holds_one(
    orm: tuple[App, Engine, str],
) -> None:
    """The guards watch only the connection lent to a handler: while a job holds one, the
    application's own connections of the same engine commit and roll back as usual."""
    app, engine, url = orm
    inside, release = threading.Event(), threading.Event()

    @app.consumer("orm.credit")
    def handle(job: Job[dict[str, Any]], session: Session) -> None:
        session.add(Credit(job_id=job.job_id, member_id="m", points=1))
        session.flush()
        inside.set()
        release.wait(30)

    def own_work() -> None:
        for end in ("commit", "rollback"):
            with engine.connect() as conn:
                conn.execute(text("SELECT count(*) FROM orm_credits"))
                getattr(conn, end)()
        if url.startswith("postgresql"):  # SQLite: the job holds the one writer
            with Session(engine) as session:
                session.add(Credit(job_id="web", member_id="m", points=2))
                session.commit()

    async with app:
        await app.enqueue("orm.credit", {}, job_id="job")
        async with RunningWorker(app) as w:
            await eventually(lambda: inside.is_set(), what="the handler holds its connection")
            try:
                await asyncio.to_thread(own_work)
            finally:
                release.set()
            await eventually(lambda: w.stats.handled == 1, what="settled")
    expected = [("job", 1), ("web", 2)] if url.startswith("postgresql") else [("job", 1)]
    assert credits(engine) == expected
    assert await fences(url) == 1
