"""Driver errors, translated at the edge: which are transient, which are unique violations.

Both drivers (psycopg 3 and the standard library's sqlite3) are core dependencies, so this
module registers both classifiers with :func:`jobfence.errors.register_classifier` when the
database package is imported; nothing outside :mod:`jobfence.db` imports a driver's errors.
"""

from __future__ import annotations

import sqlite3

import psycopg
import psycopg.errors

from ..errors import Category, register_classifier

_TEMPORARY_PG: tuple[type[BaseException], ...] = (
    psycopg.errors.SerializationFailure,
    psycopg.errors.DeadlockDetected,
    psycopg.errors.LockNotAvailable,
    psycopg.errors.QueryCanceled,
    psycopg.errors.AdminShutdown,
    psycopg.errors.CannotConnectNow,
    psycopg.OperationalError,  # lost connections, server restarts, refused connections
    psycopg.InterfaceError,  # "the connection is closed"
)


#: SQLite's primary result codes for "could not do it now": SQLITE_BUSY, SQLITE_LOCKED,
#: SQLITE_IOERR (extended codes keep the primary code in their low byte)
_TEMPORARY_SQLITE_CODES = frozenset({5, 6, 10})
#: the same, by message, for an error that carries no result code
_TEMPORARY_SQLITE_MESSAGES = ("database is locked", "database table is locked", "disk i/o error")


def _sqlite_is_transient(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF in _TEMPORARY_SQLITE_CODES
    text = str(exc).lower()
    return any(m in text for m in _TEMPORARY_SQLITE_MESSAGES)


def classify_driver_error(exc: BaseException) -> Category | None:
    """TEMPORARY_ERROR for what a driver raises when the store could not do it *now*.

    sqlite3 raises OperationalError both for a busy or locked database and for SQL it cannot
    run (syntax error, no such table or column): only the first is transient; the others are
    left to the default, TECHNICAL_ERROR (limited retries), as PostgreSQL's are."""
    if isinstance(exc, _TEMPORARY_PG):
        return Category.TEMPORARY_ERROR
    if isinstance(exc, sqlite3.Error) and _sqlite_is_transient(exc):
        return Category.TEMPORARY_ERROR
    return None


def is_unique_violation(exc: BaseException) -> bool:
    """A unique key refused the row, on either driver."""
    if isinstance(exc, psycopg.errors.UniqueViolation):
        return True
    return isinstance(exc, sqlite3.IntegrityError) and "UNIQUE" in str(exc)


#: what a driver raises for a value the database cannot store or compare (out of range…)
DATA_ERROR: type[Exception] = psycopg.DataError
#: the base class of what the PostgreSQL driver raises (for handlers of the doors)
DRIVER_ERROR: type[Exception] = psycopg.Error

#: SQLSTATEs of a server going away: admin_shutdown, crash_shutdown, cannot_connect_now
_SHUTDOWN_STATES = frozenset({"57P01", "57P02", "57P03"})


def is_connection_lost(exc: BaseException) -> bool:
    """The database went away under a statement (a restart, a lost or refused connection),
    rather than refusing the statement itself."""
    if isinstance(exc, psycopg.InterfaceError):
        return True
    if isinstance(exc, psycopg.OperationalError):
        state = exc.sqlstate
        return state is None or state.startswith("08") or state in _SHUTDOWN_STATES
    return False


def is_data_error(exc: BaseException) -> bool:
    """A value the database cannot store or compare (out of range, bad encoding…)."""
    return isinstance(exc, DATA_ERROR | OverflowError)


register_classifier(classify_driver_error)
