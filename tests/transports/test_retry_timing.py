"""Retries run at their due time: never before, and not much after (issue 10 §3.3).

RabbitMQ's delay buckets round *up* (a pure-function test over many delays), and every
transport runs a short retry within a stated bound of the due time stored in the job's
history. Before the fix, Redis promoted due retries only before its next blocking read (up
to 1 s), so short retries ran up to ~0.9 s late and their intervals stopped growing.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from fractions import Fraction
from typing import Any

import pytest

from jobfence import Job, RetryPolicy, TemporaryError, Tx
from jobfence.transports.rabbitmq import DELAY_STEPS_PER_DOUBLING, delay_bucket

from ..contract.support import KINDS, Target, cleanup, make_target
from ..helpers import RunningWorker, eventually

#: the most a retry may start after its due time in these tests: a loaded CI machine can
#: stall a process for a few hundred ms; the Redis adapter used to be up to ~0.9 s late
LATENESS_BOUND = 0.5
#: clock precision of the stored due time (SQLite keeps milliseconds)
EARLY_TOLERANCE = 0.002
STEP = 2 ** (1 / DELAY_STEPS_PER_DOUBLING)


def _delays() -> list[float]:
    """Delays in seconds: the bucket edges and their neighbours, a dense logarithmic sweep
    from 0.1 ms to 2 h, and random ones (seeded)."""
    found: set[float] = {1e-9, 0.0004, 0.0005, 0.001, 0.0015, 0.999, 1.0, 1.005, 30.0, 3600.0}
    for k in range(0, 16 * 23):
        edge = 2 ** (k / DELAY_STEPS_PER_DOUBLING) / 1000
        found.update({edge, math.nextafter(edge, 0), math.nextafter(edge, 1), edge * 1.0001})
    found.update(10 ** (e / 1000) for e in range(-4000, 3860))
    rng = random.Random(10)
    found.update(rng.uniform(0, 7200) for _ in range(20_000))
    found.update(rng.uniform(0, 2) for _ in range(20_000))
    return sorted(found)


def test_rabbitmq_delay_buckets_are_never_shorter_than_the_delay() -> None:
    """For ~60 000 delays the bucket's TTL (whole ms) is at least the delay, exactly
    (compared as fractions, no float slack), and at most one step of 16 per doubling
    (2^(1/16) ≈ 4.4 %) plus 3 ms above it; a zero delay needs no bucket."""
    assert delay_bucket(0) == 0
    assert delay_bucket(0.0) == 0
    for seconds in _delays():
        ms = delay_bucket(seconds)
        wanted = Fraction(seconds) * 1000
        assert ms >= wanted, (seconds, ms)
        assert ms <= wanted * Fraction(STEP) + 3, (seconds, ms)


def test_rabbitmq_delay_buckets_stay_few() -> None:
    """Rounding up keeps the set of delay queues bounded: the default policy's delays
    (15 s to 1 h, any jitter) use at most 16 buckets per doubling."""
    buckets = {delay_bucket(s / 10) for s in range(150, 36_001)}
    assert len(buckets) <= DELAY_STEPS_PER_DOUBLING * math.log2(3600 / 15) + 2


@pytest.fixture(params=KINDS)
def target(request: pytest.FixtureRequest) -> Iterator[Target]:
    made = make_target(str(request.param), request)
    yield made
    asyncio.run(cleanup(made))


SHORT = RetryPolicy(
    max_retries=4,
    base=timedelta(seconds=0.1),
    cap=timedelta(seconds=0.8),
    justification="test: short retries, to measure when each one runs",
)


def _at(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


async def test_a_short_retry_runs_within_a_bound_of_its_due_time(target: Target) -> None:
    """A job failing 4 times with retries due after 0.05–0.8 s: each retry starts no
    earlier than the due time stored in its history (``retry_at``) and at most
    LATENESS_BOUND after it, and the intervals keep growing (SPEC R1)."""
    app = target.app()
    starts: dict[int, float] = {}
    due: dict[int, float] = {}

    @app.consumer(target.queue, retry=SHORT)
    async def handle(job: Job[Any], tx: Tx) -> None:
        starts[job.attempt] = time.time()
        for record in job.history:
            if record.retry_at:
                due[record.attempt + 1] = _at(record.retry_at)
        if job.attempt <= SHORT.max_retries:
            raise TemporaryError(f"attempt {job.attempt} fails on purpose")

    async with app:
        await app.enqueue(target.queue, {"n": 1}, job_id="timed-1")
        async with RunningWorker(app, concurrency=2, poll_interval=2.0):
            await eventually(lambda: len(starts) == 5, timeout=60, what="5 attempts")
    assert sorted(due) == [2, 3, 4, 5]
    lateness = {n: round(starts[n] - due[n], 4) for n in due}
    assert all(late >= -EARLY_TOLERANCE for late in lateness.values()), lateness
    assert all(late <= LATENESS_BOUND for late in lateness.values()), lateness
    gaps = [starts[n + 1] - starts[n] for n in range(1, 5)]
    assert gaps[-1] > gaps[0], (gaps, lateness)
