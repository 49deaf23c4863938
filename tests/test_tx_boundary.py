"""The harness owns the transaction boundary (SPEC H5).

Whatever a handler does with ``tx`` or its raw connection — swallows a failed statement,
commits, rolls back, ends or replaces the transaction, changes the session's transaction
defaults — the outcome is an effect with its fence, or neither plus a retry and then a dead
letter that says what happened. Never one without the other, never silence. Each case runs
on PostgreSQL and SQLite (the database queue), and the group-commit cases on PostgreSQL.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from jobfence import App, Job, RetryPolicy, Tx
from jobfence.runtime.harness import Outcome

from .helpers import RunningWorker, eventually, ph, query, scalar, table

#: one limited (TECHNICAL) retry, quickly: a boundary failure runs twice, then dead-letters
ONE_RETRY = RetryPolicy(
    base=timedelta(seconds=0.05),
    cap=timedelta(seconds=0.2),
    limited_retries=1,
    justification="tests: a boundary failure retried once, quickly",
)

Body = Callable[[Tx, str], Awaitable[None]]


async def insert(tx: Tx, job_id: str, points: int = 1) -> None:
    p = ph(tx.dialect)
    await tx.execute(
        f"INSERT INTO ledger (job_id, member_id, points) VALUES ({p}, {p}, {p})",
        (job_id, "m", points),
    )


async def outcome_of(url: str) -> dict[str, Any]:
    """What the store holds after the job: effects, fences and the dead letter, if any."""
    effects = await query(url, "SELECT job_id, points FROM ledger ORDER BY job_id, points")
    fences = await scalar(url, f"SELECT count(*) FROM {table(url, 'processed_jobs')}")
    letters = await query(
        url,
        "SELECT job_id, attempts, error_category, error_code, last_error "
        f"FROM {table(url, 'dead_letters')} ORDER BY id",
    )
    return {"effects": effects, "fences": fences, "letters": letters}


async def run_one(url: str, body: Body, *, runs: int = 2) -> tuple[dict[str, Any], list[int]]:
    """Enqueue job ``j`` whose handler runs ``body``; wait for ``runs`` outcomes."""
    app = App(url)
    attempts: list[int] = []

    @app.consumer("q", retry=ONE_RETRY)
    async def handle(job: Job[Any], tx: Tx) -> None:
        attempts.append(job.attempt)
        await body(tx, job.job_id)

    async with app:
        await app.enqueue("q", {}, job_id="j")
        async with RunningWorker(app, concurrency=1) as w:
            await eventually(lambda: w.stats.handled >= runs, what=f"{runs} outcomes")
    return await outcome_of(url), attempts


def assert_failed_cleanly(result: dict[str, Any], attempts: list[int], code: str) -> str:
    """Neither effect nor fence; one retry, then one dead letter naming what happened."""
    assert result["effects"] == []
    assert result["fences"] == 0
    assert attempts == [1, 2]
    ((job_id, tries, category, error_code, error),) = result["letters"]
    assert (job_id, tries, category, error_code) == ("j", 2, "TECHNICAL_ERROR", code)
    assert "lost" not in error  # not blamed on a lost worker
    return str(error)


# -- 1. a handler that swallows a database error ---------------------------------------------


async def test_a_swallowed_database_error_fails_the_job_not_silently(ledger: str) -> None:
    """The handler writes, then catches the error of a failing statement and returns: on
    PostgreSQL the transaction is aborted (its COMMIT would answer ROLLBACK), on SQLite only
    the statement is undone — either way the job fails as TX_ABORTED, with neither its effect
    nor its fence, is retried, then dead-lettered with the statement's error."""

    async def body(tx: Tx, job_id: str) -> None:
        await insert(tx, job_id)
        with contextlib.suppress(Exception):
            await tx.execute("SELECT * FROM no_such_table")
        await insert(tx, job_id, 2) if tx.dialect == "sqlite" else None

    result, attempts = await run_one(ledger, body)
    error = assert_failed_cleanly(result, attempts, "TX_ABORTED")
    assert "no_such_table" in error
    assert "caught" in error


