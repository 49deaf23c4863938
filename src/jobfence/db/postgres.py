"""PostgreSQL driver: psycopg 3 with a connection pool, LISTEN for wake-ups."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from functools import partial
from typing import Any, LiteralString, Self

import psycopg
from psycopg import AsyncClientCursor
from psycopg import sql as pgsql
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from ..errors import DatabaseUnavailable, TransactionBoundaryError
from . import (
    SAVEPOINT_PREFIX,
    BatchLost,
    CommitConflict,
    Database,
    Params,
    Row,
    Tx,
    TxGuard,
    aborted,
    ended,
    needs_isolation,
)
from .listen import first_line as _first_line
from .listen import listen
from .placeholders import for_psycopg


def _handler_sql(sql: str, params: Params) -> str:
    """A handler's statement for psycopg (see :mod:`.placeholders`)."""
    return for_psycopg(sql) if params is not None and isinstance(sql, str) else sql


# -- the transaction boundary (SPEC H5) ----------------------------------------------------
#
# A handler gets jobfence's transaction and its psycopg connection. Three layers keep the
# fence and the work together whatever the handler does with them:
#   1. the connection's cursors and its commit()/rollback() refuse transaction control while
#      a handler runs (a clear error, and the job fails even if the handler catches it);
#   2. before COMMIT, the client-side transaction status: aborted (a failed statement the
#      handler caught) or ended (a ROLLBACK that slipped past) fails the job;
#   3. in the server: core.fence_commit() proves the transaction being committed is the one
#      jobfence began, with the session's transaction defaults unchanged, and a deferred
#      constraint trigger on the fence refuses any COMMIT that jobfence did not issue (so a
#      COMMIT hidden in a multi-statement string rolls back the fence and the work together).

#: SQLSTATEs raised by core.fence_guard / core.fence_commit (migration 0004)
_GUARD_STATES = {
    "JF001": "committed by someone other than jobfence (the commit was refused)",
    "JF002": "ended or replaced",
}
_SESSION_CHANGED = "JF003"
_tokens = itertools.count(1)
_PID = os.getpid()


def _query_text(query: Any, conn: psycopg.AsyncConnection[Any]) -> str:
    if isinstance(query, str):
        return query
    if isinstance(query, bytes | bytearray | memoryview):
        return bytes(query[:512]).decode("utf-8", "replace")
    if isinstance(query, pgsql.Composable):
        return query.as_string(conn)
    return ""  # a template string: its static text decides nothing here


def boundary_error(exc: psycopg.Error) -> TransactionBoundaryError | None:
    """jobfence's own server-side guards, as the job failure they stand for."""
    state = exc.sqlstate or ""
    if state in _GUARD_STATES:
        return ended(_GUARD_STATES[state])
    if state == _SESSION_CHANGED:
        return TransactionBoundaryError(
            "the handler changed the session's default transaction characteristics (SET "
            "SESSION CHARACTERISTICS or default_transaction_*), which would leak into the jobs "
            "that reuse the connection; the job's work and its fence were rolled back",
            code="TX_SESSION_CHANGED",
        )
    return None


