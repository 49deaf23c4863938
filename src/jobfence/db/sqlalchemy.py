"""SQLAlchemy 2: the job's transaction on the user's engine, with an ORM session joined to it.

Optional (``pip install 'jobfence[sqlalchemy]'``): nothing imports this module unless an app
is built from an engine (``App(engine=…)``) or a session is handed to ``enqueue``/``outbox``.

How the guarantee holds (SPEC F2, H5) when the handler works through the ORM:

- :class:`EngineWork` opens the job's transaction on a connection of the user's engine and
  writes the fence (and the queue row's ack) there first, through the same driver connection
  SQLAlchemy uses; the handler's session is bound to that connection with
  ``join_transaction_mode="create_savepoint"`` — SQLAlchemy's own recipe for "joining a
  Session into an external transaction". ``session.commit()`` releases a savepoint and
  ``session.rollback()`` rolls back to it: neither ends the job's transaction.
- Ending the job's transaction from the handler is refused: ``commit()``/``rollback()`` of the
  connection (``await session.connection()``) by a connection event, COMMIT/ROLLBACK text by
  the statement screen, and, below SQLAlchemy, the driver's own ``commit()`` by PostgreSQL's
  server-side guards (``core.fence_begin``/``fence_commit``) and SQLite's authorizer. A refused
  statement fails the job even if the handler catches the error.
- jobfence flushes the session (releasing its savepoint) when the handler returns, checks
  the boundary, and commits the fence, the ack and the ORM work in one COMMIT.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import threading
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from typing import Any, LiteralString

from sqlalchemy import Connection, Engine
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession
from sqlalchemy.orm import Session

from ..errors import ConfigurationError, EnqueueError, TransactionBoundaryError
from ..sql import Dialect, queries
from . import Database, Params, Row, Tx, TxGuard, aborted, ended
from .second_writer import lending, watch_sqlalchemy
from .sqlalchemy_watch import lend as _lend
from .sqlalchemy_watch import unlend as _unlend
from .sqlalchemy_watch import watch as _watch

_DRIVERS: dict[str, tuple[Dialect, str]] = {
    # SQLAlchemy dialect name, driver → jobfence dialect, what jobfence adopts
    "postgresql+psycopg": ("postgresql", "psycopg"),
    "postgresql+psycopg_async": ("postgresql", "psycopg"),
    "sqlite+aiosqlite": ("sqlite", "aiosqlite"),
    "sqlite+pysqlite": ("sqlite", "sqlite3"),
}
_tokens = itertools.count(1)
_PID = os.getpid()
watch_sqlalchemy()  # SQLite: a write through a second engine to the job's file (issue 28)


def _kind(engine: Engine | AsyncEngine) -> Dialect:
    if not isinstance(engine, Engine | AsyncEngine):
        raise ConfigurationError(
            f"App(engine=…) takes a SQLAlchemy AsyncEngine (create_async_engine) or Engine "
            f"(create_engine), not {type(engine).__name__}"
        )
    dialect = engine.dialect
    key = f"{dialect.name}+{dialect.driver}"
    if key not in _DRIVERS:
        raise ConfigurationError(
            f"jobfence works with SQLAlchemy engines on psycopg 3 (postgresql+psycopg://) or "
            f"SQLite (sqlite+aiosqlite://, sqlite://), not {key}"
        )
    return _DRIVERS[key][0]


def is_sync_engine(engine: Any) -> bool:
    """Whether ``engine`` is a synchronous SQLAlchemy ``Engine`` (not an ``AsyncEngine``)."""
    return isinstance(engine, Engine)


def database_url(engine: Engine | AsyncEngine) -> str:
    """The jobfence database URL of ``engine``'s database (the same server and database, or
    the same SQLite file; credentials included)."""
    kind = _kind(engine)
    url = engine.url
    if kind == "sqlite":
        path = url.database or ""
        if not path or path == ":memory:":
            raise ConfigurationError(
                "jobfence needs a SQLite file (sqlite+aiosqlite:///jobs.db): an in-memory "
                "database cannot be shared by the worker's connections"
            )
        return f"sqlite:///{path}"
    bare = url.set(drivername="postgresql", query={})
    return bare.render_as_string(hide_password=False)


async def driver_connection(obj: Any) -> Any:
    """The driver connection under an ``AsyncSession`` or ``AsyncConnection`` (psycopg
    ``AsyncConnection`` or aiosqlite ``Connection``), in the transaction the session holds
    (begun now if it had not begun)."""
    if isinstance(obj, AsyncSession):
        obj = await obj.connection()
    if not isinstance(obj, AsyncConnection):
        raise EnqueueError(
            f"cannot use a {type(obj).__name__} here; pass an AsyncSession or AsyncConnection "
            "(synchronous Session/Connection: use enqueue_sync / outbox.write_sync)"
        )
    if not obj.in_transaction():
        await obj.begin()
    raw = await obj.get_raw_connection()
    return raw.driver_connection


def sync_driver_connection(obj: Any) -> Any:
    """The driver connection under a ``Session`` or ``Connection`` (psycopg ``Connection`` or
    ``sqlite3.Connection``), in the transaction the session holds."""
    if isinstance(obj, Session):
        obj = obj.connection()
    if not isinstance(obj, Connection):
        raise EnqueueError(
            f"cannot use a {type(obj).__name__} here; pass a Session or Connection (an "
            "AsyncSession: use `await app.enqueue(..., session=session)`)"
        )
    if not obj.in_transaction():
        obj.begin()
    return obj.connection.driver_connection


async def _pg_begin(
    driver: Any, sql: Mapping[str, LiteralString], steps: Sequence[str], params: Mapping[str, Any]
) -> list[list[Row]]:
    """``lend_begin`` and the fence steps in one round trip (client-side binding), as
    jobfence's own pool does; psycopg begins the transaction first."""
    from psycopg import AsyncClientCursor
    from psycopg.rows import dict_row

    results: list[list[Row]] = []
    async with AsyncClientCursor(driver, row_factory=dict_row) as cur:
        await cur.execute("; ".join([sql["lend_begin"], *(sql[s] for s in steps)]), params)
        while True:
            results.append(await cur.fetchall() if cur.description is not None else [])
            if not cur.nextset():
                break
    return results[1:]


