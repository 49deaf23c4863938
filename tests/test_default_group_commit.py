"""Group commit is the default (PostgreSQL, queue in the fence's database): with no tuning
flags ready jobs share a transaction, each in its own savepoint. What would not be safe to
share is detected or declared, and such jobs get a transaction of their own."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import pytest

from jobfence import App, Job, Tx
from jobfence.config import DEFAULT_BATCH_SIZE
from jobfence.runtime import harness
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

INSERT = "INSERT INTO ledger (job_id, member_id, points) VALUES (%s, %s, %s)"


async def _txid(tx: Tx) -> int:
    (txid,) = await tx.fetchone("SELECT txid_current()") or (0,)
    return int(txid)


async def _drain(app: App, job_ids: list[tuple[str, str]], **worker: Any) -> Any:
    """Enqueue (queue, job_id) pairs, then run a default worker (one slot, so that a backlog
    forms batches) until every job has an outcome."""
    async with app:
        await app.enqueue_many([app.job(q, {}, job_id=j) for q, j in job_ids])
        async with RunningWorker(app, concurrency=1, poll_interval=60, **worker) as w:
            await eventually(lambda: w.stats.handled >= len(job_ids), what="every job")
    return w.stats


async def test_the_default_worker_commits_a_backlog_in_shared_transactions(pg_ledger: str) -> None:
    assert DEFAULT_BATCH_SIZE > 1
    app = App(pg_ledger)
    txids: dict[str, int] = {}

    @app.consumer("q")
    async def handle(job: Job[Any], tx: Tx) -> None:
        txids[job.job_id] = await _txid(tx)
        await tx.execute(INSERT, (job.job_id, "m", 1))

    stats = await _drain(app, [("q", f"j{i}") for i in range(12)])
    assert stats.outcomes[Outcome.PROCESSED] == 12
    assert len(set(txids.values())) < 12  # jobs shared transactions, with no flag
    assert await scalar(pg_ledger, "SELECT count(*) FROM ledger") == 12
    assert await scalar(pg_ledger, "SELECT count(*) FROM core.processed_jobs") == 12


async def test_an_isolated_consumer_gets_a_transaction_per_job(pg_ledger: str) -> None:
    """``isolated=True``: its jobs never share a transaction, while another consumer's jobs in
    the same backlog do."""
    app = App(pg_ledger)
    txids: dict[str, int] = {}

    @app.consumer("alone", isolated=True)
    async def alone(job: Job[Any], tx: Tx) -> None:
        txids[job.job_id] = await _txid(tx)
        await tx.execute(INSERT, (job.job_id, "a", 1))

    @app.consumer("shared")
    async def shared(job: Job[Any], tx: Tx) -> None:
        txids[job.job_id] = await _txid(tx)
        await tx.execute(INSERT, (job.job_id, "s", 1))

    order = [("alone", f"a{i}") for i in range(4)] + [("shared", f"s{i}") for i in range(6)]
    order = [order[i] for i in (0, 4, 5, 1, 6, 7, 2, 8, 3, 9)]  # interleaved
    stats = await _drain(app, order)
    assert stats.outcomes[Outcome.PROCESSED] == 10
    alone_tx = [txids[f"a{i}"] for i in range(4)]
    assert len(set(alone_tx)) == 4
    assert not set(alone_tx) & {txids[f"s{i}"] for i in range(6)}
    assert len({txids[f"s{i}"] for i in range(6)}) < 6
    assert await scalar(pg_ledger, "SELECT count(*) FROM ledger") == 10


async def test_set_local_in_a_batch_reruns_its_jobs_alone_and_never_leaks(pg_ledger: str) -> None:
    """A handler that runs SET LOCAL (whose effect would reach the batch's later jobs): the
    batch rolls back, every job runs again in a transaction of its own, each effect is applied
    once, the setting reaches no other job, and the consumer runs isolated from then on."""
    app = App(pg_ledger)
    seen: dict[str, list[tuple[int, str]]] = {}

    @app.consumer("q")
    async def handle(job: Job[Any], tx: Tx) -> None:
        if job.job_id == "j2":
            await tx.execute("SET LOCAL application_name = 'set-by-j2'")
        (name,) = await tx.fetchone("SELECT current_setting('application_name')") or ("",)
        seen.setdefault(job.job_id, []).append((await _txid(tx), str(name)))
        await tx.execute(INSERT, (job.job_id, "m", 1))

    async with app:
        await app.enqueue_many([app.job("q", {}, job_id=f"j{i}") for i in range(6)])
        async with RunningWorker(app, concurrency=1, poll_interval=60) as w:
            await eventually(lambda: w.stats.handled >= 6, what="the six jobs")
            await app.enqueue_many([app.job("q", {}, job_id=f"k{i}") for i in range(3)])
            await eventually(lambda: w.stats.handled >= 9, what="three more")
    assert w.stats.outcomes[Outcome.PROCESSED] == 9
    others = [name for job_id, runs in seen.items() if job_id != "j2" for _, name in runs]
    assert "set-by-j2" not in others
    assert seen["j2"][-1][1] == "set-by-j2"  # alone, it ran and saw its own setting
    final = {job_id: runs[-1][0] for job_id, runs in seen.items()}
    assert len(set(final.values())) == 9  # after the re-run, one transaction per job
    rows = await query(pg_ledger, "SELECT job_id, count(*) FROM ledger GROUP BY 1 ORDER BY 1")
    assert rows == sorted([(f"j{i}", 1) for i in range(6)] + [(f"k{i}", 1) for i in range(3)])
    assert await scalar(pg_ledger, "SELECT count(*) FROM core.processed_jobs") == 9
    assert await scalar(pg_ledger, "SELECT count(*) FROM core.jobs") == 0


async def test_an_advisory_xact_lock_runs_in_a_transaction_of_its_own(pg_ledger: str) -> None:
    """pg_advisory_xact_lock inside a default worker's batch (it would be held to the batch's
    commit): the jobs still succeed, once each, one per transaction."""
    app = App(pg_ledger)
    txids: dict[str, int] = {}

    @app.consumer("lock")
    async def lock(job: Job[Any], tx: Tx) -> None:
        await tx.execute("SELECT pg_advisory_xact_lock(42)")
        txids[job.job_id] = await _txid(tx)
        await tx.execute(INSERT, (job.job_id, "l", 1))

    stats = await _drain(app, [("lock", f"l{i}") for i in range(4)])
    assert stats.outcomes[Outcome.PROCESSED] == 4
    assert len(set(txids.values())) == 4
    rows = await query(pg_ledger, "SELECT job_id, count(*) FROM ledger GROUP BY 1 ORDER BY 1")
    assert rows == [(f"l{i}", 1) for i in range(4)]
    assert await scalar(pg_ledger, "SELECT count(*) FROM core.processed_jobs") == 4


async def test_copy_on_the_raw_connection_runs_in_a_transaction_of_its_own(
    pg_ledger: str,
) -> None:
    """COPY (not available in pipeline mode) inside a default worker's batch: the jobs still
    succeed, once each, one per transaction."""
    app = App(pg_ledger)
    txids: dict[str, int] = {}

    @app.consumer("copy")
    async def copy(job: Job[Any], tx: Tx) -> None:
        txids[job.job_id] = await _txid(tx)
        copy_sql = "COPY ledger (job_id, member_id, points) FROM STDIN"
        async with tx.connection.cursor() as cur, cur.copy(copy_sql) as cp:
            await cp.write_row((job.job_id, "c", 1))

    stats = await _drain(app, [("copy", f"c{i}") for i in range(4)])
    assert stats.outcomes[Outcome.PROCESSED] == 4
    assert len(set(txids.values())) == 4
    rows = await query(pg_ledger, "SELECT job_id, count(*) FROM ledger GROUP BY 1 ORDER BY 1")
    assert rows == [(f"c{i}", 1) for i in range(4)]


async def test_raw_connection_results_are_there_at_once_in_a_batch(pg_ledger: str) -> None:
    """The driver connection behaves in a batch as outside one: a statement's row count and
    rows are there when ``execute`` returns, and its error is raised there (not at a later
    statement or at the commit)."""
    app = App(pg_ledger)
    counts: dict[str, int] = {}
    caught: dict[str, str] = {}

    @app.consumer("raw")
    async def handle(job: Job[Any], tx: Tx) -> None:
        conn = tx.connection
        await conn.execute(INSERT, (job.job_id, "m", 1))
        await conn.execute(INSERT, (job.job_id, "m", 2))
        cur = await conn.execute(
            "UPDATE ledger SET points = points + 10 WHERE job_id = %s", (job.job_id,)
        )
        counts[job.job_id] = cur.rowcount
        try:
            async with tx.savepoint():
                await conn.execute("SELECT 1 / 0")
        except Exception as exc:  # raised by execute, undone by the savepoint
            caught[job.job_id] = type(exc).__name__
        row = await (
            await conn.execute("SELECT count(*) FROM ledger WHERE job_id = %s", (job.job_id,))
        ).fetchone()
        assert row == (2,)

    stats = await _drain(app, [("raw", f"r{i}") for i in range(5)])
    assert stats.outcomes[Outcome.PROCESSED] == 5
    assert counts == {f"r{i}": 2 for i in range(5)}
    assert caught == {f"r{i}": "DivisionByZero" for i in range(5)}
    assert await scalar(pg_ledger, "SELECT count(*) FROM ledger") == 10


async def test_slow_handlers_under_a_backlog_do_not_share_long_transactions(
    pg_ledger: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Handlers slower than the batch span (here 0.5 s of handler time per transaction):
    under a backlog each job still commits on its own, so one job's work does not wait on
    others."""
    monkeypatch.setattr(harness, "BATCH_SPAN", 0.5)
    app = App(pg_ledger)
    txids: dict[str, int] = {}

    @app.consumer("slow")
    async def handle(job: Job[Any], tx: Tx) -> None:
        await asyncio.sleep(0.3)
        txids[job.job_id] = await _txid(tx)
        await tx.execute(INSERT, (job.job_id, "m", 1))

    async with app, RunningWorker(app, concurrency=1, poll_interval=60) as w:
        await app.enqueue("slow", {}, job_id="warm-up")
        await eventually(lambda: w.stats.handled == 1, what="the warm-up job")
        await app.enqueue_many([app.job("slow", {}, job_id=f"s{i}") for i in range(4)])
        await eventually(lambda: w.stats.handled == 5, what="the backlog")
    assert len({txids[f"s{i}"] for i in range(4)}) == 4


