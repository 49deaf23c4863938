"""Issue 16 §3: a claim over many queues locks a share of its limit in each queue, not the
whole limit in every queue — and still returns the oldest jobs, and a single busy queue
among idle ones still drains without waiting; and a claim never reads the whole queue table.
Real PostgreSQL."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest

from jobfence import App
from jobfence.sql import queries
from jobfence.transports.database import PER_QUEUE_MIN, per_queue_limit


def test_the_share_is_the_whole_limit_for_one_queue_and_never_less_than_a_batch() -> None:
    assert per_queue_limit(550, 1) == 550
    assert per_queue_limit(550, 0) == 550
    assert per_queue_limit(550, 5) == 110
    assert per_queue_limit(550, 100) == PER_QUEUE_MIN == 50
    assert per_queue_limit(20, 100) == 20  # never more than the limit


@pytest.fixture
async def app(pg_database: str) -> AsyncIterator[App]:
    app = App(pg_database)
    await app.open()
    try:
        yield app
    finally:
        await app.close()


def _plan(url: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    """The nodes of EXPLAIN ANALYZE of the worker's claim statement (rolled back), root
    first."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "EXPLAIN (ANALYZE, FORMAT JSON) " + queries("postgresql")["claim"], params
        ).fetchone()
        conn.rollback()
    assert row is not None
    plan = row[0] if isinstance(row[0], list) else json.loads(row[0])
    nodes: list[dict[str, Any]] = []

    def walk(node: dict[str, Any]) -> None:
        nodes.append(node)
        for child in node.get("Plans", []):
            walk(child)

    walk(plan[0]["Plan"])
    return nodes


def _locked_rows(url: str, params: dict[str, Any]) -> tuple[int, int]:
    """(rows the claim locked, rows it returned)."""
    nodes = _plan(url, params)
    locked = sum(
        int(n["Actual Rows"]) * int(n["Actual Loops"])
        for n in nodes
        if n["Node Type"] == "LockRows"
    )
    return locked, int(nodes[0]["Actual Rows"])


async def test_a_claim_over_twenty_queues_takes_the_oldest_and_locks_a_share_of_each(
    app: App, pg_database: str
) -> None:
    queues = [f"q{i:02d}" for i in range(20)]
    # 100 jobs in each queue, enqueued round robin: the oldest 200 are the first 10 of each
    jobs = [app.job(q, {"n": n}, job_id=f"{q}-{n:03d}") for n in range(100) for q in queues]
    await app.enqueue_many(jobs)
    params = {
        "queues": queues,
        "limit": 200,
        "per_queue": per_queue_limit(200, len(queues)),
        "lease": 60.0,
        "worker_id": "test",
    }
    locked, returned = _locked_rows(pg_database, params)
    assert returned == 200
    # each queue's range locks its share (50), not the whole limit (here: all 100 of each)
    assert locked <= len(queues) * PER_QUEUE_MIN, locked
    whole = _locked_rows(pg_database, {**params, "per_queue": 200})[0]
    assert whole == 2000  # what the claim locked before the share: every job of every queue

    claimed = await app.transport.fetch(queues, 200, 0)
    assert sorted(d.job_id for d in claimed) == sorted(j.job_id for j in jobs[:200])


async def test_one_busy_queue_among_idle_ones_is_claimed_a_share_at_a_time_without_waiting(
    app: App,
) -> None:
    queues = [f"idle-{i:02d}" for i in range(99)] + ["busy"]
    await app.enqueue_many([app.job("busy", {"n": n}, job_id=f"b-{n:03d}") for n in range(120)])
    got: list[str] = []
    for expected in (50, 50, 20):
        started = time.monotonic()
        found = await app.transport.fetch(queues, 100, 30.0)
        # a full share means the queues may hold more: the next claim does not wait for a
        # wake-up (30 s here) first
        assert time.monotonic() - started < 10, "a claim waited although jobs were ready"
        assert len(found) == expected
        got += [d.job_id for d in found]
    assert got == [f"b-{n:03d}" for n in range(120)]  # oldest first, each once


async def test_a_claim_reads_the_queue_table_by_index_only_whatever_its_size(
    app: App, pg_database: str
) -> None:
    # 20 000 waiting jobs: a join of the candidates with core.jobs was planned as a hash
    # over a sequential scan of the whole table at this size (every claim reading it)
    for start in range(0, 20_000, 5_000):
        await app.enqueue_many(
            [app.job("bench", {"n": n}, job_id=f"j-{n:05d}") for n in range(start, start + 5_000)]
        )
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE core.jobs")
    params = {"queues": ["bench"], "limit": 550, "per_queue": 550, "lease": 60.0}
    nodes = _plan(pg_database, {**params, "worker_id": "test"})
    scans = [(n["Node Type"], n.get("Relation Name")) for n in nodes if "Scan" in n["Node Type"]]
    assert ("Seq Scan", "jobs") not in scans, scans
    assert nodes[0]["Actual Rows"] == 550