def _screened(tx: Tx) -> Tx:
    """``tx``'s statements screened while a handler holds it (the driver connection is the
    engine's, not one of jobfence's guarded connections)."""
    execute, fetchall = tx.execute, tx.fetchall

    async def screened_execute(sql: str, params: Params = None) -> int:
        if tx.guard is not None:
            tx.guard.screen(sql)
        return await execute(sql, params)

    async def screened_fetchall(sql: str, params: Params = None) -> list[tuple[Any, ...]]:
        if tx.guard is not None:
            tx.guard.screen(sql)
        return await fetchall(sql, params)

    tx.execute = screened_execute  # type: ignore[method-assign]
    tx.fetchall = screened_fetchall  # type: ignore[method-assign]
    return tx


def _driver_tx(driver: Any, sql: Mapping[str, LiteralString], dialect: Dialect) -> Tx:
    if dialect == "postgresql":
        from .postgres import PgTx

        return _screened(PgTx(driver, sql))
    from .sqlite import SqliteTx

    return SqliteTx(driver, sql)  # SqliteTx screens its statements itself


class EngineWork:
    """Opens each job's transaction on the user's ``AsyncEngine`` (see the module's doc);
    what :func:`jobfence.core.fence.work` asks of a database for it. ``session_options`` go to
    every ``AsyncSession`` handed to a handler (``expire_on_commit``, ``info``…)."""

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        schema: str,
        session_options: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(engine, AsyncEngine):
            raise ConfigurationError(
                f"App(engine=…) takes an AsyncEngine (create_async_engine) or an Engine "
                f"(create_engine), not "
                f"{type(engine).__name__}"
            )
        self.engine = engine
        self.dialect: Dialect = _kind(engine)
        self.sql = queries(self.dialect, schema)
        self.session_options = dict(session_options or {})
        self.session_options.setdefault("expire_on_commit", False)
        _watch(engine.sync_engine)
        #: jobfence's own database for the same file: on SQLite its writer lock is taken too,
        #: so that the worker's own writes and the jobs' queue up instead of busy-waiting
        self.db: Database | None = None

    def _lock(self) -> asyncio.Lock | None:
        lock = getattr(self.db, "lock", None) if self.dialect == "sqlite" else None
        return lock if isinstance(lock, asyncio.Lock) else None

    @asynccontextmanager
    async def work(
        self, steps: Sequence[str], params: Mapping[str, Any]
    ) -> AsyncIterator[tuple[Tx, list[list[Row]]]]:
        lock = self._lock()
        async with (
            lock if lock is not None else contextlib.nullcontext(),
            self.engine.connect() as conn,
            self._lent(conn, steps, params) as lent,
        ):
            yield lent

    @asynccontextmanager
    async def _lent(
        self, conn: AsyncConnection, steps: Sequence[str], params: Mapping[str, Any]
    ) -> AsyncIterator[tuple[Tx, list[list[Row]]]]:
        outer = await conn.begin()
        driver: Any = (await conn.get_raw_connection()).driver_connection
        tx = _driver_tx(driver, self.sql, self.dialect)
        guard = TxGuard()
        params = {**params, "jobfence_tx": f"{_PID}.sa.{next(_tokens)}"}
        authorizer = None
        try:
            if self.dialect == "sqlite":
                if not driver.in_transaction:
                    await driver.execute("BEGIN IMMEDIATE -- jobfence")
                results = [await tx.q(step, params) for step in steps]
            else:
                results = await _pg_begin(driver, self.sql, steps, params)
            session = AsyncSession(
                bind=conn, join_transaction_mode="create_savepoint", **self.session_options
            )
            tx.session = session
            tx.guard = guard
            _lend(conn._proxied, guard)
            if self.dialect == "sqlite":
                from .sqlite import LentGuard

                authorizer = LentGuard()
                authorizer.guard = guard
                await driver.set_authorizer(authorizer.authorize)
            try:
                if self.dialect == "sqlite":
                    with lending(self.engine.url.database or ""):
                        yield tx, results
                else:
                    yield tx, results
            finally:
                guard.active = False
                if authorizer is not None:
                    await driver.set_authorizer(None)
            problem = guard.problem(track_failures=self.dialect == "sqlite") or _status(
                conn, outer, driver, self.dialect
            )
            if problem is not None:
                raise problem
            try:
                if session.in_transaction():
                    await session.commit()  # flushes; releases the session's savepoint
                await session.close()
            except Exception as exc:
                # e.g. the savepoint is gone because the transaction was ended below
                # SQLAlchemy (the driver's own commit): say so rather than what it broke
                problem = await _lost(tx, conn, outer, driver, self.dialect, params)
                if problem is not None:
                    raise problem from exc
                raise
            problem = _status(conn, outer, driver, self.dialect)
            if problem is not None:
                raise problem
            if self.dialect == "postgresql":
                from .postgres import fenced_commit

                await fenced_commit(
                    driver, self.sql, params
                )  # the fence's check and COMMIT, one trip
            await outer.commit()  # (on PostgreSQL the driver is idle now: SQLAlchemy's bookkeeping)
        except BaseException:
            await asyncio.shield(_abandon(tx, driver))
            raise
        finally:
            _unlend(conn._proxied)


