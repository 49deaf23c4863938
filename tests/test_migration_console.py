"""SQLite migration 0008 rebuilds the append-only audit log (SQLite cannot change a CHECK in
place, and `via` now allows 'console'): an upgraded database keeps every row, its ids and its
guards."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from jobfence import App
from jobfence.sql import migrations, queries


def _at_version(path: Path, version: int) -> None:
    named = queries("sqlite")
    con = sqlite3.connect(path)
    con.executescript(named["create_migrations_table"])
    for m in migrations("sqlite")[:version]:
        con.executescript(m.sql)
        con.execute(named["record_migration"], {"version": m.version, "name": m.name})
    con.commit()
    con.close()


async def test_the_audit_log_survives_the_sqlite_upgrade(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    _at_version(path, 7)
    con = sqlite3.connect(path)
    con.executemany(
        "INSERT INTO core_audit_log (actor, via, action, details, old_state, new_state) "
        "VALUES (?, ?, ?, ?, ?, ?)",
        [
            ("ann", "cli", "ops.token.create", '{"name": "bot"}', None, "active"),
            ("bob", "api", "dead_letter.discard", "{}", "pending_review", "discarded"),
        ],
    )
    with pytest.raises(sqlite3.IntegrityError):  # before: no console door
        con.execute("INSERT INTO core_audit_log (actor, via, action) VALUES ('c', 'console', 'a')")
    con.commit()
    con.close()

    applied = await App(f"sqlite:///{path}").migrate()
    assert applied[0] == 8  # (and any migration after it)

    con = sqlite3.connect(path)
    assert con.execute(
        "SELECT id, actor, via, action, details, old_state, new_state FROM core_audit_log"
    ).fetchall() == [
        (1, "ann", "cli", "ops.token.create", '{"name": "bot"}', None, "active"),
        (2, "bob", "api", "dead_letter.discard", "{}", "pending_review", "discarded"),
    ]
    con.execute("INSERT INTO core_audit_log (actor, via, action) VALUES ('c', 'console', 'a')")
    assert con.execute("SELECT max(id) FROM core_audit_log").fetchone() == (3,)
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        con.execute("DELETE FROM core_audit_log")
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        con.execute("UPDATE core_audit_log SET actor = 'eve'")
    assert con.execute("SELECT count(*) FROM core_console_sessions").fetchone() == (0,)
    con.close()
