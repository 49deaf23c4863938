"""Redis Streams adapter: trimming never drops unacked work; XAUTOCLAIM takes over."""

from __future__ import annotations

from datetime import timedelta

from jobfence.core.jobs import Delivery, OutgoingJob
from jobfence.transports.redis import RedisTransport

from ..contract.support import Target
from ..helpers import eventually


def _transport(target: Target, worker: str, lease: float = 30.0) -> RedisTransport:
    assert target.transport_url is not None
    return RedisTransport.from_url(
        target.transport_url, lease=timedelta(seconds=lease), worker_id=worker
    )


async def test_trimming_drops_acked_entries_and_never_unacked_ones(redis: Target) -> None:
    """10 entries, 5 delivered, 3 of those acked (1, 2, 4): trimming removes exactly 1 and
    2 — below the oldest pending entry (3); entry 4, acked, stays until 3 is done. After
    all is acked the stream is empty."""
    red = _transport(redis, "w1")
    await red.open()
    try:
        jobs = [OutgoingJob(redis.queue, f"t-{i}", b"{}") for i in range(1, 11)]
        await red.publish(jobs)
        first = await red.fetch([redis.queue], 5, 0.5)
        assert [d.job_id for d in first] == ["t-1", "t-2", "t-3", "t-4", "t-5"]
        for d in (first[0], first[1], first[3]):
            await red.ack(d)
        assert await red.trim(redis.queue) == 2
        key = red.stream_key(redis.queue)
        assert await red.redis.xlen(key) == 8
        assert await red.trim(redis.queue) == 0  # nothing more may go
        rest = await red.fetch([redis.queue], 10, 0.5)
        assert [d.job_id for d in rest] == [f"t-{i}" for i in range(6, 11)]
        for d in [first[2], first[4], *rest]:
            await red.ack(d)
        assert await red.trim(redis.queue) == 8
        assert await red.redis.xlen(key) == 0
    finally:
        await red.close()


async def test_a_lost_consumers_entry_is_taken_over_as_the_next_attempt(redis: Target) -> None:
    """Consumer A takes an entry and goes silent; after the lease, B's maintenance claims
    it (XAUTOCLAIM): B gets attempt 2 with the lost attempt in the history; A can no longer
    schedule a retry of it."""
    a = _transport(redis, "a", lease=0.3)
    b = _transport(redis, "b", lease=0.3)
    await a.open()
    await b.open()
    try:
        await a.publish([OutgoingJob(redis.queue, "lost-1", b'{"n":1}')])
        (held,) = await a.fetch([redis.queue], 1, 0.5)
        assert held.attempt == 1
        assert await b.fetch([redis.queue], 1, 0.1) == []
        got: list[Delivery] = []

        async def taken_over() -> bool:
            await b.maintenance()
            got.extend(await b.fetch([redis.queue], 1, 0.1))
            return bool(got)

        await eventually(taken_over, what="takeover")
        (delivery,) = got
        assert (delivery.job_id, delivery.attempt, delivery.payload) == ("lost-1", 2, b'{"n":1}')
        assert [(h.attempt, h.category) for h in delivery.history] == [(1, "TECHNICAL_ERROR")]
        # A's late answer is refused: the entry is B's now (no second copy appears)
        await a.release(held, attempted=True)
        assert await b.redis.xlen(b.stream_key(redis.queue)) == 1
        await b.ack(delivery)
        assert (await b.redis.xpending(b.stream_key(redis.queue), b.group))["pending"] == 0
    finally:
        await a.close()
        await b.close()
