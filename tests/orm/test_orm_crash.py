"""Issue 13: SIGKILL of a worker subprocess inside the handler's ORM transaction leaves
neither the ORM row nor the fence; the redelivery makes exactly one of each — for an app
built from an ``AsyncEngine`` (``AsyncSession``) and from an ``Engine`` (``Session``, the
handler in a worker thread)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from ..helpers import eventually, scalar, start_worker, stop_process, table, wait_until
from .orm_app import Credit, build, create_tables

APPS = {"async": "tests.orm.orm_app:app", "sync": "tests.orm.orm_app:sync_app"}


async def rows(url: str) -> list[tuple[str, int]]:
    _app, engine = build(url)
    try:
        async with AsyncSession(engine) as session:
            found = await session.execute(select(Credit.job_id, Credit.points))
            return [(r[0], r[1]) for r in found]
    finally:
        await engine.dispose()


@pytest.mark.parametrize("engine_kind", ["async", "sync"])
async def test_sigkill_inside_the_orm_transaction_leaves_neither(
    database_url: str, tmp_path: Path, engine_kind: str
) -> None:
    url = database_url
    worker_app = APPS[engine_kind]
    app, engine = build(url, auto_migrate=True)
    await create_tables(engine)
    async with app:
        await app.enqueue("orm.credit", {"member_id": "m-1", "mode": "hang-in-tx"}, job_id="k-1")
    await engine.dispose()
    env = {"JF_DB": url, "JF_MARKS": str(tmp_path), "JF_LEASE": "1"}
    proc = start_worker(worker_app, env, tmp_path / "w1.log")
    try:
        wait_until(
            lambda: (tmp_path / "k-1.in-tx").exists(), timeout=60, what="handler inside its tx"
        )
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    fences = f"SELECT count(*) FROM {table(url, 'processed_jobs')}"
    assert await rows(url) == []
    assert await scalar(url, fences) == 0

    proc2 = start_worker(worker_app, env, tmp_path / "w2.log")
    try:
        await eventually(lambda: scalar(url, fences), timeout=30, what="redelivery fenced")
    finally:
        assert stop_process(proc2) == 0
    assert await rows(url) == [("k-1", 2)]  # attempt 2: the lost delivery counted
    assert await scalar(url, fences) == 1
    assert await scalar(url, f"SELECT count(*) FROM {table(url, 'jobs')}") == 0