class GuardedCursor(psycopg.AsyncCursor[Any]):
    """The cursor of jobfence's connections: while a handler holds the transaction,
    transaction control is refused and failed statements are noted (layer 1)."""

    def _guard(self) -> TxGuard | None:
        guard: TxGuard | None = getattr(self._conn, "jobfence_guard", None)
        return guard if guard is not None and guard.active else None

    def _inside(self, guard: TxGuard) -> None:
        """Refuse a statement that would run outside jobfence's transaction: on this
        autocommit connection it would commit on its own, without the fence."""
        if self._conn.pgconn.transaction_status == TransactionStatus.IDLE:
            guard.outside("ended by a statement jobfence could not see")

    async def execute(self, query: Any, params: Params = None, **kwargs: Any) -> Self:
        guard = self._guard()
        if guard is None:
            return await super().execute(query, params, **kwargs)
        guard.screen(_query_text(query, self._conn))
        self._inside(guard)
        try:
            await super().execute(query, params, **kwargs)
            if guard.pipeline is not None:
                await guard.pipeline.sync()  # results, row count and errors now, as outside
            return self
        except Exception as exc:
            guard.failed(exc)
            raise

    async def executemany(self, query: Any, params_seq: Any, **kwargs: Any) -> None:
        guard = self._guard()
        if guard is None:
            return await super().executemany(query, params_seq, **kwargs)
        guard.screen(_query_text(query, self._conn))
        self._inside(guard)
        try:
            await super().executemany(query, params_seq, **kwargs)
            if guard.pipeline is not None:
                await guard.pipeline.sync()
        except Exception as exc:
            guard.failed(exc)
            raise

    async def stream(self, query: Any, params: Params = None, **kwargs: Any) -> AsyncIterator[Any]:
        guard = self._guard()
        if guard is not None:
            if guard.batched:
                guard.wide("stream()")  # not available in pipeline mode
            guard.screen(_query_text(query, self._conn))
            self._inside(guard)
        async for row in super().stream(query, params, **kwargs):
            yield row

    def copy(self, statement: Any, params: Params = None, **kwargs: Any) -> Any:
        guard = self._guard()
        if guard is not None and guard.batched:
            guard.wide("COPY")  # not available in pipeline mode
        return super().copy(statement, params, **kwargs)


class GuardedConnection(psycopg.AsyncConnection[Any]):
    """A pooled connection of jobfence's (see :class:`GuardedCursor`)."""

    jobfence_guard: TxGuard | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cursor_factory = GuardedCursor

    def _screen(self, verb: str) -> None:
        guard = self.jobfence_guard
        if guard is not None:
            guard.screen(verb)

    async def commit(self) -> None:
        self._screen("COMMIT")
        await super().commit()

    async def rollback(self) -> None:
        self._screen("ROLLBACK")
        await super().rollback()


def _lend(conn: psycopg.AsyncConnection[Any], tx: PgTx) -> TxGuard:
    guard = TxGuard()
    tx.guard = guard
    if isinstance(conn, GuardedConnection):
        conn.jobfence_guard = guard
    return guard


def _unlend(conn: psycopg.AsyncConnection[Any]) -> None:
    if isinstance(conn, GuardedConnection):
        conn.jobfence_guard = None


def _status_problem(
    conn: psycopg.AsyncConnection[Any], guard: TxGuard
) -> TransactionBoundaryError | None:
    """Layers 1 and 2: what the client side knows before COMMIT."""
    problem = guard.problem(track_failures=False)
    if problem is not None:
        return problem
    status = conn.pgconn.transaction_status
    if status == TransactionStatus.INERROR:
        first = guard.failures[0][1] if guard.failures else None
        return aborted(first, caught=first is not None)
    if status == TransactionStatus.IDLE:
        return ended("committed or rolled back")
    return None


class PgTx(Tx):
    dialect = "postgresql"
    paramstyle = "pyformat"

    def __init__(self, conn: psycopg.AsyncConnection[Any], sql: Mapping[str, LiteralString]):
        self._conn = conn
        self._sql = sql
        #: in a transaction from :meth:`PostgresDatabase.work`: the statements that go with
        #: its COMMIT (:meth:`q_at_commit`, :meth:`execute_at_commit`); None elsewhere
        self.at_commit: list[tuple[str, Params]] | None = None

    @property
    def connection(self) -> psycopg.AsyncConnection[Any]:
        return self._conn

    async def execute(self, sql: str, params: Params = None) -> int:
        cur = await self.connection.execute(_handler_sql(sql, params), params)
        return cur.rowcount

    async def fetchall(self, sql: str, params: Params = None) -> list[tuple[Any, ...]]:
        cur = await self.connection.execute(_handler_sql(sql, params), params)
        if cur.description is None:
            return []
        return await cur.fetchall()

    async def q(self, name: str, params: Mapping[str, Any] | None = None) -> list[Row]:
        return await _named(self.connection, self._sql[name], params)

    async def q_at_commit(self, name: str, params: Mapping[str, Any]) -> None:
        if self.at_commit is None:
            await self.q(name, params)
        else:
            self.at_commit.append((self._sql[name], params))

    async def execute_at_commit(self, sql: str, params: Params = None) -> None:
        if self.at_commit is None:
            await self.execute(sql, params)
            return
        if self.guard is not None:
            self.guard.screen(sql)  # no COMMIT of the caller's own in the commit's round trip
        self.at_commit.append((_handler_sql(sql, params), params))

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


