"""SPEC H5 on every transport: a handler that swallows a failed statement never loses its
job. Before, on the brokers the job was acked and counted *processed* with neither effect nor
fence nor dead letter; on the PostgreSQL queue it was blamed on a lost worker."""

from __future__ import annotations

import contextlib
from datetime import timedelta
from typing import Any

from jobfence import App, Job, RetryPolicy, Tx
from jobfence.runtime.harness import Outcome

from ..helpers import RunningWorker, eventually, query, scalar, table
from .support import Target, effects, remaining
from .test_contract import effect

ONE_RETRY = RetryPolicy(
    base=timedelta(seconds=0.05),
    cap=timedelta(seconds=0.2),
    limited_retries=1,
    justification="contract tests: a boundary failure retried once, quickly",
)


async def test_a_swallowed_database_error_is_retried_then_dead_lettered(target: Target) -> None:
    """The handler writes its effect, catches the error of a failing statement and returns:
    the job is neither acked as processed nor lost — no effect, no fence; one retry; then one
    dead letter (TECHNICAL_ERROR, TX_ABORTED) naming the statement's error; nothing queued."""
    app: App = target.app()
    attempts: list[int] = []

    @app.consumer(target.queue, retry=ONE_RETRY)
    async def handle(job: Job[Any], tx: Tx) -> None:
        attempts.append(job.attempt)
        await effect(tx, job)
        with contextlib.suppress(Exception):
            await tx.execute("SELECT * FROM no_such_table")

    async with app:
        await app.enqueue(target.queue, {"n": 1}, job_id="swallow-1")
        async with RunningWorker(app, concurrency=2) as w:
            await eventually(lambda: w.stats.handled >= 2, timeout=60, what="two outcomes")
    assert attempts == [1, 2]
    assert w.stats.outcomes[Outcome.PROCESSED] == 0
    assert (w.stats.outcomes[Outcome.RETRY], w.stats.outcomes[Outcome.DEAD]) == (1, 1)
    db = target.database_url
    assert await effects(db) == []
    assert await scalar(db, f"SELECT count(*) FROM {table(db, 'processed_jobs')}") == 0
    letters = await query(
        db,
        "SELECT job_id, attempts, error_category, error_code, last_error "
        f"FROM {table(db, 'dead_letters')}",
    )
    ((job_id, tries, category, code, error),) = letters
    assert (job_id, tries, category, code) == ("swallow-1", 2, "TECHNICAL_ERROR", "TX_ABORTED")
    assert "no_such_table" in error
    await eventually(lambda: _drained(target), timeout=60, what="nothing left queued")


async def _drained(target: Target) -> bool:
    return await remaining(target) == 0
