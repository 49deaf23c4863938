"""Group commit (PostgreSQL, queue in the same database): several jobs per transaction, each
in its own savepoint. Every per-job guarantee of the single-job path must still hold."""

from __future__ import annotations

import asyncio
import signal
from datetime import timedelta
from pathlib import Path
from typing import Any

from jobfence import App, Job, NonRetryableError, RetryPolicy, TemporaryError, Tx
from jobfence.review import deadletters
from jobfence.runtime.harness import Outcome

from .helpers import (
    RunningWorker,
    eventually,
    query,
    scalar,
    start_worker,
    stop_process,
    wait_until,
)

FAST = RetryPolicy(
    base=timedelta(seconds=0.05), cap=timedelta(seconds=1), justification="tests: fast retries"
)


def _app(url: str) -> tuple[App, dict[str, list[int]]]:
    """An app whose handler records (job_id → [transaction ids]) and fails on demand."""
    app = App(url)
    seen: dict[str, list[int]] = {}

    @app.consumer("q", retry=FAST)
    async def handle(job: Job[dict[str, Any]], tx: Tx) -> None:
        (txid,) = await tx.fetchone("SELECT txid_current()") or (0,)
        seen.setdefault(job.job_id, []).append(int(txid))
        await tx.execute(
            "INSERT INTO ledger (job_id, member_id, points) VALUES (%s, %s, %s)",
            (job.job_id, "m", job.attempt),
        )
        fail = job.payload.get("fail")
        if fail == "temporary" and job.attempt == 1:
            raise TemporaryError("flaky")
        if fail == "sql" and job.attempt == 1:
            await tx.execute("SELECT 1 / 0")
        if fail == "never":
            raise NonRetryableError("no", code="NOPE")

    return app, seen


async def _run_batch(app: App, payloads: list[tuple[str, dict[str, Any]]], settle: int) -> Any:
    async with app:
        await app.enqueue_many([app.job("q", p, job_id=j) for j, p in payloads])
        async with RunningWorker(app, concurrency=1, batch_size=len(payloads)) as w:
            await eventually(lambda: w.stats.handled >= settle, what=f"{settle} outcomes")
        return w.stats


async def test_a_failing_job_rolls_back_alone_inside_its_batch(pg_ledger: str) -> None:
    """Ten jobs in one transaction; job 3 fails transiently, job 6 fails in SQL: the other
    eight commit once, in one transaction; the two failures retry and then succeed."""
    app, seen = _app(pg_ledger)
    payloads = [(f"j{i}", {}) for i in range(10)]
    payloads[3] = ("j3", {"fail": "temporary"})
    payloads[6] = ("j6", {"fail": "sql"})
    await _run_batch(app, payloads, settle=12)
    first_tx = {job_id: txids[0] for job_id, txids in seen.items()}
    assert len(set(first_tx.values())) == 1  # the first attempts shared one transaction
    assert {j: len(t) for j, t in seen.items()} == {
        f"j{i}": 2 if i in (3, 6) else 1 for i in range(10)
    }
    rows = await query(pg_ledger, "SELECT job_id, points FROM ledger ORDER BY job_id")
    assert rows == sorted((f"j{i}", 2 if i in (3, 6) else 1) for i in range(10))
    fences = await scalar(pg_ledger, "SELECT count(*) FROM core.processed_jobs")
    assert fences == 10
    assert await scalar(pg_ledger, "SELECT count(*) FROM core.jobs") == 0


async def test_a_retried_job_keeps_its_history_and_attempt_count(pg_ledger: str) -> None:
    app, _ = _app(pg_ledger)
    history: list[Any] = []

    @app.consumer("h", retry=FAST)
    async def handle(job: Job[Any], tx: Tx) -> None:
        history.append((job.attempt, [(h.attempt, h.category, h.error) for h in job.history]))
        if job.attempt < 3 and job.job_id == "x":
            raise TemporaryError(f"try {job.attempt}")

    async with app:
        await app.enqueue_many([app.job("h", {}, job_id=j) for j in ("a", "x", "b")])
        async with RunningWorker(app, concurrency=1, batch_size=3, queues=["h"]) as w:
            await eventually(lambda: w.stats.handled >= 5, what="x succeeded on attempt 3")
    x = [h for h in history if h[0] > 1 or h[1]]
    assert x == [
        (2, [(1, "TEMPORARY_ERROR", "TemporaryError: try 1")]),
        (
            3,
            [
                (1, "TEMPORARY_ERROR", "TemporaryError: try 1"),
                (2, "TEMPORARY_ERROR", "TemporaryError: try 2"),
            ],
        ),
    ]


