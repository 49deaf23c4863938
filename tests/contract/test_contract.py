"""The queue port's contract (SPEC Q1), run against every transport on its real server:
PostgreSQL and SQLite (the database queue), RabbitMQ, NATS JetStream and Redis Streams.
For the brokers the fence and the dead letters are in PostgreSQL, and the broker is acked
only after the work transaction committed.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pydantic

from jobfence import App, Job, Retry, RetryPolicy, TemporaryError, Tx
from jobfence.core.jobs import AttemptRecord
from jobfence.review import deadletters
from jobfence.review.letters import get_letter
from jobfence.runtime.harness import Outcome

from ..helpers import RunningWorker, eventually, scalar, table
from .support import (
    Target,
    effects,
    kill_worker,
    remaining,
    start_worker,
    stop_worker,
)

FAST = RetryPolicy(
    base=timedelta(seconds=0.05),
    cap=timedelta(seconds=0.4),
    justification="contract tests: a full retry cycle in about a second",
)
SLOWER = RetryPolicy(
    base=timedelta(seconds=0.5),
    cap=timedelta(seconds=5),
    justification="contract tests: retry delays of seconds, to measure them",
)


class Credit(pydantic.BaseModel):
    member_id: str
    points: int


async def effect(tx: Tx, job: Job[Any]) -> None:
    p = "%s" if tx.dialect == "postgresql" else "?"
    await tx.execute(
        f"INSERT INTO effects (job_id, attempt, pid) VALUES ({p}, {p}, {p})",
        (job.job_id, job.attempt, "in-process"),
    )


async def drained(target: Target) -> bool:
    return await remaining(target) == 0


async def fences(target: Target) -> int:
    db = target.database_url
    return int(await scalar(db, f"SELECT count(*) FROM {table(db, 'processed_jobs')}"))


async def test_published_jobs_are_consumed_once_and_acked(target: Target) -> None:
    """20 jobs: each reaches its handler once, on attempt 1, with its payload and
    correlation_id; each leaves one effect and one fence; nothing stays queued."""
    app = target.app()
    seen: list[tuple[str, int, int, str | None]] = []

    @app.consumer(target.queue, schema=Credit)
    async def handle(job: Job[Credit], tx: Tx) -> None:
        seen.append((job.job_id, job.attempt, job.payload.points, job.correlation_id))
        await effect(tx, job)

    jobs = [
        app.job(target.queue, {"member_id": "m", "points": i}, job_id=f"job-{i:02d}",
                correlation_id=f"corr-{i}")
        for i in range(20)
    ]  # fmt: skip
    async with app:
        await app.enqueue_many(jobs)
        async with RunningWorker(app, concurrency=5) as w:
            await eventually(lambda: w.stats.handled == 20, timeout=60, what="20 jobs handled")
    assert sorted(seen) == [(f"job-{i:02d}", 1, i, f"corr-{i}") for i in range(20)]
    assert w.stats.outcomes[Outcome.PROCESSED] == 20
    assert await effects(target.database_url) == [(f"job-{i:02d}", 1) for i in range(20)]
    assert await fences(target) == 20
    await eventually(lambda: drained(target), timeout=60, what="every message acked")


async def test_a_worker_killed_with_sigkill_loses_no_job(target: Target, tmp_path: Path) -> None:
    """SIGKILL while the handler holds the open transaction: no effect is left; a second
    worker gets the job after the lease, as attempt 2 (the lost delivery counted, R1)."""
    app = target.app()
    async with app:
        await app.enqueue(target.queue, {"mode": "hang"}, job_id="kill-1")
    env = target.env(tmp_path, lease=1.0)
    first = start_worker(env, tmp_path / "w1.log")
    try:
        await eventually(
            lambda: (tmp_path / "kill-1.started.1").exists(), timeout=180, what="handler running"
        )
    finally:
        kill_worker(first)
    assert await effects(target.database_url) == []
    assert await fences(target) == 0

    second = start_worker(env, tmp_path / "w2.log")
    try:
        await eventually(
            lambda: effects(target.database_url), timeout=120, what="redelivered job processed"
        )
        await eventually(lambda: drained(target), what="redelivery acked")
    finally:
        assert stop_worker(second) == 0
    assert await effects(target.database_url) == [("kill-1", 2)]
    assert await fences(target) == 1
    async with app:
        assert await deadletters.letters(app.db) == []


async def test_a_delayed_retry_runs_after_its_delay(target: Target) -> None:
    """Retry(delay=1 s): the second attempt starts no earlier than the delay (less the few
    ms by which the database queue's clock, its transaction's start, precedes the handler;
    RabbitMQ's delay buckets round up) and within 4 s of it on a loaded machine; its
    history holds the first attempt with the scheduled delay."""
    app = target.app()
    started: dict[int, float] = {}
    histories: list[tuple[AttemptRecord, ...]] = []

    @app.consumer(target.queue, retry=SLOWER)
    async def handle(job: Job[Any], tx: Tx) -> None:
        started[job.attempt] = time.monotonic()
        histories.append(job.history)
        if job.attempt == 1:
            raise Retry(delay=timedelta(seconds=1), reason="not yet")
        await effect(tx, job)

    async with app:
        await app.enqueue(target.queue, {"x": 1}, job_id="later-1")
        async with RunningWorker(app, concurrency=2, poll_interval=0.5) as w:
            await eventually(lambda: w.stats.handled == 2, timeout=30, what="two attempts")
    gap = started[2] - started[1]
    assert 0.97 <= gap <= 5.0, gap
    assert histories[0] == ()
    (record,) = histories[1]
    assert (record.attempt, record.category) == (1, "TEMPORARY_ERROR")
    assert record.retry_at is not None
    scheduled = _ts(record.retry_at) - _ts(record.at)
    assert abs(scheduled - 1.0) < 0.01, scheduled
    assert await effects(target.database_url) == [("later-1", 2)]
    await eventually(lambda: drained(target), what="acked")


def _ts(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


async def test_a_poison_payload_goes_to_dead_letters_without_retries(target: Target) -> None:
    """A payload that fails its schema: one dead letter (VALIDATION_ERROR, POISON, 1
    attempt) with the payload as sent; the handler never runs; the message is acked."""
    app = target.app()
    called: list[str] = []

    @app.consumer(target.queue, schema=Credit)
    async def handle(job: Job[Credit], tx: Tx) -> None:
        called.append(job.job_id)

    async with app:
        await app.enqueue(target.queue, {"member_id": "m", "points": "lots"}, job_id="bad-1",
                          correlation_id="req-9")  # fmt: skip
        async with RunningWorker(app) as w:
            await eventually(lambda: w.stats.handled == 1, what="poison handled")
        letters = await deadletters.letters(app.db)
        letter = await get_letter(app.db, letters[0].id)
    assert called == []
    assert letter is not None
    assert (letter.job_id, letter.attempts, letter.error_category, letter.error_code) == (
        "bad-1", 1, "VALIDATION_ERROR", "POISON",
    )  # fmt: skip
    assert (letter.payload, letter.correlation_id, letter.queue) == (
        b'{"member_id":"m","points":"lots"}', "req-9", target.queue,
    )  # fmt: skip
    assert w.stats.outcomes[Outcome.DEAD] == 1
    await eventually(lambda: drained(target), what="poison acked")


async def test_exhausted_retries_end_in_one_dead_letter_with_the_history(
    target: Target,
) -> None:
    """Always a temporary error: attempts 1..6, then one dead letter with 6 attempts and
    every attempt in its history (the history travels with the message)."""
    app = target.app()
    attempts: list[int] = []

    @app.consumer(target.queue, retry=FAST)
    async def handle(job: Job[Any], tx: Tx) -> None:
        attempts.append(job.attempt)
        raise TemporaryError("ERP answered 503")

    async with app:
        await app.enqueue(target.queue, {"po": 7}, job_id="po-7")
        async with RunningWorker(app, concurrency=2, poll_interval=0.5) as w:
            await eventually(lambda: w.stats.handled == 6, timeout=60, what="six attempts")
        letters = await deadletters.letters(app.db)
        letter = await get_letter(app.db, letters[0].id)
    assert attempts == [1, 2, 3, 4, 5, 6]
    assert len(letters) == 1
    assert letter is not None
    assert (letter.job_id, letter.attempts, letter.error_category) == ("po-7", 6, "TEMPORARY_ERROR")
    assert [h.attempt for h in letter.history] == [1, 2, 3, 4, 5, 6]
    assert {h.error for h in letter.history} == {"TemporaryError: ERP answered 503"}
    assert [h.retry_at is not None for h in letter.history] == [True] * 5 + [False]
    assert await effects(target.database_url) == []
    await eventually(lambda: drained(target), what="dead letter acked")


async def test_64_duplicate_deliveries_make_one_effect(target: Target) -> None:
    """64 messages with one job_id, 32 handled at once: the handler runs once, one effect,
    63 duplicates skipped and acked."""
    app = target.app()
    calls: list[int] = []

    @app.consumer(target.queue)
    async def handle(job: Job[Any], tx: Tx) -> None:
        calls.append(job.attempt)
        await asyncio.sleep(0.05)  # duplicates pile up behind the fence
        await effect(tx, job)

    async with app:
        await app.enqueue_many(
            [app.job(target.queue, {"n": 1}, job_id="order-42") for _ in range(64)]
        )
        async with RunningWorker(app, concurrency=32) as w:
            await eventually(lambda: w.stats.handled == 64, timeout=60, what="64 deliveries")
    assert calls == [1]
    assert (w.stats.outcomes[Outcome.PROCESSED], w.stats.outcomes[Outcome.DUPLICATE]) == (1, 63)
    assert await effects(target.database_url) == [("order-42", 1)]
    assert await fences(target) == 1
    await eventually(lambda: drained(target), what="all 64 acked")


async def test_sigterm_finishes_the_running_job_and_takes_nothing_new(
    target: Target, tmp_path: Path
) -> None:
    """Graceful shutdown (H4): SIGTERM during a 2 s handler; it commits and is acked, the
    worker exits 0; a job enqueued after the SIGTERM stays queued, untouched, and the next
    worker runs it as attempt 1 (a fetched-but-unstarted message is handed back refunded)."""
    app = target.app()
    async with app:
        await app.enqueue(target.queue, {"mode": "sleep", "seconds": 2}, job_id="slow-2")
        proc = start_worker(target.env(tmp_path, lease=5.0), tmp_path / "w1.log")
        try:
            await eventually(
                lambda: (tmp_path / "slow-2.started.1").exists(), timeout=180, what="running"
            )
            proc.terminate()
            await app.enqueue(target.queue, {"n": 2}, job_id="after-stop")
            assert await asyncio.to_thread(proc.wait, 60) == 0
        finally:
            kill_worker(proc)
        assert await effects(target.database_url) == [("slow-2", 1)]
        assert await remaining(target) == 1
        proc = start_worker(target.env(tmp_path, lease=5.0), tmp_path / "w2.log")
        try:
            # wait for the effect, not only an empty queue: a broker's count leaves out a
            # message the worker holds unacked, and SIGTERM would hand an unstarted one back
            await eventually(
                lambda: _has_effect(target, "after-stop"), timeout=180, what="after-stop applied"
            )
            await eventually(lambda: drained(target), timeout=180, what="second worker done")
        finally:
            assert stop_worker(proc) == 0
    assert await effects(target.database_url) == [("after-stop", 1), ("slow-2", 1)]


async def test_a_second_sigterm_hands_the_running_job_back_at_once(
    target: Target, tmp_path: Path
) -> None:
    """Issue 12 §7 on every transport: a handler hangs inside its transaction after writing
    its effect; the grace is 60 s. Two SIGTERMs: the worker exits in seconds, the effect rolled
    back (no fence either); the job was handed back (nacked, republished or left to its lease,
    per transport) and the next worker applies it exactly once, as attempt 2."""
    app = target.app()
    async with app:
        await app.enqueue(target.queue, {"mode": "hang"}, job_id="hung-1")
    log = tmp_path / "w1.log"
    proc = start_worker(target.env(tmp_path, lease=5.0), log, "--shutdown-grace", "60s")
    try:
        await eventually(
            lambda: (tmp_path / "hung-1.started.1").exists(), timeout=180, what="running"
        )
        proc.terminate()
        await eventually(lambda: "shutdown requested" in log.read_text(), what="first signal")
        proc.terminate()
        began = time.monotonic()
        assert await asyncio.to_thread(proc.wait, 30) == 0
        assert time.monotonic() - began < 30  # not the 60 s grace
    finally:
        kill_worker(proc)
    assert await effects(target.database_url) == []
    assert await fences(target) == 0
    assert "cancelled 1 in-flight job" in log.read_text()
    proc = start_worker(target.env(tmp_path, lease=5.0), tmp_path / "w2.log")
    try:
        await eventually(lambda: _has_effect(target, "hung-1"), timeout=180, what="hung-1 applied")
        await eventually(lambda: drained(target), timeout=180, what="second worker done")
    finally:
        assert stop_worker(proc) == 0
    assert await effects(target.database_url) == [("hung-1", 2)]
    assert await fences(target) == 1


async def _has_effect(target: Target, job_id: str) -> bool:
    return job_id in {j for j, _ in await effects(target.database_url)}


async def test_published_job_survives_a_new_app(target: Target) -> None:
    """What publish returned for is durable in the queue: a new app (new connections)
    consumes it."""
    first = target.app()
    async with first:
        await first.enqueue(target.queue, {"k": "v"}, job_id="kept-1")
    assert await remaining(target) == 1
    second: App = target.app()
    got: list[Any] = []

    @second.consumer(target.queue)
    async def handle(job: Job[Any], tx: Tx) -> None:
        got.append((job.job_id, job.payload))
        await effect(tx, job)

    async with second, RunningWorker(second) as w:
        await eventually(lambda: w.stats.handled == 1, what="consumed by the new app")
    assert got == [("kept-1", {"k": "v"})]


async def test_a_handler_longer_than_the_lease_keeps_its_job(target: Target) -> None:
    """Lease 1 s (Pub/Sub's ack deadline, JetStream's AckWait, the takeover idle time…), a
    handler of 3.5 s: the worker's renewals keep the job its own — one delivery, attempt 1,
    one effect — and nothing is left queued."""
    app = target.app(lease=1.0)
    calls: list[int] = []

    @app.consumer(target.queue)
    async def handle(job: Job[Any], tx: Tx) -> None:
        calls.append(job.attempt)
        await asyncio.sleep(3.5)
        await effect(tx, job)

    async with app:
        await app.enqueue(target.queue, {"n": 1}, job_id="long-1")
        async with RunningWorker(app, concurrency=4, poll_interval=0.2) as w:
            await eventually(lambda: w.stats.handled == 1, what="handled")
            await asyncio.sleep(2.0)  # a redelivery would arrive within a lease: give it two
    assert calls == [1]
    assert w.stats.outcomes[Outcome.PROCESSED] == 1
    assert await effects(target.database_url) == [("long-1", 1)]
    await eventually(lambda: drained(target), what="acked")
