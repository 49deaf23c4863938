"""A worker app for flow-control subprocess tests (tests/flow/test_proof.py).

Environment: JF_DB (database URL), JF_LEASE (seconds), JF_MARKS (a folder for marker files),
JF_CONCURRENCY / JF_RATE / JF_PER (the Limit of queue ``flow``, per partner; empty: none).
Each run of a job writes one row into ``flow_runs`` in the job's transaction (so only runs
that committed are there, each at most once): its job, partner, attempt, worker pid, and its
start and end by the database's clock. Payload ``{"partner_id": …, "seconds": …, "mode": …}``:
- ``hang``: on attempt 1, mark ``<job_id>.hang`` and hang (the test kills the worker);
- ``backoff``: on its first run (no ``<job_id>.backoff`` mark yet), mark it and raise
  ``BackOff(seconds)``;
- otherwise: sleep ``seconds`` inside the transaction.

JF_MEET=N (optional): a worker's first job waits, inside its transaction, until N worker
processes have each started one (marker ``meet.<pid>``; at most 60 s): while the first ones
wait holding all of their slots, only a worker with a free slot can claim the rest — so
every one of the N takes part, whatever the machine's scheduler favours.
"""

from __future__ import annotations

import asyncio
import os
from datetime import timedelta
from pathlib import Path
from typing import Any

from jobfence import App, BackOff, Job, Limit, Rate, Tx

MARKS = Path(os.environ.get("JF_MARKS", "."))

NOW = {
    "postgresql": "clock_timestamp()",
    "sqlite": "((julianday('now') - 2440587.5) * 86400.0)",
}


def _limit() -> Limit:
    concurrency = os.environ.get("JF_CONCURRENCY") or None
    rate = os.environ.get("JF_RATE") or None
    return Limit(
        concurrency=int(concurrency) if concurrency else None,
        rate=Rate(int(rate), per=float(os.environ.get("JF_PER", "1"))) if rate else None,
        key="partner",
    )


MEET = int(os.environ.get("JF_MEET") or 0)


async def _meet() -> None:
    """Wait until ``MEET`` worker processes each started a job (see the module's doc)."""
    (MARKS / f"meet.{os.getpid()}").touch()
    deadline = asyncio.get_running_loop().time() + 60
    while len(await asyncio.to_thread(lambda: list(MARKS.glob("meet.*")))) < MEET:
        if asyncio.get_running_loop().time() > deadline:
            return  # the test's "every worker took part" assertion says what went wrong
        await asyncio.sleep(0.02)


app = App(os.environ["JF_DB"], lease=timedelta(seconds=float(os.environ.get("JF_LEASE", "30"))))


@app.consumer("flow", limit=_limit())
async def handle(job: Job[dict[str, Any]], tx: Tx) -> None:
    if MEET:
        await _meet()
    mode = job.payload.get("mode")
    seconds = float(job.payload.get("seconds", 0))
    if mode == "backoff":
        mark = MARKS / f"{job.job_id}.backoff"
        if not mark.exists():
            mark.write_text(str(os.getpid()))
            raise BackOff(seconds, reason="partner 429")
    p = "%s" if tx.dialect == "postgresql" else "?"
    now = NOW[tx.dialect]
    started = (await tx.fetchone(f"SELECT {now}"))[0]  # type: ignore[index]
    if mode == "hang" and job.attempt == 1:
        (MARKS / f"{job.job_id}.hang").write_text(str(os.getpid()))
        await asyncio.sleep(3600)
    elif mode != "backoff":
        await asyncio.sleep(seconds)
    await tx.execute(
        f"INSERT INTO flow_runs (job_id, partner, attempt, pid, started_at, ended_at) "
        f"VALUES ({p}, {p}, {p}, {p}, {p}, {now})",
        (job.job_id, job.payload["partner_id"], job.attempt, os.getpid(), started),
    )