def _status(
    conn: AsyncConnection | Connection, outer: Any, driver: Any, dialect: Dialect
) -> TransactionBoundaryError | None:
    """What the client side knows before COMMIT: the job's transaction must still be the one
    jobfence began, and (PostgreSQL) not aborted by a failed statement."""
    if not outer.is_active or conn.get_transaction() is not outer:
        return ended("ended or replaced")
    if dialect == "sqlite":
        return None if driver.in_transaction else ended("rolled back")
    from psycopg.pq import TransactionStatus

    status = driver.pgconn.transaction_status
    if status == TransactionStatus.INERROR:
        return aborted(None, caught=True)
    if status == TransactionStatus.IDLE:
        return ended("committed or rolled back")
    return None


async def _lost(
    tx: Tx,
    conn: AsyncConnection,
    outer: Any,
    driver: Any,
    dialect: Dialect,
    params: Mapping[str, Any],
) -> TransactionBoundaryError | None:
    """Whether the job's transaction is no longer the one jobfence began."""
    problem = _status(conn, outer, driver, dialect)
    if problem is not None or dialect != "postgresql":
        return problem
    try:
        async with driver.cursor() as cur:
            await cur.execute("SELECT current_setting('jobfence.tx', true)")
            row = await cur.fetchone()
    except Exception:
        return None
    return None if row and row[0] == params["jobfence_tx"] else ended("ended or replaced")


