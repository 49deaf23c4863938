"""The database port: connections, transactions and named queries, one small driver per dialect.

Drivers only *execute*; :mod:`jobfence.store` owns what is executed. A :class:`Tx` is also
what a handler receives: its writes commit or roll back together with the fence row.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import json
import re
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, LiteralString, Protocol

from ..config import DatabaseURL
from ..errors import (
    ConfigurationError,
    TransactionBoundaryError,
    register_classifier,
    register_coder,
)
from ..sql import Dialect, queries
from .translate import (
    DATA_ERROR,
    DRIVER_ERROR,
    classify_driver_error,
    driver_code,
    is_connection_lost,
    is_data_error,
    is_unique_violation,
)

# the drivers' errors take part in errors.classify and errors.error_code (errors.py knows
# no driver)
register_classifier(classify_driver_error)
register_coder(driver_code)

Params = Sequence[Any] | Mapping[str, Any] | None
Row = dict[str, Any]

#: Set while a handler's work transaction is open (lets us refuse self-deadlocks on SQLite).
current_tx: contextvars.ContextVar[Tx | None] = contextvars.ContextVar("jobfence_tx", default=None)


# -- the transaction boundary (SPEC H5) ----------------------------------------------------

#: statements that end, replace or reshape a transaction; see :func:`control_statement`
_CONTROL = re.compile(
    r"""\A(?:\s+|--[^\n]*(?:\n|\Z)|/\*.*?\*/)*
    (?P<verb>begin|start\s+transaction|commit|end|rollback|abort|release|prepare\s+transaction
       |discard|set\s+session\s+characteristics)\b
    (?P<rest>[^;]*)""",
    re.IGNORECASE | re.DOTALL | re.VERBOSE,
)
_SAVEPOINT_ARG = re.compile(r"\A\s*(?:to\s+)?(?:savepoint\s+)?\"?(?P<name>[A-Za-z0-9_]*)", re.I)
#: savepoints jobfence itself sets (a handler may not release or roll back to them)
SAVEPOINT_PREFIX = "jobfence_"
_FIRST = frozenset("bBsScCeErRaApPdD-/ \t\r\n")


def control_statement(sql: str) -> str | None:
    """The transaction-control verb that ``sql`` starts with (``"COMMIT"``, ``"ROLLBACK"``…)
    when running it would end, replace or reshape the transaction jobfence lent a handler;
    else None. ``ROLLBACK TO``/``RELEASE`` of the handler's own savepoints are allowed."""
    if not sql or sql[0] not in _FIRST:
        return None
    match = _CONTROL.match(sql)
    if match is None:
        return None
    verb = " ".join(match["verb"].upper().split())
    rest = match["rest"]
    if verb == "RELEASE" or (verb == "ROLLBACK" and re.match(r"\s*to\b", rest, re.I)):
        arg = _SAVEPOINT_ARG.match(rest)
        name = arg["name"] if arg else ""
        if not name.lower().startswith(SAVEPOINT_PREFIX):
            return None
        verb = f"{verb} {'TO ' if verb == 'ROLLBACK' else ''}SAVEPOINT {name}"
    return verb


#: statements whose effect lasts to the end of the transaction rather than the job's
#: savepoint: in a group commit they would reach the batch's later jobs (SET LOCAL,
#: set_config(…, true)), hold locks to the batch's commit (advisory xact locks, LOCK TABLE), or
#: cannot run in pipeline mode (COPY); see :func:`wide_statement`
_WIDE = re.compile(
    r"""(?P<what>\bset\s+local\b|\bset_config\s*\(|\bpg_(?:try_)?advisory_xact_lock
        |(?:\A|;)\s*(?:lock|copy)\b)""",
    re.IGNORECASE | re.VERBOSE,
)


