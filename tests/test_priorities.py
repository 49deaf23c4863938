"""Job priorities on the database queue (issue 26 §3): the claim order, the bound on
starving a low priority, the index the claim reads, and refusing bad priorities clearly.
Brokers: tests/transports/test_priorities_brokers.py."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from jobfence import App, EnqueueError, Relay, outbox
from jobfence.config import parse_database_url
from jobfence.core.jobs import Delivery
from jobfence.db import connect
from jobfence.sql import queries
from jobfence.transports.database import AGE_ROUND_EVERY, DatabaseQueue

from .helpers import eventually, query, table


def _queue(app: App) -> DatabaseQueue:
    transport = app.transport
    assert isinstance(transport, DatabaseQueue)
    return transport


async def _claim_one(app: App, queues: list[str]) -> Delivery:
    """One claim round of limit 1 (a fetch whose first claim finds a job is one round)."""
    found = await _queue(app).fetch(queues, 1, 0.5)
    assert len(found) == 1, found
    return found[0]


async def test_claims_take_the_highest_priority_first_then_the_oldest(database_url: str) -> None:
    """Mixed priorities in one queue, and across two queues: each claim takes the highest
    priority that is due, the oldest first within it; a job of priority 9 scheduled later is
    not taken early; every delivery says its priority."""
    app = App(database_url, auto_migrate=True)
    async with app:
        for job_id, priority in [("a0", 0), ("b5", 5), ("c9", 9), ("d5", 5), ("e0", 0)]:
            await app.enqueue("q", {}, job_id=job_id, priority=priority)
        await app.enqueue("q", {}, job_id="later9", priority=9, delay=3600)
        await app.enqueue("other", {}, job_id="o7", priority=7)
        await app.enqueue("other", {}, job_id="o0")
        order = [await _claim_one(app, ["q", "other"]) for _ in range(7)]
        assert [(d.job_id, d.priority) for d in order] == [
            ("c9", 9),
            ("o7", 7),
            ("b5", 5),
            ("d5", 5),
            ("a0", 0),
            ("e0", 0),
            ("o0", 0),
        ]
        assert await _queue(app).fetch(["q", "other"], 1, 0.05) == []  # later9 is not due
        jobs = table(database_url, "jobs")
        rows = await query(
            database_url, f"SELECT job_id, priority FROM {jobs} WHERE state = 'available'"
        )
        assert rows == [("later9", 9)]


async def test_a_retried_job_keeps_its_priority(database_url: str) -> None:
    """A retry puts the job back with its priority (the row is kept, only run_at moves)."""
    from datetime import timedelta

    from jobfence.errors import Category

    app = App(database_url, auto_migrate=True)
    async with app:
        await app.enqueue("q", {}, job_id="r", priority=8)
        first = await _claim_one(app, ["q"])
        await _queue(app).retry(first, timedelta(0), Category.TEMPORARY_ERROR, "try again")
        await app.enqueue("q", {}, job_id="plain")
        again = await _claim_one(app, ["q"])
        assert (again.job_id, again.priority, again.attempt) == ("r", 8, 2)


async def test_a_low_priority_job_is_claimed_within_k_rounds_under_a_stream_of_high_ones(
    database_url: str,
) -> None:
    """The starvation bound: a job of priority 0 waits while jobs of priority 9 keep coming
    (one new one before every claim, so a claim by priority alone would never take it), and
    is claimed by the worker's first claim round by age: within AGE_ROUND_EVERY rounds."""
    app = App(database_url, auto_migrate=True)
    async with app:
        await app.enqueue("q", {}, job_id="low", priority=0)
        claimed: list[str] = []
        for n in range(3 * AGE_ROUND_EVERY):
            await app.enqueue("q", {}, job_id=f"high-{n}", priority=9)
            claimed.append((await _claim_one(app, ["q"])).job_id)
            if claimed[-1] == "low":
                break
        assert "low" in claimed, claimed
        rounds = claimed.index("low") + 1
        assert 1 < rounds <= AGE_ROUND_EVERY, claimed
        # every other round took the newest high-priority job's elders by priority: all high
        assert all(job.startswith("high-") for job in claimed[: rounds - 1])