async def _abandon(tx: Tx, driver: Any) -> None:
    """Roll the job's transaction back at the driver, whatever state SQLAlchemy's objects are
    in after a refused commit (the connection then goes back to the engine's pool)."""
    session = getattr(tx, "session", None)
    if session is not None:
        with contextlib.suppress(Exception):
            await session.close()
    with contextlib.suppress(Exception):
        await driver.rollback()


# -- synchronous engines: `def handle(job, session: Session)` -----------------------------------


_writers: dict[str, threading.Lock] = {}
_writers_lock = threading.Lock()


def _sqlite_writer(engine: Engine) -> threading.Lock:
    """One lock per SQLite file in this process (see :func:`jobfence.runtime.hosted.sqlite_writer`,
    which ``db/`` may not import)."""
    key = os.path.realpath(engine.url.database or "")
    with _writers_lock:
        return _writers.setdefault(key, threading.Lock())


class SessionHost:
    """Runs the ``def`` handlers of an app built from a synchronous ``Engine``
    (``create_engine``): each job's transaction on a connection of that engine, in a worker
    thread, with a ``Session`` joined to it exactly as :class:`EngineWork` does for an
    ``AsyncSession`` (fence first, savepoint-mode session, transaction control refused, one
    COMMIT). A :class:`jobfence.runtime.hosted.WorkHost`: the harness plans the steps and
    decides."""

    def __init__(
        self,
        engine: Engine,
        *,
        schema: str,
        session_options: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(engine, Engine):
            raise ConfigurationError(
                f"expected a SQLAlchemy Engine (create_engine), not {type(engine).__name__}"
            )
        self.engine = engine
        self.dialect: Dialect = _kind(engine)
        self.sql = queries(self.dialect, schema)
        self.session_options = dict(session_options or {})
        self.session_options.setdefault("expire_on_commit", False)
        _watch(engine)
        self.writer = _sqlite_writer(engine) if self.dialect == "sqlite" else None

    def check_handler(self, handler: Any, *, is_async: bool) -> None:
        if is_async:
            name = getattr(handler, "__name__", repr(handler))
            raise ConfigurationError(
                f"{name} is `async def`, but the app's engine is synchronous (create_engine): "
                "write `def handle(job, session: Session)` (it runs in a worker thread), or "
                "build the app from an AsyncEngine (create_async_engine)"
            )

    @contextmanager
    def transaction(self) -> Iterator[SessionWork]:
        # SQLite: the worker's threads queue for the one writer here, in turn, rather than in
        # sqlite3's busy handler (which sleeps in growing steps)
        writer = self.writer if self.writer is not None else contextlib.nullcontext()
        with writer, self.engine.connect() as conn:
            work = SessionWork(self, conn)
            try:
                yield work
                work.outer.commit()  # (on PostgreSQL the driver is idle: lend() committed)
            except BaseException:
                work.abandon()
                raise
            finally:
                _unlend(conn)


class SessionWork:
    """One job's transaction on a connection of the user's ``Engine`` (see
    :class:`SessionHost`)."""

    def __init__(self, host: SessionHost, conn: Connection) -> None:
        self.host = host
        self.conn = conn
        self.dialect = host.dialect
        self.outer = conn.begin()
        driver: Any = conn.connection.driver_connection
        self.driver = driver
        self.session: Session | None = None
        self.token = {"jobfence_tx": f"{_PID}.sa.{next(_tokens)}"}
        #: PostgreSQL: ``lend_begin`` goes to the server with the first fence step
        self.begun = self.dialect == "sqlite"
        if self.dialect == "sqlite" and not self.driver.in_transaction:
            self.driver.execute("BEGIN IMMEDIATE -- jobfence")

    def run(self, name: str, params: Mapping[str, Any]) -> list[Row]:
        """One of jobfence's named statements, on the driver's connection (on PostgreSQL the
        first one in the same round trip as ``lend_begin``, client-side bound)."""
        sql = self.host.sql
        if not self.begun:
            from psycopg import ClientCursor
            from psycopg.rows import dict_row

            self.begun = True
            with ClientCursor(self.driver, row_factory=dict_row) as cur:
                cur.execute(f"{sql['lend_begin']}; {sql[name]}", {**params, **self.token})
                cur.nextset()
                return cur.fetchall() if cur.description is not None else []
        cur = self.driver.execute(sql[name], params)
        if cur.description is None:
            return []
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    @contextmanager
    def lend(self) -> Iterator[Session]:
        guard = TxGuard(active=True)
        session = Session(
            bind=self.conn, join_transaction_mode="create_savepoint", **self.host.session_options
        )
        self.session = session
        _lend(self.conn, guard)
        sqlite = self.dialect == "sqlite"
        if sqlite:
            from .sqlite import LentGuard

            authorizer = LentGuard()
            authorizer.guard = guard
            self.driver.set_authorizer(authorizer.authorize)
        try:
            if sqlite:
                with lending(self.host.engine.url.database or ""):
                    yield session
            else:
                yield session
        finally:
            guard.active = False
            if sqlite:
                with contextlib.suppress(Exception):  # closed by the handler
                    self.driver.set_authorizer(None)
        problem = guard.problem(track_failures=sqlite) or self._status()
        if problem is not None:
            raise problem
        try:
            if session.in_transaction():
                session.commit()  # flushes; releases the session's savepoint
            session.close()
        except Exception as exc:
            problem = self._lost()
            if problem is not None:
                raise problem from exc
            raise
        problem = self._status()
        if problem is not None:
            raise problem
        if not sqlite:
            import psycopg
            from psycopg import ClientCursor

            from .postgres import boundary_error

            try:  # the fence's check and COMMIT in one round trip
                with ClientCursor(self.driver) as cur:
                    cur.execute(self.host.sql["lend_commit_and_commit"], self.token)
            except psycopg.Error as exc:
                problem = boundary_error(exc)
                if problem is not None:
                    raise problem from exc
                raise

    def _status(self) -> TransactionBoundaryError | None:
        return _status(self.conn, self.outer, self.driver, self.dialect)

    def _lost(self) -> TransactionBoundaryError | None:
        problem = self._status()
        if problem is not None or self.dialect != "postgresql":
            return problem
        try:
            cur = self.driver.execute("SELECT current_setting('jobfence.tx', true)")
            found = cur.fetchone()
        except Exception:
            return None
        return (
            None if found and found[0] == self.token["jobfence_tx"] else ended("ended or replaced")
        )

    def abandon(self) -> None:
        """Roll the job's transaction back at the driver, whatever state SQLAlchemy's objects
        are in (the connection then goes back to the engine's pool)."""
        if self.session is not None:
            with contextlib.suppress(Exception):
                self.session.close()
        with contextlib.suppress(Exception):
            self.driver.rollback()