async def test_a_savepoint_lets_a_handler_undo_one_statement_and_carry_on(ledger: str) -> None:
    """``tx.savepoint()`` is the supported way to try a statement: its failure is undone
    alone, and the rest of the work commits with the fence."""

    async def body(tx: Tx, job_id: str) -> None:
        await insert(tx, job_id, 1)
        try:
            async with tx.savepoint():
                await insert(tx, job_id, 99)
                await tx.execute("SELECT * FROM no_such_table")
        except Exception:
            pass
        await insert(tx, job_id, 2)

    result, attempts = await run_one(ledger, body, runs=1)
    assert result == {"effects": [("j", 1), ("j", 2)], "fences": 1, "letters": []}
    assert attempts == [1]


# -- 2. nobody else may end the transaction ----------------------------------------------------

TX_CONTROL = ["COMMIT", "ROLLBACK", "END", "BEGIN", "  -- why not\ncommit"]
PG_ONLY_CONTROL = [
    "ABORT",
    "START TRANSACTION",
    "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL SERIALIZABLE",
    "DISCARD ALL",
    "PREPARE TRANSACTION 'x'",
]


async def refused_on_tx(url: str, statement: str, swallow: bool) -> None:
    async def body(tx: Tx, job_id: str) -> None:
        await insert(tx, job_id, 1)
        try:
            await tx.execute(statement)
        except Exception:
            if not swallow:
                raise
        await insert(tx, job_id, 2)

    result, attempts = await run_one(url, body)
    error = assert_failed_cleanly(result, attempts, "TX_CONTROL_REFUSED")
    assert "jobfence owns that transaction" in error


@pytest.mark.parametrize("swallow", [True, False], ids=["swallowed", "raised"])
@pytest.mark.parametrize("statement", TX_CONTROL)
async def test_transaction_control_on_tx_is_refused(
    ledger: str, statement: str, swallow: bool
) -> None:
    """``tx.execute("COMMIT")`` and its kin are refused with a clear error; the job fails even
    when the handler catches the refusal, and nothing it wrote (before or after) commits."""
    await refused_on_tx(ledger, statement, swallow)


@pytest.mark.parametrize("swallow", [True, False], ids=["swallowed", "raised"])
@pytest.mark.parametrize("statement", PG_ONLY_CONTROL)
async def test_postgresql_transaction_control_on_tx_is_refused(
    pg_ledger: str, statement: str, swallow: bool
) -> None:
    """The same for PostgreSQL's other ways to end or reshape a transaction."""
    await refused_on_tx(pg_ledger, statement, swallow)


RAW_CASES = [
    ("postgresql", "commit()", "TX_CONTROL_REFUSED"),
    ("postgresql", "rollback()", "TX_CONTROL_REFUSED"),
    ("postgresql", "execute:COMMIT", "TX_CONTROL_REFUSED"),
    ("postgresql", "execute:RELEASE SAVEPOINT jobfence_job_1", "TX_CONTROL_REFUSED"),
    # past the client-side screen, hidden in a multi-statement string: the server's guards
    ("postgresql", "execute:SELECT 1; COMMIT", "TX_ENDED"),
    ("postgresql", "execute:SELECT 1; END", "TX_ENDED"),
    ("postgresql", "execute:SELECT 1; ROLLBACK", "TX_ENDED"),
    ("postgresql", "execute:SELECT 1; ROLLBACK; BEGIN", "TX_ENDED"),
    (
        "postgresql",
        "execute:SELECT 1; ROLLBACK; BEGIN; SET LOCAL jobfence.tx = 'x'",
        "TX_ENDED",
    ),
    (
        "postgresql",
        "execute:SELECT 1; SET default_transaction_isolation = 'serializable'",
        "TX_SESSION_CHANGED",
    ),
    (
        "postgresql",
        "execute:SELECT 1; SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY",
        "TX_SESSION_CHANGED",
    ),
    ("postgresql", "execute:SELECT 1; DISCARD ALL", "TX_ABORTED"),
    ("postgresql", "client cursor:COMMIT", "TX_ENDED"),
    ("postgresql", "client cursor:ROLLBACK", "TX_ENDED"),
    ("sqlite", "commit()", "TX_CONTROL_REFUSED"),
    ("sqlite", "rollback()", "TX_CONTROL_REFUSED"),
    ("sqlite", "execute:COMMIT", "TX_CONTROL_REFUSED"),
    ("sqlite", "execute:END", "TX_CONTROL_REFUSED"),
    ("sqlite", "execute:ROLLBACK", "TX_CONTROL_REFUSED"),
    ("sqlite", "execute:BEGIN", "TX_CONTROL_REFUSED"),
    (
        "sqlite",
        "executescript:INSERT INTO ledger VALUES ('s', 'm', 7); COMMIT;",
        "TX_CONTROL_REFUSED",
    ),
]