def wide_statement(sql: str) -> str | None:
    """What in ``sql`` takes transaction-wide state (``"SET LOCAL"``, ``"LOCK"``…), else None.
    Screened only for jobs that share a group-commit transaction: such a job must run in a
    transaction of its own. Text screening: a match inside a string literal costs a re-run,
    never a wrong result."""
    match = _WIDE.search(sql)
    if match is None:
        return None
    return " ".join(match["what"].lstrip(";").split()).rstrip("(").strip().upper()


def needs_isolation(what: str) -> TransactionBoundaryError:
    return TransactionBoundaryError(
        f"the handler ran {what} inside a group-commit transaction, whose effect would last "
        "beyond its job to the batch's commit; the batch was rolled back and its jobs run "
        "again, each in a transaction of its own (declare the consumer isolated=True to "
        "skip this)",
        code="TX_NEEDS_ISOLATION",
    )


def refusal(verb: str) -> TransactionBoundaryError:
    return TransactionBoundaryError(
        f"the handler ran {verb} on the transaction jobfence lent it; jobfence owns that "
        "transaction (it holds the job's fence and commits it with the handler's work), so "
        "the job's work was rolled back. Return normally to commit, raise to roll back, and "
        "use `tx.savepoint()` to undo part of the work",
        code="TX_CONTROL_REFUSED",
    )


@dataclass
class TxGuard:
    """What jobfence watches while a handler holds its transaction (SPEC H5).

    ``active`` is set while the handler runs. A refused transaction-control statement, or a
    failed statement the handler carried on after (outside a savepoint), fails the job even
    when the handler caught the exception: its work and its fence roll back together.
    """

    active: bool = False
    refused: str | None = None
    #: how the transaction ended, when a handler's statement found it already ended
    ended: str | None = None
    #: (savepoint depth, description) of statements that failed while the handler ran
    failures: list[tuple[int, str]] = field(default_factory=list)
    depth: int = 0
    #: the transaction is shared by a group commit's jobs: statements with transaction-wide
    #: effects are refused (the job needs a transaction of its own), and ``pipeline`` (the
    #: driver's pipeline, if any) is synced after each of the handler's statements
    batched: bool = False
    pipeline: Any = None
    #: the transaction-wide statement a batched job tried (see :func:`wide_statement`)
    isolation: str | None = None
    #: statements that failed through an ORM session (seen by its own events, which also
    #: follow its savepoints); counted on both stores
    orm_failures: list[tuple[int, str]] = field(default_factory=list)
    #: how the handler rolled back work of a transaction it did not open itself
    #: (``session.rollback()``, ``transaction.set_rollback(True)``)
    rolled_back: str | None = None

    def screen(self, sql: str) -> None:
        """Refuse a transaction-control statement while the handler runs (and, in a group
        commit, one with transaction-wide effects)."""
        if not self.active:
            return
        verb = control_statement(sql)
        if verb is not None:
            self.refused = self.refused or verb
            raise refusal(verb)
        if self.batched:
            wide = wide_statement(sql)
            if wide is not None:
                self.wide(wide)

    def wide(self, what: str) -> None:
        """A batched job tried something that needs a transaction of its own."""
        self.isolation = self.isolation or what
        raise needs_isolation(what)

    def outside(self, how: str) -> None:
        """A handler's statement would run after its transaction ended (and so commit on its
        own, without the fence): refuse it."""
        self.ended = self.ended or how
        raise ended(how)

    def failed(self, exc: BaseException) -> None:
        if self.active and not isinstance(exc, TransactionBoundaryError):
            self.failures.append((self.depth, f"{type(exc).__name__}: {exc}".strip()))

    @contextmanager
    def internal(self) -> Iterator[None]:
        """jobfence's own statements inside a lent transaction pass unscreened."""
        active, self.active = self.active, False
        try:
            yield
        finally:
            self.active = active

    def problem(self, *, track_failures: bool) -> TransactionBoundaryError | None:
        """Why the transaction must not be committed, as seen from the client side."""
        if self.isolation is not None:
            return needs_isolation(self.isolation)
        if self.refused is not None:
            return refusal(self.refused)
        if self.ended is not None:
            return ended(self.ended)
        if track_failures and self.failures:
            return aborted(self.failures[0][1], caught=True)
        if self.orm_failures:
            return aborted(self.orm_failures[0][1], caught=True)
        if self.rolled_back is not None:
            return rolled_back(self.rolled_back)
        return None


