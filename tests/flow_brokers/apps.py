"""The worker app of the broker flow-control proofs (``jobfence worker``, one per process).

Configured by environment: JF_DB (the fence's database, PostgreSQL), JF_TRANSPORT (the
broker), JF_QUEUE, JF_LEASE (seconds), JF_CONCURRENCY (per key; empty: none), JF_RATE
(``N/seconds`` per key; empty: none), JF_MARKS (a folder). The limit's key is the payload's
``key``. Each job that runs to its end leaves one ``flow_runs`` row, written in its work
transaction: when its handler started and ended by the database's clock (one clock for every
process), its attempt, how many of its earlier deliveries were lost with a killed worker (its
history says so; each of those was an attempt, SPEC R1) and the worker's pid.

Payload ``mode``: ``hang`` (on attempt 1: a marker ``<job_id>.hang`` with the pid and the
start time, then hang: a worker to kill while it holds a slot), ``backoff`` (the first time:
raise BackOff for ``seconds``), else sleep ``seconds``. Every deferral is appended to
``deferred.<pid>`` by the Observer hook.
"""

from __future__ import annotations

import asyncio
import os
from datetime import timedelta
from pathlib import Path
from typing import Any

from jobfence import App, BackOff, Job, Limit, Observer, Rate, RetryPolicy, Tx
from jobfence.core.jobs import Delivery

MARKS = Path(os.environ.get("JF_MARKS", "."))
QUEUE = os.environ.get("JF_QUEUE", "flow")


def _limit() -> Limit:
    concurrency = os.environ.get("JF_CONCURRENCY") or None
    rate = os.environ.get("JF_RATE") or None
    count, _, per = (rate or "").partition("/")
    return Limit(
        concurrency=int(concurrency) if concurrency else None,
        rate=Rate(int(count), per=float(per)) if rate else None,
        key=lambda p: p["key"],
    )


class Deferrals(Observer):
    def job_deferred(
        self, delivery: Delivery, consumer: str, reason: str, key: str, delay: timedelta
    ) -> None:
        with open(MARKS / f"deferred.{os.getpid()}", "a") as out:
            out.write(f"{delivery.job_id} {delivery.attempt} {reason} {key}\n")


app = App(
    os.environ.get("JF_DB", "postgresql://postgres@127.0.0.1:5432/test"),
    transport=os.environ.get("JF_TRANSPORT") or None,
    lease=timedelta(seconds=float(os.environ.get("JF_LEASE", "3"))),
    observers=[Deferrals()],
)


@app.consumer(
    QUEUE,
    limit=_limit(),
    retry=RetryPolicy(
        base=timedelta(seconds=0.2),
        cap=timedelta(seconds=1),
        justification="flow proofs: no job is expected to fail",
    ),
)
async def handle(job: Job[dict[str, Any]], tx: Tx) -> None:
    row = await tx.fetchone("SELECT clock_timestamp()")
    assert row is not None
    started = row[0]
    mode = job.payload.get("mode")
    if mode == "hang" and job.attempt == 1:
        marker = MARKS / f"{job.job_id}.hang"
        marker.write_text(f"{os.getpid()} {started.isoformat()}")
        await asyncio.sleep(3600)
    if mode == "backoff" and job.attempt == 1 and not job.history:
        raise BackOff(seconds=float(job.payload["seconds"]), reason="partner said 429")
    await asyncio.sleep(float(job.payload.get("seconds", 0)))
    lost = sum(1 for h in job.history if h.error.startswith("delivery lost"))
    await tx.execute(
        "INSERT INTO flow_runs (job_id, key, attempt, lost, pid, started, ended) "
        "VALUES (%s, %s, %s, %s, %s, %s, clock_timestamp())",
        (job.job_id, job.payload["key"], job.attempt, lost, os.getpid(), started),
    )
