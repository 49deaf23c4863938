"""Ops tokens and their audit rows commit together (house rule: an action and its audit row
are one transaction): creating or revoking a token writes ``ops.token.create`` /
``ops.token.revoke`` in the token's own transaction, so an audit row that cannot be written
leaves no token (and no revocation) behind — through the library and through the CLI."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from jobfence.cli import main
from jobfence.ops.auth import authenticate, create_token, revoke_token
from jobfence.review.deadletters import Actor

from ..helpers import query, table
from .conftest import opened

ALICE = Actor("alice", "cli")
DB_ERRORS = (psycopg.Error, sqlite3.Error)


async def tokens(url: str) -> list[tuple[Any, ...]]:
    """(name, role, partner, active) of every token."""
    rows = await query(
        url, f"SELECT name, role, partner, revoked_at IS NULL FROM {table(url, 'ops_tokens')}"
    )
    return [(*row[:3], bool(row[3])) for row in rows]


async def token_audit(url: str) -> list[tuple[Any, ...]]:
    rows = await query(
        url,
        f"SELECT actor, via, action, partner, details, old_state, new_state "
        f"FROM {table(url, 'audit_log')} "
        "WHERE action IN ('ops.token.create', 'ops.token.revoke') ORDER BY id",
    )
    return [(*row[:4], _json(row[4]), *row[5:]) for row in rows]


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str | bytes) else value


async def refuse_audit_of(url: str, action: str) -> None:
    """A real trigger on the audit log that refuses rows of ``action`` (what a full disk, a
    lost grant or a constraint would do): the audit insert fails inside the database."""
    if url.startswith("postgresql"):
        statements = [
            "CREATE FUNCTION core.refuse_audit() RETURNS trigger LANGUAGE plpgsql AS $$ "
            "BEGIN RAISE EXCEPTION 'audit refused by the test'; END $$",
            "CREATE TRIGGER refuse_audit BEFORE INSERT ON core.audit_log FOR EACH ROW "
            f"WHEN (NEW.action = '{action}') EXECUTE FUNCTION core.refuse_audit()",
        ]
    else:
        statements = [
            "CREATE TRIGGER refuse_audit BEFORE INSERT ON core_audit_log "
            f"WHEN NEW.action = '{action}' "
            "BEGIN SELECT RAISE(ABORT, 'audit refused by the test'); END"
        ]
    for sql in statements:
        await query(url, sql)


async def test_a_token_and_its_audit_row_are_written_together(database_url: str) -> None:
    """Create and revoke each leave the token's change and one audit row naming the actor,
    the door, the transition and what was done."""
    async with opened(database_url) as db:
        token = await create_token(
            db,
            name="carol",
            role="operator",
            partner="acme",
            expires_in=timedelta(days=30),
            actor=ALICE,
        )
        assert (await authenticate(db, token)) is not None
        assert await revoke_token(db, "carol", actor=ALICE)
        assert not await revoke_token(db, "carol", actor=ALICE)  # nothing to revoke: no row
        assert await authenticate(db, token) is None
    assert await tokens(database_url) == [("carol", "operator", "acme", False)]
    assert await token_audit(database_url) == [
        (
            "alice",
            "cli",
            "ops.token.create",
            "acme",
            {"name": "carol", "role": "operator", "expires_in": "30d"},
            None,
            "active",
        ),
        ("alice", "cli", "ops.token.revoke", None, {"name": "carol"}, "active", "revoked"),
    ]


async def test_a_refused_audit_row_leaves_no_token(database_url: str) -> None:
    """The audit insert fails in the database after the token's insert: the transaction
    rolls back, so no token exists (a token without its audit row would be unaccountable)."""
    await refuse_audit_of(database_url, "ops.token.create")
    async with opened(database_url) as db:
        with pytest.raises(DB_ERRORS, match="audit refused by the test"):
            await create_token(db, name="mallory", role="operator", actor=ALICE)
    assert await tokens(database_url) == []
    assert await token_audit(database_url) == []


async def test_a_refused_audit_row_leaves_the_token_active(database_url: str) -> None:
    """Likewise a revocation: if its audit row cannot be written, the token stays active."""
    async with opened(database_url) as db:
        token = await create_token(db, name="dave", role="viewer", actor=ALICE)
    await refuse_audit_of(database_url, "ops.token.revoke")
    async with opened(database_url) as db:
        with pytest.raises(DB_ERRORS, match="audit refused by the test"):
            await revoke_token(db, "dave", actor=ALICE)
        principal = await authenticate(db, token)
    assert principal is not None
    assert principal.name == "dave"
    assert await tokens(database_url) == [("dave", "viewer", None, True)]
    assert [row[2] for row in await token_audit(database_url)] == ["ops.token.create"]


def jobfence(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    try:
        main(list(args))
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_the_cli_audits_in_the_token_transaction(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`ops token create|revoke` record who did it (--actor, via cli) with the token; an
    actor the audit refuses (blank) is one clear line and leaves no token behind."""
    url = ["--database-url", database_url]
    refused = jobfence(
        capsys, "ops", "token", "create", "--name", "erin", "--role", "viewer", "--actor", " ", *url
    )
    assert asyncio.run(tokens(database_url)) == []
    made = jobfence(
        capsys,
        "ops",
        "token",
        "create",
        "--name",
        "erin",
        "--role",
        "viewer",
        "--actor",
        "bob",
        *url,
    )
    revoked = jobfence(capsys, "ops", "token", "revoke", "erin", "--actor", "bob", *url)
    assert refused[0] == 1
    assert refused[2].count("\n") == 1
    assert "actor" in refused[2]
    assert (made[0], revoked[0]) == (0, 0)
    assert asyncio.run(tokens(database_url)) == [("erin", "viewer", None, False)]
    assert asyncio.run(token_audit(database_url)) == [
        (
            "bob",
            "cli",
            "ops.token.create",
            None,
            {"name": "erin", "role": "viewer", "expires_in": "90d"},
            None,
            "active",
        ),
        ("bob", "cli", "ops.token.revoke", None, {"name": "erin"}, "active", "revoked"),
    ]
