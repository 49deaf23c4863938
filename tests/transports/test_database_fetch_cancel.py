"""The database queue's claim is not lost to a cancelled fetch (a worker cancels its fetch
when it stops): what the claim took comes back refunded instead of waiting out its lease
with an attempt lost."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from datetime import timedelta

import jobfence
from jobfence.config import parse_database_url
from jobfence.db import connect
from jobfence.transports.database import DatabaseQueue
from tests.helpers import query


async def test_a_fetch_cancelled_while_its_claim_waits_loses_no_attempt(
    sqlite_database: str,
) -> None:
    """SQLite runs the claim in the driver's thread, where a cancelled await does not stop
    it: the claim waits behind another writer, the fetch is cancelled, the writer lets go,
    the claim commits. The job must be handed back at close, with no attempt used."""
    app = jobfence.App(sqlite_database)
    async with app:
        await app.enqueue("q", {"n": 1}, job_id="j-1")
    path = sqlite_database.removeprefix("sqlite:///")
    db = connect(parse_database_url(sqlite_database))
    await db.open(max_size=1)
    queue = DatabaseQueue(db, shares_database=True, lease=timedelta(minutes=10))
    blocker = sqlite3.connect(path, isolation_level=None)
    try:
        blocker.execute("BEGIN IMMEDIATE")  # another writer holds the lock
        fetch = asyncio.create_task(queue.fetch(["q"], 10, 0.0))
        # let the claim reach the driver's thread, where it waits on the writer's lock
        await asyncio.sleep(0.3)
        assert not fetch.done()
        fetch.cancel()
        blocker.execute("COMMIT")  # the claim goes through now, in the thread
        with contextlib.suppress(asyncio.CancelledError):
            await fetch
        await queue.close()
    finally:
        blocker.close()
        await db.close()
    rows = await query(sqlite_database, "SELECT state, attempts FROM core_jobs")
    assert [tuple(r) for r in rows] == [("available", 0)]
