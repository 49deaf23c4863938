"""A job's work in ``transaction.atomic()`` on Django's connection, with its fence (SPEC F2, H5).

The fence steps run first inside the atomic block, on Django's own database connection; the
handler's ORM writes follow; the block commits them together. While the handler runs, what
could end that transaction early is refused or caught:

- ``transaction.commit()``, ``rollback()``, ``set_autocommit()`` and ``connection.commit()``
  are refused by Django itself inside ``atomic()`` (``TransactionManagementError``);
- SQL that ends the transaction (``cursor.execute("COMMIT")``) is refused by an
  ``execute_wrapper`` before it reaches the database;
- the driver's own ``commit()``/``rollback()`` (``connection.connection``): on SQLite an
  authorizer refuses them; on PostgreSQL jobfence's server-side guard (migration 0004) refuses
  to commit the fence outside jobfence's COMMIT, so the fence and the work roll back together;
- a transaction marked for rollback (``transaction.set_rollback(True)``, a database error the
  handler caught inside the ORM, a closed connection) or aborted fails the job instead of
  committing nothing silently.
"""

from __future__ import annotations

import contextlib
import sqlite3
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import psycopg
from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from psycopg.pq import TransactionStatus

from ...db import Row, TxGuard, aborted, ended, rolled_back
from ...db.adopt import SyncConnection
from ...db.postgres import boundary_error
from ...db.second_writer import check, lending
from ...db.sqlite import LentGuard
from ...errors import ConfigurationError, TransactionBoundaryError
from ...runtime.hosted import HostedWork, WorkHost, sqlite_writer
from ...sql import Dialect


def dialect_of(connection: BaseDatabaseWrapper) -> Dialect:
    """The jobfence dialect of a Django connection; one line for anything else."""
    vendor = connection.vendor
    if vendor == "postgresql":
        from django.db.backends.postgresql.psycopg_any import is_psycopg3

        if not is_psycopg3:
            raise ConfigurationError(
                f"database {connection.alias!r} uses psycopg2; jobfence needs Django's psycopg 3 "
                "backend: pip install 'psycopg[binary]>=3.2' (Django picks it when installed)"
            )
        return "postgresql"
    if vendor == "sqlite":
        return "sqlite"
    raise ConfigurationError(
        f"database {connection.alias!r} is {vendor}; jobfence works on PostgreSQL (psycopg 3) "
        "and SQLite"
    )


def raw_connection(connection: BaseDatabaseWrapper) -> Any:
    """The driver's connection under a Django connection (connecting if needed)."""
    connection.ensure_connection()
    return connection.connection


