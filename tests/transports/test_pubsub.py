"""Google Pub/Sub adapter, on the real Pub/Sub emulator: the seed's subscription (004 §10.3),
who decides a dead letter, Pub/Sub's own dead letters, the DLQ attributes (004 §10.5),
delayed retries and long handlers (E6)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import pytest

from jobfence import App, Job, Retry, RetryPolicy, TemporaryError, Tx
from jobfence.core.jobs import AttemptRecord, Delivery
from jobfence.errors import ConfigurationError
from jobfence.review import deadletters
from jobfence.review.letters import get_letter
from jobfence.runtime.harness import Outcome
from jobfence.transports._broker import Meta
from jobfence.transports.pubsub import (
    ATTRIBUTE_BYTES,
    DEAD_LETTER,
    PubSubTransport,
    attributes,
    delayed_step,
    read_meta,
)

from ..contract.support import Target, effects, remaining, with_option
from ..helpers import RunningWorker, eventually

SIX_ATTEMPTS = RetryPolicy(
    base=timedelta(seconds=0.05),
    cap=timedelta(seconds=0.4),
    justification="test: the default's 6 attempts, with delays of a fraction of a second",
)
ONE_RETRY = RetryPolicy(
    max_retries=1,
    base=timedelta(seconds=0.05),
    cap=timedelta(seconds=1),
    justification="test: a job that lost its worker twice must go to dead letters",
)
#: the emulator's redeliveries of unanswered messages at once (the seed's 10 s – 10 min
#: backoff would make a test of five lost deliveries take minutes): no retry policy
FAST_REDELIVERY = {"min_backoff": 0, "max_backoff": 0}


def url_with(target: Target, **options: object) -> str:
    url = target.transport_url or ""
    for name, value in options.items():
        url = with_option(url, name, value)
    return url


async def effect(tx: Tx, job: Job[Any]) -> None:
    await tx.execute(
        "INSERT INTO effects (job_id, attempt, pid) VALUES (%s, %s, %s)",
        (job.job_id, job.attempt, "in-process"),
    )


class DlqReader:
    """What an operator sees on a queue's DLQ topic: a subscription of their own on it."""

    def __init__(self, transport: PubSubTransport, queue: str) -> None:
        self.transport = transport
        self.queue = queue
        self.path = ""

    async def open(self) -> DlqReader:
        names = await self.transport.declare(self.queue)
        self.path = self.transport.subscription_path(f"{names.dlq_topic}.operators")
        await self.transport.subscriber.create_subscription(
            name=self.path, topic=self.transport.topic_path(names.dlq_topic)
        )
        return self

    async def read(self) -> list[tuple[bytes, dict[str, str]]]:
        """Every message there now (acked: read once)."""
        found: list[tuple[bytes, dict[str, str]]] = []
        while True:
            sub = self.path.rpartition("/")[2]
            received = await self.transport._pull(sub, 100, 1.0)
            if not received:
                return found
            found += [(bytes(r.message.data), dict(r.message.attributes)) for r in received]
            await self.transport._ack_ids(self.path, [r.ack_id for r in received])


async def lose_deliveries(transport: PubSubTransport, queue: str, count: int) -> list[int]:
    """Take the queue's message ``count`` times and never answer (as a killed worker would):
    each time its ack deadline (the lease) runs out and Pub/Sub delivers it again."""
    attempts: list[int] = []
    for n in range(1, count + 1):
        got: list[Delivery] = []

        async def fetched(into: list[Delivery] = got) -> bool:
            into += await transport.fetch([queue], 1, 1.0)
            return bool(into)

        await eventually(fetched, timeout=60, what=f"delivery {n}")
        attempts += [d.attempt for d in got]
    return attempts


# -- pure parts: attributes within Pub/Sub's limits, the delay steps -------------------------------


