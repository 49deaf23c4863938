"""Issue 28, point 4: on SQLite, a handler that writes the job's own file through a second
connection (another SQLAlchemy engine; Django: tests/integrations) waits for the write lock
its own job holds until it returns — it can never succeed. The first attempt fails, at once
and for good, with an error that says why (``DB_SECOND_CONNECTION``), instead of every
attempt failing with "database is locked" until the job is dead-lettered."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from jobfence import App, Job

from ..helpers import RunningWorker, eventually, query, table
from .orm_app import build, build_sync, create_tables, engine_url, sync_engine_url

INSERT = "INSERT INTO orm_credits (job_id, member_id, points) VALUES (:job, 'm', 1)"


async def letters_and_rows(url: str) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    letters = await query(
        url,
        f"SELECT job_id, attempts, error_category, error_code, last_error "
        f"FROM {table(url, 'dead_letters')}",
    )
    rows = await query(url, "SELECT job_id FROM orm_credits ORDER BY job_id")
    return letters, rows


def check(letters: list[tuple[Any, ...]], rows: list[tuple[Any, ...]], url: str) -> None:
    ((job_id, attempts, category, code, error),) = letters
    assert (job_id, attempts, category, code) == (
        "j",
        1,
        "NON_RETRYABLE_ERROR",
        "DB_SECOND_CONNECTION",
    ), error
    path = url.removeprefix("sqlite:///")
    assert "through a second SQLAlchemy engine" in error, error
    assert path.rsplit("/", 1)[-1] in error, error
    assert rows == [], rows  # neither the handler's own write nor the other one


@pytest.mark.parametrize("door", ["async", "tx"])
async def test_a_second_async_engine_to_the_jobs_file_fails_the_first_attempt(
    sqlite_database: str, door: str
) -> None:
    url = sqlite_database
    app, engine = build(url) if door == "async" else (App(url), None)
    setup = create_async_engine(engine_url(url))
    await create_tables(setup)
    await setup.dispose()
    other = create_async_engine(engine_url(url))  # the user's second engine, same file

    async def write_elsewhere(job_id: str) -> None:
        async with other.begin() as conn:
            await conn.execute(text(INSERT), {"job": f"{job_id}-other"})

    if engine is not None:

        @app.consumer("q")
        async def handle(job: Job[Any], session: AsyncSession) -> None:
            await session.execute(text(INSERT), {"job": job.job_id})
            await write_elsewhere(job.job_id)

    else:

        @app.consumer("q")
        async def handle_tx(job: Job[Any], tx: Any) -> None:
            await tx.execute(
                "INSERT INTO orm_credits (job_id, member_id, points) VALUES (%s, 'm', 1)",
                (job.job_id,),
            )
            await write_elsewhere(job.job_id)

    try:
        async with app:
            await app.enqueue("q", {}, job_id="j")
            async with RunningWorker(app) as w:
                await eventually(lambda: w.stats.handled >= 1, timeout=60, what="settled")
    finally:
        await other.dispose()
        if engine is not None:
            await engine.dispose()
    check(*await letters_and_rows(url), url)


async def test_a_second_sync_engine_to_the_jobs_file_fails_the_first_attempt(
    sqlite_database: str,
) -> None:
    url = sqlite_database
    app, engine = build_sync(url)
    setup = create_async_engine(engine_url(url))
    await create_tables(setup)
    await setup.dispose()
    other = create_engine(sync_engine_url(url))

    @app.consumer("q")
    def handle(job: Job[Any], session: Session) -> None:
        session.execute(text(INSERT), {"job": job.job_id})
        with other.begin() as conn:
            conn.execute(text(INSERT), {"job": f"{job.job_id}-other"})

    try:
        async with app:
            await app.enqueue("q", {}, job_id="j")
            async with RunningWorker(app) as w:
                await eventually(lambda: w.stats.handled >= 1, timeout=60, what="settled")
    finally:
        other.dispose()
        engine.dispose()
    check(*await letters_and_rows(url), url)
