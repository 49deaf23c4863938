"""RabbitMQ adapter: delay buckets, and a delivery limit that ends in dead letters."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import subprocess
from datetime import timedelta
from typing import Any

import pytest

from jobfence import Job, RetryPolicy, Tx
from jobfence.core.jobs import Delivery
from jobfence.review import deadletters
from jobfence.review.letters import get_letter
from jobfence.transports import rabbitmq as rabbitmq_transport
from jobfence.transports.rabbitmq import RabbitMQTransport, defer_bucket, delay_bucket

from ..contract.support import Target, remaining, with_option
from ..helpers import RunningWorker, eventually

ONE_RETRY = RetryPolicy(
    max_retries=1,
    base=timedelta(seconds=0.05),
    cap=timedelta(seconds=1),
    justification="test: a job that lost its worker twice must go to dead letters",
)


def test_delay_buckets_round_up_and_keep_their_order() -> None:
    """Every delay from 1 ms to 1 h maps to a TTL at least as long and at most 4.4 % (one
    step of 16 per doubling) plus whole-ms rounding longer, and a longer delay never gets a
    shorter TTL; any positive delay, however small, gets a delay queue (it must not run
    early). See also tests/transports/test_retry_timing.py."""
    delays = [0.001 * 1.01**k for k in range(1500)]  # 1 ms … ~3 h
    buckets = [delay_bucket(d) for d in delays]
    for delay, ms in zip(delays, buckets, strict=True):
        assert delay * 1000 <= ms <= delay * 1000 * 2 ** (1 / 16) + 3, (delay, ms)
    assert buckets == sorted(buckets)
    assert delay_bucket(0.0004) == 1
    assert delay_bucket(0) == 0
    # 16 buckets per doubling: delays from just above 2^15 ms (the float 32.768 is a hair
    # more than 32 768 ms) to just below 2^16 ms use these TTLs
    within = {delay_bucket(32.768 * 2 ** (k / 160)) for k in range(155)}
    assert within == {math.ceil(2 ** (step / 16)) for step in range(241, 257)}
    assert 60_000 <= delay_bucket(60) <= 60_000 * 1.044


async def test_a_message_past_the_delivery_limit_ends_in_dead_letters(rabbitmq: Target) -> None:
    """delivery_limit=1: a message twice returned without an answer (its lease ran out) is
    dead-lettered by RabbitMQ into jobfence.exhausted.Q — not dropped — and the worker ends
    it in jobfence's dead letters with its true attempt count (3) and the lost attempts in
    its history."""
    url = with_option(rabbitmq.transport_url or "", "delivery_limit", 1)
    app = rabbitmq.app(lease=0.3, transport_url=url)
    called: list[int] = []

    @app.consumer(rabbitmq.queue, retry=ONE_RETRY)
    async def handle(job: Job[Any], tx: Tx) -> None:
        called.append(job.attempt)

    async with app:
        await app.enqueue(rabbitmq.queue, {"n": 1}, job_id="limit-1")
        transport = app.transport
        assert isinstance(transport, RabbitMQTransport)
        for expected in (1, 2):
            got: list[Delivery] = []

            async def fetched(into: list[Delivery] = got) -> bool:
                into += await transport.fetch([rabbitmq.queue], 1, 0.2)
                return bool(into)

            await eventually(fetched, what=f"delivery {expected}")
            assert [(d.job_id, d.attempt) for d in got] == [("limit-1", expected)]

            async def given_back() -> bool:
                await transport.maintenance()  # its lease ran out: back to RabbitMQ
                return not transport._held

            await eventually(given_back, what="lease expired")
        async with RunningWorker(app, poll_interval=0.2) as w:
            letters = await eventually(lambda: deadletters.letters(app.db), what="dead letter")
            await eventually(lambda: w.stats.handled == 1, what="handled")
        letter = await get_letter(app.db, letters[0].id)
    assert called == []
    assert letter is not None
    assert (letter.job_id, letter.attempts, letter.error_code) == (
        "limit-1",
        3,
        "ATTEMPTS_EXHAUSTED",
    )
    assert [(h.attempt, h.error.startswith("delivery lost")) for h in letter.history] == [
        (1, True),
        (2, True),
        (3, False),
    ]
    await eventually(lambda: _empty(rabbitmq), what="exhausted queue acked")


async def _empty(target: Target) -> bool:
    return await remaining(target) == 0


def test_deferral_delays_use_few_buckets_and_never_run_early() -> None:
    """A deferral's delay is rounded up to every 4th delay bucket: never shorter, at most
    2^(1/4) (≈ 19 %) + 3 ms longer, always one of the retries' buckets, and 4 per doubling:
    delays from 10 ms to 10 s (what flow control asks for) use at most 41 delay queues."""
    delays = [0.001 * 1.003**k for k in range(2400)]  # 1 ms … ~1.3 min
    retry_buckets = {math.ceil(2 ** (step / 16)) for step in range(16 * 17)}
    for delay in delays:
        ms = defer_bucket(delay)
        assert delay * 1000 <= ms <= delay * 1000 * 2 ** (1 / 4) + 3, (delay, ms)
        assert ms in retry_buckets, (delay, ms)
    used = {defer_bucket(d) for d in delays if 0.01 <= d <= 10}
    assert len(used) <= 41, len(used)
    assert defer_bucket(0) == 0


def _rabbitmqctl(*args: str) -> str:
    done = subprocess.run(["rabbitmqctl", *args], check=True, capture_output=True, timeout=60)
    return done.stdout.decode()


def _policy_of(queue: str) -> str:
    """The policy RabbitMQ applies to ``queue`` (empty: none)."""
    listed = _rabbitmqctl("list_queues", "name", "policy", "--quiet", "--no-table-headers")
    for line in listed.splitlines():
        name, _, policy = line.partition("\t")
        if name == queue:
            return policy.strip()
    return ""


async def test_a_publish_rabbitmq_refuses_is_sent_again(
    rabbitmq: Target, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A policy caps the queue at one message and makes RabbitMQ refuse more (overflow
    ``reject-publish``: it answers the publish with basic.nack). An enqueue into the full
    queue is refused, sent again, and taken once a worker has made room: both jobs run,
    each once. With no room ever, the enqueue fails after its tries (the caller hears of
    it; nothing is reported queued that is not). Resends are 1 s apart here (50 ms × n in
    production) so that the worker's start fits between them on a loaded machine."""
    monkeypatch.setattr(rabbitmq_transport, "PUBLISH_RETRY_PAUSE", 1.0)
    caplog.set_level(logging.WARNING, logger="jobfence.transport.rabbitmq")
    policy = f"jobfence-test-{rabbitmq.token}"
    app = rabbitmq.app()
    ran: list[str] = []

    @app.consumer(rabbitmq.queue)
    async def handle(job: Job[Any], tx: Tx) -> None:
        ran.append(job.job_id)

    async with app:
        await app.enqueue(rabbitmq.queue, {"n": 1}, job_id="first")
        cap = json.dumps({"max-length": 1, "overflow": "reject-publish"})
        pattern = f"^{re.escape(rabbitmq.queue)}$"
        _rabbitmqctl("set_policy", policy, pattern, cap, "--apply-to", "queues")
        try:
            await eventually(
                lambda: _policy_of(rabbitmq.queue) == policy, what="the policy applied"
            )
            monkeypatch.setattr(rabbitmq_transport, "PUBLISH_RETRY_PAUSE", 0.05)
            # a quorum queue's cap is soft (it takes one past it): fill it until refused
            accepted = ["first"]
            refusal: Exception | None = None
            for n in range(5):
                try:
                    await app.enqueue(rabbitmq.queue, {"n": n}, job_id=f"fill-{n}")
                except Exception as exc:  # the last resend's refusal, as the caller hears it
                    refusal = exc
                    break
                accepted.append(f"fill-{n}")
            assert refusal is not None
            assert "Nack" in str(refusal), refusal
            refused = len(caplog.records)
            assert refused == rabbitmq_transport.PUBLISH_TRIES - 1  # every resend refused too
            monkeypatch.setattr(rabbitmq_transport, "PUBLISH_RETRY_PAUSE", 1.0)
            second = asyncio.create_task(app.enqueue(rabbitmq.queue, {"n": 9}, job_id="second"))
            await eventually(lambda: len(caplog.records) > refused, what="a refused publish")
            async with RunningWorker(app, concurrency=1, poll_interval=0.2):
                await asyncio.wait_for(second, timeout=30)  # a resend was taken
                expected = sorted([*accepted, "second"])
                await eventually(lambda: sorted(ran) == expected, what="every accepted job ran")
        finally:
            _rabbitmqctl("clear_policy", policy)
    assert sorted(ran) == expected  # each once; the refused one never
