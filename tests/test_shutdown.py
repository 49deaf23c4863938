"""Issue 12 §7: shutdown. A second SIGTERM/SIGINT forces a fast stop (in-flight work rolls back
and is redelivered, exactly once); a plain ``def`` handler still blocked when the worker gives
up on it does not keep the process alive, and a statement it sends later is refused (its
effect never appears); the worker says what it waits for. Real worker subprocesses on real
PostgreSQL and SQLite."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from jobfence import App, Job, SyncTx, TransactionBoundaryError, outbox

from .helpers import REPO, eventually, ph, query, scalar, stop_process, table, wait_until

APP = "tests.apps.shutdown_app:app"


def start(ledger: str, tmp_path: Path, *args: str) -> subprocess.Popen[bytes]:
    import os
    import sys

    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("JOBFENCE_")},
        "JF_DB": ledger,
        "JF_MARKS": str(tmp_path),
        "JF_LEASE": "30",  # a redelivery must come from the hand-back, not a lease expiry
        "PYTHONUNBUFFERED": "1",
    }
    log = (tmp_path / "worker.log").open("ab")
    return subprocess.Popen(
        [sys.executable, "-m", "jobfence.cli", "worker", APP, "--log-format", "json", *args],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def events(tmp_path: Path, prefix: str) -> list[dict[str, Any]]:
    lines = (tmp_path / "worker.log").read_text(encoding="utf-8").splitlines()
    found = [json.loads(line) for line in lines if line.startswith("{")]
    return [r for r in found if str(r.get("event", "")).startswith(prefix)]


async def enqueue(ledger: str, queue: str, job_id: str, payload: dict[str, Any]) -> None:
    app = App(ledger)
    async with app:
        await app.enqueue(queue, payload, job_id=job_id)


async def counts(ledger: str) -> tuple[int, int]:
    effects = await scalar(ledger, "SELECT count(*) FROM ledger")
    fences = await scalar(ledger, f"SELECT count(*) FROM {table(ledger, 'processed_jobs')}")
    return int(effects), int(fences)


def stopped_within(proc: subprocess.Popen[bytes], seconds: float) -> float:
    """Wait for the process to exit; return how long it took (fails past ``seconds``)."""
    began = time.monotonic()
    try:
        assert proc.wait(timeout=seconds) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return time.monotonic() - began


async def redelivered_once(ledger: str, tmp_path: Path, job_id: str) -> None:
    """A new worker processes the handed-back job: one effect, one fence, attempt 2."""
    proc = start(ledger, tmp_path)
    try:
        await eventually(lambda: _done(ledger), what="the redelivered job committed")
    finally:
        assert stop_process(proc) == 0
    assert [r[0] for r in await query(ledger, "SELECT job_id FROM ledger")] == [job_id]
    assert await counts(ledger) == (1, 1)
    assert (tmp_path / f"{job_id}.started.2").exists()


async def _done(ledger: str) -> bool:
    return await counts(ledger) == (1, 1)


@pytest.mark.parametrize("queue", ["work", "work.sync"])
async def test_a_second_signal_forces_a_fast_stop_and_the_job_is_redelivered_once(
    ledger: str, tmp_path: Path, queue: str
) -> None:
    """The handler wrote its effect and blocks for 60 s; the grace is 60 s. SIGTERM: the
    worker says what it waits for; SIGINT: it cancels the job and exits in seconds, leaving
    no effect and no fence; the next worker runs the job exactly once."""
    await enqueue(ledger, queue, "hold-1", {"mode": "sleep", "seconds": 60})
    proc = start(ledger, tmp_path, "--shutdown-grace", "60s")
    try:
        wait_until(lambda: (tmp_path / "hold-1.started.1").exists(), what="handler running")
        proc.send_signal(signal.SIGTERM)
        asked = wait_until(lambda: events(tmp_path, "shutdown requested"), what="first line")[0]
        assert asked["level"] == "info"
        assert asked["inflight"] == 1
        assert asked["jobs"][0]["job_id"] == "hold-1"
        assert asked["jobs"][0]["queue"] == queue
        assert asked["jobs"][0]["running_s"] >= 0
        assert 50 < asked["grace_left_s"] <= 60
        assert "second Ctrl-C" in asked["event"]
        proc.send_signal(signal.SIGINT)
        took = stopped_within(proc, 15)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert took < 15  # well before the 60 s grace (and the 60 s handler)
    assert events(tmp_path, "second signal")[0]["inflight"] == 1
    cancelled = events(tmp_path, "cancelled 1 in-flight job")
    assert cancelled[0]["jobs"] == [{"job_id": "hold-1", "queue": queue}]
    assert events(tmp_path, "worker stopped")[0]["cancelled"] == 1
    assert await counts(ledger) == (0, 0)
    rows = await query(ledger, f"SELECT state, attempts FROM {table(ledger, 'jobs')}")
    assert rows == [("available", 1)]  # handed back at once, not left to its lease
    await redelivered_once(ledger, tmp_path, "hold-1")


async def test_a_blocked_def_handler_does_not_outlive_the_grace(
    ledger: str, tmp_path: Path
) -> None:
    """A ``def`` handler in ``time.sleep(60)`` after writing its effect; SIGTERM with a 0.5 s
    grace: the process exits within seconds (the handler's thread is not waited for), no
    effect is committed, and the job is redelivered exactly once."""
    await enqueue(ledger, "work.sync", "sleepy-1", {"mode": "sleep", "seconds": 60})
    proc = start(ledger, tmp_path, "--shutdown-grace", "500ms")
    try:
        wait_until(lambda: (tmp_path / "sleepy-1.started.1").exists(), what="handler running")
        proc.send_signal(signal.SIGTERM)
        took = stopped_within(proc, 15)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert took < 15
    assert events(tmp_path, "shutdown grace period over")[0]["jobs"][0]["job_id"] == "sleepy-1"
    assert not (tmp_path / "sleepy-1.woke.1").exists()
    assert await counts(ledger) == (0, 0)
    await redelivered_once(ledger, tmp_path, "sleepy-1")


async def test_a_handler_thread_that_wakes_after_its_job_was_cancelled_cannot_write(
    ledger: str,
) -> None:
    """In one process (the loop and the pool outlive the worker): a ``def`` handler writes its
    effect and blocks; the grace ends and the job is cancelled. When the thread wakes, its
    next statement is refused — it would otherwise run on a connection back in the pool,
    outside any fenced transaction — and neither effect ever appears."""
    app = App(ledger, lease=timedelta(seconds=30))
    release = threading.Event()
    woke: list[BaseException | None] = []
    p = ph(app.url.dialect)
    insert = f"INSERT INTO ledger (job_id, member_id, points) VALUES ({p}, {p}, {p})"

    @app.consumer("late")
    def late(job: Job[dict[str, Any]], tx: SyncTx) -> None:
        tx.execute(insert, (job.job_id, "before", 1))
        if job.attempt > 1:
            return
        release.wait(30)
        try:
            tx.execute(insert, (job.job_id, "after", 1))
        except BaseException as exc:
            woke.append(exc)
            raise
        woke.append(None)

    async with app:
        await app.enqueue("late", {}, job_id="late-1")
        worker = app.worker(shutdown_grace=0.2)
        task = asyncio.create_task(worker.run())
        await eventually(lambda: _has_inflight(worker), what="handler running")
        worker.request_stop()
        await asyncio.wait_for(task, timeout=30)
        assert worker.cancelled == 1
        release.set()  # the thread wakes, on a loop that still runs, its connection pooled
        await eventually(lambda: _said(woke), what="the thread's late statement")
        assert isinstance(woke[0], TransactionBoundaryError)
        assert "not run" in str(woke[0])
        assert await counts(ledger) == (0, 0)
        # the job was handed back: a new worker runs it once (attempt 2 returns at once)
        second = app.worker()
        task = asyncio.create_task(second.run())
        await eventually(lambda: _done(ledger), what="the redelivery committed")
        second.request_stop()
        await asyncio.wait_for(task, timeout=30)
    assert await query(ledger, "SELECT member_id FROM ledger") == [("before",)]


async def _has_inflight(worker: Any) -> bool:
    return bool(worker._inflight)


async def _said(woke: list[Any]) -> bool:
    return bool(woke)


async def test_the_worker_says_what_it_waits_for_every_few_seconds(
    ledger: str, caplog: pytest.LogCaptureFixture
) -> None:
    """While it waits for in-flight jobs the worker repeats what it waits for (job id, queue,
    time running, grace left); a forced stop then cancels the job and says so."""
    app = App(ledger)
    hold = asyncio.Event()

    @app.consumer("slow")
    async def slow(job: Job[dict[str, Any]], tx: Any) -> None:
        await hold.wait()

    caplog.set_level("INFO", logger="jobfence.worker")
    async with app:
        await app.enqueue("slow", {}, job_id="slow-1")
        worker = app.worker(shutdown_grace=60)
        worker.wait_report_interval = 0.2
        task = asyncio.create_task(worker.run())
        await eventually(lambda: _has_inflight(worker), what="handler running")
        worker.request_stop()
        await eventually(lambda: _periodic(caplog, 2), what="two periodic lines")
        line = [r for r in caplog.records if r.getMessage().startswith("still waiting")][-1]
        assert line.jobs[0]["job_id"] == "slow-1"  # type: ignore[attr-defined]
        assert line.jobs[0]["queue"] == "slow"  # type: ignore[attr-defined]
        assert line.jobs[0]["running_s"] > 0  # type: ignore[attr-defined]
        assert 0 < line.grace_left_s < 60  # type: ignore[attr-defined]
        worker.force_stop()
        await asyncio.wait_for(task, timeout=15)
    assert worker.cancelled == 1
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("cancelled 1 in-flight job") for m in messages)
    assert await counts(ledger) == (0, 0)


async def _periodic(caplog: pytest.LogCaptureFixture, n: int) -> bool:
    return len([r for r in caplog.records if r.getMessage().startswith("still waiting")]) >= n


async def test_a_second_signal_stops_a_relay_stuck_in_its_round(pg_database: str) -> None:
    """`jobfence relay` stops after its current round on SIGTERM; when that round is stuck
    (here: the outbox locked by another transaction), a second signal cancels it and the relay
    exits at once. Nothing is lost: the event is relayed once the lock is gone."""
    import psycopg

    async with App(pg_database) as app, app.db.transaction() as tx:
        await outbox.write(tx, "q", {"x": 1}, event_id="evt-stuck")
    locker = await psycopg.AsyncConnection.connect(pg_database)
    proc = None
    try:
        await locker.execute("LOCK TABLE core.outbox IN ACCESS EXCLUSIVE MODE")
        proc = spawn_relay(pg_database)
        await eventually(lambda: _waits_on_lock(pg_database), what="the relay stuck on the lock")
        proc.send_signal(signal.SIGTERM)  # the first signal is not enough: the round is stuck
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=1)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=15)
        assert proc.returncode == 0, out
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        await locker.rollback()
        await locker.close()
    said = [json.loads(line)["event"] for line in out.splitlines() if line.startswith("{")]
    assert any(e.startswith("shutdown requested: the relay stops") for e in said), said
    assert any(e.startswith("second signal: stopping the relay now") for e in said), said
    assert await query(pg_database, "SELECT state FROM core.outbox") == [("PENDING",)]
    async with App(pg_database) as app:
        from jobfence.outbox.relay import Relay

        assert await Relay(app).run_once() == 1
    assert await query(pg_database, "SELECT job_id FROM core.jobs") == [("evt-stuck",)]


async def _waits_on_lock(url: str) -> bool:
    rows = await query(
        url,
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event_type = 'Lock'",
    )
    return bool(rows[0][0])


def spawn_relay(url: str) -> subprocess.Popen[str]:
    import os
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBFENCE_")}
    cli = [sys.executable, "-m", "jobfence.cli"]
    return subprocess.Popen(
        [*cli, "relay", "--database-url", url, "--log-format", "json"],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_the_handler_threads_are_daemons_and_bounded() -> None:
    """jobfence.runtime.threads: results and errors come back; at most ``max_workers`` threads, all
    daemons; ``shutdown(wait=False)`` does not wait for a blocked thread, and
    ``cancel_futures`` cancels what never started."""
    from jobfence.runtime.threads import DaemonThreadPool

    pool = DaemonThreadPool(2)
    assert pool.submit(lambda a, b: a + b, 2, b=3).result(timeout=5) == 5
    with pytest.raises(ZeroDivisionError):
        pool.submit(lambda: 1 / 0).result(timeout=5)
    gate = threading.Event()
    blocked = [pool.submit(gate.wait, 30) for _ in range(2)]
    queued = pool.submit(lambda: "never")
    wait_until(lambda: all(f.running() for f in blocked), what="both threads busy")
    threads = [t for t in threading.enumerate() if t.name.startswith(pool._prefix + "_")]
    assert 1 <= len(threads) <= 2
    assert all(t.daemon for t in threads)
    began = time.monotonic()
    pool.shutdown(wait=False, cancel_futures=True)
    assert time.monotonic() - began < 1
    assert queued.cancelled()
    with pytest.raises(RuntimeError):
        pool.submit(lambda: None)
    gate.set()
    assert all(f.result(timeout=5) for f in blocked)
