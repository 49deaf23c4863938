"""Issue 13: one placeholder style for a handler's SQL on both stores — psycopg's ``%s`` /
``%(name)s`` / ``%%`` — so the same statement runs unchanged on PostgreSQL and SQLite."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest

from jobfence.config import parse_database_url
from jobfence.db import SyncTx, Tx, connect
from jobfence.db.placeholders import for_psycopg, for_sqlite

MISMATCH = (psycopg.ProgrammingError, sqlite3.ProgrammingError)


@pytest.fixture
async def tx(database_url: str) -> AsyncIterator[Tx]:
    db = connect(parse_database_url(database_url))
    await db.open(max_size=1)
    try:
        async with db.transaction() as tx:
            await tx.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT NOT NULL)")
            yield tx
    finally:
        await db.close()


async def test_positional(tx: Tx) -> None:
    assert await tx.execute("INSERT INTO notes (id, body) VALUES (%s, %s)", (1, "one")) == 1
    assert await tx.fetchone("SELECT body FROM notes WHERE id = %s", (1,)) == ("one",)
    assert await tx.fetchall("SELECT id FROM notes WHERE id = %s OR id = %s", [1, 2]) == [(1,)]


async def test_named_and_repeated(tx: Tx) -> None:
    await tx.execute(
        "INSERT INTO notes (id, body) VALUES (%(id)s, %(body)s)", {"id": 2, "body": "two"}
    )
    row = await tx.fetchone(
        "SELECT body, %(id)s + %(id)s FROM notes WHERE id = %(id)s", {"id": 2, "unused": 0}
    )
    assert row == ("two", 4)


async def test_percent_in_literals_identifiers_and_comments_is_text(tx: Tx) -> None:
    """``'%s'`` inside a string is text, not a placeholder; so are percents in quoted
    identifiers and comments; ``%%`` outside them is one percent (the modulo operator)."""
    row = await tx.fetchone(
        """SELECT '%s', 'it''s 100%', 7 %% 3, %s AS "a%b" -- a %s comment
        /* another %(x)s one */""",
        (5,),
    )
    assert row == ("%s", "it's 100%", 1, 5)
    await tx.execute("INSERT INTO notes (id, body) VALUES (%s, %s)", (3, "50% off"))
    like = await tx.fetchall("SELECT id FROM notes WHERE body LIKE '%%off' AND id = %s", (3,))
    assert like == [(3,)]


async def test_without_parameters_the_statement_runs_as_written(tx: Tx) -> None:
    assert await tx.fetchone("SELECT '%s', 7 % 3") == ("%s", 1)


@pytest.mark.parametrize(
    ("sql", "params", "message"),
    [
        ("SELECT %s, %s", (1,), "has 2 placeholders but 1 parameters"),
        ("SELECT %s", (1, 2), "has 1 placeholders but 2 parameters"),
        ("SELECT %(a)s", {"b": 1}, "missing: a"),
        ("SELECT %s, %(a)s", (1,), "mixed"),
        ("SELECT 7 % 3 + %s", (1,), "incomplete placeholder.*'%%'"),
        ("SELECT %d", (1,), "'%d'"),
    ],
)
async def test_a_mismatch_says_what_is_wrong(tx: Tx, sql: str, params: Any, message: str) -> None:
    with pytest.raises(MISMATCH, match=message):
        await tx.fetchall(sql, params)
    # the error is the client's: the transaction goes on
    assert await tx.fetchone("SELECT %s", (1,)) == (1,)


async def test_a_def_handlers_tx_takes_the_same_style(tx: Tx) -> None:
    sync = SyncTx(tx, asyncio.get_running_loop())

    def work() -> Any:
        sync.execute(
            "INSERT INTO notes (id, body) VALUES (%(id)s, %(body)s)", {"id": 9, "body": "x"}
        )
        return sync.fetchone("SELECT body FROM notes WHERE id = %s", (9,))

    assert await asyncio.to_thread(work) == ("x",)


def test_the_translation_skips_every_kind_of_quote() -> None:
    """Where each dialect's literals, identifiers and comments start and end."""
    sql, args = for_sqlite('SELECT `a%s`, [b%s], "c""%s", /* %s */ %s', (1,))
    assert sql == 'SELECT `a%s`, [b%s], "c""%s", /* %s */ ?'
    assert args == (1,)
    assert for_psycopg("SELECT E'\\'%s', $q$ %s $q$, /* /* %s */ %s */ arr[1], %s") == (
        "SELECT E'\\'%%s', $q$ %%s $q$, /* /* %%s */ %%s */ arr[1], %s"
    )
    assert for_psycopg("SELECT a$b$, '%%'") == "SELECT a$b$, '%%'"  # `$b$` in a name quotes nothing


def test_sqlite_native_placeholders_still_work_alone() -> None:
    assert for_sqlite("SELECT ?, ?", (1, 2)) == ("SELECT ?, ?", (1, 2))
    assert for_sqlite("SELECT :a", {"a": 1}) == ("SELECT :a", {"a": 1})
    with pytest.raises(sqlite3.ProgrammingError, match="cannot be mixed"):
        for_sqlite("SELECT ?, %s", (1, 2))