async def test_priorities_survive_the_outbox(database_url: str) -> None:
    """An outbox event's priority becomes its job's (the relay's direct path on PostgreSQL,
    the publish path on SQLite)."""
    app = App(database_url, auto_migrate=True)
    async with app:
        async with app.db.transaction() as tx:
            await outbox.write(tx, "q", {"n": 1}, event_id="ev-low")
            await outbox.write(tx, "q", {"n": 2}, event_id="ev-high", priority=6)
        relay = Relay(app, poll_interval=0.05)
        await eventually(relay.run_once, what="relayed")
        rows = await query(
            database_url,
            f"SELECT job_id, priority FROM {table(database_url, 'jobs')} ORDER BY job_id",
        )
        assert rows == [("ev-high", 6), ("ev-low", 0)]
        assert (await _claim_one(app, ["q"])).job_id == "ev-high"


@pytest.mark.parametrize(
    ("priority", "says"),
    [
        (10, "priority 10 is out of range: use 0 (the default) to 9, higher runs first"),
        (-1, "priority -1 is out of range"),
        ("high", "priority must be a whole number from 0 to 9 (higher runs first), got str"),
        (True, "got bool"),
        (2.0, "got float"),
    ],
)
async def test_a_bad_priority_is_refused_with_one_clear_line(
    sqlite_database: str, priority: Any, says: str
) -> None:
    app = App(sqlite_database, auto_migrate=True)
    async with app:
        with pytest.raises(EnqueueError, match=says.replace("(", r"\(").replace(")", r"\)")):
            await app.enqueue("q", {}, priority=priority)
        with pytest.raises(EnqueueError, match="priority"):
            app.enqueue_sync("q", {}, priority=priority)
        async with app.db.transaction() as tx:
            with pytest.raises(EnqueueError, match="priority"):
                await outbox.write(tx, "q", {}, priority=priority)
    assert await query(sqlite_database, "SELECT count(*) FROM core_jobs") == [(0,)]


async def test_enqueue_sync_and_bulk_copy_keep_priorities(pg_database: str) -> None:
    """enqueue_sync on its own connection, and a bulk enqueue large enough for COPY."""
    app = App(pg_database, auto_migrate=True)
    app.enqueue_sync("q", {}, job_id="sync", priority=4)
    async with app:
        jobs = [app.job("bulk", {}, job_id=f"b{n}", priority=n % 10) for n in range(100)]
        await app.enqueue_many(jobs)
    rows = await query(pg_database, "SELECT job_id, priority FROM core.jobs")
    got = dict(rows)
    assert got["sync"] == 4
    assert all(got[f"b{n}"] == n % 10 for n in range(100))


def _unlimited_jobs_below(node: dict[str, Any]) -> bool:
    """Whether rows of core.jobs reach ``node`` without a LIMIT on the way up."""
    for child in node.get("Plans", []):
        if child.get("Relation Name") == "jobs":
            return True
        if child["Node Type"] != "Limit" and _unlimited_jobs_below(child):
            return True
    return False


def _plan_nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    nodes = [plan]
    for child in plan.get("Plans", []):
        nodes += _plan_nodes(child)
    return nodes


async def test_the_postgresql_claim_reads_one_index_range_not_a_sort_of_the_queue(
    pg_database: str,
) -> None:
    """EXPLAIN of both claims over a queue of 20 000 waiting jobs of mixed priorities (and
    another busy queue): an index scan of jobs_priority_idx (by priority) or jobs_available_idx
    (by age) under a LIMIT, no sequential scan of core.jobs, and no sort of its rows (the
    only sort is of the few candidates the ranges returned)."""
    db = connect(parse_database_url(pg_database))
    await db.open(max_size=1)
    try:
        async with db.transaction() as tx:
            await tx.execute(
                "INSERT INTO core.jobs (queue, job_id, payload, priority) "
                "SELECT CASE WHEN n % 2 = 0 THEN 'q' ELSE 'busy' END, 'j' || n, '\\x7b7d', n % 10 "
                "FROM generate_series(1, 40000) AS n"
            )
            await tx.execute("ANALYZE core.jobs")
        sql = queries("postgresql")
        params = {
            "queues": ["q"],
            "limit": 10,
            "per_queue": 10,
            "lease": 30.0,
            "worker_id": "explain",
        }
        for name, index in [("claim", "jobs_priority_idx"), ("claim_by_age", "jobs_available_idx")]:
            async with db.transaction() as tx:
                rows = await tx.fetchall("EXPLAIN (FORMAT JSON) " + sql[name], params)
                await tx.execute("ROLLBACK")
            plan = rows[0][0]
            plan = json.loads(plan) if isinstance(plan, str) else plan
            nodes = _plan_nodes(plan[0]["Plan"])
            scans = [n for n in nodes if n.get("Relation Name") == "jobs"]
            kinds = {(n["Node Type"], n.get("Index Name")) for n in scans}
            assert ("Index Scan", index) in kinds, (name, kinds)
            assert all(n["Node Type"] != "Seq Scan" for n in scans), (name, kinds)
            for node in nodes:
                if node["Node Type"] == "Sort":
                    assert not _unlimited_jobs_below(node), (name, "a sort of the queue's rows")
    finally:
        await db.close()


