"""A worker app for subprocess tests of the summary line and of shutdown.

Configured by environment: JF_DB (database URL), JF_LEASE (seconds), JF_MARKS (a folder where
it drops marker files). Queue ``work`` (async handler) and ``work.sync`` (plain ``def``
handler) write the effect (a ledger row), then act on the payload's ``mode``:
- ``retry-once``: ask for a retry on the first attempt;
- ``dead``: fail for good (a dead letter);
- ``sleep``: sleep ``seconds`` inside the transaction, on the first attempt only;
- ``block-loop`` (queue ``work``): block the event loop itself for ``seconds`` (a handler
  that calls ``time.sleep`` in an ``async def``: what /livez must catch);
- anything else: nothing more.
"""

from __future__ import annotations

import asyncio
import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from jobfence import App, Job, NonRetryableError, Retry, SyncTx, Tx

MARKS = Path(os.environ.get("JF_MARKS", "."))

app = App(os.environ["JF_DB"], lease=timedelta(seconds=float(os.environ.get("JF_LEASE", "2"))))


def _insert(dialect: str) -> str:
    p = "%s" if dialect == "postgresql" else "?"
    return f"INSERT INTO ledger (job_id, member_id, points) VALUES ({p}, {p}, {p})"


def _mark(job: Job[Any], what: str) -> None:
    (MARKS / f"{job.job_id}.{what}.{job.attempt}").write_text(str(os.getpid()))


def _after_effect(job: Job[dict[str, Any]]) -> float:
    """Raise for the failing modes; return how long to sleep (0: none)."""
    mode = job.payload.get("mode")
    _mark(job, "started")
    if mode == "retry-once" and job.attempt == 1:
        raise Retry(delay=0.05, reason="once more")
    if mode == "dead":
        raise NonRetryableError("this job can never succeed")
    if mode == "sleep" and job.attempt == 1:
        return float(job.payload.get("seconds", 1))
    return 0.0


@app.consumer("work")
async def work(job: Job[dict[str, Any]], tx: Tx) -> None:
    await tx.execute(_insert(tx.dialect), (job.job_id, "async", job.attempt))
    seconds = _after_effect(job)
    if job.payload.get("mode") == "block-loop":
        time.sleep(float(job.payload.get("seconds", 1)))  # noqa: ASYNC251 - on purpose
        _mark(job, "woke")
    elif seconds:
        await asyncio.sleep(seconds)


@app.consumer("work.sync")
def work_sync(job: Job[dict[str, Any]], tx: SyncTx) -> None:
    tx.execute(_insert(tx.dialect), (job.job_id, "sync", job.attempt))
    seconds = _after_effect(job)
    if seconds:
        time.sleep(seconds)
        _mark(job, "woke")