def test_attributes_stay_within_pubsubs_limits_and_keep_the_history() -> None:
    """A history of 6 attempts with 4 000-character errors: every attribute value fits
    Pub/Sub's 1 024 bytes (errors are cut, marked with …), and reading them back gives the
    same attempts, times and categories in order."""
    history = [
        AttemptRecord(
            attempt=n,
            at=f"2026-12-01T10:00:0{n}.000000Z",
            category="TEMPORARY_ERROR",
            error="ERP said: " + "é" * 4000,
            retry_at=f"2026-12-01T10:01:0{n}.000000Z",
        )
        for n in range(1, 7)
    ]
    meta = Meta("job-1", "corr-1", None, 6, history)
    attrs = attributes(meta, delay=2.5)
    assert max(len(v.encode()) for v in attrs.values()) <= ATTRIBUTE_BYTES
    back = read_meta(attrs, "fallback")
    assert (back.job_id, back.correlation_id, back.attempts) == ("job-1", "corr-1", 6)
    assert [(h.attempt, h.at, h.category, h.retry_at) for h in back.history] == [
        (h.attempt, h.at, h.category, h.retry_at) for h in history
    ]
    assert all(h.error.startswith("ERP said: éé") and h.error.endswith("…") for h in back.history)
    assert attrs["jobfence-delay"] == "2.500000"


def test_delayed_jobs_are_held_never_past_their_due_time() -> None:
    """For every wait from 1 ms to 2 h: a hold is whole seconds, at least 1, at most 600
    (Pub/Sub's longest ack deadline) and never longer than the wait; under a second the
    worker waits itself; a due job moves. Repeated holds bring any wait under a second."""
    waits = [0.001 * 1.01**k for k in range(1300)]  # 1 ms … ~7 h
    for wait in waits:
        step, seconds = delayed_step(wait)
        if wait < 1:
            assert (step, seconds) == ("timer", wait)
            continue
        assert step == "hold"
        assert seconds == int(seconds)
        assert 1 <= seconds <= min(wait, 600)
        left = wait
        while left >= 1:  # Pub/Sub hands it back after each hold
            left -= delayed_step(left)[1]
        assert 0 <= left < 1
    assert delayed_step(0) == ("move", 0.0)
    assert delayed_step(-3) == ("move", 0.0)


# -- URL options and the subscription's settings ---------------------------------------------------


def test_url_options_are_checked_with_one_clear_line() -> None:
    """Out-of-range or unknown options fail at once, naming the option and the rule."""
    lease = timedelta(seconds=30)
    bad = {
        "pubsub://p?max_delivery_attempts=4": "max_delivery_attempts must be >= 5",
        "pubsub://p?max_delivery_attempts=101": "between 5 and 100",
        "pubsub://p?min_backoff=20&max_backoff=10": "min_backoff <= max_backoff <= 600",
        "pubsub://p?max_backoff=900": "min_backoff <= max_backoff <= 600",
        "pubsub://p?max_deliveries=5": "unknown pubsub URL option(s) max_deliveries",
        "pubsub://p?prefix=9lives": "must start with a letter",
        "pubsub://?emulator=x:1": "needs a project",
    }
    for url, message in bad.items():
        with pytest.raises(
            ConfigurationError, match=message.replace("(", r"\(").replace(")", r"\)")
        ):
            PubSubTransport.from_url(url, lease=lease, worker_id="t")


def test_without_the_extra_the_error_names_the_pip_command() -> None:
    """Without google-cloud-pubsub installed, a pubsub:// transport fails with one line that
    says what to install (run in a fresh interpreter where the client cannot be imported)."""
    code = (
        "import sys; sys.modules['google.pubsub_v1'] = None\n"
        "from datetime import timedelta\n"
        "from jobfence.transports import broker_from_url\n"
        "try:\n"
        "    broker_from_url('pubsub://p', lease=timedelta(seconds=1), worker_id='x')\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert out.startswith(
        "MissingExtra the pubsub transport needs jobfence[pubsub]: pip install 'jobfence[pubsub]'"
    ), out