async def test_kill_inside_a_default_batch_commits_none_of_it(
    pg_ledger: str, tmp_path: Path
) -> None:
    """SIGKILL of `jobfence worker` with no tuning flags while job 5 of a backlog is inside
    the shared transaction: nothing committed; after redelivery each job has one effect."""
    app = App(pg_ledger)
    async with app:
        jobs = [app.job("crash", {}, job_id=f"b{i}") for i in range(10)]
        jobs[4] = app.job("crash", {"mode": "hang-in-tx"}, job_id="b4")
        await app.enqueue_many(jobs)
    env = {"JF_DB": pg_ledger, "JF_MARKS": str(tmp_path), "JF_LEASE": "1"}
    args = ("--concurrency", "1")
    proc = start_worker("tests.apps.crash_app:app", env, tmp_path / "w1.log", *args)
    try:
        wait_until(lambda: (tmp_path / "b4.in-tx.1").exists(), what="job 5 inside the batch")
        assert (tmp_path / "b0.started.1").exists()
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert await scalar(pg_ledger, "SELECT count(*) FROM ledger") == 0
    assert await scalar(pg_ledger, "SELECT count(*) FROM core.processed_jobs") == 0
    proc2 = start_worker("tests.apps.crash_app:app", env, tmp_path / "w2.log", *args)
    try:
        await eventually(lambda: _empty(pg_ledger), timeout=30, what="all redelivered and done")
    finally:
        assert stop_process(proc2) == 0
    rows = await query(pg_ledger, "SELECT job_id, count(*) FROM ledger GROUP BY 1 ORDER BY 1")
    assert rows == [(f"b{i}", 1) for i in range(10)]
    assert await scalar(pg_ledger, "SELECT count(*) FROM core.processed_jobs") == 10


async def _empty(url: str) -> bool:
    return await scalar(url, "SELECT count(*) FROM core.jobs") == 0
