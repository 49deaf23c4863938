"""Calls in doubt made the way a handler makes them: a worker runs jobs whose step's answer
is lost (or whose request never arrives), with neither reconcile nor repeat, so each job is
parked and its call waits for an operator (what the operator-side tests start from)."""

from __future__ import annotations

import collections
from datetime import timedelta
from typing import Any

from jobfence import App, CallInDoubt, CallRetry, Job, RetryPolicy, Tx
from jobfence.calls import default_key

from ..helpers import RunningWorker, eventually, query, table

FAST = CallRetry(attempts=2, initial=0.01, multiplier=2.0, maximum=0.05)
QUICK = RetryPolicy(
    max_retries=3,
    base=timedelta(milliseconds=50),
    cap=timedelta(milliseconds=200),
    justification="tests: retries within a second",
)
QUEUE = "orders"
STEP = "erp.create"


class Downstream:
    """Counts its effects per key and does not deduplicate. A key in ``lose`` is applied
    and its answer lost; in ``drop``, the request is lost before it is applied; either way
    the caller cannot know (in doubt). Later sends answer."""

    def __init__(self) -> None:
        self.effects: collections.Counter[str] = collections.Counter()
        self.sends: collections.Counter[str] = collections.Counter()
        self.lose: set[str] = set()
        self.drop: set[str] = set()

    async def send(self, key: str) -> dict[str, Any]:
        self.sends[key] += 1
        if key in self.drop:
            self.drop.discard(key)
            raise CallInDoubt("read timeout: no answer within 10 s")
        self.effects[key] += 1
        if key in self.lose:
            self.lose.discard(key)
            raise CallInDoubt("read timeout after the request was sent")
        return {"reference": f"PO-{sum(self.effects.values())}"}


class Orders:
    """An app whose ``orders`` consumer makes one recorded call per job and keeps what the
    step returned (``results``, by job_id)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.downstream = Downstream()
        self.results: dict[str, Any] = {}
        self.app = App(url)

        @self.app.consumer(QUEUE, retry=QUICK)
        async def handle(job: Job[Any], tx: Tx) -> None:
            self.results[job.job_id] = await job.call(STEP, self.downstream.send, retry=FAST)

    async def park(self, jobs: dict[str, str | None], *, lost: bool = True) -> None:
        """Enqueue ``jobs`` (job_id → partner) and run them until each is parked; ``lost``:
        the downstream applied each request (else it never got it)."""
        for job_id, partner in jobs.items():
            key = default_key(job_id, STEP)
            (self.downstream.lose if lost else self.downstream.drop).add(key)
            payload: dict[str, Any] = {"order": job_id}
            if partner is not None:
                payload["partner_id"] = partner
            await self.app.enqueue(QUEUE, payload, job_id=job_id)
        await self.run(lambda: _letters_at_least(self.url, len(jobs)), "the parked jobs")

    async def run(self, check: Any, what: str) -> None:
        async with RunningWorker(self.app, poll_interval=0.05, concurrency=2):
            await eventually(check, timeout=30, what=what)


async def _letters_at_least(url: str, n: int) -> bool:
    rows = await query(url, f"SELECT count(*) FROM {table(url, 'dead_letters')}")
    return int(rows[0][0]) >= n