async def test_dead_letter_inside_a_batch(pg_ledger: str) -> None:
    app, _ = _app(pg_ledger)
    payloads = [("ok-1", {}), ("bad", {"fail": "never"}), ("ok-2", {})]
    stats = await _run_batch(app, payloads, settle=3)
    async with app:
        (letter,) = await deadletters.letters(app.db)
    assert (letter.job_id, letter.attempts, letter.error_category, letter.error_code) == (
        "bad",
        1,
        "NON_RETRYABLE_ERROR",
        "NOPE",
    )
    assert await query(pg_ledger, "SELECT job_id FROM ledger ORDER BY 1") == [("ok-1",), ("ok-2",)]
    assert await query(pg_ledger, "SELECT job_id FROM core.processed_jobs ORDER BY 1") == [
        ("ok-1",),
        ("ok-2",),
    ]
    assert sum(stats.outcomes.values()) == 3


async def test_duplicates_inside_one_batch_run_once(pg_ledger: str) -> None:
    app, seen = _app(pg_ledger)
    payloads = [("same", {})] * 6 + [("other", {})] * 2
    await _run_batch(app, payloads, settle=8)
    assert {j: len(t) for j, t in seen.items()} == {"same": 1, "other": 1}
    assert await query(pg_ledger, "SELECT job_id FROM ledger ORDER BY 1") == [
        ("other",),
        ("same",),
    ]


async def test_sync_handlers_work_in_a_batch(pg_ledger: str) -> None:
    app = App(pg_ledger)

    @app.consumer("s")
    def handle(job: Job[Any], tx: Any) -> None:
        (n,) = tx.fetchone("SELECT count(*) FROM ledger")
        tx.execute(
            "INSERT INTO ledger (job_id, member_id, points) VALUES (%s, 'm', %s)", (job.job_id, n)
        )

    async with app:
        await app.enqueue_many([app.job("s", {}, job_id=f"s{i}") for i in range(5)])
        async with RunningWorker(app, concurrency=1, batch_size=5) as w:
            await eventually(lambda: w.stats.handled == 5, what="5 sync jobs")
    rows = await query(pg_ledger, "SELECT points FROM ledger ORDER BY points")
    assert rows == [(0,), (1,), (2,), (3,), (4,)]  # each saw its predecessors' uncommitted rows


async def test_kill_inside_a_batch_commits_none_of_it(pg_ledger: str, tmp_path: Path) -> None:
    """SIGKILL while job 5 of a 10-job batch is inside the transaction: jobs 1–4 finished in
    their savepoints but nothing was committed; after redelivery, each job has one effect."""
    app = App(pg_ledger)
    async with app:
        jobs = [app.job("crash", {}, job_id=f"b{i}") for i in range(10)]
        jobs[4] = app.job("crash", {"mode": "hang-in-tx"}, job_id="b4")
        await app.enqueue_many(jobs)
    env = {"JF_DB": pg_ledger, "JF_MARKS": str(tmp_path), "JF_LEASE": "1"}
    args = ("--concurrency", "1", "--batch-size", "10")
    proc = start_worker("tests.apps.crash_app:app", env, tmp_path / "w1.log", *args)
    try:
        wait_until(lambda: (tmp_path / "b4.in-tx.1").exists(), what="job 5 inside the batch")
        assert (tmp_path / "b0.started.1").exists()  # earlier jobs of the batch ran
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert await scalar(pg_ledger, "SELECT count(*) FROM ledger") == 0
    assert await scalar(pg_ledger, "SELECT count(*) FROM core.processed_jobs") == 0
    proc2 = start_worker("tests.apps.crash_app:app", env, tmp_path / "w2.log", *args)
    try:
        await eventually(
            lambda: _count(pg_ledger, "SELECT count(*) FROM core.jobs", 0),
            timeout=30,
            what="all redelivered and done",
        )
    finally:
        assert stop_process(proc2) == 0
    rows = await query(pg_ledger, "SELECT job_id, count(*) FROM ledger GROUP BY 1 ORDER BY 1")
    assert rows == [(f"b{i}", 1) for i in range(10)]
    assert await scalar(pg_ledger, "SELECT count(*) FROM core.processed_jobs") == 10


async def _count(url: str, sql: str, expected: int) -> bool:
    return await scalar(url, sql) == expected


async def test_raw_connection_statements_fail_the_job_that_sent_them(pg_ledger: str) -> None:
    """A handler using the driver connection directly in a batch (no fetch, so nothing syncs
    the pipeline for it): its error still belongs to its own job, not to the next one."""
    app = App(pg_ledger)

    @app.consumer("raw", retry=FAST)
    async def handle(job: Job[dict[str, Any]], tx: Tx) -> None:
        value = "oops" if job.payload.get("bad") and job.attempt == 1 else "1"
        await tx.connection.execute(
            "INSERT INTO ledger (job_id, member_id, points) VALUES (%s, 'm', %s::int)",
            (job.job_id, value),
        )

    async with app:
        jobs = [app.job("raw", {"bad": i == 2}, job_id=f"r{i}") for i in range(5)]
        await app.enqueue_many(jobs)
        async with RunningWorker(app, concurrency=1, batch_size=5) as w:
            await eventually(lambda: w.stats.handled == 6, what="5 jobs and one retry")
    assert w.stats.outcomes[Outcome.RETRY] == 1
    rows = await query(pg_ledger, "SELECT job_id, count(*) FROM ledger GROUP BY 1 ORDER BY 1")
    assert rows == [(f"r{i}", 1) for i in range(5)]


