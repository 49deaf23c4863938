"""Driver errors, translated at the edge: which are transient, which are unique violations.

Both drivers (psycopg 3 and the standard library's sqlite3) are core dependencies: the
database package registers :func:`classify_driver_error` and :func:`driver_code` with
:mod:`jobfence.errors` (``register_classifier``, ``register_coder``) when it is imported;
nothing outside :mod:`jobfence.db` imports a driver's errors.
"""

from __future__ import annotations

import sqlite3

import psycopg
import psycopg.errors

from ..errors import Category

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
    found = driver_error(exc)  # the driver's, or the one an ORM wrapped
    if isinstance(found, _TEMPORARY_PG):
        return Category.TEMPORARY_ERROR
    if isinstance(found, sqlite3.Error) and _sqlite_is_transient(found):
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


#: PostgreSQL's SQLSTATEs that have a jobfence code of their own
_PG_CODES = {
    "25P02": "TX_ABORTED",  # in_failed_sql_transaction: a statement after one that failed
    "55P03": "DB_LOCKED",  # lock_not_available
    "40P01": "DB_DEADLOCK",
    "40001": "DB_SERIALIZATION",
    "23505": "DB_UNIQUE_VIOLATION",
    "57P01": "DB_UNAVAILABLE",  # admin_shutdown
    "57P03": "DB_UNAVAILABLE",  # cannot_connect_now
}


def driver_error(exc: BaseException) -> BaseException | None:
    """The driver's own error carried by ``exc``: ``exc`` itself, or the one an ORM wrapped
    (SQLAlchemy's ``.orig``, Django's ``__cause__``)."""
    seen = 0
    while seen < 4:
        if isinstance(exc, sqlite3.Error | psycopg.Error):
            return exc
        orig = getattr(exc, "orig", None)  # SQLAlchemy's DBAPIError
        if isinstance(orig, BaseException):
            nxt: BaseException | None = orig
        elif type(exc).__module__.startswith("django.db"):  # Django's DatabaseErrorWrapper
            nxt = exc.__cause__
        else:
            return None
        if nxt is None:
            return None
        exc, seen = nxt, seen + 1
    return None


def is_locked(exc: BaseException) -> bool:
    """SQLite's "database is locked" (busy), raised by the driver or wrapped by an ORM."""
    found = driver_error(exc)
    return isinstance(found, sqlite3.Error) and _sqlite_is_transient(found)


def driver_code(exc: BaseException) -> str | None:
    """jobfence's code for a driver's error (or one an ORM wrapped): ``DB_LOCKED``,
    ``TX_ABORTED``, ``DB_UNIQUE_VIOLATION``…; the driver's own name for the rest
    (``SQLSTATE 22003``, ``SQLITE_CONSTRAINT_NOTNULL``); None when ``exc`` carries none."""
    found = driver_error(exc)
    if isinstance(found, sqlite3.Error):
        if _sqlite_is_transient(found):
            text = str(found).lower()
            return "DB_LOCKED" if "locked" in text or "busy" in text else "DB_IO_ERROR"
        name = getattr(found, "sqlite_errorname", None)
        if name == "SQLITE_CONSTRAINT_UNIQUE" or name == "SQLITE_CONSTRAINT_PRIMARYKEY":
            return "DB_UNIQUE_VIOLATION"
        if isinstance(name, str) and name.startswith("SQLITE_CONSTRAINT"):
            return name  # SQLITE_CONSTRAINT_NOTNULL, _CHECK, _FOREIGNKEY…
        return type(found).__name__
    if isinstance(found, psycopg.Error):
        if found.sqlstate:
            return _PG_CODES.get(found.sqlstate, f"SQLSTATE {found.sqlstate}")
        if isinstance(found, psycopg.OperationalError | psycopg.InterfaceError):
            return "DB_UNAVAILABLE"
        return type(found).__name__
    if type(exc).__module__.startswith("sqlalchemy."):
        # SQLAlchemy's ``code`` is an internal link key (``7s2a``), not for people: a session
        # that must be rolled back after a failed statement is TX_ABORTED; the rest by name
        if type(exc).__name__ == "PendingRollbackError":
            return "TX_ABORTED"
        return type(exc).__name__
    return None
