"""A worker app for subprocess tests: it can stop dead at chosen points so a test can kill it.

Configured by environment: JF_DB (database URL), JF_TRANSPORT (optional queue URL),
JF_LEASE (seconds), JF_MARKS (a folder where it drops marker files).
Payload ``{"mode": …, "seconds": …}``:
- ``hang-in-tx``: write the effect, then hang inside the open transaction (attempt 1 only);
- ``hang-after-commit``: commit, then hang before the ack (attempt 1 only);
- ``sleep``: write the effect, sleep ``seconds`` inside the transaction;
- anything else: write the effect.
"""

from __future__ import annotations

import asyncio
import os
from datetime import timedelta
from pathlib import Path
from typing import Any

from jobfence import App, Job, Observer, Tx

MARKS = Path(os.environ.get("JF_MARKS", "."))


def mark(job: Job[Any], what: str) -> None:
    (MARKS / f"{job.job_id}.{what}.{job.attempt}").write_text(str(os.getpid()))


class HangAfterCommit(Observer):
    async def after_commit(self, job: Job[Any]) -> None:
        if job.payload.get("mode") == "hang-after-commit" and job.attempt == 1:
            mark(job, "committed")
            await asyncio.sleep(3600)


app = App(
    os.environ["JF_DB"],
    transport=os.environ.get("JF_TRANSPORT") or None,
    lease=timedelta(seconds=float(os.environ.get("JF_LEASE", "2"))),
    observers=[HangAfterCommit()],
)


@app.consumer("crash")
async def handle(job: Job[dict[str, Any]], tx: Tx) -> None:
    p = "%s" if tx.dialect == "postgresql" else "?"
    await tx.execute(
        f"INSERT INTO ledger (job_id, member_id, points) VALUES ({p}, {p}, {p})",
        (job.job_id, str(os.getpid()), job.attempt),
    )
    mode = job.payload.get("mode")
    mark(job, "started")
    if mode == "hang-in-tx" and job.attempt == 1:
        mark(job, "in-tx")
        await asyncio.sleep(3600)
    if mode == "sleep":
        await asyncio.sleep(float(job.payload.get("seconds", 1)))
