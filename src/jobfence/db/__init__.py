"""The database port: connections, transactions and named queries, one small driver per dialect.

Drivers only *execute*; :mod:`jobfence.store` owns what is executed. A :class:`Tx` is also
what a handler receives: its writes commit or roll back together with the fence row.
"""

from __future__ import annotations

import asyncio
import contextvars
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, LiteralString

from ..config import DatabaseURL
from ..sql import Dialect, queries

Params = Sequence[Any] | Mapping[str, Any] | None
Row = dict[str, Any]

#: Set while a handler's work transaction is open (lets us refuse self-deadlocks on SQLite).
current_tx: contextvars.ContextVar[Tx | None] = contextvars.ContextVar("jobfence_tx", default=None)


class Tx(ABC):
    """An open transaction. Handlers use ``execute``/``fetchone``/``fetchall`` with the
    driver's own placeholders (``%s`` on PostgreSQL, ``?`` on SQLite; see ``paramstyle``).
    ``connection`` is the driver's connection (psycopg ``AsyncConnection`` or aiosqlite
    ``Connection``) for anything else.
    """

    dialect: Dialect
    paramstyle: str

    @property
    @abstractmethod
    def connection(self) -> Any: ...

    @abstractmethod
    async def execute(self, sql: str, params: Params = None) -> int:
        """Run a statement; return the number of rows it affected."""

    @abstractmethod
    async def fetchall(self, sql: str, params: Params = None) -> list[tuple[Any, ...]]: ...

    async def fetchone(self, sql: str, params: Params = None) -> tuple[Any, ...] | None:
        rows = await self.fetchall(sql, params)
        return rows[0] if rows else None

    @abstractmethod
    async def q(self, name: str, params: Mapping[str, Any] | None = None) -> list[Row]:
        """Run a named jobfence query; rows as dicts."""

    @abstractmethod
    async def qmany(self, name: str, params: Sequence[Mapping[str, Any]]) -> None:
        """Run a named jobfence statement once per parameter set (batched by the driver)."""

    @abstractmethod
    async def script(self, sql: LiteralString) -> None:
        """Run several statements (migrations)."""


class SyncTx:
    """The same transaction for a plain ``def`` handler running in a worker thread.

    Each call is carried out on the event loop that owns the connection, so sync and async
    handlers share one driver and one transaction.
    """

    def __init__(self, tx: Tx, loop: asyncio.AbstractEventLoop) -> None:
        self._tx = tx
        self._loop = loop
        self.dialect = tx.dialect
        self.paramstyle = tx.paramstyle

    @property
    def async_tx(self) -> Tx:
        return self._tx

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def execute(self, sql: str, params: Params = None) -> int:
        result: int = self._run(self._tx.execute(sql, params))
        return result

    def fetchall(self, sql: str, params: Params = None) -> list[tuple[Any, ...]]:
        result: list[tuple[Any, ...]] = self._run(self._tx.fetchall(sql, params))
        return result

    def fetchone(self, sql: str, params: Params = None) -> tuple[Any, ...] | None:
        result: tuple[Any, ...] | None = self._run(self._tx.fetchone(sql, params))
        return result


class Database(ABC):
    """A pool of connections to one database."""

    dialect: Dialect

    def __init__(self, url: DatabaseURL) -> None:
        self.url = url
        self.sql = queries(url.dialect)

    @abstractmethod
    async def open(self, max_size: int = 10) -> None: ...

    @abstractmethod
    async def close(self) -> None: ...

    @abstractmethod
    def transaction(self) -> AbstractAsyncContextManager[Tx]:
        """A pooled connection inside a transaction that commits on success."""

    @abstractmethod
    def work(
        self, steps: Sequence[str], params: Mapping[str, Any]
    ) -> AbstractAsyncContextManager[tuple[Tx, list[list[Row]]]]:
        """A transaction that starts by running the named ``steps`` (one parameter set for
        all), in as few round trips as the driver allows; yields the transaction and each
        step's rows, and commits on success."""

    @abstractmethod
    async def run(self, name: str, params: Mapping[str, Any] | None = None) -> list[Row]:
        """Run one named query in its own transaction (autocommit)."""

    @abstractmethod
    def wakeups(self, channel: str) -> AsyncIterator[str]:
        """Yield notification payloads (PostgreSQL LISTEN); SQLite never yields."""

    @property
    def display(self) -> str:
        return self.url.display


def connect(url: DatabaseURL) -> Database:
    """A (not yet opened) :class:`Database` for a URL."""
    if url.dialect == "postgresql":
        from .postgres import PostgresDatabase

        return PostgresDatabase(url)
    from .sqlite import SQLiteDatabase

    return SQLiteDatabase(url)