async def test_declared_policies_read_back_from_the_server(pubsub: Target) -> None:
    """URL options reach the subscription: 15 delivery attempts, backoff 5 s – 2 min,
    exactly-once delivery asked for, names from a prefix (the seed's nexus.….dlq)."""
    url = url_with(
        pubsub, prefix="nexus", max_delivery_attempts=15, min_backoff=5, max_backoff=120,
        exactly_once=1,
    )  # fmt: skip
    transport = PubSubTransport.from_url(url, lease=timedelta(seconds=45), worker_id="t")
    await transport.open()
    try:
        got = await transport.durability("purchase-order")
    finally:
        await transport.close()
    assert got == {
        "topic": "nexus.purchase-order",
        "subscription": "nexus.purchase-order.workers",
        "ack_deadline_seconds": 45,
        "dead_letter_topic": "nexus.purchase-order.dlq",
        "max_delivery_attempts": 15,
        "minimum_backoff": 5.0,
        "maximum_backoff": 120.0,
        "exactly_once": True,
        "dlq_subscription": ("nexus.purchase-order.dlq.workers", "nexus.purchase-order.dlq"),
        "delay_subscription": (
            "nexus.purchase-order.delay.workers",
            "nexus.purchase-order.delay",
            False,
            0.0,
        ),
    }


async def test_a_queue_name_outside_pubsubs_alphabet_is_encoded(pubsub: Target) -> None:
    """Queue "orders/eu west": its topic is jobfence.orders%2Feu%20west (Pub/Sub allows
    letters, digits and - _ . ~ + %), and a job goes through it."""
    app = pubsub.app()
    queue = "orders/eu west"
    got: list[str] = []

    @app.consumer(queue)
    async def handle(job: Job[Any], tx: Tx) -> None:
        got.append(job.job_id)

    async with app:
        transport = app.transport
        assert isinstance(transport, PubSubTransport)
        assert transport.names(queue).subscription == "jobfence.orders%2Feu%20west.workers"
        await app.enqueue(queue, {"n": 1}, job_id="eu-1")
        async with RunningWorker(app, poll_interval=0.5) as w:
            await eventually(lambda: w.stats.handled == 1, what="handled")
    assert got == ["eu-1"]


async def test_verify_only_refuses_what_is_missing_or_different(pubsub: Target) -> None:
    """create=0 (production, where workers may not create resources): a missing topic is a
    one-line error naming it; once created (here by a transport that may), it is used; a
    subscription with other settings than the URL's is refused in both modes."""
    lease = timedelta(seconds=30)
    verify = PubSubTransport.from_url(url_with(pubsub, create=0), lease=lease, worker_id="v")
    await verify.open()
    try:
        with pytest.raises(ConfigurationError, match=r"topic projects/.*\.dlq does not exist"):
            await verify.declare(pubsub.queue)
        creator = PubSubTransport.from_url(pubsub.transport_url or "", lease=lease, worker_id="c")
        await creator.open()
        try:
            await creator.declare(pubsub.queue)
        finally:
            await creator.close()
        names = await verify.declare(pubsub.queue)
        assert names.subscription == f"jobfence.{pubsub.queue}.workers"
    finally:
        await verify.close()
    other = PubSubTransport.from_url(
        url_with(pubsub, max_delivery_attempts=7), lease=lease, worker_id="o"
    )
    await other.open()
    try:
        with pytest.raises(ConfigurationError, match=r"max_delivery_attempts 10 \(want 7\)"):
            await other.declare(pubsub.queue)
    finally:
        await other.close()


# -- who decides a dead letter ---------------------------------------------------------------------


