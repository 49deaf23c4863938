"""Issue 28, point 6: a dead letter's ``error_code`` is one a person can read.

Driver and ORM errors are translated at the edge (``db/translate.py`` and the SQLAlchemy and
Django layers) into jobfence's codes — never SQLAlchemy's internal ones (``e3q8`` for an
``OperationalError``, ``7s2a`` for a ``PendingRollbackError``) — and the letter's message keeps
the original class. Real errors from real drivers, no mocks.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import IntegrityError, OperationalError, PendingRollbackError
from sqlalchemy.orm import Session

from jobfence.errors import Category, classify, describe, error_code


def _locked(path: Path) -> sqlite3.OperationalError:
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("CREATE TABLE IF NOT EXISTS t (k INTEGER PRIMARY KEY)")
    holder.execute("BEGIN IMMEDIATE")
    other = sqlite3.connect(path, isolation_level=None, timeout=0)
    try:
        other.execute("INSERT INTO t VALUES (1)")
    except sqlite3.OperationalError as exc:
        return exc
    finally:
        other.close()
        holder.close()
    raise AssertionError("the second writer was not refused")


def test_sqlite_busy_is_db_locked_raw_and_through_sqlalchemy(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    raw = _locked(path)
    assert error_code(raw) == "DB_LOCKED"
    engine = create_engine(f"sqlite:///{path}", connect_args={"timeout": 0})
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(OperationalError) as caught, engine.begin() as conn:
            conn.execute(text("INSERT INTO t VALUES (2)"))
    finally:
        holder.close()
        engine.dispose()
    wrapped = caught.value
    assert wrapped.code == "e3q8"  # SQLAlchemy's own code: never on a dead letter
    assert error_code(wrapped) == "DB_LOCKED"
    assert classify(wrapped) is Category.TEMPORARY_ERROR
    assert describe(wrapped).startswith("OperationalError: (sqlite3.OperationalError) database")


def test_unique_violations_and_pending_rollback_through_sqlalchemy(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'y.db'}")
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE t (k INTEGER PRIMARY KEY)"))
        conn.execute(text("INSERT INTO t VALUES (1)"))
    with Session(engine) as session:
        with pytest.raises(IntegrityError) as unique:
            session.execute(text("INSERT INTO t VALUES (1)"))
        session.execute(text("SELECT 1"))
    assert error_code(unique.value) == "DB_UNIQUE_VIOLATION"
    assert "IntegrityError" in describe(unique.value)

    class T:
        pass

    from sqlalchemy import Column, Integer, MetaData, Table
    from sqlalchemy.orm import registry

    mapper = registry(metadata=MetaData())
    mapper.map_imperatively(T, Table("t", mapper.metadata, Column("k", Integer, primary_key=True)))
    with Session(engine) as session:
        first, again = T(), T()
        first.k = again.k = 1  # type: ignore[attr-defined]
        session.add(first)
        with pytest.raises(IntegrityError):
            session.flush()
        session.add(again)
        with pytest.raises(PendingRollbackError) as pending:
            session.flush()
    engine.dispose()
    assert pending.value.code == "7s2a"
    assert error_code(pending.value) == "TX_ABORTED"
    assert describe(pending.value).startswith("PendingRollbackError: ")


def test_postgresql_errors_have_jobfence_codes(pg_database: str) -> None:
    with psycopg.connect(pg_database) as conn:
        conn.execute("CREATE TABLE t (k int PRIMARY KEY)")
        conn.execute("INSERT INTO t VALUES (1)")
        with pytest.raises(psycopg.errors.UniqueViolation) as unique:
            conn.execute("INSERT INTO t VALUES (1)")
        with pytest.raises(psycopg.errors.InFailedSqlTransaction) as aborted:
            conn.execute("SELECT 1")
        conn.rollback()
        with pytest.raises(psycopg.errors.NumericValueOutOfRange) as other:
            conn.execute("SELECT 2147483647::int + 1")
    assert error_code(unique.value) == "DB_UNIQUE_VIOLATION"
    assert error_code(aborted.value) == "TX_ABORTED"
    assert error_code(other.value) == "SQLSTATE 22003"


def test_django_wrapped_errors_take_the_drivers_code(tmp_path: Path) -> None:
    from django.db import utils as django_utils  # a dev dependency: missing is a failure

    raw = _locked(tmp_path / "z.db")
    wrapped = django_utils.OperationalError(*raw.args)
    wrapped.__cause__ = raw  # what Django's DatabaseErrorWrapper raises
    assert error_code(wrapped) == "DB_LOCKED"
    assert classify(wrapped) is Category.TEMPORARY_ERROR


def test_a_handlers_own_error_keeps_its_class_name_even_when_raised_from_a_driver_error(
    tmp_path: Path,
) -> None:
    raw = _locked(tmp_path / "w.db")

    class LedgerBusy(Exception):
        pass

    with pytest.raises(LedgerBusy) as caught:
        raise LedgerBusy("try later") from raw
    assert error_code(caught.value) == "LedgerBusy"