async def raw_action(url: str, action: str, code: str) -> None:
    """The handler writes, does ``action`` on the raw connection, swallows any error and
    writes again; the job ends with neither effect nor fence, retried, then a dead letter."""

    async def body(tx: Tx, job_id: str) -> None:
        conn = tx.connection
        await insert(tx, job_id, 1)
        try:
            if action == "commit()":
                await conn.commit()
            elif action == "rollback()":
                await conn.rollback()
            elif action.startswith("executescript:"):
                await conn.executescript(action.split(":", 1)[1])
            elif action.startswith("client cursor:"):
                await psycopg.AsyncClientCursor(conn).execute(action.split(":", 1)[1])
            else:
                await conn.execute(action.split(":", 1)[1])
        except Exception:
            pass
        with contextlib.suppress(Exception):
            await insert(tx, job_id, 2)

    result, attempts = await run_one(url, body)
    assert_failed_cleanly(result, attempts, code)


@pytest.mark.parametrize(
    ("action", "code"), [(a, c) for store, a, c in RAW_CASES if store == "postgresql"]
)
async def test_postgresql_raw_connection_never_splits_work_and_fence(
    pg_ledger: str, action: str, code: str
) -> None:
    """On psycopg's ``AsyncConnection``: commit()/rollback() and transaction control through
    its cursors are refused; what slips past the client (a multi-statement string, a cursor
    class jobfence did not hand out) meets the server's guards."""
    await raw_action(pg_ledger, action, code)


@pytest.fixture
async def sqlite_ledger(sqlite_database: str) -> str:
    from .conftest import make_ledger

    return await make_ledger(sqlite_database)


@pytest.mark.parametrize(
    ("action", "code"), [(a, c) for store, a, c in RAW_CASES if store == "sqlite"]
)
async def test_sqlite_raw_connection_never_splits_work_and_fence(
    sqlite_ledger: str, action: str, code: str
) -> None:
    """On aiosqlite's ``Connection``: the connection's authorizer refuses BEGIN, COMMIT,
    END and ROLLBACK while a handler runs, however they are sent."""
    await raw_action(sqlite_ledger, action, code)


# -- group commit (PostgreSQL) -----------------------------------------------------------------


async def _batch(url: str, bodies: dict[str, Body], settle: int) -> tuple[App, dict[str, int]]:
    app = App(url)
    runs: dict[str, int] = {}

    @app.consumer("q", retry=ONE_RETRY)
    async def handle(job: Job[Any], tx: Tx) -> None:
        runs[job.job_id] = runs.get(job.job_id, 0) + 1
        await bodies[job.job_id](tx, job.job_id)

    async with app:
        await app.enqueue_many([app.job("q", {}, job_id=j) for j in bodies])
        async with RunningWorker(app, concurrency=1, batch_size=len(bodies)) as w:
            await eventually(lambda: w.stats.handled >= settle, what=f"{settle} outcomes")
        assert w.stats.outcomes[Outcome.PROCESSED] == len(bodies) - 1
    return app, runs


async def swallow(tx: Tx, job_id: str) -> None:
    await insert(tx, job_id)
    with contextlib.suppress(Exception):
        await tx.execute("SELECT * FROM no_such_table")


async def test_group_commit_a_swallowed_error_fails_that_job_alone(pg_ledger: str) -> None:
    """In a batch, the job that swallows a failed statement is rolled back to its own
    savepoint and fails (TX_ABORTED); its fence does not commit without its effect, and no
    other job of the batch is touched: each runs once and commits once."""
    bodies: dict[str, Body] = {f"ok-{i}": insert for i in range(4)}
    bodies["bad"] = swallow
    order = ["ok-0", "ok-1", "bad", "ok-2", "ok-3"]
    _, runs = await _batch(pg_ledger, {k: bodies[k] for k in order}, settle=6)
    result = await outcome_of(pg_ledger)
    assert result["effects"] == [(f"ok-{i}", 1) for i in range(4)]
    assert result["fences"] == 4
    ((job_id, _, category, code, error),) = result["letters"]
    assert (job_id, category, code) == ("bad", "TECHNICAL_ERROR", "TX_ABORTED")
    assert "no_such_table" in error
    assert runs == {"ok-0": 1, "ok-1": 1, "bad": 2, "ok-2": 1, "ok-3": 1}


