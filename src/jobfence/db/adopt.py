"""The caller's connection, adopted: jobfence's named statements run inside a transaction the
caller holds (enqueue and outbox writes next to the caller's own, SPEC O1), on whichever
driver the caller uses. One place knows the drivers' connection classes."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import aiosqlite
import psycopg

from ..config import DatabaseURL, env_schema
from ..errors import EnqueueError, extra_needed
from ..sql import Dialect, queries
from . import Row, SyncTx, Tx


def adopt(connection: Any, *, doing: str, sync_way: str, schema: str | None = None) -> Tx:
    """``connection`` as a :class:`Tx`: a jobfence ``Tx`` (a handler's) as it is, a psycopg
    ``AsyncConnection`` or an aiosqlite ``Connection`` inside the caller's transaction.
    ``doing`` and ``sync_way`` word the error for anything else; ``schema`` is where
    jobfence's tables are (default ``$JOBFENCE_SCHEMA``, else ``core``)."""
    if isinstance(connection, Tx):
        return connection
    if isinstance(connection, SyncTx):
        raise EnqueueError(f"from a plain `def` handler use {sync_way}")
    if isinstance(connection, psycopg.AsyncConnection):
        from .postgres import PgTx

        return PgTx(connection, queries("postgresql", schema or env_schema()))
    if isinstance(connection, aiosqlite.Connection):
        from .sqlite import SqliteTx

        return SqliteTx(connection, queries("sqlite"))
    raise EnqueueError(
        f"cannot {doing} on a {type(connection).__name__}; pass the handler's tx, a psycopg "
        f"AsyncConnection or an aiosqlite Connection (sync connections: {sync_way})"
    )


def is_sqlalchemy(obj: Any) -> bool:
    """Whether ``obj`` is a SQLAlchemy session or connection (imports nothing)."""
    return type(obj).__module__.startswith("sqlalchemy.")


async def adopt_async(
    connection: Any, *, doing: str, sync_way: str, schema: str | None = None
) -> Tx:
    """:func:`adopt`, and also a SQLAlchemy ``AsyncSession`` or ``AsyncConnection``: jobfence's
    statements run in the transaction the session holds (begun now if it had not begun)."""
    if is_sqlalchemy(connection):
        with extra_needed("sqlalchemy", f"{doing} in a SQLAlchemy session"):
            from .sqlalchemy import driver_connection
        connection = await driver_connection(connection)
    return adopt(connection, doing=doing, sync_way=sync_way, schema=schema)


@contextmanager
def connect_sync(url: DatabaseURL) -> Iterator[Any]:
    """A short synchronous connection of jobfence's own (for ``enqueue_sync`` without the
    caller's): committed when the block ends, rolled back if it raises, then closed."""
    if url.dialect == "sqlite":
        conn = sqlite3.connect(url.target, timeout=30)
        try:
            with conn:
                yield conn
        finally:
            conn.close()
        return
    with psycopg.connect(url.target) as pg:
        yield pg


class SyncConnection:
    """A caller's *synchronous* connection (psycopg ``Connection``, ``sqlite3.Connection``,
    a SQLAlchemy ``Session``/``Connection`` on one of them, or a ``def`` handler's
    :class:`SyncTx`), running jobfence's named statements inside the
    caller's transaction; the caller commits."""

    def __init__(
        self,
        connection: Any,
        *,
        doing: str,
        dialect: Dialect | None = None,
        schema: str | None = None,
    ) -> None:
        if is_sqlalchemy(connection):
            with extra_needed("sqlalchemy", f"{doing} in a SQLAlchemy session"):
                from .sqlalchemy import sync_driver_connection
            connection = sync_driver_connection(connection)
        if isinstance(connection, SyncTx):
            found: Dialect = connection.dialect
        elif isinstance(connection, sqlite3.Connection):
            found = "sqlite"
        elif isinstance(connection, psycopg.Connection):
            found = "postgresql"
        else:
            raise EnqueueError(
                f"cannot {doing} on a {type(connection).__name__}; pass a psycopg Connection, "
                "an sqlite3 Connection or a `def` handler's tx"
            )
        if dialect is not None and found != dialect:
            raise EnqueueError(f"a {found} connection cannot {doing} in a {dialect} store")
        self.connection = connection
        self.dialect = found
        self._sql = queries(found, schema or env_schema())

    def run(self, name: str, params: Mapping[str, Any]) -> list[Row]:
        """One named statement; its rows as dicts."""
        conn = self.connection
        if isinstance(conn, SyncTx):
            rows: list[Row] = conn.run_sync(conn.async_tx.q(name, params))
            return rows
        if isinstance(conn, sqlite3.Connection):
            cur = conn.execute(self._sql[name], params)
            names = [d[0] for d in cur.description or ()]
            return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
        with conn.cursor() as pg:
            pg.execute(self._sql[name], params)
            names = [d.name for d in pg.description or ()]
            return [dict(zip(names, row, strict=True)) for row in pg.fetchall()]

    def run_many(self, name: str, params: Sequence[Mapping[str, Any]]) -> None:
        """One named statement per parameter set."""
        conn = self.connection
        if isinstance(conn, SyncTx):
            conn.run_sync(conn.async_tx.qmany(name, params))
        elif isinstance(conn, sqlite3.Connection):
            conn.executemany(self._sql[name], params)
        else:
            with conn.cursor() as pg:
                pg.executemany(self._sql[name], params)