async def test_jobfence_decides_retries_even_at_the_seeds_minimum_of_5_deliveries(
    pubsub: Target,
) -> None:
    """max_delivery_attempts=5 (the seed's lowest) and a policy of 6 attempts that always
    fail: all 6 attempts run (each retry is a new copy, so Pub/Sub's counter never passes 1),
    then one jobfence dead letter (TEMPORARY_ERROR, 6 attempts). The DLQ topic holds exactly
    one message, jobfence's: Pub/Sub dead-lettered nothing."""
    app = pubsub.app(transport_url=url_with(pubsub, max_delivery_attempts=5))
    attempts: list[int] = []

    @app.consumer(pubsub.queue, retry=SIX_ATTEMPTS)
    async def handle(job: Job[Any], tx: Tx) -> None:
        attempts.append(job.attempt)
        raise TemporaryError("ERP answered 503")

    async with app:
        transport = app.transport
        assert isinstance(transport, PubSubTransport)
        operators = await DlqReader(transport, pubsub.queue).open()
        await app.enqueue(pubsub.queue, {"request_id": "r-1"}, job_id="po-1")
        async with RunningWorker(app, concurrency=2, poll_interval=0.5) as w:
            await eventually(lambda: w.stats.handled == 6, timeout=60, what="six attempts")
            letters = await deadletters.letters(app.db)
        on_dlq = await eventually(operators.read, what="the DLQ message")
        assert await operators.read() == []
    assert attempts == [1, 2, 3, 4, 5, 6]
    assert w.stats.outcomes[Outcome.RETRY] == 5
    assert w.stats.outcomes[Outcome.DEAD] == 1
    assert [(x.job_id, x.attempts, x.error_category) for x in letters] == [
        ("po-1", 6, "TEMPORARY_ERROR")
    ]
    [(data, attrs)] = on_dlq
    assert (attrs[DEAD_LETTER], attrs["attempts"], attrs["error_category"]) == (
        "1",
        "6",
        "TEMPORARY_ERROR",
    )
    assert "CloudPubSubDeadLetterSourceDeliveryCount" not in attrs
    assert json.loads(data) == {"request_id": "r-1"}


async def test_lost_deliveries_end_in_jobfence_before_pubsubs_limit(pubsub: Target) -> None:
    """With max_delivery_attempts (10) above the policy's attempts + 1: a message whose two
    deliveries got no answer comes a third time and the harness dead-letters it itself
    (ATTEMPTS_EXHAUSTED, 3 attempts, the lost ones in its history); Pub/Sub dead-lettered
    nothing, the DLQ topic has jobfence's one copy."""
    app = pubsub.app(lease=1.0, transport_url=url_with(pubsub, **FAST_REDELIVERY))
    called: list[int] = []

    @app.consumer(pubsub.queue, retry=ONE_RETRY)
    async def handle(job: Job[Any], tx: Tx) -> None:
        called.append(job.attempt)

    async with app:
        transport = app.transport
        assert isinstance(transport, PubSubTransport)
        operators = await DlqReader(transport, pubsub.queue).open()
        await app.enqueue(pubsub.queue, {"n": 1}, job_id="lost-1")
        assert await lose_deliveries(transport, pubsub.queue, 2) == [1, 2]
        async with RunningWorker(app, poll_interval=0.5) as w:
            letters = await eventually(
                lambda: deadletters.letters(app.db), timeout=60, what="letter"
            )
            await eventually(lambda: w.stats.handled == 1, what="handled")
        letter = await get_letter(app.db, letters[0].id)
        on_dlq = await eventually(operators.read, what="the DLQ message")
    assert called == []
    assert letter is not None
    assert (letter.attempts, letter.error_code) == (3, "ATTEMPTS_EXHAUSTED")
    assert [(h.attempt, h.error.startswith("delivery lost")) for h in letter.history] == [
        (1, True),
        (2, True),
        (3, False),
    ]
    assert [(a[DEAD_LETTER], a["attempts"], a["error_code"]) for _, a in on_dlq] == [
        ("1", "3", "ATTEMPTS_EXHAUSTED")
    ]


