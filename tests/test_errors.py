"""Classification of real exceptions onto the taxonomy (SPEC R4)."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path
from typing import Any

import psycopg
import psycopg.errors
import pytest

import jobfence
from jobfence.errors import TAXONOMY, Category, DatabaseUnavailable, RetryMode, classify, describe


@pytest.mark.parametrize(
    ("exc", "category"),
    [
        (psycopg.errors.SerializationFailure("could not serialize"), Category.TEMPORARY_ERROR),
        (psycopg.errors.DeadlockDetected("deadlock"), Category.TEMPORARY_ERROR),
        (psycopg.OperationalError("server closed the connection"), Category.TEMPORARY_ERROR),
        (psycopg.errors.AdminShutdown("terminating connection"), Category.TEMPORARY_ERROR),
        (psycopg.InterfaceError("the connection is closed"), Category.TEMPORARY_ERROR),
        (sqlite3.OperationalError("database is locked"), Category.TEMPORARY_ERROR),
        (TimeoutError(), Category.TEMPORARY_ERROR),
        (ConnectionResetError(), Category.TEMPORARY_ERROR),
        (DatabaseUnavailable("down"), Category.TEMPORARY_ERROR),
        (psycopg.errors.UniqueViolation("dup"), Category.TECHNICAL_ERROR),
        (ValueError("bad"), Category.TECHNICAL_ERROR),
        (ZeroDivisionError(), Category.TECHNICAL_ERROR),
        (jobfence.BusinessError("over limit"), Category.BUSINESS_ERROR),
        (jobfence.IntegrationError("ERP 422"), Category.INTEGRATION_ERROR),
        (jobfence.AuthorizationError("403"), Category.AUTHORIZATION_ERROR),
        (jobfence.Retry(1), Category.TEMPORARY_ERROR),
    ],
)
def test_classify(exc: BaseException, category: Category) -> None:
    assert classify(exc) is category


def _sqlite_error(sql: str) -> sqlite3.OperationalError:
    """The error SQLite itself raises for ``sql`` on a database with a table t(x)."""
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE t (x)")
    try:
        db.execute(sql)
    except sqlite3.OperationalError as exc:
        return exc
    finally:
        db.close()
    raise AssertionError(f"{sql!r} did not fail")


def _sqlite_busy(tmp_path: Path) -> sqlite3.OperationalError:
    """SQLITE_BUSY: another connection holds the write lock (no busy timeout)."""
    holder = sqlite3.connect(tmp_path / "busy.db", isolation_level=None)
    other = sqlite3.connect(tmp_path / "busy.db", timeout=0, isolation_level=None)
    try:
        holder.execute("CREATE TABLE t (x)")
        holder.execute("BEGIN EXCLUSIVE")
        try:
            other.execute("INSERT INTO t VALUES (1)")
        except sqlite3.OperationalError as exc:
            return exc
        raise AssertionError("the second writer was not refused")
    finally:
        other.close()
        holder.close()


def _sqlite_table_locked() -> sqlite3.OperationalError:
    """SQLITE_LOCKED: the table is being read by an open statement of the same connection."""
    db = sqlite3.connect(":memory:")
    try:
        db.execute("CREATE TABLE t (x)")
        db.executemany("INSERT INTO t VALUES (?)", [(1,), (2,)])
        reading = db.execute("SELECT x FROM t")
        reading.fetchone()
        try:
            db.execute("DROP TABLE t")
        except sqlite3.OperationalError as exc:
            return exc
        raise AssertionError("the table was dropped under an open statement")
    finally:
        db.close()


@pytest.mark.parametrize(
    ("make", "message", "category"),
    [
        (_sqlite_busy, "database is locked", Category.TEMPORARY_ERROR),
        (lambda _: _sqlite_table_locked(), "database table is locked", Category.TEMPORARY_ERROR),
        (
            lambda _: sqlite3.OperationalError("disk I/O error"),
            "disk I/O",
            Category.TEMPORARY_ERROR,
        ),
        (lambda _: _sqlite_error("SELEC 1"), "syntax error", Category.TECHNICAL_ERROR),
        (lambda _: _sqlite_error("SELECT * FROM nope"), "no such table", Category.TECHNICAL_ERROR),
        (lambda _: _sqlite_error("SELECT nope FROM t"), "no such column", Category.TECHNICAL_ERROR),
    ],
)
def test_sqlite_errors_are_classified_as_postgresql_errors_are(
    make: Any, message: str, category: Category, tmp_path: Path
) -> None:
    """Busy, locked and I/O errors are transient; SQL the database cannot run is a
    programming error (TECHNICAL: limited retries), though sqlite3 raises OperationalError
    for both."""
    exc = make(tmp_path)
    assert message in str(exc)
    assert classify(exc) is category


def test_taxonomy_table_matches_the_spec() -> None:
    """Retry, HTTP status, log level and alert for every category (seed 004 §10.4)."""
    expected = {
        "VALIDATION_ERROR": (RetryMode.NEVER, (422,), logging.WARNING, False),
        "BUSINESS_ERROR": (RetryMode.NEVER, (422, 409), logging.WARNING, False),
        "TEMPORARY_ERROR": (RetryMode.POLICY, (502, 504), logging.ERROR, True),
        "INTEGRATION_ERROR": (RetryMode.NEVER, (422,), logging.ERROR, True),
        "AUTHENTICATION_ERROR": (RetryMode.TOKEN_REFRESH, (401,), logging.ERROR, True),
        "AUTHORIZATION_ERROR": (RetryMode.NEVER, (403,), logging.ERROR, True),
        "TECHNICAL_ERROR": (RetryMode.LIMITED, (500,), logging.ERROR, True),
        "NON_RETRYABLE_ERROR": (RetryMode.NEVER, (422, 500), logging.CRITICAL, True),
    }
    actual = {c.value: (i.retry, i.http_status, i.log_level, i.alert) for c, i in TAXONOMY.items()}
    assert actual == expected


def test_describe_makes_errors_storable() -> None:
    text = describe(ValueError("nul\x00 and \ud800 surrogate" + "x" * 5000))
    assert "\x00" not in text
    text.encode("utf-8")  # no lone surrogates left
    assert len(text) <= 4000
    assert text.startswith("ValueError: nul\\x00")


def test_public_api_is_curated() -> None:
    assert sorted(jobfence.__all__) == sorted(
        name for name in jobfence.__all__ if hasattr(jobfence, name)
    )
    assert {"App", "Job", "Tx", "RetryPolicy", "Retry", "TemporaryError"} <= set(jobfence.__all__)