class PgDeferredTx(PgTx):
    """A transaction of :meth:`PostgresDatabase.deferred`: it holds no connection and has
    sent nothing (:attr:`deferred`) until its first statement whose result is needed, which
    checks a connection out and sends ``BEGIN`` and the opening steps with it; else all of
    it goes with the COMMIT (:meth:`PostgresDatabase.commit_deferred`)."""

    def __init__(
        self,
        sql: Mapping[str, LiteralString],
        checkout: Callable[[], AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]],
        steps: list[tuple[str, Params]],
        params: Mapping[str, Any],
    ) -> None:
        super().__init__(None, sql)  # type: ignore[arg-type]
        self._checkout = checkout
        self.params = params
        self.at_commit = []
        self.guard = TxGuard(active=True)
        #: the opening steps, until they are sent (then None)
        self.steps: list[tuple[str, Params]] | None = steps
        #: the opening broke a constraint when it was sent: the transaction cannot commit,
        #: whatever the caller made of the error
        self.conflict: CommitConflict | None = None
        self._hold: contextlib.AsyncExitStack | None = None

    @property
    def deferred(self) -> bool:  # type: ignore[override]
        return self.steps is not None

    @property
    def connection(self) -> psycopg.AsyncConnection[Any]:
        if self._conn is None:
            raise TransactionBoundaryError(
                "this transaction has not begun yet (its BEGIN and first steps go with its "
                "first statement): run a statement through it (tx.execute, tx.fetchall, "
                "tx.q) before using its connection directly",
                code="TX_NOT_BEGUN",
            )
        return self._conn

    async def begin(self) -> None:
        """Check a connection out and send ``BEGIN`` and the opening steps now (one round
        trip), if not done yet."""
        if self.steps is None:
            return
        steps, self.steps = self.steps, None
        hold = contextlib.AsyncExitStack()
        conn = await hold.enter_async_context(self._checkout())
        self._conn, self._hold = conn, hold
        opening = [("BEGIN", None), (self._sql["lend_begin"], self.params), *steps]
        try:
            async with AsyncClientCursor(conn) as cur:
                bound = [cur.mogrify(query, step) for query, step in opening]
                await cur.execute("; ".join(bound).encode())
        except psycopg.IntegrityError as exc:
            self.conflict = CommitConflict(_first_line(exc))
            raise self.conflict from exc
        _lend(conn, self).active = True

    async def release(self) -> None:
        """Roll back what was sent, if anything, and give the connection back."""
        conn, hold, self._hold = self._conn, self._hold, None
        if hold is None or conn is None:
            return
        _unlend(conn)  # jobfence's own ROLLBACK from here on
        try:
            if not conn.closed and conn.info.transaction_status != TransactionStatus.IDLE:
                with contextlib.suppress(psycopg.Error):
                    await asyncio.shield(conn.execute("ROLLBACK"))
        finally:
            await hold.aclose()

    async def execute(self, sql: str, params: Params = None) -> int:
        await self.begin()
        return await super().execute(sql, params)

    async def fetchall(self, sql: str, params: Params = None) -> list[tuple[Any, ...]]:
        await self.begin()
        return await super().fetchall(sql, params)

    async def q(self, name: str, params: Mapping[str, Any] | None = None) -> list[Row]:
        await self.begin()
        return await super().q(name, params)

    async def qmany(self, name: str, params: Sequence[Mapping[str, Any]]) -> None:
        await self.begin()
        await super().qmany(name, params)

    async def script(self, sql: LiteralString) -> None:
        await self.begin()
        await super().script(sql)

    async def copy(self, name: str, rows: Iterable[Sequence[Any]], types: Sequence[str]) -> None:
        await self.begin()
        await super().copy(name, rows, types)


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
        self.savepoint_name = b"jobfence_job"

    @property
    def connection(self) -> psycopg.AsyncConnection[Any]:
        if self.savepoint_due:
            self.savepoint_due = False
            _queue_command(self._pipeline, self._conn, b"SAVEPOINT " + self.savepoint_name)
        return self._conn

    @property
    def can_copy(self) -> bool:
        return False  # COPY is not available in pipeline mode

    async def _sync(self) -> None:
        """Sync the pipeline unless the statement's cursor already did (a handler's
        statements are synced by :class:`GuardedCursor`; jobfence's own are not)."""
        if self._pipeline.result_queue or self._pipeline.command_queue:
            await self._pipeline.sync()

    async def execute(self, sql: str, params: Params = None) -> int:
        cur = await self.connection.execute(_handler_sql(sql, params), params)
        await self._sync()
        return cur.rowcount

    async def fetchall(self, sql: str, params: Params = None) -> list[tuple[Any, ...]]:
        cur = await self.connection.execute(_handler_sql(sql, params), params)
        await self._sync()
        if cur.description is None:
            return []
        return await cur.fetchall()

    async def q(self, name: str, params: Mapping[str, Any] | None = None) -> list[Row]:
        cur = self.connection.cursor(row_factory=dict_row)
        await cur.execute(self._sql[name], params)
        await self._sync()
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
        self._jobs = 0

    @asynccontextmanager
    async def job(self) -> AsyncIterator[Tx]:
        """A savepoint for one job, rolled back if the block raises (the batch's other jobs
        are untouched).

        Savepoints are not released: each job's SAVEPOINT nests in the previous one, and each
        has its own name, so ``ROLLBACK TO`` reaches this job's and no earlier one (a RELEASE
        per job would be one more statement for nothing). (Batches stay at or below 64
        jobs, PostgreSQL's cache of subtransaction ids per backend, beyond which every
        snapshot gets slower.)

        The SAVEPOINT is neither sent nor even queued until the job first touches the
        connection (see :class:`PgPipelineTx`): a job that runs no statement has nothing to
        roll back and costs the server nothing. Sending one SAVEPOINT per job cost about 30 % of
        the no-op workload's throughput. (With a psycopg whose pipeline has no command
        queue, the SAVEPOINT is executed up front.)"""
        self._jobs += 1
        name = f"{SAVEPOINT_PREFIX}job_{self._jobs}"
        self.tx.savepoint_name = name.encode()
        guard = _lend(self._conn, self.tx)
        guard.batched = True
        guard.pipeline = self._pipeline
        if self._lazy:
            self.tx.savepoint_due = True
        else:
            await self._conn.execute(f"SAVEPOINT {name}")
        queued = self._queued()
        try:
            yield self.tx
            guard.active = False
            now_queued = self._queued()
            if queued is None or now_queued is None or now_queued > queued:
                # the handler left statements unsynced (raw connection use): their errors
                # are this job's, so collect them before the job counts as done
                await self._pipeline.sync()
            problem = _status_problem(self._conn, guard)
            if problem is not None:
                raise problem
        except BaseException as exc:
            guard.active = False
            if guard.isolation is not None:
                # transaction-wide state: the whole batch rolls back and its jobs run alone
                raise BatchLost(needs_isolation(guard.isolation), guard.isolation) from exc
            if self._conn.pgconn.transaction_status == TransactionStatus.IDLE:
                # the handler ended the batch's transaction: no savepoint to return to, and
                # the other jobs' work is gone too; the harness re-runs them
                raise BatchLost(ended("ended (it was the whole batch's transaction)")) from exc
            if not self.tx.savepoint_due:  # the job touched the connection: undo its work
                with contextlib.suppress(psycopg.Error):
                    await self._pipeline.sync()  # clear a pending error before rolling back
                try:
                    await self._conn.execute(f"ROLLBACK TO SAVEPOINT {name}")
                    await self._pipeline.sync()
                except psycopg.Error as rollback_error:
                    # the job's savepoint is gone (released by the handler): the batch
                    # cannot undo this job alone
                    raise BatchLost(ended("released past its savepoint")) from rollback_error
            raise
        finally:
            self.tx.savepoint_due = False
            _unlend(self._conn)

    def _queued(self) -> int | None:
        """Statements sent but not yet synced (psycopg's pipeline keeps them in
        ``result_queue``); None when unknown, and then the job syncs (one round trip)."""
        pending = getattr(self._pipeline, "result_queue", None)
        return len(pending) if pending is not None else None


