"""``Transport.defer``: flow control's "not now" (issue 26) on every transport.

A deferred delivery goes back to its queue and comes back after the delay — never before —
with the same attempt number and the same history: deferring is not an attempt. The brokers'
own redelivery limits (RabbitMQ's delivery limit, JetStream's MaxDeliver, Pub/Sub's
max_delivery_attempts) are set as low as they go here, so a deferral that counted as a
delivery there would end the job in dead letters within the 20 deferrals of the test.
A worker killed (``kill -9``) inside ``defer`` loses nothing: the job still runs, once.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest

from jobfence import App, Job, RetryPolicy, Tx
from jobfence.core.jobs import Delivery
from jobfence.errors import Category
from jobfence.review import deadletters
from jobfence.transports import Transport

from ..contract.support import (
    KINDS,
    REPO,
    Target,
    cleanup,
    effects,
    make_target,
    remaining,
    with_option,
)
from ..helpers import RunningWorker, eventually

#: the clocks involved keep milliseconds (SQLite, Redis) or round to them (RabbitMQ's TTLs)
EARLY_TOLERANCE = 0.005

POLICY = RetryPolicy(
    max_retries=3,
    base=timedelta(seconds=0.05),
    cap=timedelta(seconds=0.1),
    justification="test: a few short retries; deferrals must not use them up",
)

#: the lowest redelivery limit each broker takes: a deferral counted there dead-letters fast
LOW_LIMITS = {
    "rabbitmq": ("delivery_limit", 1),
    "nats": ("max_deliver", 2),
    "pubsub": ("max_delivery_attempts", 5),
}


@pytest.fixture(params=KINDS)
def target(request: pytest.FixtureRequest) -> Iterator[Target]:
    made = make_target(str(request.param), request)
    option = LOW_LIMITS.get(made.kind)
    if option is not None and made.transport_url is not None:
        made.transport_url = with_option(made.transport_url, *option)
    yield made
    asyncio.run(cleanup(made))


def _app(target: Target, *, lease: float = 5.0) -> App:
    return target.app(lease=lease)


async def _next(transport: Transport, queue: str, what: str, timeout: float = 30) -> Delivery:
    got: list[Delivery] = []

    async def fetched() -> bool:
        got.extend(await transport.fetch([queue], 1, 0.1))
        return bool(got)

    await eventually(fetched, timeout=timeout, interval=0.001, what=what)
    assert len(got) == 1, got
    return got[0]


def _at(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def _past(delivery: Delivery) -> list[tuple[int, str, str]]:
    return [(h.attempt, h.category, h.error) for h in delivery.history]


async def test_a_deferred_job_comes_back_after_its_delay_with_its_attempt_and_history(
    target: Target,
) -> None:
    """A job fails once (a retry: attempt 2 next, one entry of history), then is deferred
    for 0.6 s: it is not delivered again before 0.6 s have passed since ``defer`` was
    called, and it then comes back as attempt 2 with the same one-entry history."""
    app = _app(target)
    async with app:
        await app.enqueue(target.queue, {"n": 1}, job_id="defer-1")
        transport = app.transport
        first = await _next(transport, target.queue, "first delivery")
        assert (first.job_id, first.attempt, first.history) == ("defer-1", 1, [])
        await transport.retry(first, timedelta(0), Category.TECHNICAL_ERROR, "Boom: once")
        second = await _next(transport, target.queue, "the retry")
        assert (second.attempt, _past(second)) == (2, [(1, "TECHNICAL_ERROR", "Boom: once")])

        delay = 0.6
        called = time.monotonic()
        await transport.defer(second, timedelta(seconds=delay))
        back = await _next(transport, target.queue, "the deferred job")
        waited = time.monotonic() - called
        assert waited >= delay - EARLY_TOLERANCE, waited
        assert (back.job_id, back.attempt, back.payload) == ("defer-1", 2, second.payload)
        assert _past(back) == _past(second)
        await transport.ack(back)
        await eventually(lambda: _left(target, 0), what="queue empty")


async def test_a_deferral_with_a_note_adds_it_to_the_history(target: Target) -> None:
    """``note`` (a handler's back-off gives one) adds the deferral to the history, as the
    database queue records it: category DEFERRED, the note, the attempts used so far, when
    it is due; the attempt is still refunded."""
    app = _app(target)
    async with app:
        await app.enqueue(target.queue, {"n": 1}, job_id="noted-1")
        transport = app.transport
        first = await _next(transport, target.queue, "first delivery")
        await transport.defer(first, timedelta(seconds=0.2), note="back-off: partner 429")
        back = await _next(transport, target.queue, "the deferred job")
        assert (back.attempt, _past(back)) == (1, [(0, "DEFERRED", "back-off: partner 429")])
        record = back.history[0]
        assert record.retry_at is not None
        due = (_at(record.retry_at) - _at(record.at)).total_seconds()
        assert 0.199 <= due <= 0.201, record
        await transport.ack(back)


async def test_twenty_deferrals_never_use_an_attempt_or_dead_letter_a_job(target: Target) -> None:
    """The same job deferred 20 times in a row (the broker's redelivery limit is at its
    lowest) keeps attempt 1 and an empty history; a worker then runs it once, as attempt
    1, and no dead letter is written."""
    app = _app(target)
    ran: list[int] = []

    @app.consumer(target.queue, retry=POLICY)
    async def handle(job: Job[Any], tx: Tx) -> None:
        ran.append(job.attempt)

    async with app:
        await app.enqueue(target.queue, {"n": 1}, job_id="defer-20")
        transport = app.transport
        for n in range(20):
            delivery = await _next(transport, target.queue, f"delivery {n + 1}")
            assert (delivery.job_id, delivery.attempt, delivery.history) == ("defer-20", 1, []), n
            await transport.defer(delivery, timedelta(seconds=0.02))
        async with RunningWorker(app, poll_interval=0.1) as w:
            await eventually(lambda: w.stats.handled >= 1, timeout=30, what="handled")
        assert ran == [1]
        assert await deadletters.letters(app.db) == []
    await eventually(lambda: _left(target, 0), what="queue empty")


async def _left(target: Target, expected: int) -> bool:
    return await remaining(target) == expected


# -- kill -9 inside defer -----------------------------------------------------------------

#: A process that takes one delivery of the queue and is killed (SIGKILL, by itself) inside
#: ``defer``: after the refunded copy is published and before the old delivery is answered.
VICTIM = """
import asyncio, os, signal, sys
from datetime import timedelta
from jobfence.transports import broker_from_url

async def die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)