async def test_a_lost_batch_redelivered_and_lost_again_never_stalls_redelivery(
    pubsub: Target,
) -> None:
    """A worker killed twice while holding the same pulled batch (as in the fault runs): with
    ``min_backoff=0&max_backoff=0`` the subscription has no retry policy, so the batch and any
    later lost message come back at once. (With a retry policy, the emulator's backoff of a
    batch whose deadline ran out together on a redelivery stops redelivering anything that
    was lost twice on that subscription, for good.)"""
    url = url_with(pubsub, **FAST_REDELIVERY)
    transport = PubSubTransport.from_url(url, lease=timedelta(seconds=1), worker_id="t")
    app = pubsub.app(lease=1.0, transport_url=url)
    async with app:
        await app.enqueue_many([app.job(pubsub.queue, {"n": i}, job_id=f"b-{i}") for i in range(4)])
    await transport.open()
    try:
        held: dict[str, int] = {}

        async def take(jobs: set[str], attempt: int) -> bool:
            """Take (and never answer) each of ``jobs`` at ``attempt``."""
            for d in await transport.fetch([pubsub.queue], 10, 0.5):
                held[d.job_id] = d.attempt
            return all(held.get(job) == attempt for job in jobs)

        batch = {f"b-{i}" for i in range(4)}
        for attempt in (1, 2, 3):
            await eventually(lambda a=attempt: take(batch, a), timeout=30, what=f"batch {attempt}")
        async with app:
            await app.enqueue(pubsub.queue, {"n": 9}, job_id="probe")
        for attempt in (1, 2, 3):
            await eventually(
                lambda a=attempt: take({"probe"}, a), timeout=30, what=f"probe {attempt}"
            )
    finally:
        await transport.close()


async def test_a_message_pubsub_dead_letters_becomes_one_jobfence_dead_letter(
    pubsub: Target,
) -> None:
    """max_delivery_attempts=5 and five deliveries without an answer (a crash loop): Pub/Sub
    forwards the message to the DLQ topic; a worker reads it from there and writes one
    dead letter (ATTEMPTS_EXHAUSTED, 6 attempts: five lost plus this one, which does not run
    the handler). It is not published to the DLQ topic again: the operators' subscription
    sees Pub/Sub's one copy, and the workers' DLQ subscription ends empty (no loop)."""
    url = url_with(pubsub, max_delivery_attempts=5, **FAST_REDELIVERY)
    app = pubsub.app(lease=1.0, transport_url=url)
    called: list[int] = []

    @app.consumer(pubsub.queue)
    async def handle(job: Job[Any], tx: Tx) -> None:
        called.append(job.attempt)

    async with app:
        transport = app.transport
        assert isinstance(transport, PubSubTransport)
        operators = await DlqReader(transport, pubsub.queue).open()
        await app.enqueue(pubsub.queue, {"partner_id": "acme"}, job_id="crash-1",
                          correlation_id="req-1")  # fmt: skip
        assert await lose_deliveries(transport, pubsub.queue, 5) == [1, 2, 3, 4, 5]
        async with RunningWorker(app, poll_interval=0.5) as w:
            letters = await eventually(
                lambda: deadletters.letters(app.db), timeout=90, what="letter"
            )
            await eventually(lambda: w.stats.handled == 1, what="handled")
            on_dlq = await eventually(operators.read, what="Pub/Sub's DLQ message")
            await eventually(lambda: _drained(pubsub), what="the DLQ subscription acked")
        letter = await get_letter(app.db, letters[0].id)
        assert await operators.read() == []
    assert called == []
    assert len(letters) == 1
    assert letter is not None
    assert (letter.job_id, letter.correlation_id, letter.attempts) == ("crash-1", "req-1", 6)
    assert (letter.error_category, letter.error_code) == ("TECHNICAL_ERROR", "ATTEMPTS_EXHAUSTED")
    assert letter.last_error.startswith("Pub/Sub dead-lettered it after 5 deliveries")
    assert [h.attempt for h in letter.history] == [1, 2, 3, 4, 5, 6]
    [(data, attrs)] = on_dlq
    assert attrs["CloudPubSubDeadLetterSourceDeliveryCount"] == "5"
    assert DEAD_LETTER not in attrs
    assert json.loads(data) == {"partner_id": "acme"}


# -- the DLQ topic's attributes (seed 004 §10.5) ---------------------------------------------------