def _token() -> str:
    """Names one lent transaction (core.fence_begin / core.fence_commit)."""
    return f"{_PID}.{next(_tokens)}"


async def fenced_commit(
    conn: psycopg.AsyncConnection[Any],
    sql: Mapping[str, LiteralString],
    params: Mapping[str, Any],
    before: Sequence[tuple[str, Params]] = (),
) -> None:
    """Layer 3 and COMMIT in one round trip: core.fence_commit raises (and the COMMIT is not
    reached) unless this is the transaction jobfence began, its session defaults unchanged.
    The statements ``before`` (:meth:`PgTx.q_at_commit`) lead the same query."""
    try:
        async with AsyncClientCursor(conn) as cur:
            if before:
                bound = [cur.mogrify(query, step) for query, step in before]
                bound.append(cur.mogrify(sql["lend_commit_and_commit"], params))
                await cur.execute("; ".join(bound).encode())
            else:
                await cur.execute(sql["lend_commit_and_commit"], params)
    except psycopg.Error as exc:
        problem = boundary_error(exc)
        if problem is not None:
            raise problem from exc
        raise


async def _named(
    conn: psycopg.AsyncConnection[Any], query: LiteralString, params: Mapping[str, Any] | None
) -> list[Row]:
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(query, params)
        if cur.description is None:
            return []
        return await cur.fetchall()