async def main():
    url, queue, kind = sys.argv[1:4]
    transport = broker_from_url(url, lease=timedelta(seconds=2), worker_id="victim")
    await transport.open()
    got = []
    while not got:
        got = await transport.fetch([queue], 1, 1.0)
    if kind == "rabbitmq":
        transport._settle = die          # the old message's ack
    elif kind == "pubsub":
        transport.ack = die              # the old message's ack
    elif kind == "nats":
        from nats.aio.msg import Msg
        Msg.nak = die                    # the nak that carries the deferral (room left)
        transport.ack = die              # the old message's ack (a copy was published)
    print("deferring", flush=True)
    await transport.defer(got[0], timedelta(seconds=0.3))
    print("survived", flush=True)

asyncio.run(main())
"""


@pytest.fixture(params=["rabbitmq", "nats-copy", "nats-nak", "pubsub"])
def two_step(request: pytest.FixtureRequest) -> Iterator[Target]:
    """A broker whose defer takes two steps. NATS twice: with MaxDeliver at its lowest the
    deferral is a copy and an ack; with the default (20) it is a nak."""
    kind, _, how = str(request.param).partition("-")
    made = make_target(kind, request)
    assert made.transport_url is not None
    if how != "nak":
        made.transport_url = with_option(made.transport_url, *LOW_LIMITS[made.kind])
    yield made
    asyncio.run(cleanup(made))


async def test_a_worker_killed_inside_defer_loses_nothing(two_step: Target) -> None:
    """The brokers whose defer is two steps (publish a copy, then answer the old delivery;
    NATS: save the refund, then nak): a worker SIGKILLed between them leaves the job on
    its queue — the old delivery comes back when the broker notices the dead worker, and
    where a copy was published both run through the fence: the handler's effect happens
    exactly once and nothing is dead-lettered. (Redis defers in one script and the
    database queue in one statement: there is no step between to be killed in.)"""
    made = two_step
    assert made.transport_url is not None
    app = made.app(lease=2.0)
    ran: list[int] = []

    @app.consumer(made.queue, retry=POLICY)
    async def handle(job: Job[Any], tx: Tx) -> None:
        await tx.execute(
            "INSERT INTO effects (job_id, attempt) VALUES (%s, %s)", (job.job_id, job.attempt)
        )
        ran.append(job.attempt)

    async with app:
        await app.enqueue(made.queue, {"n": 1}, job_id="killed-in-defer")
        proc = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-c", VICTIM, made.transport_url, made.queue, made.kind],
            cwd=REPO, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        text = proc.stdout + proc.stderr
        assert proc.returncode == -signal.SIGKILL, text
        assert "deferring" in text, text
        assert "survived" not in text, text
        async with RunningWorker(app, poll_interval=0.1) as w:
            await eventually(lambda: w.stats.handled >= 1, timeout=60, what="handled")
            await eventually(lambda: _left(made, 0), timeout=60, what="queue empty")
        assert await deadletters.letters(app.db) == []
    assert [job for job, _ in await effects(made.database_url)] == ["killed-in-defer"]
    assert len(ran) == 1
