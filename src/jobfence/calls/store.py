"""Where the call ledger lives, and the connection it is written through (SPEC E2).

A call's intent must be durable *before* its request leaves, in a transaction of its own —
not the job's, which commits only when the handler returns. So the ledger is written through
a database handle of its own:

- **PostgreSQL**: the table ``calls`` in jobfence's schema of the same database, written
  through a small pool of its own (:data:`POOL_SIZE` connections), so a ledger write never
  waits for a connection that running jobs hold.
- **SQLite**: the job's transaction holds the store's only write lock for as long as its
  handler runs (``BEGIN IMMEDIATE``), so no other connection can write to that file until the
  job ends. The ledger is therefore a file of its own next to the store,
  ``<store>-calls`` (``jobs.db`` → ``jobs.db-calls``), with its own write lock: a jobfence
  store of its own (migrated when opened) whose ``core_calls`` table is the ledger. Its
  writes are short transactions in WAL mode with ``synchronous = FULL``, durable on disk
  before the request leaves. Back it up and move it together with the store; the store's own
  ``core_calls`` table stays empty.
"""

from __future__ import annotations

from dataclasses import replace

from ..config import DatabaseURL
from ..db import Database, connect
from ..store import Store

#: connections of the ledger's own pool on PostgreSQL (each write is one short statement)
POOL_SIZE = 4
#: what the SQLite ledger's file name adds to the store's
SQLITE_SUFFIX = "-calls"


def ledger_url(url: DatabaseURL) -> DatabaseURL:
    """The database that holds the call ledger of the store at ``url`` (module docstring)."""
    if url.dialect == "postgresql":
        return url
    return replace(url, target=url.target + SQLITE_SUFFIX, display=url.display + SQLITE_SUFFIX)


async def open_ledger(url: DatabaseURL, *, pool_size: int = POOL_SIZE) -> Database:
    """An open handle on the ledger of the store at ``url``: on SQLite the ledger's file is
    created and migrated when needed; on PostgreSQL the store's schema must be migrated (the
    app checks it when it opens)."""
    db = connect(ledger_url(url))
    await db.open(max_size=pool_size)
    try:
        if db.dialect == "sqlite":
            await Store(db).migrate()
        else:
            await Store(db).check_schema()
    except BaseException:
        await db.close()
        raise
    return db
