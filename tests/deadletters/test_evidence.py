"""Dead letters and their audit trail as evidence (issue 10 §3.5): every audit row records the
transition it made (old state → new state); a decided letter cannot be deleted (a trigger,
like the audit log's); and an application role with only the grants docs/dead-letters.md
documents runs the worker and the review operations but cannot delete decided letters,
alter the audit log or switch the guards off."""

from __future__ import annotations

import re
import sqlite3
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from jobfence import App, Job, NonRetryableError, RetryPolicy, Tx, outbox
from jobfence.alerts import AlertDispatcher
from jobfence.review import deadletters as dl
from jobfence.review import jobctl, replays
from jobfence.runtime.cleanup import cleanup_fences, expire_letters
from jobfence.runtime.maintenance import Maintenance
from jobfence.transports.database import DatabaseQueue

from ..conftest import PG_ADMIN
from ..helpers import REPO, RunningWorker, credit, eventually, query, table
from .conftest import letter_params, seed_letters

ALICE = dl.Actor("alice", "library")
NO_RETRY = RetryPolicy(max_retries=0, justification="tests: fail straight to a dead letter")
DB_ERRORS = (psycopg.Error, sqlite3.Error)


def dialect(url: str) -> str:
    return "postgresql" if url.startswith("postgresql") else "sqlite"


def ph(url: str) -> str:
    return "%s" if url.startswith("postgresql") else "?"


async def transitions(url: str) -> list[tuple[Any, ...]]:
    return await query(
        url,
        f"SELECT action, dead_letter_id, replay_id, old_state, new_state "
        f"FROM {table(url, 'audit_log')} ORDER BY id",
    )


# -- old state → new state in every audit row --------------------------------------------------


async def test_every_audit_row_records_the_transition_it_made(database_url: str) -> None:
    """Discard, replay, a bulk replay (preview, start, finish, its items) and an outbox
    re-drive: each audit row says which state the thing was in and which it is in now, and
    the service (what the API and CLI show) returns both."""
    url = database_url
    d = dialect(url)
    discarded, replayed, bulk = await seed_letters(
        url, [letter_params(d, j) for j in ("t-1", "t-2", "t-3")]
    )
    async with App(url, maintenance=Maintenance(cleanup=False, alerts=False)) as app:
        async with app.db.transaction() as tx:
            await outbox.write(tx, "q.out", {"x": 1}, event_id="evt-failed")
        await query(
            url,
            f"UPDATE {table(url, 'outbox')} SET state = 'PUBLISH_FAILED_RETRY', attempts = 5",
        )
        await dl.discard(app.db, discarded, actor=ALICE, reason="duplicate of t-9")
        await dl.replay(app.db, app.transport, replayed, actor=ALICE, reason="ERP back")
        preview = await replays.preview_replay(app.db, dl.Filter(ids=(bulk,)), actor=ALICE)
        await replays.run_replay(
            app.db, app.transport, preview.replay_id, actor=ALICE, expected_total=1
        )
        await outbox.redrive(app.db, actor="alice", reason="broker back", event_ids=["evt-failed"])
        page = await dl.audit(app.db, actor=ALICE)
    replay = preview.replay_id
    assert await transitions(url) == [
        ("dead_letter.discard", discarded, None, "pending_review", "discarded"),
        ("dead_letter.replay", replayed, None, "pending_review", "replayed"),
        ("replay.preview", None, replay, None, "previewed"),
        ("replay.start", None, replay, "previewed", "running"),
        ("dead_letter.replay", bulk, replay, "pending_review", "replayed"),
        ("replay.finish", None, replay, "running", "done"),
        ("outbox.redrive", None, None, "PUBLISH_FAILED_RETRY", "PENDING"),
    ]
    newest = page.items[0]
    assert (newest.action, newest.old_state, newest.new_state) == (
        "outbox.redrive",
        "PUBLISH_FAILED_RETRY",
        "PENDING",
    )
    assert newest.to_json()["old_state"] == "PUBLISH_FAILED_RETRY"


# -- decided letters cannot be deleted -----------------------------------------------------------