def aborted(error: str | None, *, caught: bool) -> TransactionBoundaryError:
    what = f" ({error.splitlines()[0][:300]})" if error else ""
    return TransactionBoundaryError(
        f"a statement failed inside the handler's transaction{what} and the handler "
        + ("caught the error and returned normally" if caught else "returned normally")
        + "; the transaction cannot commit, so the job's work and its fence were rolled back. "
        "Let the error propagate, or run the statement inside `tx.savepoint()` to undo it "
        "alone and carry on",
        code="TX_ABORTED",
    )


def rolled_back(how: str) -> TransactionBoundaryError:
    """The handler rolled back work of the job's transaction that it had not scoped itself,
    then returned normally: the job's work vanished, so it must not be fenced as done."""
    return TransactionBoundaryError(
        f"the handler rolled back the job's work ({how}) and returned normally; jobfence does "
        "not fence a job whose work vanished, so nothing was committed and the job fails. "
        "Raise to fail a job; to undo part of the work on purpose and carry on, do it in a "
        "savepoint the handler opens itself (`session.begin_nested()`, `tx.savepoint()`, a "
        "nested `transaction.atomic()`); to do nothing, return without writing",
        code="TX_ROLLBACK_ONLY",
    )


def ended(how: str) -> TransactionBoundaryError:
    return TransactionBoundaryError(
        f"the transaction jobfence lent the handler was {how} before jobfence committed it; "
        "the job's work and its fence were not committed together, so the job fails and "
        "runs again. A handler must not end or replace the transaction it is given",
        code="TX_ENDED",
    )


def let_go(how: str) -> TransactionBoundaryError:
    """A statement from a handler thread after jobfence let go of its job's transaction."""
    return TransactionBoundaryError(
        f"this handler's transaction is gone: {how}. The statement was not run: a handler "
        "thread that outlives its job can never write outside the job's transaction, nor "
        "commit without its fence (a cancelled job is redelivered)",
        code="TX_ENDED",
    )


class CommitConflict(Exception):
    """A transaction of :meth:`Database.deferred` broke a constraint (a unique key, a
    foreign key, a check) in the round trip that carried its statements and ``COMMIT``:
    nothing was committed. The caller decides again, e.g. with statements that look first."""


class BatchLost(Exception):
    """A handler ended a whole group-commit transaction (or released past its savepoint, or
    took transaction-wide state: ``isolate`` names what): no job of the batch committed; the
    harness runs each of them again on its own."""

    def __init__(self, problem: TransactionBoundaryError, isolate: str | None = None) -> None:
        super().__init__(str(problem))
        self.problem = problem
        self.isolate = isolate


_savepoints = itertools.count(1)


