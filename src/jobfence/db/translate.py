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


def classify_driver_error(exc: BaseException) -> Category | None:
    """TEMPORARY_ERROR for what a driver raises when the store could not do it *now*."""
    if isinstance(exc, _TEMPORARY_PG):
        return Category.TEMPORARY_ERROR
    if isinstance(exc, sqlite3.OperationalError):
        # "database is locked", "disk I/O error": the store could not do it now.
        return Category.TEMPORARY_ERROR
    return None


def is_unique_violation(exc: BaseException) -> bool:
    """A unique key refused the row, on either driver."""
    if isinstance(exc, psycopg.errors.UniqueViolation):
        return True
    return isinstance(exc, sqlite3.IntegrityError) and "UNIQUE" in str(exc)


#: what a driver raises for a value the database cannot store or compare (out of range…)
DATA_ERROR: type[Exception] = psycopg.DataError


def is_data_error(exc: BaseException) -> bool:
    """A value the database cannot store or compare (out of range, bad encoding…)."""
    return isinstance(exc, DATA_ERROR | OverflowError)


register_classifier(classify_driver_error)
