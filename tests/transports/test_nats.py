"""NATS JetStream adapter: progress acks for long handlers, MaxDeliver into dead letters."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from jobfence import Job, RetryPolicy, Tx
from jobfence.core.jobs import Delivery
from jobfence.review import deadletters
from jobfence.review.letters import get_letter
from jobfence.transports.nats import NatsTransport

from ..contract.support import Target, effects, remaining, with_option
from ..helpers import RunningWorker, eventually

ONE_RETRY = RetryPolicy(
    max_retries=1,
    base=timedelta(seconds=0.05),
    cap=timedelta(seconds=1),
    justification="test: a job past JetStream's MaxDeliver must go to dead letters",
)


async def test_a_handler_four_times_longer_than_ack_wait_is_not_redelivered(nats: Target) -> None:
    """AckWait 0.5 s, handler 2 s: the worker's progress acks (+WPI) keep the message
    its own; one delivery, attempt 1, one effect, acked."""
    app = nats.app(lease=0.5)
    calls: list[int] = []

    @app.consumer(nats.queue)
    async def handle(job: Job[Any], tx: Tx) -> None:
        calls.append(job.attempt)
        await asyncio.sleep(2.0)
        p = "%s"
        await tx.execute(
            f"INSERT INTO effects (job_id, attempt, pid) VALUES ({p}, {p}, {p})",
            (job.job_id, job.attempt, "in-process"),
        )

    async with app:
        await app.enqueue(nats.queue, {"n": 1}, job_id="long-1")
        async with RunningWorker(app, concurrency=4, poll_interval=0.2) as w:
            await eventually(lambda: w.stats.handled == 1, what="handled")
            await asyncio.sleep(1.0)  # a redelivery would show up here (AckWait 0.5 s)
    assert calls == [1]
    assert w.stats.handled == 1
    assert await effects(nats.database_url) == [("long-1", 1)]
    assert await remaining(nats) == 0


async def test_a_message_past_max_deliver_ends_in_dead_letters(nats: Target) -> None:
    """max_deliver=2: after two deliveries without an answer JetStream stops; its
    MAX_DELIVERIES advisory is captured, and the worker ends the message in jobfence's dead
    letters with 3 attempts; the message is then deleted from its stream."""
    url = with_option(nats.transport_url or "", "max_deliver", 2)
    app = nats.app(lease=0.4, transport_url=url)
    called: list[int] = []

    @app.consumer(nats.queue, retry=ONE_RETRY)
    async def handle(job: Job[Any], tx: Tx) -> None:
        called.append(job.attempt)

    async with app:
        await app.enqueue(nats.queue, {"n": 1}, job_id="maxdel-1")
        transport = app.transport
        assert isinstance(transport, NatsTransport)
        seen: list[Delivery] = []
        for expected in (1, 2):

            async def fetched(n: int = expected) -> bool:
                seen.extend(await transport.fetch([nats.queue], 1, 0.3))
                return len(seen) == n

            await eventually(fetched, what=f"delivery {expected}")
        assert [d.attempt for d in seen] == [1, 2]
        async with RunningWorker(app, poll_interval=0.2) as w:
            letters = await eventually(lambda: deadletters.letters(app.db), what="dead letter")
            await eventually(lambda: w.stats.handled == 1, what="handled")
        letter = await get_letter(app.db, letters[0].id)
    assert called == []
    assert letter is not None
    assert (letter.job_id, letter.attempts, letter.error_code) == (
        "maxdel-1",
        3,
        "ATTEMPTS_EXHAUSTED",
    )
    assert [h.attempt for h in letter.history] == [1, 2, 3]
    await eventually(lambda: _empty(nats), what="message deleted from its stream")


async def _empty(target: Target) -> bool:
    return await remaining(target) == 0