class Tx(ABC):
    """An open transaction. Handlers use ``execute``/``fetchone``/``fetchall`` with one
    placeholder style on both stores, psycopg's: ``%s`` for a positional parameter,
    ``%(name)s`` for a named one (a mapping), ``%%`` for a literal percent; a ``%`` inside a
    string literal, a quoted identifier or a comment is text. On SQLite the statement is
    translated to ``?`` (:mod:`jobfence.db.placeholders`; SQLite's own ``?`` still works
    there, without ``%s`` in the same statement, but is not portable). Without parameters a
    statement runs exactly as written. ``connection`` is the driver's connection (psycopg
    ``AsyncConnection`` or aiosqlite ``Connection``, with the driver's own placeholders)
    for anything else.

    The transaction belongs to jobfence (SPEC H5): a handler may not commit, roll back, end
    or replace it, on ``tx`` or on ``connection`` (such statements are refused and fail the
    job). ``savepoint()`` undoes part of the work.
    """

    dialect: Dialect
    paramstyle: str
    #: set on transactions lent to handlers
    guard: TxGuard | None = None
    #: the ORM session joined to this transaction, on an app built from a SQLAlchemy engine
    #: (``App(engine=…)``; see docs/integrations/sqlalchemy.md); else None
    session: Any = None

    @asynccontextmanager
    async def savepoint(self) -> AsyncIterator[Tx]:
        """A savepoint: if the block raises, its statements are undone and the error goes on;
        the rest of the transaction (and the job) carries on if the handler catches it."""
        name = f"{SAVEPOINT_PREFIX}sp_{next(_savepoints)}"
        guard = self.guard or TxGuard()
        with guard.internal():
            await self.execute(f"SAVEPOINT {name}")
        guard.depth += 1
        depth = guard.depth
        try:
            yield self
        except BaseException:
            guard.depth = depth - 1
            guard.failures = [f for f in guard.failures if f[0] < depth]
            with guard.internal():
                await self.execute(f"ROLLBACK TO SAVEPOINT {name}")
                await self.execute(f"RELEASE SAVEPOINT {name}")
            raise
        guard.depth = depth - 1
        with guard.internal():
            await self.execute(f"RELEASE SAVEPOINT {name}")

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

    #: True while a transaction from :meth:`Database.deferred` has sent nothing yet: its
    #: BEGIN and first steps leave with its first statement whose result is needed, or with
    #: its COMMIT (what :meth:`q_at_commit` and :meth:`execute_at_commit` queue goes there)
    deferred: bool = False

    async def q_at_commit(self, name: str, params: Mapping[str, Any]) -> None:
        """Run a named jobfence statement as the transaction's last, its rows unread. In a
        transaction from :meth:`Database.work` on PostgreSQL it goes to the server with the
        COMMIT, in the same round trip (its error fails the commit); elsewhere it runs now."""
        await self.q(name, params)

    async def execute_at_commit(self, sql: str, params: Params = None) -> None:
        """:meth:`q_at_commit` for a statement of the caller's own (psycopg placeholders, as
        :meth:`execute`): with the COMMIT where :meth:`q_at_commit` goes there, else now."""
        await self.execute(sql, params)

    @abstractmethod
    async def qmany(self, name: str, params: Sequence[Mapping[str, Any]]) -> None:
        """Run a named jobfence statement once per parameter set (batched by the driver)."""

    @abstractmethod
    async def script(self, sql: LiteralString) -> None:
        """Run several statements (migrations)."""

    @property
    def can_copy(self) -> bool:
        """Whether :meth:`copy` is available (PostgreSQL, outside pipeline mode)."""
        return False

    async def copy(self, name: str, rows: Iterable[Sequence[Any]], types: Sequence[str]) -> None:
        """Bulk-load ``rows`` with the named ``COPY … FROM STDIN`` statement (see
        :attr:`can_copy`)."""
        raise ConfigurationError(f"COPY is not available on {self.dialect}")