class DjangoTx:
    """What a Django handler receives as ``tx``: Django's connection, inside the job's
    transaction. Use the ORM as usual; ``execute``/``fetchall``/``fetchone`` take Django's
    ``%s`` placeholders on both stores; ``savepoint()`` is ``transaction.atomic()``."""

    def __init__(self, using: str, dialect: Dialect) -> None:
        self.using = using
        self.dialect = dialect
        self.paramstyle = "format"

    @property
    def connection(self) -> BaseDatabaseWrapper:
        """Django's connection (``django.db.connections[tx.using]``)."""
        return connections[self.using]

    def execute(self, sql: str, params: Any = None) -> int:
        """Run one statement (``%s`` placeholders); the number of rows it affected."""
        with self.connection.cursor() as cursor:
            cursor.execute(sql, params)
            return int(cursor.rowcount)

    def fetchall(self, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        with self.connection.cursor() as cursor:
            cursor.execute(sql, params)
            return [tuple(row) for row in cursor.fetchall()]

    def fetchone(self, sql: str, params: Any = None) -> tuple[Any, ...] | None:
        rows = self.fetchall(sql, params)
        return rows[0] if rows else None

    def savepoint(self) -> Any:
        """``transaction.atomic(using=tx.using)``: undoes its block alone if it raises."""
        return transaction.atomic(using=self.using)


class _Watch:
    """Django's ``execute_wrapper`` while a handler runs: refuses SQL that would end the
    transaction, and keeps the failed statements the handler carried on after (outside a
    savepoint that was rolled back), which SQLite would otherwise commit around."""

    def __init__(self, guard: TxGuard) -> None:
        self.guard = guard
        self.savepoints: list[str] = []

    def __call__(
        self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any
    ) -> Any:
        guard = self.guard
        guard.screen(sql)
        try:
            result = execute(sql, params, many, context)
        except Exception as exc:
            guard.failed(exc)
            raise
        self._track(sql)
        return result

    def _track(self, sql: str) -> None:
        """Follow Django's savepoints (nested ``atomic()`` blocks)."""
        words = sql.replace('"', " ").split()
        if len(words) < 2:
            return
        verb = words[0].upper()
        if verb == "SAVEPOINT":
            self.savepoints.append(words[1])
            self.guard.depth = len(self.savepoints)
        elif verb in ("ROLLBACK", "RELEASE") and words[-1] in self.savepoints:
            depth = self.savepoints.index(words[-1]) + 1
            if verb == "ROLLBACK":
                # the savepoint's block is undone, with the statements that failed in it
                self.guard.failures = [f for f in self.guard.failures if f[0] < depth]
                return
            del self.savepoints[depth - 1 :]
            self.guard.depth = depth - 1
            self.guard.failures = [(min(d, depth - 1), e) for d, e in self.guard.failures]


def rollback_only() -> TransactionBoundaryError:
    """The job's atomic block was marked for rollback by the handler itself (a failed
    statement it caught is ``TX_ABORTED`` instead, as on every store and integration)."""
    return rolled_back("the transaction was marked for rollback: transaction.set_rollback(True)")


class DjangoWork(HostedWork):
    """One job's transaction: an outermost ``atomic()`` block on Django's connection."""

    def __init__(self, connection: BaseDatabaseWrapper, dialect: Dialect, schema: str) -> None:
        self.django = connection
        self.dialect = dialect
        self.raw = raw_connection(connection)
        self.adopted = SyncConnection(self.raw, doing="run a job", dialect=dialect, schema=schema)
        self.token = f"django.{uuid.uuid4().hex}"
        if dialect == "postgresql":
            # names the transaction: only jobfence's COMMIT may commit the fence (SPEC H5)
            self.adopted.run("lend_begin", {"jobfence_tx": self.token})

    def run(self, name: str, params: Mapping[str, Any]) -> list[Row]:
        return self.adopted.run(name, params)

    @contextmanager
    def lend(self) -> Iterator[DjangoTx]:
        guard = TxGuard(active=True)
        lent = LentGuard()
        lent.guard = guard
        sqlite = isinstance(self.raw, sqlite3.Connection)
        if sqlite:
            self.raw.set_authorizer(lent.authorize)
        try:
            with (
                lending(str(self.django.settings_dict["NAME"]))
                if sqlite
                else contextlib.nullcontext(),
                self.django.execute_wrapper(_Watch(guard)),
            ):
                try:
                    yield DjangoTx(self.django.alias, self.dialect)
                except Exception as exc:
                    if sqlite:
                        self._second_alias(exc)
                    raise
        except psycopg.Error as exc:
            problem = boundary_error(exc) or guard.problem(track_failures=False)
            if problem is not None:
                raise problem from exc
            raise
        except Exception as exc:
            problem = guard.problem(track_failures=False)
            if problem is not None:
                raise problem from exc
            raise
        finally:
            guard.active = False
            if sqlite:
                with contextlib.suppress(sqlite3.ProgrammingError):  # closed by the handler
                    self.raw.set_authorizer(None)
        self._check(guard)

    def _second_alias(self, exc: BaseException) -> None:
        """SQLite: "database is locked" from another alias of the job's own file, which waits
        for the lock the job holds until its handler returns: say so, and fail at once."""
        for other in connections.all(initialized_only=True):
            if other.alias != self.django.alias and other.vendor == "sqlite":
                name = str(other.settings_dict["NAME"])
                check(exc, name, f"the Django database alias {other.alias!r}")

    def _check(self, guard: TxGuard) -> None:
        """The handler returned normally: may the transaction commit with the fence? The one
        rule of every store and integration (docs/concepts.md): a failed statement the handler
        caught (outside a savepoint it rolled back) is ``TX_ABORTED``; work rolled back that
        the handler had not scoped itself is ``TX_ROLLBACK_ONLY``. Django's ``execute_wrapper``
        sees every statement and savepoint of the ORM, so failures count on both stores."""
        problem = guard.problem(track_failures=False)
        if problem is not None:
            raise problem
        if self.django.closed_in_transaction or self.django.connection is None:
            raise ended("closed by the handler (connection.close())")
        problem = guard.problem(track_failures=True)
        if problem is not None:
            raise problem
        if self.django.needs_rollback:
            raise rollback_only()
        if isinstance(self.raw, sqlite3.Connection):
            if not self.raw.in_transaction:
                raise ended("committed or rolled back on the sqlite3 connection")
            return
        status = self.raw.info.transaction_status
        if status == TransactionStatus.INERROR:
            raise aborted(None, caught=True)
        if status != TransactionStatus.INTRANS:
            raise ended("committed or rolled back on the psycopg connection")
        try:
            self.adopted.run("lend_commit", {"jobfence_tx": self.token})
        except psycopg.Error as exc:
            problem = boundary_error(exc)
            if problem is not None:
                raise problem from exc
            raise


class DjangoHost(WorkHost):
    """Runs a :class:`~jobfence.integrations.django.DjangoApp`'s handlers in
    ``transaction.atomic(using=…)``, the fence first (see the module's docstring)."""

    def __init__(self, using: str, schema: str) -> None:
        self.using = using
        self.schema = schema

    def check_handler(self, handler: Callable[..., Any], *, is_async: bool) -> None:
        if is_async:
            name = getattr(handler, "__name__", repr(handler))
            raise ConfigurationError(
                f"{name} is `async def`; Django's transactions are synchronous, so a DjangoApp "
                "runs plain `def handle(job, tx)` handlers (each in a worker thread, inside "
                "transaction.atomic())"
            )

    @contextmanager
    def transaction(self) -> Iterator[DjangoWork]:
        connection = connections[self.using]
        if connection.in_atomic_block:
            raise ConfigurationError(
                "a job's transaction must be the outermost atomic block; this thread is "
                "already inside transaction.atomic()"
            )
        # what Django does around a request: drop a broken connection or one past CONN_MAX_AGE
        connection.close_if_unusable_or_obsolete()
        dialect = dialect_of(connection)
        writer = (
            sqlite_writer(str(connection.settings_dict["NAME"]))
            if dialect == "sqlite"
            else contextlib.nullcontext()
        )
        with writer, transaction.atomic(using=self.using):
            yield DjangoWork(connection, dialect, self.schema)