async def test_group_commit_refuses_releasing_jobfences_savepoint(pg_ledger: str) -> None:
    """A handler that releases its job's savepoint (which would merge its work into the
    previous job's and make a later rollback undo that one) is refused; the others commit."""

    async def release(tx: Tx, job_id: str) -> None:
        await insert(tx, job_id)
        for n in range(1, 6):
            with contextlib.suppress(Exception):
                await tx.execute(f"RELEASE SAVEPOINT jobfence_job_{n}")

    bodies: dict[str, Body] = {"ok-0": insert, "bad": release, "ok-1": insert}
    _, runs = await _batch(pg_ledger, bodies, settle=4)
    result = await outcome_of(pg_ledger)
    assert result["effects"] == [("ok-0", 1), ("ok-1", 1)]
    assert result["fences"] == 2
    assert [row[3] for row in result["letters"]] == ["TX_CONTROL_REFUSED"]
    assert runs == {"ok-0": 1, "bad": 2, "ok-1": 1}


async def test_group_commit_a_hidden_commit_costs_the_batch_a_rerun_not_an_effect(
    pg_ledger: str,
) -> None:
    """A COMMIT hidden where the client cannot see it is refused by the fence's deferred
    guard: the whole batch rolls back (fences and work together), and each job runs again on
    its own — the culprit fails alone, every other job commits exactly one effect."""

    async def hidden_commit(tx: Tx, job_id: str) -> None:
        await insert(tx, job_id)
        with contextlib.suppress(Exception):
            # a cursor class jobfence did not hand out passes the client-side screen
            await psycopg.AsyncClientCursor(tx.connection).execute("COMMIT")

    bodies: dict[str, Body] = {"ok-0": insert, "bad": hidden_commit, "ok-1": insert}
    app, runs = await _batch(pg_ledger, bodies, settle=4)
    result = await outcome_of(pg_ledger)
    assert result["effects"] == [("ok-0", 1), ("ok-1", 1)]
    assert result["fences"] == 2
    assert [(row[0], row[3]) for row in result["letters"]] == [("bad", "TX_ENDED")]
    # ok-0 in the batch, then alone; bad in the batch, alone, and its retry; ok-1 alone (the
    # batch ended before its turn)
    assert runs == {"ok-0": 2, "bad": 3, "ok-1": 1}
    async with app:
        assert await scalar(pg_ledger, "SELECT count(*) FROM core.jobs") == 0


async def test_def_handlers_get_the_same_boundary(ledger: str) -> None:
    """A plain ``def`` handler (run in a thread, on ``SyncTx``): a swallowed failed statement
    fails its job; ``with tx.savepoint():`` undoes one statement and the job commits."""
    app = App(ledger)
    p = "%s" if ledger.startswith("postgresql") else "?"
    sql = f"INSERT INTO ledger (job_id, member_id, points) VALUES ({p}, {p}, {p})"

    @app.consumer("q", retry=ONE_RETRY)
    def handle(job: Job[Any], tx: Any) -> None:
        tx.execute(sql, (job.job_id, "m", 1))
        if job.job_id == "swallow":
            with contextlib.suppress(Exception):
                tx.execute("SELECT * FROM no_such_table")
        else:
            with contextlib.suppress(Exception), tx.savepoint():
                tx.execute(sql, (job.job_id, "m", 99))
                tx.execute("SELECT * FROM no_such_table")
            tx.execute(sql, (job.job_id, "m", 2))

    async with app:
        await app.enqueue_many([app.job("q", {}, job_id=j) for j in ("savepoint", "swallow")])
        async with RunningWorker(app, concurrency=2) as w:
            await eventually(lambda: w.stats.handled >= 3, what="three outcomes")
    result = await outcome_of(ledger)
    assert result["effects"] == [("savepoint", 1), ("savepoint", 2)]
    assert result["fences"] == 1
    assert [(row[0], row[3]) for row in result["letters"]] == [("swallow", "TX_ABORTED")]
