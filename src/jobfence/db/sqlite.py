"""SQLite driver: the embedded default. One file in WAL mode, safe for several processes.

SQLite has one writer at a time. Within a process, writers queue on an asyncio lock (no
busy-waiting); across processes they wait on SQLite's busy timeout. A work transaction
starts with ``BEGIN IMMEDIATE`` so it holds the write lock from its first statement: the
fence is written first, and a parallel duplicate waits for it.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, LiteralString, TypeVar

import aiosqlite

from ..errors import DatabaseLocked, DatabaseUnavailable, TransactionBoundaryError
from . import SAVEPOINT_PREFIX, Database, Params, Row, Tx, TxGuard, ended, refusal
from .placeholders import for_sqlite
from .second_writer import lending
from .translate import is_locked

BUSY_TIMEOUT_MS = 30_000
T = TypeVar("T")

# jobfence's own transaction control, spelled apart from anything a handler would write: the
# sqlite3 module caches prepared statements by their text, and the authorizer (below) is only
# consulted when a statement is prepared
_BEGIN = "BEGIN IMMEDIATE -- jobfence"
_COMMIT = "COMMIT -- jobfence"
_ROLLBACK = "ROLLBACK -- jobfence"


class LentGuard:
    """The guard of the transaction a connection has lent to a handler, if any."""

    __slots__ = ("guard",)

    def __init__(self) -> None:
        self.guard: TxGuard | None = None

    def authorize(
        self, action: int, arg1: str | None, arg2: str | None, _db: str | None, _trigger: str | None
    ) -> int:
        """SQLite's authorizer (SPEC H5): while a handler holds the transaction, refuse
        BEGIN/COMMIT/END/ROLLBACK, on ``tx`` or the raw connection (``commit()`` and
        ``rollback()`` included), and releasing or rolling back to jobfence's savepoints."""
        guard = self.guard
        if guard is None or not guard.active:
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_TRANSACTION:
            verb = (arg1 or "").upper()
        elif (
            action == sqlite3.SQLITE_SAVEPOINT
            and (arg1 or "").upper() in ("RELEASE", "ROLLBACK")
            and (arg2 or "").lower().startswith(SAVEPOINT_PREFIX)
        ):
            verb = f"{arg1} SAVEPOINT {arg2}".upper()
        else:
            return sqlite3.SQLITE_OK
        guard.refused = guard.refused or verb
        return sqlite3.SQLITE_DENY


class SqliteTx(Tx):
    dialect = "sqlite"
    paramstyle = "pyformat"  # translated to SQLite's `?` (see .placeholders)

    def __init__(self, conn: aiosqlite.Connection, sql: Mapping[str, LiteralString]) -> None:
        self._conn = conn
        self._sql = sql

    @property
    def connection(self) -> aiosqlite.Connection:
        return self._conn

    async def execute(self, sql: str, params: Params = None) -> int:
        query, args = for_sqlite(sql, params)

        async def run() -> int:
            async with self._conn.execute(query, args) as cur:
                await cur.fetchall()  # step to completion (RETURNING, triggers)
                return int(cur.rowcount)

        return await self._guarded(sql, run)

    async def fetchall(self, sql: str, params: Params = None) -> list[tuple[Any, ...]]:
        query, args = for_sqlite(sql, params)

        async def run() -> list[tuple[Any, ...]]:
            async with self._conn.execute(query, args) as cur:
                return [tuple(row) for row in await cur.fetchall()]

        return await self._guarded(sql, run)

    async def _guarded(self, sql: str, run: Callable[[], Awaitable[T]]) -> T:
        """A handler's statement: transaction control is refused with a clear error, and a
        failed statement is noted (SQLite undoes only that statement, but jobfence fails
        the job as PostgreSQL would, unless the handler ran it inside ``tx.savepoint()``)."""
        guard = self.guard
        if guard is None or not guard.active:
            return await run()
        guard.screen(sql)
        if not self._conn.in_transaction:
            guard.outside("rolled back (e.g. by INSERT OR ROLLBACK)")
        try:
            return await run()
        except sqlite3.DatabaseError as exc:
            if guard.refused is not None and "not authorized" in str(exc):
                raise refusal(guard.refused) from exc
            guard.failed(exc)
            raise
        except Exception as exc:
            guard.failed(exc)
            raise

    async def q(self, name: str, params: Mapping[str, Any] | None = None) -> list[Row]:
        return await _named(self._conn, self._sql[name], params)

    async def qmany(self, name: str, params: Sequence[Mapping[str, Any]]) -> None:
        await self._conn.executemany(self._sql[name], params)

    async def script(self, sql: LiteralString) -> None:
        # executescript would COMMIT first; run statement by statement inside our transaction
        for statement in split_script(sql):
            await self._conn.execute(statement)


def split_script(script: str) -> list[str]:
    statements, buffer = [], ""
    for line in script.splitlines(keepends=True):
        buffer += line
        if sqlite3.complete_statement(buffer):
            if buffer.strip():
                statements.append(buffer)
            buffer = ""
    if buffer.strip() and not all(
        ln.strip().startswith("--") or not ln.strip() for ln in buffer.splitlines()
    ):
        statements.append(buffer)
    return statements


async def _settle(conn: aiosqlite.Connection) -> None:
    """Leave ``conn`` outside any transaction after a failure or a cancellation — even one
    that hit while BEGIN was still waiting for the write lock on the connection's thread
    (it runs to completion there): a statement queued behind it waits for it first."""
    await conn.execute("SELECT 1")
    if conn.in_transaction:
        await conn.execute(_ROLLBACK)