async def test_a_decided_letter_cannot_be_deleted_even_by_the_owner(database_url: str) -> None:
    """DELETE of a replayed or a discarded letter fails in the database (a trigger, as for
    the audit log), for any role including the owner; TRUNCATE too (PostgreSQL). A letter
    still pending review is not yet evidence of a decision and can be removed by a role that
    has DELETE (the application role does not: see the next test)."""
    url = database_url
    d = dialect(url)
    discarded, replayed, pending = await seed_letters(
        url, [letter_params(d, j) for j in ("d-1", "d-2", "d-3")]
    )
    letters, p = table(url, "dead_letters"), ph(url)
    async with App(url, maintenance=Maintenance(cleanup=False, alerts=False)) as app:
        await dl.discard(app.db, discarded, actor=ALICE, reason="test order")
        await dl.replay(app.db, app.transport, replayed, actor=ALICE)
    for letter in (discarded, replayed):
        with pytest.raises(DB_ERRORS, match="evidence"):
            await query(url, f"DELETE FROM {letters} WHERE id = {p}", (letter,))
    with pytest.raises(DB_ERRORS, match="evidence"):
        await query(url, f"DELETE FROM {letters}")
    if d == "postgresql":
        with pytest.raises(DB_ERRORS, match="evidence"):
            await query(url, f"TRUNCATE {letters} CASCADE")
    await query(url, f"DELETE FROM {letters} WHERE id = {p}", (pending,))
    left = await query(url, f"SELECT id, status FROM {letters} ORDER BY id")
    assert left == [(discarded, "discarded"), (replayed, "replayed")]


# -- the documented application role (PostgreSQL) ----------------------------------------------


def documented_grants(role: str) -> str:
    """The SQL block of docs/dead-letters.md that sets up the application role."""
    text = (REPO / "docs" / "dead-letters.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```sql\n(-- jobfence application role.*?)```", text, re.DOTALL)
    assert len(blocks) == 1, "docs/dead-letters.md must hold one application-role block"
    return blocks[0].replace("jobfence_app", role)


def as_role(url: str, role: str) -> str:
    scheme, rest = url.split("://", 1)
    return f"{scheme}://{role}@{rest.split('@', 1)[1]}"


def admin_run(url: str, sql: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql)  # type: ignore[arg-type]


async def test_the_documented_application_role_names_every_table(pg_database: str) -> None:
    """Every table of the migrated schema is granted in docs/dead-letters.md's block (and
    every table it grants exists): a migration that adds a table must extend the block."""
    granted = set(re.findall(r"\bcore\.(\w+)", documented_grants("jobfence_app")))
    rows = await query(pg_database, "SELECT tablename FROM pg_tables WHERE schemaname = 'core'")
    tables = {name for (name,) in rows}
    assert "queue_pauses" in tables  # the schema is the migrated one
    assert tables - granted == set(), "tables the application role cannot use"
    assert granted - tables == set(), "granted tables that do not exist"


@pytest.fixture
async def app_role(pg_database: str) -> AsyncIterator[str]:
    """A login role with exactly the documented grants (and the test's ledger table, as an
    application grants its own tables); its database URL."""
    role = f"jf_app_{uuid.uuid4().hex[:10]}"
    admin_run(pg_database, documented_grants(role))
    admin_run(
        pg_database,
        "CREATE TABLE ledger (job_id TEXT NOT NULL, member_id TEXT NOT NULL, "
        f"points INTEGER NOT NULL); GRANT SELECT, INSERT ON ledger TO {role}",
    )
    try:
        yield as_role(pg_database, role)
    finally:
        admin_run(pg_database, f"DROP OWNED BY {role}")
        admin_run(PG_ADMIN, f"DROP ROLE {role}")