async def test_the_sqlite_claim_reads_the_priority_index_and_stops_early(
    sqlite_database: str,
) -> None:
    """The SQLite claims of one queue search one index range (the priority index, or the
    available index by age) and stop after the LIMIT: the virtual machine steps of the claim's
    select do not grow with the number of waiting jobs (200 against 20 000)."""
    import sqlite3

    app = App(sqlite_database, auto_migrate=True)
    async with app:
        pass
    conn = sqlite3.connect(sqlite_database.removeprefix("sqlite:///"))
    sql = queries("sqlite")
    fill = (
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?) "
        "INSERT INTO core_jobs (queue, job_id, payload, run_at, enqueued_at, priority) "
        "SELECT CASE WHEN i % 2 = 0 THEN 'q' ELSE 'busy' END, 'j' || i || '-' || ?, x'7b7d', "
        "i, 0, i % 10 FROM n"
    )
    try:
        steps: dict[tuple[str, int], int] = {}
        for size in (200, 20000):
            conn.execute("DELETE FROM core_jobs")
            conn.execute(fill, (size, size))
            conn.execute("ANALYZE")
            for name, index in [
                ("claim", "core_jobs_priority_idx"),
                ("claim_by_age", "core_jobs_available_idx"),
            ]:
                # the claim's select of candidates (the UPDATE around it changes nothing here)
                select = sql[name][sql[name].index("SELECT id FROM") : sql[name].rindex(")")]
                params = {"queues": '["q"]', "limit": 10}
                plan = conn.execute("EXPLAIN QUERY PLAN " + select, params).fetchall()
                details = " | ".join(str(row[-1]) for row in plan)
                assert f"USING INDEX {index} (queue=?" in details, (name, details)
                counted = [0]

                def step(counted: list[int] = counted) -> int:
                    counted[0] += 1
                    return 0

                conn.set_progress_handler(step, 10)
                assert len(conn.execute(select, params).fetchall()) == 10
                conn.set_progress_handler(None, 0)
                steps[(name, size)] = counted[0]
        for name in ("claim", "claim_by_age"):
            assert steps[(name, 20000)] < 2 * steps[(name, 200)] + 10, steps
    finally:
        conn.close()


def test_the_cli_enqueues_with_a_priority_and_shows_it(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`jobfence enqueue --priority 7`, then `jobs show` (table and JSON) says priority 7; a
    priority out of range is one line naming the option and the range, and enqueues nothing."""
    from .deadletters.test_cli import jobfence

    db = ("--database-url", database_url)
    code, _, err = jobfence(
        capsys, "enqueue", "q", "-p", "{}", "--job-id", "p7", "--priority", "7", *db
    )
    assert code == 0, err
    code, out, err = jobfence(capsys, "jobs", "show", "p7", *db)
    assert code == 0, err
    assert any(line.split() == ["│", "priority", "│", "7", "│"] for line in out.splitlines()), out
    code, out, _ = jobfence(capsys, "jobs", "show", "p7", "--json", *db)
    assert json.loads(out)["priority"] == 7
    code, _, err = jobfence(capsys, "enqueue", "q", "-p", "{}", "--priority", "12", *db)
    assert code != 0
    assert "--priority" in err
    assert "priority 12 is out of range: use 0 (the default) to 9, higher runs first" in err
    jobs = table(database_url, "jobs")
    assert asyncio.run(query(database_url, f"SELECT job_id, priority FROM {jobs}")) == [("p7", 7)]