async def _named(
    conn: aiosqlite.Connection, query: LiteralString, params: Mapping[str, Any] | None
) -> list[Row]:
    async with conn.execute(query, params or {}) as cur:
        rows = await cur.fetchall()
        if not cur.description:  # a statement without a result
            return []
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row, strict=True)) for row in rows]


def _problem(conn: aiosqlite.Connection, guard: TxGuard) -> TransactionBoundaryError | None:
    problem = guard.problem(track_failures=True)
    if problem is None and not conn.in_transaction:
        # e.g. INSERT OR ROLLBACK, or an I/O error: SQLite rolled the whole transaction back
        problem = ended("rolled back")
    return problem


class SQLiteDatabase(Database):
    dialect = "sqlite"

    def __init__(self, url: Any, *, lock_timeout: float | None = None) -> None:
        super().__init__(url)
        #: how long a write waits for the file's write lock (SQLite's busy timeout), seconds
        self.lock_timeout = BUSY_TIMEOUT_MS / 1000 if lock_timeout is None else lock_timeout
        self._idle: list[aiosqlite.Connection] = []
        self._all: list[aiosqlite.Connection] = []
        self._lock: asyncio.Lock | None = None
        self._opened = False
        self._lent: dict[aiosqlite.Connection, LentGuard] = {}

    async def open(self, max_size: int = 10) -> None:
        if self._opened:
            return
        parent = self.url.path.absolute().parent
        if not parent.is_dir():
            raise DatabaseUnavailable(f"cannot open {self.display}: folder {parent} does not exist")
        self._lock = asyncio.Lock()
        conn = await self._new_connection()
        self._idle.append(conn)
        self._opened = True

    async def _new_connection(self) -> aiosqlite.Connection:
        try:
            conn = await aiosqlite.connect(
                self.url.target, isolation_level=None, timeout=self.lock_timeout
            )
            await conn.execute(f"PRAGMA busy_timeout = {int(self.lock_timeout * 1000)}")
            await conn.execute("PRAGMA journal_mode = WAL")
            await conn.execute("PRAGMA synchronous = FULL")
            await conn.execute("PRAGMA foreign_keys = ON")
            lent = LentGuard()
            await conn.set_authorizer(lent.authorize)
        except sqlite3.Error as exc:
            raise DatabaseUnavailable(f"cannot open {self.display}: {exc}") from None
        self._lent[conn] = lent
        self._all.append(conn)
        return conn

    async def close(self) -> None:
        conns, self._all, self._idle = self._all, [], []
        self._lent.clear()
        for conn in conns:
            await conn.close()
        self._opened = False

    @property
    def lock(self) -> asyncio.Lock:
        if self._lock is None:
            raise RuntimeError("database is not open")
        return self._lock

    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[aiosqlite.Connection]:
        # Callers hold the write lock, so one connection per process would do; keep the
        # ones we made for reuse.
        conn = self._idle.pop() if self._idle else await self._new_connection()
        try:
            yield conn
        finally:
            self._idle.append(conn)

    def locked(self, exc: BaseException) -> DatabaseLocked:
        """SQLite's "database is locked", for people: what holds the lock, that nothing was
        changed, and what to do."""
        return DatabaseLocked(
            f"the SQLite database {self.display} is locked: another connection held its only "
            f"write lock for more than {self.lock_timeout:g}s (on SQLite a running job's "
            "transaction holds it until its handler returns); nothing was changed — try again "
            f"when that job has finished ({exc})"
        )

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Tx]:
        async with self.lock, self._connection() as conn:
            try:
                await conn.execute(_BEGIN)
                yield SqliteTx(conn, self.sql)
                await conn.execute(_COMMIT)
            except sqlite3.Error as exc:
                await asyncio.shield(_settle(conn))
                if is_locked(exc):
                    raise self.locked(exc) from exc
                raise
            except BaseException:
                await asyncio.shield(_settle(conn))
                raise

    @asynccontextmanager
    async def work(
        self, steps: Sequence[str], params: Mapping[str, Any]
    ) -> AsyncIterator[tuple[Tx, list[list[Row]]]]:
        """The transaction lent to a handler: the fence steps first, then the handler; before
        COMMIT the boundary is checked (SPEC H5)."""
        async with self.lock, self._connection() as conn:
            lent = self._lent[conn]
            tx = SqliteTx(conn, self.sql)
            try:
                await conn.execute(_BEGIN)
                results = [await tx.q(step, params) for step in steps]
                tx.guard = lent.guard = TxGuard()
                with lending(self.url.path):
                    yield tx, results
                tx.guard.active = False
                problem = _problem(conn, tx.guard)
                if problem is not None:
                    raise problem
                await conn.execute(_COMMIT)
            except BaseException:
                await asyncio.shield(_settle(conn))
                raise
            finally:
                lent.guard = None

    async def run(self, name: str, params: Mapping[str, Any] | None = None) -> list[Row]:
        async with self.lock, self._connection() as conn:
            try:
                return await _named(conn, self.sql[name], params)
            except sqlite3.Error as exc:
                if is_locked(exc):
                    raise self.locked(exc) from exc
                raise

    async def wakeups(self, channel: str) -> AsyncIterator[str]:
        """SQLite has no notifications across processes; workers poll instead."""
        await asyncio.Event().wait()
        yield ""  # pragma: no cover - never reached