class SyncTx:
    """The same transaction for a plain ``def`` handler running in a worker thread.

    Each call is carried out on the event loop that owns the connection, so sync and async
    handlers share one driver and one transaction.

    When jobfence is done with the job (the handler returned, or the job was cancelled by a
    forced stop or the end of the shutdown grace while the thread was still running), it calls
    :meth:`end`: the transaction is rolled back or committed by then, and its connection may
    serve another job, so every later call from the thread is refused
    (:class:`~jobfence.errors.TransactionBoundaryError`) — it can never run outside the job's
    transaction, nor commit without the fence.
    """

    def __init__(self, tx: Tx, loop: asyncio.AbstractEventLoop) -> None:
        self._tx = tx
        self._loop = loop
        self.dialect = tx.dialect
        self.paramstyle = tx.paramstyle
        self._ended: str | None = None
        self._pending: set[Any] = set()

    @property
    def async_tx(self) -> Tx:
        return self._tx

    @property
    def ended_how(self) -> str | None:
        """How the job's transaction ended for this handler (None: it still holds it)."""
        return self._ended

    def end(self, how: str = "the job was cancelled") -> None:
        """Refuse every later statement; cancel one still running (call on the loop)."""
        self._ended = self._ended or how
        for future in list(self._pending):
            future.cancel()

    async def _checked(self, coro: Any) -> Any:
        # on the loop, where end() is called: no statement starts after the job let go
        if self._ended is not None:
            coro.close()
            raise let_go(self._ended)
        return await coro

    def run_sync(self, coro: Any) -> Any:
        """Run ``coro`` (a statement of the job's transaction) on the worker's loop and wait
        for it here, in the handler's thread; refused once the job let go of it."""
        if self._ended is not None:
            coro.close()
            raise let_go(self._ended)
        try:
            future = asyncio.run_coroutine_threadsafe(self._checked(coro), self._loop)
        except RuntimeError:  # the loop is closed: the process is stopping
            coro.close()
            raise let_go("the worker stopped") from None
        self._pending.add(future)
        try:
            return future.result()
        except Exception as exc:
            how = self.ended_how  # end() may have run meanwhile, on the loop
            if how is not None and not isinstance(exc, TransactionBoundaryError):
                raise let_go(how) from exc
            raise
        finally:
            self._pending.discard(future)

    def execute(self, sql: str, params: Params = None) -> int:
        result: int = self.run_sync(self._tx.execute(sql, params))
        return result

    def fetchall(self, sql: str, params: Params = None) -> list[tuple[Any, ...]]:
        result: list[tuple[Any, ...]] = self.run_sync(self._tx.fetchall(sql, params))
        return result

    def fetchone(self, sql: str, params: Params = None) -> tuple[Any, ...] | None:
        result: tuple[Any, ...] | None = self.run_sync(self._tx.fetchone(sql, params))
        return result

    @contextmanager
    def savepoint(self) -> Iterator[SyncTx]:
        """See :meth:`Tx.savepoint`."""
        manager = self._tx.savepoint()
        self.run_sync(manager.__aenter__())
        try:
            yield self
        except BaseException as exc:
            self.run_sync(manager.__aexit__(type(exc), exc, exc.__traceback__))
            raise
        self.run_sync(manager.__aexit__(None, None, None))


def to_datetime(value: Any) -> datetime | None:
    """A database time (``timestamptz``, or SQLite's epoch seconds) as an aware datetime."""
    if value is None:
        return None
    if isinstance(value, datetime):
        return value
    return datetime.fromtimestamp(float(value), tz=UTC)


