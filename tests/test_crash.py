"""Real process kills (SIGKILL) at the worst moments: the fence keeps effects single (H3, F2)."""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobfence import App

from .conftest import create_pg_database, drop_pg_database, pg_url
from .helpers import (
    eventually,
    query,
    scalar,
    start_worker,
    stop_process,
    table,
    wait_until,
)

APP = "tests.apps.crash_app:app"


@pytest.fixture
def second_database(database_url: str, tmp_path: Path) -> Iterator[str]:
    """Another database of the same kind, to hold the queue apart from the fence."""
    if database_url.startswith("postgresql"):
        name = create_pg_database()
        try:
            yield pg_url(name)
        finally:
            drop_pg_database(name)
    else:
        yield f"sqlite:///{tmp_path / f'queue-{uuid.uuid4().hex[:6]}.db'}"


async def _enqueue(db: str, transport: str | None, job_id: str, payload: dict[str, object]) -> None:
    app = App(db, transport=transport, auto_migrate=True)
    async with app:
        await app.enqueue("crash", payload, job_id=job_id)


def _env(db: str, marks: Path, transport: str | None = None, lease: float = 1.0) -> dict[str, str]:
    env = {"JF_DB": db, "JF_MARKS": str(marks), "JF_LEASE": str(lease)}
    if transport:
        env["JF_TRANSPORT"] = transport
    return env


async def test_kill_inside_the_transaction_leaves_neither_work_nor_fence(
    ledger: str, tmp_path: Path
) -> None:
    """SIGKILL after the handler's write, inside the open transaction: 0 effect rows and
    0 fence rows; after the lease expires the job is redelivered: exactly 1 and 1."""
    await _enqueue(ledger, None, "crash-1", {"mode": "hang-in-tx"})
    proc = start_worker(APP, _env(ledger, tmp_path), tmp_path / "w1.log")
    try:
        wait_until(lambda: (tmp_path / "crash-1.in-tx.1").exists(), what="handler inside tx")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert await scalar(ledger, "SELECT count(*) FROM ledger") == 0
    assert await scalar(ledger, f"SELECT count(*) FROM {table(ledger, 'processed_jobs')}") == 0

    proc2 = start_worker(APP, _env(ledger, tmp_path), tmp_path / "w2.log")
    try:
        await eventually(
            lambda: scalar(ledger, f"SELECT count(*) FROM {table(ledger, 'processed_jobs')}"),
            timeout=30,
            what="redelivered job fenced",
        )
    finally:
        assert stop_process(proc2) == 0
    # the redelivery was attempt 2: the lost delivery counted (R1)
    assert await query(ledger, "SELECT job_id, points FROM ledger") == [("crash-1", 2)]
    assert await scalar(ledger, f"SELECT count(*) FROM {table(ledger, 'processed_jobs')}") == 1
    assert await scalar(ledger, f"SELECT count(*) FROM {table(ledger, 'jobs')}") == 0


async def test_kill_after_commit_before_ack_is_skipped_as_duplicate(
    ledger: str, second_database: str, tmp_path: Path
) -> None:
    """Queue in another database, so the ack comes after the commit: SIGKILL between the
    two; the redelivery meets the fence and is skipped; one effect."""
    queue_db = second_database
    await _enqueue(ledger, queue_db, "crash-2", {"mode": "hang-after-commit"})
    env = _env(ledger, tmp_path, transport=queue_db)
    proc = start_worker(APP, env, tmp_path / "w1.log")
    try:
        wait_until(lambda: (tmp_path / "crash-2.committed.1").exists(), what="commit done")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert await scalar(ledger, "SELECT count(*) FROM ledger") == 1
    # not acknowledged: the job is still in the queue, leased by the dead worker
    assert await scalar(queue_db, f"SELECT count(*) FROM {table(queue_db, 'jobs')}") == 1

    proc2 = start_worker(APP, env, tmp_path / "w2.log")
    try:
        await eventually(
            lambda: _queue_empty(queue_db), timeout=30, what="redelivery acked as duplicate"
        )
    finally:
        assert stop_process(proc2) == 0
    assert await query(ledger, "SELECT job_id, points FROM ledger") == [("crash-2", 1)]
    assert not (tmp_path / "crash-2.started.2").exists()  # the handler did not run again
    log = (tmp_path / "w2.log").read_text()
    assert "duplicate skipped" in log


async def _queue_empty(url: str) -> bool:
    return await scalar(url, f"SELECT count(*) FROM {table(url, 'jobs')}") == 0


async def test_kill_after_commit_with_the_queue_in_the_same_database(
    ledger: str, tmp_path: Path
) -> None:
    """With the queue next to the fence the ack is part of the commit: a kill right after
    the commit leaves one effect and no job to redeliver."""
    await _enqueue(ledger, None, "crash-3", {"mode": "hang-after-commit"})
    proc = start_worker(APP, _env(ledger, tmp_path), tmp_path / "w1.log")
    try:
        wait_until(lambda: (tmp_path / "crash-3.committed.1").exists(), what="commit done")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert await query(ledger, "SELECT job_id, points FROM ledger") == [("crash-3", 1)]
    assert await scalar(ledger, f"SELECT count(*) FROM {table(ledger, 'jobs')}") == 0


async def test_sigterm_lets_the_in_flight_job_finish(ledger: str, tmp_path: Path) -> None:
    """Graceful shutdown (H4): SIGTERM during a 1.5 s handler; the job commits, exit 0."""
    await _enqueue(ledger, None, "slow-1", {"mode": "sleep", "seconds": 1.5})
    proc = start_worker(APP, _env(ledger, tmp_path, lease=5), tmp_path / "w.log")
    try:
        wait_until(lambda: (tmp_path / "slow-1.started.1").exists(), what="handler running")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert await query(ledger, "SELECT job_id FROM ledger") == [("slow-1",)]
    assert await scalar(ledger, f"SELECT count(*) FROM {table(ledger, 'jobs')}") == 0


async def test_sigterm_past_the_grace_period_hands_the_job_back(
    ledger: str, tmp_path: Path
) -> None:
    """A handler longer than the grace period is cancelled: its transaction rolls back and
    the job returns to the queue at once (no lease wait) for another worker."""
    await _enqueue(ledger, None, "slow-2", {"mode": "sleep", "seconds": 60})
    proc = start_worker(
        APP, _env(ledger, tmp_path, lease=30), tmp_path / "w.log", "--shutdown-grace", "0.5"
    )
    try:
        wait_until(lambda: (tmp_path / "slow-2.started.1").exists(), what="handler running")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert await scalar(ledger, "SELECT count(*) FROM ledger") == 0
    rows = await query(
        ledger, f"SELECT state, attempts FROM {table(ledger, 'jobs')} WHERE job_id = 'slow-2'"
    )
    assert rows == [("available", 1)]