async def test_the_documented_application_role_works_and_cannot_erase_evidence(
    app_role: str, pg_database: str
) -> None:
    """As the application role: a worker processes jobs (fence, ledger) and dead-letters a
    failing one, fence cleanup and alert grouping run, an operator discards, replays and
    bulk-replays, reads the audit log and re-drives the outbox. Then, as the same role, every
    way to erase or rewrite evidence fails: DELETE of a letter, UPDATE/DELETE/TRUNCATE of
    the audit log, rewriting a letter's payload, disabling triggers, replication mode."""
    url = app_role
    app = App(url, maintenance=Maintenance(cleanup=False, alerts=False))
    failing = {"bad-1", "bad-2", "bad-3"}

    @app.consumer("points.credit", retry=NO_RETRY)
    async def handle(job: Job[Any], tx: Tx) -> None:
        if job.job_id in failing:
            raise NonRetryableError(f"member {job.payload['member']} is blocked")
        await credit(tx, job.job_id, job.payload["member"], job.payload["points"])

    async with app:
        for job_id in ("ok-1", "ok-2", *sorted(failing)):
            await app.enqueue("points.credit", {"member": "m", "points": 5}, job_id=job_id)
        async with RunningWorker(app, concurrency=2) as w:
            await eventually(lambda: w.stats.handled == 5, what="five deliveries")
        cleaned = await cleanup_fences(
            app.db, min_age=timedelta(0), now=datetime.now(UTC) + timedelta(days=30)
        )
        expired = await expire_letters(app.db)  # no retention set by the owner: none
        dispatcher = AlertDispatcher(app.db, [], window=timedelta(minutes=5), timeout=5.0)
        try:
            await dispatcher.tick()
        finally:
            await dispatcher.close()
        letters = sorted(r.id for r in (await dl.search(app.db, dl.Filter(), actor=ALICE)).items)
        await dl.discard(app.db, letters[0], actor=ALICE, reason="member closed the account")
        assert isinstance(app.transport, DatabaseQueue)
        await dl.replay(app.db, app.transport, letters[1], actor=ALICE, reason="unblocked")
        preview = await replays.preview_replay(app.db, dl.Filter(ids=(letters[2],)), actor=ALICE)
        done = await replays.run_replay(
            app.db, app.transport, preview.replay_id, actor=ALICE, expected_total=1
        )
        async with app.db.transaction() as tx:
            await outbox.write(tx, "q.out", {"x": 1}, event_id="evt-app-role")
        admin_run(pg_database, "UPDATE core.outbox SET state = 'PUBLISH_FAILED_RETRY'")
        redriven = await outbox.redrive(
            app.db, actor="alice", reason="broker back", event_ids=["evt-app-role"]
        )
        trail = await dl.audit(app.db, actor=ALICE)
        # job control (issue 14): pause and resume a queue, cancel a waiting job
        await jobctl.pause_queue(app.db, "points.credit", actor=ALICE, reason="ERP down")
        await jobctl.resume_queue(app.db, "points.credit", actor=ALICE)
        await app.enqueue("points.credit", {"member": "m", "points": 5}, job_id="late-1")
        page = await jobctl.list_jobs(app.db, jobctl.JobFilter(job_id="late-1"), actor=ALICE)
        cancelled = await jobctl.cancel_job(
            app.db, page.items[0].id, actor=ALICE, reason="entered twice"
        )

    assert await query(url, "SELECT count(*) FROM ledger") == [(2,)]
    assert cleaned.deleted == 2
    assert expired == 0
    assert done.counts == {"published": 1}
    assert redriven == ["evt-app-role"]
    assert [e.action for e in trail.items][-2:] == ["dead_letter.replay", "dead_letter.discard"]
    assert await query(url, "SELECT count(*) FROM core.alert_events") == [(0,)]
    assert await query(
        url, f"SELECT status FROM core.dead_letters WHERE id = {cancelled.dead_letter_id}"
    ) == [("discarded",)]

    decided = letters[0]
    refused = [
        f"DELETE FROM core.dead_letters WHERE id = {decided}",
        "DELETE FROM core.dead_letters",
        "TRUNCATE core.dead_letters CASCADE",
        "UPDATE core.dead_letters SET payload = 'forged'",
        "UPDATE core.dead_letters SET last_error = 'nothing happened'",
        "UPDATE core.audit_log SET reason = 'rewritten'",
        "DELETE FROM core.audit_log",
        "TRUNCATE core.audit_log",
        "ALTER TABLE core.dead_letters DISABLE TRIGGER dead_letters_keep_decided",
        "ALTER TABLE core.audit_log DISABLE TRIGGER USER",
        "DROP TRIGGER audit_log_append_only ON core.audit_log",
        "SET session_replication_role = replica",
        "DELETE FROM core.schema_migrations",
        "UPDATE core.ops_tokens SET role = 'operator'",
        "INSERT INTO core.dead_letter_retention (decided_for) VALUES ('1 day')",
        "UPDATE core.dead_letter_retention SET decided_for = '1 day'",
    ]
    answers = []
    for sql in refused:
        try:
            await query(url, sql)
            answers.append((sql, "done"))
        except psycopg.errors.InsufficientPrivilege as exc:
            denied = "permission denied" in str(exc) or "must be owner" in str(exc)
            answers.append((sql, "refused" if denied else str(exc)))
        except psycopg.Error as exc:
            answers.append((sql, f"{type(exc).__name__}: {exc}"))
    assert answers == [(sql, "refused") for sql in refused]
    statuses = await query(
        pg_database, "SELECT status, count(*) FROM core.dead_letters GROUP BY 1 ORDER BY 1"
    )
    assert statuses == [("discarded", 2), ("replayed", 2)]  # one discarded, one cancelled