def _as_deferred(tx: Tx) -> PgDeferredTx:
    if not isinstance(tx, PgDeferredTx):
        raise TypeError(f"not a transaction from deferred(): {tx!r}")
    return tx


class PostgresDatabase(Database):
    dialect = "postgresql"
    supports_batch = True

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
            connection_class=GuardedConnection,
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
            if not self.check_connections:
                async with self.pool.connection() as conn:
                    yield conn
                return
            conn = await self._checked_out()
            try:
                yield conn
            finally:
                await self.pool.putconn(conn)
        except PoolTimeout as exc:
            raise DatabaseUnavailable(f"no connection to {self.display}: {exc}") from None

    async def _checked_out(self) -> psycopg.AsyncConnection[Any]:
        """A connection that has just answered (``check_connections``): one the server
        dropped (a restart) goes back to the pool, which discards and replaces it."""
        pool = self.pool
        for _ in range(pool.max_size + 1):
            conn = await pool.getconn(timeout=self.checkout_timeout)
            try:
                await AsyncConnectionPool.check_connection(conn)
            except psycopg.Error:
                await pool.putconn(conn)
                continue
            return conn
        raise DatabaseUnavailable(f"no working connection to {self.display}")

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Tx]:
        async with self._connection() as conn, conn.transaction():
            yield PgTx(conn, self.sql)

    @asynccontextmanager
    async def work(
        self, steps: Sequence[str], params: Mapping[str, Any]
    ) -> AsyncIterator[tuple[Tx, list[list[Row]]]]:
        """BEGIN and the steps go to the server as one query (client-side binding, one round
        trip); the handler's statements follow on the same connection; then the checks of
        the transaction boundary and COMMIT, again in one round trip."""
        query = "; ".join(["BEGIN", self.sql["lend_begin"], *(self.sql[s] for s in steps)])
        params = {**params, "jobfence_tx": _token()}
        async with self._connection() as conn:
            tx = PgTx(conn, self.sql)
            tx.at_commit = []
            try:
                results: list[list[Row]] = []
                async with AsyncClientCursor(conn, row_factory=dict_row) as cur:
                    await cur.execute(query, params)
                    while True:
                        if cur.description is not None:
                            results.append(await cur.fetchall())
                        if not cur.nextset():
                            break
                guard = _lend(conn, tx)
                yield tx, results[1:]
                guard.active = False
                problem = _status_problem(conn, guard)
                if problem is not None:
                    raise problem
                await fenced_commit(conn, self.sql, params, tx.at_commit)
            except BaseException:
                if conn.info.transaction_status != TransactionStatus.IDLE:
                    with contextlib.suppress(psycopg.Error):
                        await asyncio.shield(conn.execute("ROLLBACK"))
                raise
            finally:
                _unlend(conn)

    supports_deferred = True

    def deferred(self, steps: Sequence[str], params: Mapping[str, Any]) -> Tx:
        return PgDeferredTx(
            self.sql,
            self._connection,
            [(self.sql[s], params) for s in steps],
            {**params, "jobfence_tx": _token()},
        )

    async def commit_deferred(self, txs: Sequence[Tx]) -> None:
        """See :meth:`Database.commit_deferred`. Transactions that sent nothing yet go as one
        query: ``BEGIN``, the boundary's name, each one's steps and queued statements, the
        boundary's check and ``COMMIT``, bound client-side (one round trip, one commit)."""
        deferred = [_as_deferred(tx) for tx in txs]
        for tx in deferred:
            if tx.conflict is not None:
                raise tx.conflict
        if len(deferred) == 1 and not deferred[0].deferred:
            await self._commit_begun(deferred[0])
            return
        if any(not tx.deferred for tx in deferred):
            raise ValueError("a transaction that has begun commits on its own")
        params = deferred[0].params
        before: list[tuple[str, Params]] = [("BEGIN", None), (self.sql["lend_begin"], params)]
        for tx in deferred:
            before += tx.steps or []
            before += tx.at_commit or []
        async with self._connection() as conn:
            try:
                await fenced_commit(conn, self.sql, params, before)
            except psycopg.IntegrityError as exc:
                raise CommitConflict(_first_line(exc)) from exc
            finally:
                if conn.info.transaction_status != TransactionStatus.IDLE:
                    with contextlib.suppress(psycopg.Error):
                        await asyncio.shield(conn.execute("ROLLBACK"))
        for tx in deferred:
            tx.steps = None

    async def _commit_begun(self, tx: PgDeferredTx) -> None:
        conn = tx.connection
        try:
            assert tx.guard is not None
            tx.guard.active = False
            problem = _status_problem(conn, tx.guard)
            if problem is not None:
                raise problem
            try:
                await fenced_commit(conn, self.sql, tx.params, tx.at_commit or [])
            except psycopg.IntegrityError as exc:
                raise CommitConflict(_first_line(exc)) from exc
        finally:
            await tx.release()

    async def abandon_deferred(self, tx: Tx) -> None:
        await _as_deferred(tx).release()

    @asynccontextmanager
    async def batch(
        self, step: str, params: Mapping[str, Any]
    ) -> AsyncIterator[tuple[PgBatch, list[Row]]]:
        """Group commit: BEGIN and ``step`` in one round trip, then the jobs (see
        :meth:`PgBatch.job`), then COMMIT — all on one connection in pipeline mode."""
        token = {"jobfence_tx": _token()}
        async with self._connection() as conn:
            try:
                async with conn.pipeline() as pipeline:
                    await conn.execute("BEGIN")
                    await conn.execute(self.sql["lend_begin"], token)
                    cur = conn.cursor(row_factory=dict_row)
                    await cur.execute(self.sql[step], params)
                    await pipeline.sync()
                    rows = await cur.fetchall()
                    yield PgBatch(conn, pipeline, self.sql), rows
                    try:
                        await conn.execute(self.sql["lend_commit"], token)
                        await conn.execute("COMMIT")
                        await pipeline.sync()
                    except psycopg.Error as exc:
                        problem = boundary_error(exc)
                        if problem is not None:
                            raise BatchLost(problem) from exc
                        raise
            except BaseException:
                if not conn.closed and conn.info.transaction_status != TransactionStatus.IDLE:
                    with contextlib.suppress(psycopg.Error):
                        await asyncio.shield(conn.execute("ROLLBACK"))
                raise

    async def run(self, name: str, params: Mapping[str, Any] | None = None) -> list[Row]:
        async with self._connection() as conn:
            return await _named(conn, self.sql[name], params)

    def wakeups(self, channel: str) -> AsyncIterator[str]:
        return listen(self.url.target, channel)