async def test_jobs_without_statements_share_a_batch_with_jobs_that_write(pg_ledger: str) -> None:
    """A job's savepoint is queued, not sent, until something follows it. Jobs that run no
    statement, jobs that fail before any statement and jobs that fail after raw statements,
    in one batch: each failure rolls back only its own work, never an earlier job's."""
    app = App(pg_ledger)
    txids: dict[str, int] = {}

    @app.consumer("mixed", retry=FAST)
    async def handle(job: Job[dict[str, Any]], tx: Tx) -> None:
        mode = job.payload["mode"]
        if mode == "fail-first":
            raise NonRetryableError("before any statement", code="EARLY")
        if mode == "noop":
            return
        insert = "INSERT INTO ledger (job_id, member_id, points) VALUES (%s, 'm', 1)"
        if mode == "raw-then-fail":
            await tx.connection.execute(insert, (job.job_id,))
            raise NonRetryableError("after a raw statement", code="LATE")
        (txid,) = await tx.fetchone("SELECT txid_current()") or (0,)
        txids[job.job_id] = int(txid)
        await tx.execute(insert, (job.job_id,))

    modes = ["write", "fail-first", "noop", "raw-then-fail", "write", "noop", "fail-first"]
    async with app:
        jobs = [app.job("mixed", {"mode": m}, job_id=f"m{i}") for i, m in enumerate(modes)]
        await app.enqueue_many(jobs)
        async with RunningWorker(app, concurrency=1, batch_size=len(modes)) as w:
            await eventually(lambda: w.stats.handled == len(modes), what="every job's outcome")
    assert w.stats.outcomes[Outcome.PROCESSED] == 4
    assert w.stats.outcomes[Outcome.DEAD] == 3
    assert txids["m0"] == txids["m4"]  # one transaction
    rows = await query(pg_ledger, "SELECT job_id FROM ledger ORDER BY job_id")
    assert rows == [("m0",), ("m4",)]
    fences = await query(pg_ledger, "SELECT job_id FROM core.processed_jobs ORDER BY job_id")
    assert fences == [("m0",), ("m2",), ("m4",), ("m5",)]
    letters = await query(
        pg_ledger, "SELECT job_id, error_code FROM core.dead_letters ORDER BY job_id"
    )
    assert letters == [("m1", "EARLY"), ("m3", "LATE"), ("m6", "EARLY")]
    assert await scalar(pg_ledger, "SELECT count(*) FROM core.jobs") == 0


async def _ready_together(pg_ledger: str, handler_sleep: float, **worker: Any) -> dict[str, int]:
    """Warm a worker up with one job (so it knows how long handlers take), then enqueue six
    jobs in one transaction into the idle worker: no backlog, six jobs ready together.
    Returns each of the six jobs' transaction id."""
    app = App(pg_ledger)
    txids: dict[str, int] = {}

    @app.consumer("ready")
    async def handle(job: Job[Any], tx: Tx) -> None:
        if handler_sleep:
            await asyncio.sleep(handler_sleep)  # a handler waiting on something slow
        (txid,) = await tx.fetchone("SELECT txid_current()") or (0,)
        txids[job.job_id] = int(txid)
        await tx.execute(
            "INSERT INTO ledger (job_id, member_id, points) VALUES (%s, 'm', 1)", (job.job_id,)
        )

    async with (
        app,
        RunningWorker(app, concurrency=8, batch_size=10, poll_interval=60, **worker) as w,
    ):
        await app.enqueue("ready", {}, job_id="warm-up")
        await eventually(lambda: w.stats.handled == 1, what="the warm-up job")
        await app.enqueue_many([app.job("ready", {}, job_id=f"r{i}") for i in range(6)])
        await eventually(lambda: w.stats.handled == 7, what="the six ready jobs")
    assert await scalar(pg_ledger, "SELECT count(*) FROM ledger") == 7
    return {j: t for j, t in txids.items() if j != "warm-up"}


async def test_jobs_ready_together_share_a_transaction_when_handlers_are_fast(
    pg_ledger: str,
) -> None:
    """No backlog (8 free slots, 6 jobs), fast handlers: one commit for the six, not six."""
    txids = await _ready_together(pg_ledger, 0.0, batch_window=1.0)
    assert len(txids) == 6
    assert len(set(txids.values())) == 1


async def test_jobs_ready_together_run_side_by_side_when_handlers_are_slow(
    pg_ledger: str,
) -> None:
    """Handlers slower than the batch window: each ready job gets its own transaction, so
    they run at the same time instead of one after the other."""
    txids = await _ready_together(pg_ledger, 0.2, batch_window=0.05)
    assert len(set(txids.values())) == 6


async def test_a_zero_batch_window_batches_only_under_a_backlog(pg_ledger: str) -> None:
    txids = await _ready_together(pg_ledger, 0.0, batch_window=0.0)
    assert len(set(txids.values())) == 6