async def test_dead_letters_reach_the_dlq_topic_with_the_seeds_attributes(pubsub: Target) -> None:
    """A poison purchase-order event and a poison payload without any ids: each dead letter
    is published to ``<topic>.dlq`` with requestId, eventId, partnerId, original_topic,
    original_subscription, attempts, error_code and error_category — an unknown value is an
    empty string, never a missing key — and the payload as it was."""
    app = pubsub.app(transport_url=url_with(pubsub, prefix="nexus"))

    @app.consumer(pubsub.queue, schema={"type": "object", "required": ["lines"]})
    async def handle(job: Job[Any], tx: Tx) -> None:
        raise AssertionError("a poison payload never reaches the handler")

    event = {"request_id": "7f0c", "partner_id": "acme", "company_id": "BU-1"}
    async with app:
        transport = app.transport
        assert isinstance(transport, PubSubTransport)
        operators = await DlqReader(transport, pubsub.queue).open()
        await app.enqueue(pubsub.queue, event, job_id="ev-1", correlation_id="7f0c")
        await app.enqueue(pubsub.queue, [1, 2], job_id="ev-2")
        async with RunningWorker(app, poll_interval=0.5) as w:
            await eventually(lambda: w.stats.handled == 2, what="both handled")
        found: list[tuple[bytes, dict[str, str]]] = []

        async def both() -> bool:
            found.extend(await operators.read())
            return len(found) == 2

        await eventually(both, what="two DLQ messages")
    topic = f"nexus.{pubsub.queue}"
    seed_keys = (
        "requestId", "eventId", "partnerId", "original_topic", "original_subscription",
        "attempts", "error_code", "error_category",
    )  # fmt: skip
    by_event = {attrs["eventId"]: (data, attrs) for data, attrs in found}
    data, attrs = by_event["ev-1"]
    assert {k: attrs[k] for k in seed_keys} == {
        "requestId": "7f0c",
        "eventId": "ev-1",
        "partnerId": "acme",
        "original_topic": topic,
        "original_subscription": f"{topic}.workers",
        "attempts": "1",
        "error_code": "POISON",
        "error_category": "VALIDATION_ERROR",
    }
    assert json.loads(data) == event
    data, attrs = by_event["ev-2"]
    assert {k: attrs[k] for k in seed_keys} == {
        "requestId": "",
        "eventId": "ev-2",
        "partnerId": "",
        "original_topic": topic,
        "original_subscription": f"{topic}.workers",
        "attempts": "1",
        "error_code": "POISON",
        "error_category": "VALIDATION_ERROR",
    }
    assert data == b"[1,2]"


# -- delayed retries -------------------------------------------------------------------------------


async def test_retry_delays_follow_jobfences_schedule(pubsub: Target) -> None:
    """Base 1 s, cap 4 s, three retries, always failing: each scheduled delay lies in
    [d/2, d] for d = 1, 2, 4 s (R1) and the delays grow; each retry starts no earlier than
    its delay and at most 1.5 s after it (the delay subscription's hold, then the move)."""
    policy = RetryPolicy(
        max_retries=3,
        base=timedelta(seconds=1),
        cap=timedelta(seconds=4),
        justification="test: R1's growth on a compressed time scale",
    )
    app = pubsub.app()
    started: dict[int, float] = {}
    letters_history: list[Sequence[AttemptRecord]] = []

    @app.consumer(pubsub.queue, retry=policy)
    async def handle(job: Job[Any], tx: Tx) -> None:
        started[job.attempt] = time.monotonic()
        letters_history.append(job.history)
        raise TemporaryError("not yet")

    async with app:
        await app.enqueue(pubsub.queue, {"n": 1}, job_id="grow-1")
        async with RunningWorker(app, concurrency=2, poll_interval=0.5) as w:
            await eventually(lambda: w.stats.handled == 4, timeout=60, what="four attempts")
    history = letters_history[-1]
    scheduled = [_ts(h.retry_at or "") - _ts(h.at) for h in history]
    assert [h.attempt for h in history] == [1, 2, 3]
    for delay, ceiling in zip(scheduled, (1.0, 2.0, 4.0), strict=True):
        assert ceiling / 2 - 0.01 <= delay <= ceiling + 0.01, (delay, ceiling)
    assert scheduled == sorted(scheduled)
    gaps = [started[n + 1] - started[n] for n in (1, 2, 3)]
    for gap, delay in zip(gaps, scheduled, strict=True):
        assert delay - 0.03 <= gap <= delay + 1.5, (gap, delay)


