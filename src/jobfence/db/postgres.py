"""PostgreSQL driver: psycopg 3 with a connection pool, LISTEN for wake-ups."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from functools import partial
from typing import Any, LiteralString

import psycopg
from psycopg import AsyncClientCursor
from psycopg import sql as pgsql
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from ..errors import DatabaseUnavailable
from . import Database, Params, Row, Tx

log = logging.getLogger("jobfence.db")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class PgTx(Tx):
    dialect = "postgresql"
    paramstyle = "pyformat"

    def __init__(self, conn: psycopg.AsyncConnection[Any], sql: Mapping[str, LiteralString]):
        self._conn = conn
        self._sql = sql

    @property
    def connection(self) -> psycopg.AsyncConnection[Any]:
        return self._conn

    async def execute(self, sql: str, params: Params = None) -> int:
        cur = await self.connection.execute(sql, params)
        return cur.rowcount

    async def fetchall(self, sql: str, params: Params = None) -> list[tuple[Any, ...]]:
        cur = await self.connection.execute(sql, params)
        if cur.description is None:
            return []
        return await cur.fetchall()

    async def q(self, name: str, params: Mapping[str, Any] | None = None) -> list[Row]:
        return await _named(self.connection, self._sql[name], params)

    async def qmany(self, name: str, params: Sequence[Mapping[str, Any]]) -> None:
        async with self.connection.cursor() as cur:
            await cur.executemany(self._sql[name], params)

    async def script(self, sql: LiteralString) -> None:
        await self.connection.execute(sql)

    @property
    def can_copy(self) -> bool:
        return True

    async def copy(self, name: str, rows: Iterable[Sequence[Any]], types: Sequence[str]) -> None:
        """Binary COPY of ``rows`` with the named ``COPY … FROM STDIN`` statement."""
        async with self.connection.cursor() as cur, cur.copy(self._sql[name]) as copy:
            copy.set_types(list(types))
            for row in rows:
                await copy.write_row(row)


class PgPipelineTx(PgTx):
    """A job's view of a group-commit transaction running in pipeline mode.

    Each statement is followed by a sync, so results, row counts and errors belong to the
    statement that caused them. The job's SAVEPOINT is queued just before its first use of
    the connection (a statement, or the raw ``connection``), and leaves with it.
    """

    def __init__(
        self,
        conn: psycopg.AsyncConnection[Any],
        pipeline: psycopg.AsyncPipeline,
        sql: Mapping[str, LiteralString],
    ) -> None:
        super().__init__(conn, sql)
        self._pipeline = pipeline
        self.savepoint_due = False  # a job runs and its SAVEPOINT is not queued yet

    @property
    def connection(self) -> psycopg.AsyncConnection[Any]:
        if self.savepoint_due:
            self.savepoint_due = False
            _queue_command(self._pipeline, self._conn, b"SAVEPOINT jobfence_job")
        return self._conn

    @property
    def can_copy(self) -> bool:
        return False  # COPY is not available in pipeline mode

    async def execute(self, sql: str, params: Params = None) -> int:
        cur = await self.connection.execute(sql, params)
        await self._pipeline.sync()
        return cur.rowcount

    async def fetchall(self, sql: str, params: Params = None) -> list[tuple[Any, ...]]:
        cur = await self.connection.execute(sql, params)
        await self._pipeline.sync()
        if cur.description is None:
            return []
        return await cur.fetchall()

    async def q(self, name: str, params: Mapping[str, Any] | None = None) -> list[Row]:
        cur = self.connection.cursor(row_factory=dict_row)
        await cur.execute(self._sql[name], params)
        await self._pipeline.sync()
        return await cur.fetchall() if cur.description is not None else []


def _can_queue(pipeline: psycopg.AsyncPipeline) -> bool:
    return hasattr(pipeline, "command_queue") and hasattr(pipeline, "result_queue")


def _queue_command(
    pipeline: psycopg.AsyncPipeline, conn: psycopg.AsyncConnection[Any], command: bytes
) -> None:
    """Queue a parameterless command in the pipeline without sending it, the way psycopg
    queues its own savepoint commands in pipeline mode: it leaves with the next statement
    sent, ahead of it, and its result is checked when it arrives (an error raises from the
    call that reads it)."""
    pipeline.command_queue.append(partial(conn.pgconn.send_query_params, command, None))
    pipeline.result_queue.append(None)


class PgBatch:
    """A group-commit transaction: many jobs, each in its own savepoint."""

    def __init__(
        self,
        conn: psycopg.AsyncConnection[Any],
        pipeline: psycopg.AsyncPipeline,
        sql: Mapping[str, LiteralString],
    ) -> None:
        self.tx = PgPipelineTx(conn, pipeline, sql)
        self._conn = conn
        self._pipeline = pipeline
        self._lazy = _can_queue(pipeline)

    @asynccontextmanager
    async def job(self) -> AsyncIterator[Tx]:
        """A savepoint for one job, rolled back if the block raises (the batch's other jobs
        are untouched).

        Savepoints are not released: each job's SAVEPOINT nests in the previous one and
        ``ROLLBACK TO`` always reaches the newest, this job's, so a RELEASE per job would be
        one more statement for nothing. (Batches stay at or below 64 jobs, PostgreSQL's cache
        of subtransaction ids per backend, beyond which every snapshot gets slower.)

        The SAVEPOINT is neither sent nor even queued until the job first touches the
        connection (see :class:`PgPipelineTx`): a job that runs no statement has nothing to
        roll back and costs the server nothing. Sending one SAVEPOINT per job cost about 30 % of
        the no-op workload's throughput. (With a psycopg whose pipeline has no command
        queue, the SAVEPOINT is executed up front.)"""
        if self._lazy:
            self.tx.savepoint_due = True
        else:
            await self._conn.execute("SAVEPOINT jobfence_job")
        queued = self._queued()
        try:
            yield self.tx
            now_queued = self._queued()
            if queued is None or now_queued is None or now_queued > queued:
                # the handler left statements unsynced (raw connection use): their errors
                # are this job's, so collect them before the job counts as done
                await self._pipeline.sync()
        except BaseException:
            if not self.tx.savepoint_due:  # the job touched the connection: undo its work
                with contextlib.suppress(psycopg.Error):
                    await self._pipeline.sync()  # clear a pending error before rolling back
                await self._conn.execute("ROLLBACK TO SAVEPOINT jobfence_job")
                await self._pipeline.sync()
            raise
        finally:
            self.tx.savepoint_due = False

    def _queued(self) -> int | None:
        """Statements sent but not yet synced (psycopg's pipeline keeps them in
        ``result_queue``); None when unknown, and then the job syncs (one round trip)."""
        pending = getattr(self._pipeline, "result_queue", None)
        return len(pending) if pending is not None else None


async def _named(
    conn: psycopg.AsyncConnection[Any], query: LiteralString, params: Mapping[str, Any] | None
) -> list[Row]:
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(query, params)
        if cur.description is None:
            return []
        return await cur.fetchall()


class PostgresDatabase(Database):
    dialect = "postgresql"

    _pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]] | None = None

    async def open(self, max_size: int = 10) -> None:
        if self._pool is not None:
            return
        # One direct connection first: a clear message beats a pool timeout.
        try:
            conn = await psycopg.AsyncConnection.connect(
                self.url.target, autocommit=True, connect_timeout=10
            )
        except psycopg.Error as exc:
            raise DatabaseUnavailable(
                f"cannot connect to {self.display}: {_first_line(exc)}"
            ) from None
        await conn.close()
        pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]] = AsyncConnectionPool(
            self.url.target,
            min_size=min(2, max_size),
            max_size=max_size,
            kwargs={"autocommit": True},
            open=False,
            timeout=30,
            name="jobfence",
        )
        await pool.open(wait=True, timeout=30)
        self._pool = pool

    async def close(self) -> None:
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await pool.close()

    @property
    def pool(self) -> AsyncConnectionPool[psycopg.AsyncConnection[Any]]:
        if self._pool is None:
            raise RuntimeError("database is not open")
        return self._pool

    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        try:
            async with self.pool.connection() as conn:
                yield conn
        except PoolTimeout as exc:
            raise DatabaseUnavailable(f"no connection to {self.display}: {exc}") from None

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Tx]:
        async with self._connection() as conn, conn.transaction():
            yield PgTx(conn, self.sql)

    @asynccontextmanager
    async def work(
        self, steps: Sequence[str], params: Mapping[str, Any]
    ) -> AsyncIterator[tuple[Tx, list[list[Row]]]]:
        """BEGIN and the steps go to the server as one query (client-side binding, one round
        trip); the handler's statements follow on the same connection; then COMMIT."""
        query = "; ".join(["BEGIN", *(self.sql[step] for step in steps)])
        async with self._connection() as conn:
            try:
                results: list[list[Row]] = []
                async with AsyncClientCursor(conn, row_factory=dict_row) as cur:
                    await cur.execute(query, params)
                    while True:
                        if cur.description is not None:
                            results.append(await cur.fetchall())
                        if not cur.nextset():
                            break
                yield PgTx(conn, self.sql), results
                await conn.execute("COMMIT")
            except BaseException:
                if conn.info.transaction_status != TransactionStatus.IDLE:
                    with contextlib.suppress(psycopg.Error):
                        await asyncio.shield(conn.execute("ROLLBACK"))
                raise

    @asynccontextmanager
    async def batch(
        self, step: str, params: Mapping[str, Any]
    ) -> AsyncIterator[tuple[PgBatch, list[Row]]]:
        """Group commit: BEGIN and ``step`` in one round trip, then the jobs (see
        :meth:`PgBatch.job`), then COMMIT — all on one connection in pipeline mode."""
        async with self._connection() as conn:
            try:
                async with conn.pipeline() as pipeline:
                    await conn.execute("BEGIN")
                    cur = conn.cursor(row_factory=dict_row)
                    await cur.execute(self.sql[step], params)
                    await pipeline.sync()
                    rows = await cur.fetchall()
                    yield PgBatch(conn, pipeline, self.sql), rows
                    await conn.execute("COMMIT")
            except BaseException:
                if not conn.closed and conn.info.transaction_status != TransactionStatus.IDLE:
                    with contextlib.suppress(psycopg.Error):
                        await asyncio.shield(conn.execute("ROLLBACK"))
                raise

    async def run(self, name: str, params: Mapping[str, Any] | None = None) -> list[Row]:
        async with self._connection() as conn:
            return await _named(conn, self.sql[name], params)

    async def wakeups(self, channel: str) -> AsyncIterator[str]:
        """LISTEN on ``channel`` on a dedicated connection, reconnecting with backoff.

        Yields ``""`` after each (re)connection so the caller polls once for anything it
        missed while it was not listening.
        """
        backoff = 0.1
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self.url.target, autocommit=True, connect_timeout=10
                )
            except psycopg.Error as exc:
                log.warning(
                    "listen connection failed; retrying",
                    extra={"error": _first_line(exc), "retry_in": backoff},
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            try:
                await conn.execute(pgsql.SQL("LISTEN {}").format(pgsql.Identifier(channel)))
                backoff = 0.1
                yield ""
                async for notify in conn.notifies():
                    yield notify.payload
            except psycopg.Error as exc:
                log.warning(
                    "listen connection lost; reconnecting", extra={"error": _first_line(exc)}
                )
            finally:
                await conn.close()
