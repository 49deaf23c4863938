"""Job priorities on the brokers (issue 26 §3): RabbitMQ's priority lanes (``max_priority``)
deliver the highest priority first, with a prefetch of 1, keep a retry's priority, and do
not starve a low priority; a broker without priorities refuses a job that has one, in one
line, and publishes nothing."""

from __future__ import annotations

from datetime import timedelta

import pytest

from jobfence import EnqueueError
from jobfence.core.jobs import Delivery
from jobfence.errors import Category
from jobfence.transports.rabbitmq import AGE_ROUND_EVERY, RabbitMQTransport, lane_name

from ..contract.support import Target, remaining, with_option
from ..helpers import eventually


def _lanes(target: Target, max_priority: int = 9) -> str:
    url = with_option(target.transport_url or "", "prefetch", 1)
    return with_option(url, "max_priority", max_priority)


async def _held(transport: RabbitMQTransport, queue: str, count: int) -> None:
    """Consume ``queue`` and wait until the worker holds ``count`` messages (one per lane with
    a prefetch of 1), so that the order of a fetch does not depend on arrival races."""
    await transport._consume([queue])
    await eventually(lambda: len(transport._buffer) >= count, what=f"{count} messages held")


async def _one(transport: RabbitMQTransport, queue: str) -> Delivery:
    found = await transport.fetch([queue], 1, 1.0)
    assert len(found) == 1
    return found[0]


async def test_rabbitmq_delivers_the_highest_priority_first_with_a_prefetch_of_1(
    rabbitmq: Target,
) -> None:
    """Jobs of priorities 0, 5, 9, 0 wait in their lanes; a worker with prefetch 1 is handed
    9, then 5, then the two 0s in the order they were enqueued; a retry of the 9 goes back to
    its lane and keeps its priority and its history."""
    app = rabbitmq.app(transport_url=_lanes(rabbitmq))
    q = rabbitmq.queue
    async with app:
        transport = app.transport
        assert isinstance(transport, RabbitMQTransport)
        for job_id, priority in [("low-1", 0), ("mid", 5), ("high", 9), ("low-2", 0)]:
            await app.enqueue(q, {"n": job_id}, job_id=job_id, priority=priority)
        await _held(transport, q, 3)
        high = await _one(transport, q)
        assert (high.job_id, high.priority) == ("high", 9)
        await transport.retry(high, timedelta(0), Category.TEMPORARY_ERROR, "try again")
        await eventually(lambda: len(transport._buffer) >= 3, what="the retry held again")
        again = await _one(transport, q)
        assert (again.job_id, again.priority, again.attempt) == ("high", 9, 2)
        assert [h.error for h in again.history] == ["try again"]
        order = []
        for _ in range(3):
            delivery = await _one(transport, q)
            order.append((delivery.job_id, delivery.priority))
            await transport.ack(delivery)
        await transport.ack(again)
        assert order == [("mid", 5), ("low-1", 0), ("low-2", 0)]
        assert await remaining(rabbitmq) == 0


async def test_rabbitmq_does_not_starve_a_low_priority(rabbitmq: Target) -> None:
    """A job of priority 0 waits while jobs of priority 9 keep coming (one new one before
    every pick, held before the pick): it is handed over within AGE_ROUND_EVERY picks."""
    app = rabbitmq.app(transport_url=_lanes(rabbitmq))
    q = rabbitmq.queue
    async with app:
        transport = app.transport
        assert isinstance(transport, RabbitMQTransport)
        await app.enqueue(q, {}, job_id="low", priority=0)
        await _held(transport, q, 1)
        picked: list[str] = []
        for n in range(3 * AGE_ROUND_EVERY):
            await app.enqueue(q, {}, job_id=f"high-{n}", priority=9)
            await eventually(lambda: len(transport._buffer) >= 2, what="a high one held")
            delivery = await _one(transport, q)
            await transport.ack(delivery)
            picked.append(delivery.job_id)
            if delivery.job_id == "low":
                break
        assert "low" in picked, picked
        assert 1 < len(picked) <= AGE_ROUND_EVERY, picked


async def test_rabbitmq_refuses_a_priority_above_max_priority_or_without_lanes(
    rabbitmq: Target,
) -> None:
    """Without max_priority a job with a priority is refused (the error says how to turn the
    lanes on); with max_priority=2, priority 3 is refused; nothing is published, and no lane
    above 2 is declared."""
    q = rabbitmq.queue
    async with rabbitmq.app() as plain:
        with pytest.raises(EnqueueError, match=r"add \?max_priority=9 to the transport URL"):
            await plain.enqueue(q, {}, priority=1)
        await plain.enqueue(q, {}, job_id="plain")
    async with rabbitmq.app(transport_url=_lanes(rabbitmq, 2)) as lanes:
        with pytest.raises(EnqueueError, match="above the transport URL's max_priority=2"):
            await lanes.enqueue(q, {}, priority=3)
        await lanes.enqueue(q, {}, job_id="two", priority=2)
        transport = lanes.transport
        assert isinstance(transport, RabbitMQTransport)
        assert set(transport.arguments(q)) == {
            q,
            f"jobfence.exhausted.{q}",
            lane_name(q, 1),
            lane_name(q, 2),
        }
    assert await remaining(rabbitmq) == 1  # "plain" on the queue itself ("two" in its lane)


@pytest.mark.parametrize("kind", ["redis", "nats", "pubsub"])
async def test_a_broker_without_priorities_refuses_a_job_with_one(
    kind: str, request: pytest.FixtureRequest
) -> None:
    target: Target = request.getfixturevalue(kind)
    async with target.app() as app:
        jobs = [app.job(target.queue, {}, job_id="a"), app.job(target.queue, {}, priority=4)]
        with pytest.raises(EnqueueError) as refused:
            await app.enqueue_many(jobs)
        said = str(refused.value)
        assert f"has priority 4, but the {kind} transport cannot deliver by priority" in said
        assert "\n" not in said
        await app.enqueue(target.queue, {}, job_id="zero", priority=0)
    assert await remaining(target) == 1  # the refused batch published nothing
