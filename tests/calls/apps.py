"""The worker app of the call ledger's fault suite (``jobfence worker tests.calls.apps:app``).

Configured by environment: JF_DB (fence, dead letters, the job's own effect), JF_TRANSPORT
(queue URL, empty: the database queue), JF_QUEUE, JF_LEASE (seconds), JF_STUB (the
downstream's base URL, tests/calls/stub.py), JF_RECONCILE ("1": look calls in doubt up
downstream), JF_MARKS (a folder for marker files).

Each job's payload plans what goes wrong, once per job (a marker file remembers it across
the worker processes): ``kill`` is where the worker kills itself with SIGKILL — ``before``
the call, ``in_send`` (the intent is committed, the request not sent), ``in_flight`` (the
downstream applies the request and kills the worker before answering), ``after`` (the answer
is recorded, the job's transaction not committed); ``fault`` is what the downstream does to
the first request (see the stub). The job's own database effect is one ``effects`` row.
"""

from __future__ import annotations

import os
import signal
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx

from jobfence import App, CallRetry, Job, RetryPolicy, Tx
from jobfence.calls import check

MARKS = Path(os.environ.get("JF_MARKS", "."))
QUEUE = os.environ.get("JF_QUEUE", "calls")
STUB = os.environ.get("JF_STUB", "http://127.0.0.1:9")
RECONCILE = os.environ.get("JF_RECONCILE") == "1"
STEP = "stub.create"
#: the client gives up on an answer well before the stub's slow one (SLOW = 3 s) comes
CLIENT_TIMEOUT = 1.0

app = App(
    os.environ.get("JF_DB", "sqlite:///calls.db"),
    transport=os.environ.get("JF_TRANSPORT") or None,
    lease=timedelta(seconds=float(os.environ.get("JF_LEASE", "2"))),
)

_client: httpx.AsyncClient | None = None


def client() -> httpx.AsyncClient:
    global _client
    if _client is None:
        _client = httpx.AsyncClient(timeout=CLIENT_TIMEOUT)
    return _client


def once(job: Job[Any], what: str) -> bool:
    """True the first time ``what`` happens to this job, in any worker process."""
    try:
        fd = os.open(MARKS / f"{job.job_id}.{what}", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.close(fd)
    return True


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


async def lookup(key: str) -> dict[str, Any] | None:
    answer = await client().get(f"{STUB}/orders/{key}")
    if answer.status_code == 404:
        return None
    answer.raise_for_status()
    return {"reference": answer.json()["id"]}


@app.consumer(
    QUEUE,
    retry=RetryPolicy(
        max_retries=40,
        base=timedelta(seconds=0.2),
        cap=timedelta(seconds=1),
        justification="fault suite: kills and faults are retried within seconds, many times",
    ),
)
async def handle(job: Job[dict[str, Any]], tx: Tx) -> None:
    plan = job.payload
    kill = plan.get("kill")
    if kill == "before" and once(job, "before"):
        die()

    async def send(key: str) -> dict[str, Any]:
        headers = {"Idempotency-Key": key, "X-Worker-Pid": str(os.getpid())}
        if kill == "in_send" and once(job, "in_send"):
            die()
        if kill == "in_flight" and once(job, "in_flight"):
            headers["X-Fault"] = "kill"
        elif plan.get("fault") and once(job, "fault"):
            headers["X-Fault"] = plan["fault"]
        answer = check(
            await client().post(f"{STUB}/orders", json={"job_id": job.job_id}, headers=headers)
        )
        return {"reference": answer.json()["id"]}

    result = await job.call(
        STEP,
        send,
        reconcile=lookup if RECONCILE else None,
        retry=CallRetry(attempts=3, initial=0.1, multiplier=2.0, maximum=0.5),
    )
    if kill == "after" and once(job, "after"):
        die()
    p = "%s" if tx.dialect == "postgresql" else "?"
    await tx.execute(
        f"INSERT INTO effects (job_id, attempt, pid) VALUES ({p}, {p}, {p})",
        (job.job_id, job.attempt, str(result["reference"])),
    )