class Database(ABC):
    """A pool of connections to one database.

    Parameters that the dialects spell differently are adapted here, so that code above the
    driver never asks which dialect it runs on: :meth:`at` for times, :meth:`array` for the
    lists a named query matches against.
    """

    dialect: Dialect
    #: Check each connection as it leaves the pool (one empty query) and replace a dead one,
    #: and give up on a checkout after :attr:`checkout_timeout` seconds (DatabaseUnavailable):
    #: for servers that must outlive a database restart without failing a request on a stale
    #: connection, and answer "unavailable" quickly while it is down (the ops server). Off by
    #: default: a worker's transactions do without the extra round trip.
    check_connections: bool = False
    checkout_timeout: float = 5.0

    def __init__(self, url: DatabaseURL) -> None:
        self.url = url
        self.sql = queries(url.dialect, url.schema)

    def at(self, value: datetime | None) -> Any:
        """A time as a query parameter (``timestamptz``; epoch seconds on SQLite)."""
        if value is None or self.dialect == "postgresql":
            return value
        return value.timestamp()

    def array(self, values: Iterable[Any] | None) -> Any:
        """A list as a query parameter (an array; a JSON array that SQLite's queries unpack
        with ``json_each``); None stays None."""
        if values is None:
            return None
        items = list(values)
        return items if self.dialect == "postgresql" else json.dumps(items)

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

    #: :meth:`deferred` transactions: one that only queues statements is sent in one round
    #: trip, and several such together (PostgreSQL)
    supports_deferred: bool = False

    def deferred(self, steps: Sequence[str], params: Mapping[str, Any]) -> Tx:
        """A transaction that holds no connection and sends nothing up front
        (:attr:`Tx.deferred`): ``BEGIN`` and the named ``steps`` (one parameter set; their
        rows are never read, so a step that must hold raises instead, e.g. a plain
        ``INSERT`` on a unique key) leave with its first statement whose result is needed
        (which checks a connection out), or, when it only queued statements
        (:meth:`Tx.q_at_commit`, :meth:`Tx.execute_at_commit`), with its ``COMMIT``. End it
        with :meth:`commit_deferred` or :meth:`abandon_deferred`. See
        :attr:`supports_deferred`."""
        raise ConfigurationError(f"deferred transactions are not available on {self.dialect}")

    async def commit_deferred(self, txs: Sequence[Tx]) -> None:
        """Commit transactions from :meth:`deferred`: one that has begun on its own
        connection; several that sent nothing yet together, as **one** transaction in one
        round trip (all or nothing: on an error none of them committed, and each may be
        committed alone). A statement breaking a constraint raises :class:`CommitConflict`."""
        raise ConfigurationError(f"deferred transactions are not available on {self.dialect}")

    async def abandon_deferred(self, tx: Tx) -> None:
        """Roll back a transaction from :meth:`deferred` (nothing to do if it sent nothing)
        and give its connection back."""
        raise ConfigurationError(f"deferred transactions are not available on {self.dialect}")

    #: Group commit (:meth:`batch`): many jobs in one transaction, each in a savepoint.
    supports_batch: bool = False

    def batch(
        self, step: str, params: Mapping[str, Any]
    ) -> AbstractAsyncContextManager[tuple[Any, list[Row]]]:
        """Group commit: a transaction that starts with the named ``step`` and gives each job
        its own savepoint (``batch.job()``); see :attr:`supports_batch`."""
        raise ConfigurationError(f"group commit is not available on {self.dialect}")

    @abstractmethod
    async def run(self, name: str, params: Mapping[str, Any] | None = None) -> list[Row]:
        """Run one named query in its own transaction (autocommit)."""

    @abstractmethod
    def wakeups(self, channel: str) -> AsyncIterator[str]:
        """Yield notification payloads (PostgreSQL LISTEN); SQLite never yields."""

    @property
    def display(self) -> str:
        return self.url.display


class WorkSource(Protocol):
    """What opens a job's transaction (:meth:`Database.work`): jobfence's own pool, or the
    user's SQLAlchemy engine (:class:`jobfence.db.sqlalchemy.EngineWork`)."""

    dialect: Dialect

    def work(
        self, steps: Sequence[str], params: Mapping[str, Any]
    ) -> AbstractAsyncContextManager[tuple[Tx, list[list[Row]]]]: ...


def connect(url: DatabaseURL, *, lock_timeout: float | None = None) -> Database:
    """A (not yet opened) :class:`Database` for a URL. ``lock_timeout`` (SQLite): how long a
    write waits for the file's one write lock before it fails with
    :class:`~jobfence.errors.DatabaseLocked` (default 30 s)."""
    if url.dialect == "postgresql":
        from .postgres import PostgresDatabase

        return PostgresDatabase(url)
    from .sqlite import SQLiteDatabase

    return SQLiteDatabase(url, lock_timeout=lock_timeout)


__all__ = [
    "DATA_ERROR",
    "DRIVER_ERROR",
    "BatchLost",
    "CommitConflict",
    "Database",
    "Params",
    "Row",
    "SyncTx",
    "Tx",
    "TxGuard",
    "WorkSource",
    "connect",
    "current_tx",
    "is_connection_lost",
    "is_data_error",
    "is_unique_violation",
    "to_datetime",
]