async def test_a_job_enqueued_for_later_waits_on_the_delay_subscription(pubsub: Target) -> None:
    """enqueue(delay=3 s): the job waits on ``<topic>.delay`` (Pub/Sub holds it for whole
    seconds, the worker the last fraction) and starts no earlier than 3 s after the enqueue,
    as attempt 1."""
    app = pubsub.app()
    started: list[tuple[int, float]] = []

    @app.consumer(pubsub.queue)
    async def handle(job: Job[Any], tx: Tx) -> None:
        started.append((job.attempt, time.monotonic()))
        await effect(tx, job)

    async with app, RunningWorker(app, poll_interval=0.5) as w:
        enqueued = time.monotonic()
        await app.enqueue(pubsub.queue, {"n": 1}, job_id="later-1", delay=3.0)
        await eventually(lambda: w.stats.handled == 1, timeout=30, what="handled")
    [(attempt, at)] = started
    assert attempt == 1
    assert 3.0 <= at - enqueued <= 5.0, at - enqueued
    assert await effects(pubsub.database_url) == [("later-1", 1)]
    assert await remaining(pubsub) == 0


# -- long handlers (seed E6) -----------------------------------------------------------------------


# (a handler longer than the ack deadline, renewed: tests/contract, for every transport)


class NoRenewal(PubSubTransport):
    """A worker that cannot renew its ack deadlines (e.g. stalled): Pub/Sub redelivers."""

    async def extend(self, deliveries: Sequence[Delivery]) -> None:
        return None


async def test_a_redelivery_past_the_ack_deadline_is_stopped_by_the_fence(pubsub: Target) -> None:
    """E6 when renewal fails: the ack deadline (1 s) runs out during a 3 s handler and
    Pub/Sub delivers the message again to the same worker. The second delivery waits on the
    fence row until the first commits, then is skipped: the handler ran once, one effect."""
    transport = NoRenewal.from_url(
        pubsub.transport_url or "", lease=timedelta(seconds=1), worker_id="stalled"
    )
    app = App(pubsub.database_url, transport=transport, lease=timedelta(seconds=1))
    calls: list[int] = []

    @app.consumer(pubsub.queue)
    async def handle(job: Job[Any], tx: Tx) -> None:
        calls.append(job.attempt)
        await effect(tx, job)
        await asyncio.sleep(3.0)

    async with app:
        await app.enqueue(pubsub.queue, {"n": 1}, job_id="slow-erp-1")
        async with RunningWorker(app, concurrency=4, poll_interval=0.5) as w:
            await eventually(
                lambda: w.stats.outcomes[Outcome.DUPLICATE] >= 1, timeout=60, what="a duplicate"
            )
            await eventually(lambda: _drained(pubsub), timeout=60, what="acked")
    assert calls == [1]
    assert w.stats.outcomes[Outcome.PROCESSED] == 1
    assert await effects(pubsub.database_url) == [("slow-erp-1", 1)]


async def test_a_retry_requested_with_a_delay_keeps_its_attempt_count(pubsub: Target) -> None:
    """Retry(delay=0.3 s) twice, then success: attempts 1, 2, 3 (copies carry the count), and
    the job's history has both retries with their scheduled times."""
    app = pubsub.app()
    seen: list[tuple[int, int]] = []

    @app.consumer(pubsub.queue, retry=SIX_ATTEMPTS)
    async def handle(job: Job[Any], tx: Tx) -> None:
        seen.append((job.attempt, len(job.history)))
        if job.attempt < 3:
            raise Retry(delay=timedelta(seconds=0.3), reason="ERP busy")
        await effect(tx, job)

    async with app:
        await app.enqueue(pubsub.queue, {"n": 1}, job_id="again-1")
        async with RunningWorker(app, poll_interval=0.5) as w:
            await eventually(lambda: w.stats.handled == 3, timeout=30, what="three attempts")
    assert seen == [(1, 0), (2, 1), (3, 2)]
    assert await effects(pubsub.database_url) == [("again-1", 3)]


async def _drained(target: Target) -> bool:
    return await remaining(target) == 0


def _ts(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
