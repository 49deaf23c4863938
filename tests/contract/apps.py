"""The worker app of the contract suite's subprocess tests (``jobfence worker``).

Configured by environment: JF_DB (fence and dead letters), JF_TRANSPORT (queue URL, or
empty for the database queue), JF_QUEUE, JF_LEASE (seconds), JF_MARKS (a folder for
marker files). The effect is one ``effects`` row per processed job. Payload modes:
``hang`` (write the effect, then hang inside the transaction on attempt 1), ``sleep``
(hold the transaction ``seconds``), ``crash`` (an unexpected KeyError deep in a helper: a
TECHNICAL_ERROR, retried a little), ``reject`` (a BusinessError: dead-lettered at once),
anything else: just the effect.
"""

from __future__ import annotations

import asyncio
import os
from datetime import timedelta
from pathlib import Path
from typing import Any

from jobfence import App, BusinessError, Job, RetryPolicy, Tx

MARKS = Path(os.environ.get("JF_MARKS", "."))
QUEUE = os.environ.get("JF_QUEUE", "contract")

app = App(
    os.environ.get("JF_DB", "sqlite:///contract.db"),
    transport=os.environ.get("JF_TRANSPORT") or None,
    lease=timedelta(seconds=float(os.environ.get("JF_LEASE", "2"))),
)


def mark(job: Job[Any], what: str) -> None:
    (MARKS / f"{job.job_id}.{what}.{job.attempt}").write_text(str(os.getpid()))


def _lookup_member(members: dict[str, Any], member: str) -> Any:
    return members[member]  # the crash mode's KeyError comes from here


@app.consumer(
    QUEUE,
    retry=RetryPolicy(
        base=timedelta(seconds=0.2),
        cap=timedelta(seconds=2),
        justification="contract tests: a failed job is retried within seconds",
    ),
)
async def handle(job: Job[dict[str, Any]], tx: Tx) -> None:
    p = "%s" if tx.dialect == "postgresql" else "?"
    await tx.execute(
        f"INSERT INTO effects (job_id, attempt, pid) VALUES ({p}, {p}, {p})",
        (job.job_id, job.attempt, str(os.getpid())),
    )
    mode = job.payload.get("mode") if isinstance(job.payload, dict) else None
    if mode in ("hang", "sleep"):
        mark(job, "started")
    if mode == "hang" and job.attempt == 1:
        await asyncio.sleep(3600)
    if mode == "sleep":
        await asyncio.sleep(float(job.payload.get("seconds", 1)))
    if mode == "crash":
        _lookup_member({}, f"member-of-{job.job_id}")
    if mode == "reject":
        raise BusinessError(f"order {job.job_id} was already shipped", code="SHIPPED")
