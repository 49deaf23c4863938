"""A background duty (cleanup, alert dispatch) cancelled at worker shutdown while its
transaction was still waiting for SQLite's write lock must not leave the pooled connection
inside a transaction (found by the dead-letter tests: "cannot start a transaction within a
transaction" on the next use)."""

from __future__ import annotations

import asyncio
import sqlite3

from jobfence.db.sqlite import SQLiteDatabase

from ..helpers import eventually
from .conftest import opened


async def test_a_transaction_cancelled_while_waiting_for_the_write_lock_leaves_no_transaction(
    sqlite_database: str,
) -> None:
    """Another process holds the write lock; our BEGIN IMMEDIATE waits on its busy timeout;
    the task is cancelled; the lock is released (so the BEGIN completes on the connection's
    thread). The next transaction on the same pool works, and sees no leftover."""
    path = sqlite_database.removeprefix("sqlite:///")
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    entered = asyncio.Event()
    async with opened(sqlite_database) as db:
        assert isinstance(db, SQLiteDatabase)

        async def wait_for_the_lock() -> None:
            entered.set()
            async with db.transaction() as tx:
                await tx.execute("SELECT 1")

        task = asyncio.create_task(wait_for_the_lock())
        await entered.wait()  # the task ran up to awaiting its BEGIN IMMEDIATE, now queued
        task.cancel()
        blocker.execute("COMMIT")  # the BEGIN now completes on the connection's thread
        await asyncio.gather(task, return_exceptions=True)
        assert task.cancelled()

        async def usable() -> bool:
            async with db.transaction() as tx:
                return await tx.fetchone("SELECT 1") == (1,)

        assert await eventually(usable, what="the pooled connection to be usable")
        assert not any(conn.in_transaction for conn in db._idle)
    blocker.close()
