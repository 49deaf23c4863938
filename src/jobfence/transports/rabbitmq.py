"""RabbitMQ as the queue (``amqp://user:pass@host:5672/vhost``), with aio-pika.

Per jobfence queue ``Q`` the adapter declares (all durable quorum queues, replicated and
fsynced by Raft before a publish is confirmed):

* ``Q`` — the work queue: manual acks, a per-consumer prefetch, a delivery limit
  (``x-delivery-limit``) whose overflow is dead-lettered *at least once* to
  ``jobfence.exhausted.Q`` instead of being dropped;
* ``jobfence.exhausted.Q`` — messages RabbitMQ gave up redelivering; the adapter consumes
  them too and hands them to the harness, which writes them to jobfence's dead letters
  (their attempt count is past any sane policy) — never silence;
* ``jobfence.delay.Q.<ms>`` — one queue per delay bucket, with ``x-message-ttl`` and a
  dead-letter route back to ``Q``: delayed retries on a stock server (no plugin). Delays
  are rounded *up* to 16 buckets per doubling: never early, at most 4.4 % (+ 3 ms) late.

Every publish waits for the publisher confirm. A retry publishes a new copy carrying the
attempt count and history in its headers, then acks the old one. Attempts follow SPEC R1:
the headers' count plus the quorum queue's ``x-delivery-count`` (deliveries returned
without an answer: a killed worker, a lease that ran out).

URL options (removed before connecting): ``prefetch`` (default 20), ``delivery_limit``
(default 20; keep it above the policies' attempts), ``max_message_size`` (the server's
``max_message_size`` when it is not the default of its version: 128 MiB on 3.8–3.13, 16 MiB
from 4.0), ``max_priority`` (default 0: no priorities).

Priorities (``max_priority=N``, 1–9): a quorum queue refuses ``x-max-priority`` (the
server answers PRECONDITION_FAILED) and RabbitMQ 3.x quorum queues have no message
priorities at all, so jobs of priority ``p`` > 0 go to a lane of their own,
``jobfence.priority.Q.<p>`` — a quorum queue with ``Q``'s arguments, dead-lettering to the
same ``jobfence.exhausted.Q`` — and priority 0 stays on ``Q`` (the queue is never declared
again with other arguments). A worker consumes ``Q`` and its lanes, and each fetch takes the
highest priority it holds, the oldest first within it; every ``AGE_ROUND_EVERY``-th pick
takes the oldest it holds whatever its priority, so a low priority is not starved. Order is
kept among what the worker holds: ``prefetch`` messages per lane (docs/flow-control.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from fractions import Fraction
from typing import Any

import aio_pika
import aio_pika.abc
import aiormq.exceptions

from ..core.jobs import MAX_PRIORITY, Delivery, OutgoingJob
from ..errors import Category, ConfigurationError, EnqueueError
from . import Transport
from ._broker import Meta, Options, deferred_history, retry_record

log = logging.getLogger("jobfence.transport.rabbitmq")

DELAY_STEPS_PER_DOUBLING = 16
#: flow control's deferrals use every 4th delay bucket only (4 per doubling, at most 19 %
#: late): their delays vary far more than a retry policy's, and each bucket is a quorum queue
DEFER_STEP = 4
PUBLISH_BATCH = 500
#: how many times one message is sent when RabbitMQ refuses it (basic.nack), and the pause
#: before the n-th resend (n × this, seconds)
PUBLISH_TRIES = 4
PUBLISH_RETRY_PAUSE = 0.05
MiB = 1024 * 1024


def default_max_message_size(version: str) -> int:
    """RabbitMQ's default ``max_message_size`` (checked against the body) for a server
    version: 16 MiB from 4.0, 128 MiB on 3.8–3.13, about 2 GiB before. An unknown version
    gets the smallest."""
    try:
        major, minor = (int(part) for part in version.split(".")[:2])
    except ValueError:
        return 16 * MiB
    if (major, minor) >= (4, 0):
        return 16 * MiB
    if (major, minor) >= (3, 8):
        return 128 * MiB
    return 2_147_383_648


def _bucket(step: int) -> int:
    return math.ceil(2 ** (step / DELAY_STEPS_PER_DOUBLING))


def delay_bucket(seconds: float) -> int:
    """The TTL in ms of the delay queue used for ``seconds`` (0: no delay queue).

    The smallest bucket of 16 per doubling (``ceil(2^(k/16))`` ms) that is not shorter
    than the delay: a retry never runs early, and at most 2^(1/16) ≈ 4.4 % (+ 3 ms for
    whole milliseconds) late. (Rounding to the nearest bucket ran half of all retries up to
    2.2 % early, which could break the retry policy's [d/2, d] bound.)
    """
    if seconds <= 0:
        return 0
    needed = math.ceil(Fraction(seconds) * 1000)  # whole ms, exactly, never below the delay
    step = math.ceil(math.log2(needed) * DELAY_STEPS_PER_DOUBLING)
    # the logarithm is a float: correct it to the smallest step whose bucket is long enough
    while _bucket(step) < needed:
        step += 1
    while step > 0 and _bucket(step - 1) >= needed:
        step -= 1
    return _bucket(step)


def defer_bucket(seconds: float) -> int:
    """The TTL in ms of the delay queue a deferral of ``seconds`` waits in (0: none):
    :func:`delay_bucket` rounded *up* to every :data:`DEFER_STEP`-th bucket (never early, at
    most 2^(1/4) ≈ 19 % + 3 ms late), so the delay queues deferrals create stay few: 4 per
    doubling of the delays used, each one of the retries' buckets."""
    ms = delay_bucket(seconds)
    if ms == 0:
        return 0
    step = math.ceil(math.log2(ms) * DELAY_STEPS_PER_DOUBLING)
    while _bucket(step) < ms:
        step += 1
    while step > 0 and _bucket(step - 1) >= ms:
        step -= 1
    step = -(-step // DEFER_STEP) * DEFER_STEP
    return _bucket(step)


def exhausted_name(queue: str) -> str:
    return f"jobfence.exhausted.{queue}"


def delay_name(queue: str, ms: int) -> str:
    return f"jobfence.delay.{queue}.{ms}"


def lane_name(queue: str, priority: int) -> str:
    """The quorum queue that holds ``queue``'s jobs of ``priority`` (0: ``queue`` itself)."""
    return queue if priority == 0 else f"jobfence.priority.{queue}.{priority}"


#: Every this many picks from what a worker holds, it takes the oldest whatever its priority
#: (the same bound as the database queue's claim rounds by age).
AGE_ROUND_EVERY = 10


@dataclass
class _Held:
    message: aio_pika.abc.AbstractIncomingMessage
    deadline: float


class RabbitMQTransport(Transport):
    """Jobs as messages in RabbitMQ quorum queues."""

    name = "rabbitmq"
    shares_database = False

    def __init__(
        self,
        url: str,
        *,
        lease: timedelta = timedelta(seconds=30),
        worker_id: str = "jobfence",
        prefetch: int = 20,
        delivery_limit: int = 20,
        max_message_size: int | None = None,
        max_priority: int = 0,
    ) -> None:
        if not 0 <= max_priority <= MAX_PRIORITY:
            raise ConfigurationError(
                f"rabbitmq URL option max_priority={max_priority}: use 1 to {MAX_PRIORITY} "
                "(0, the default: no priorities)"
            )
        self.max_priority = max_priority
        self.priorities = max_priority > 0
        self.no_priorities_reason = (
            "its quorum queues have no message priorities; add ?max_priority=9 to the "
            "transport URL of every app and worker of the queue for priority lanes"
        )
        self._picks = 0  # fetch picks so far (AGE_ROUND_EVERY)
        self.url = url
        self.lease = lease
        self.worker_id = worker_id
        self.prefetch = prefetch
        self.delivery_limit = delivery_limit
        self.max_message_size = max_message_size
        self.server_version = ""
        self._conn: aio_pika.abc.AbstractRobustConnection | None = None
        self._pub: aio_pika.abc.AbstractChannel | None = None
        self._sub: aio_pika.abc.AbstractChannel | None = None
        self._declared: set[str] = set()
        self._declare_lock = asyncio.Lock()
        self._consuming: set[str] = set()
        self._consumers: list[tuple[aio_pika.abc.AbstractQueue, str]] = []
        # (queue, priority, message) in the order they arrived
        self._buffer: deque[tuple[str, int, aio_pika.abc.AbstractIncomingMessage]] = deque()
        self._ready = asyncio.Event()
        self._held: dict[int, _Held] = {}
        self._tokens = itertools.count(1)
        self._opened = False  # open() succeeded and close() was not called

    @classmethod
    def from_url(cls, url: str, *, lease: timedelta, worker_id: str) -> RabbitMQTransport:
        options = Options(url, "rabbitmq")
        prefetch = options.integer("prefetch", 20, minimum=1)
        limit = options.integer("delivery_limit", 20, minimum=1)
        size = options.integer("max_message_size", 0, minimum=0)
        max_priority = options.integer("max_priority", 0, minimum=0)
        return cls(
            options.remaining_url(),
            lease=lease,
            worker_id=worker_id,
            prefetch=prefetch,
            delivery_limit=limit,
            max_message_size=size or None,
            max_priority=max_priority,
        )

    # -- connection -------------------------------------------------------------------------

    async def open(self) -> None:
        try:
            self._conn = await aio_pika.connect_robust(
                self.url, client_properties={"connection_name": f"jobfence {self.worker_id}"}
            )
        except (OSError, aiormq.exceptions.AMQPError) as exc:
            raise ConfigurationError(f"cannot connect to RabbitMQ: {exc}") from None
        underlay = self._conn.transport
        properties = (underlay.connection.server_properties if underlay else None) or {}
        version = properties.get("version", "")
        self.server_version = version.decode() if isinstance(version, bytes) else str(version)
        self._pub = await self._conn.channel(publisher_confirms=True)
        self._opened = True

    async def close(self) -> None:
        self._opened = False
        if self._conn is None:
            return
        if self._sub is not None:
            # stop deliveries, then hand back what was prefetched but never worked on,
            # refunded (closing the channel would count a delivery against each)
            for queue_obj, tag in self._consumers:
                with contextlib.suppress(Exception):
                    await queue_obj.cancel(tag)
            buffered, self._buffer = list(self._buffer), deque()
            for queue, priority, message in buffered:
                with contextlib.suppress(Exception):
                    delivery = self._delivery(queue, priority, message)
                    self._held[delivery.token] = _Held(message, time.monotonic())
                    await self._republish(delivery, attempts=delivery.attempt - 1, delay=0.0)
            with contextlib.suppress(Exception):
                await self._sub.close()
            self._sub = None
            self._consumers.clear()
        with contextlib.suppress(Exception):
            await self._conn.close()
        self._conn = None
        self._pub = None
        self._held.clear()

    @property
    def max_payload(self) -> int | None:
        if self.max_message_size is not None:
            return self.max_message_size
        if not self.server_version:
            return None  # not connected yet
        return default_max_message_size(self.server_version)

    @property
    def max_payload_reason(self) -> str:
        if self.max_message_size is not None:
            return "max_message_size from the transport URL"
        return (
            f"RabbitMQ {self.server_version}'s default max_message_size; a server configured "
            "otherwise: add ?max_message_size= to the transport URL"
        )

    @property
    def _channel(self) -> aio_pika.abc.AbstractChannel:
        if self._pub is None:
            raise RuntimeError("the RabbitMQ transport is not open")
        return self._pub

    # -- topology ---------------------------------------------------------------------------

    def arguments(self, queue: str) -> dict[str, dict[str, Any]]:
        """The declared arguments of ``queue``'s work and exhausted queues, and of its
        priority lanes (``max_priority``), which are work queues like ``queue``."""
        work = {
            "x-queue-type": "quorum",
            "x-delivery-limit": self.delivery_limit,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": exhausted_name(queue),
            "x-dead-letter-strategy": "at-least-once",
            "x-overflow": "reject-publish",
        }
        lanes = {lane_name(queue, p): work for p in range(1, self.max_priority + 1)}
        return {queue: work, exhausted_name(queue): {"x-queue-type": "quorum"}, **lanes}

    def check_payloads(self, jobs: Sequence[OutgoingJob]) -> None:
        super().check_payloads(jobs)
        for job in jobs:
            if job.priority > self.max_priority > 0:
                raise EnqueueError(
                    f"job {job.job_id[:60]!r} has priority {job.priority}, above the "
                    f"transport URL's max_priority={self.max_priority}; raise max_priority "
                    "(on every app and worker of the queue) or enqueue it lower"
                )

    def delay_arguments(self, queue: str, ms: int) -> dict[str, Any]:
        return {
            "x-queue-type": "quorum",
            "x-message-ttl": ms,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": queue,
            "x-dead-letter-strategy": "at-least-once",
            "x-overflow": "reject-publish",
        }

    async def _declare(self, name: str, arguments: dict[str, Any]) -> None:
        if name in self._declared:
            return
        async with self._declare_lock:
            if name in self._declared:
                return
            try:
                await self._channel.declare_queue(name, durable=True, arguments=arguments)
            except aiormq.exceptions.ChannelPreconditionFailed as exc:
                raise ConfigurationError(
                    f"RabbitMQ queue {name!r} exists with other settings than jobfence "
                    f"declares ({exc}); delete it or use another queue name"
                ) from None
            self._declared.add(name)

    async def declare(self, queue: str) -> None:
        """Declare ``queue``'s work and exhausted queues (idempotent)."""
        for name, arguments in self.arguments(queue).items():
            await self._declare(name, arguments)

    async def _route(
        self, queue: str, delay: float, priority: int = 0, *, ms: int | None = None
    ) -> str:
        """The queue to publish a job of ``queue`` and ``priority`` due after ``delay``
        seconds to (or after ``ms``, a delay bucket already chosen)."""
        await self.declare(queue)
        target = lane_name(queue, min(priority, self.max_priority))
        if ms is None:
            ms = delay_bucket(delay)
        if ms == 0:
            return target
        name = delay_name(target, ms)
        await self._declare(name, self.delay_arguments(target, ms))
        return name

    # -- publishing -------------------------------------------------------------------------

    async def _send(self, routing_key: str, payload: bytes, meta: Meta) -> None:
        message = aio_pika.Message(
            payload,
            headers=dict(meta.headers()),
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            message_id=meta.job_id,
            correlation_id=meta.correlation_id,
        )
        # waits for the publisher confirm; mandatory: an unroutable message is an error. A
        # basic.nack says the broker did not take the message (a queue's process failed to
        # accept it): it is sent again, a few times, before the caller hears of it — what
        # it publishes for stays unacked until then, so nothing is lost either way
        for tries_left in reversed(range(PUBLISH_TRIES)):
            try:
                await self._channel.default_exchange.publish(message, routing_key, mandatory=True)
                return
            except aiormq.exceptions.PublishError:
                raise
            except aiormq.exceptions.DeliveryError as exc:
                if tries_left == 0:
                    raise
                log.warning(
                    "RabbitMQ refused a publish (basic.nack); sending it again",
                    extra={"routing_key": routing_key, "job_id": meta.job_id, "error": str(exc)},
                )
                await asyncio.sleep(PUBLISH_RETRY_PAUSE * (PUBLISH_TRIES - tries_left))

    async def publish(self, jobs: Sequence[OutgoingJob]) -> None:
        self.check_payloads(jobs)
        await self._ensure_publisher()
        for start in range(0, len(jobs), PUBLISH_BATCH):
            chunk = jobs[start : start + PUBLISH_BATCH]
            routes = [await self._route(job.queue, job.delay, job.priority) for job in chunk]
            await asyncio.gather(
                *(
                    self._send(route, job.payload, Meta.new(job))
                    for route, job in zip(routes, chunk, strict=True)
                )
            )

    async def _republish(self, delivery: Delivery, *, attempts: int, delay: float) -> None:
        """Publish a new copy of ``delivery`` (confirmed), then ack the old one."""
        meta = Meta.again(delivery, attempts=attempts, history=delivery.history)
        route = await self._route(delivery.queue, delay, delivery.priority)
        await self._send(route, delivery.payload, meta)
        await self._settle(delivery, ack=True)

    # -- consuming --------------------------------------------------------------------------

    async def _reconnect(self) -> None:
        """A new connection when the robust one did not come back by itself (seen after a
        broker crash: a channel whose restore failed stays closed)."""
        log.warning("RabbitMQ channel closed and not restored: reconnecting")
        old, self._conn = self._conn, None
        if old is not None:
            with contextlib.suppress(Exception):
                await old.close()
        self._sub = None
        self._consuming.clear()
        self._consumers.clear()
        self._declared.clear()
        await self.open()

    async def _ensure_publisher(self) -> None:
        if self._conn is None or self._pub is None:
            if self._opened:
                await self._reconnect()  # an earlier reconnection failed: try again
            return
        if self._pub.is_closed and not self._conn.is_closed:
            try:
                self._pub = await self._conn.channel(publisher_confirms=True)
                return
            except Exception:
                log.debug("could not reopen the publishing channel", exc_info=True)
        if self._pub.is_closed:
            await self._reconnect()

    async def _consume(self, queues: Sequence[str]) -> None:
        if self._sub is None or self._sub.is_closed:
            if self._conn is None:
                await self._reconnect()  # an earlier reconnection failed: try again
            assert self._conn is not None
            try:
                self._sub = await self._conn.channel(publisher_confirms=False)
            except Exception:
                await self._reconnect()
                assert self._conn is not None
                self._sub = await self._conn.channel(publisher_confirms=False)
            await self._sub.set_qos(prefetch_count=self.prefetch)
            self._consuming.clear()
            self._consumers.clear()
        for queue in queues:
            if queue in self._consuming:
                continue
            await self.declare(queue)
            lanes = [(lane_name(queue, p), p) for p in range(1, self.max_priority + 1)]
            for name, priority in [(queue, 0), (exhausted_name(queue), 0), *lanes]:
                q = await self._sub.declare_queue(name, passive=True)
                tag = await q.consume(self._on_message(queue, priority), no_ack=False)
                self._consumers.append((q, tag))
            self._consuming.add(queue)

    def _on_message(self, queue: str, priority: int) -> Any:
        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            self._buffer.append((queue, priority, message))
            self._ready.set()

        return on_message

    def _delivery(
        self, queue: str, priority: int, message: aio_pika.abc.AbstractIncomingMessage
    ) -> Delivery:
        headers = dict(message.headers or {})
        meta = Meta.read(headers, fallback_job_id=message.message_id or "")
        returned = _int(headers.get("x-delivery-count"))
        # through jobfence.exhausted.Q: each such death took delivery_limit + 1 deliveries
        works = {lane_name(queue, p) for p in range(self.max_priority + 1)}
        lost_before = _limit_deaths(headers, works) * (self.delivery_limit + 1)
        attempt = meta.attempts + lost_before + returned + 1
        token = next(self._tokens)
        delivery = meta.delivery(queue, message.body, attempt, token=token, ref=message)
        delivery.priority = priority
        return delivery

    def _pick(self) -> tuple[str, int, aio_pika.abc.AbstractIncomingMessage]:
        """The next held message: the highest priority, the oldest within it; every
        AGE_ROUND_EVERY-th pick the oldest of all (no priority starves)."""
        self._picks += 1
        if self.max_priority == 0 or self._picks % AGE_ROUND_EVERY == 0:
            return self._buffer.popleft()
        best = max(range(len(self._buffer)), key=lambda i: (self._buffer[i][1], -i))
        chosen = self._buffer[best]
        del self._buffer[best]
        return chosen

    async def fetch(self, queues: Sequence[str], limit: int, timeout: float) -> list[Delivery]:
        if limit <= 0:
            return []
        await self._consume(queues)
        if not self._buffer:
            self._ready.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._ready.wait()
        found: list[Delivery] = []
        deadline = time.monotonic() + self.lease.total_seconds()
        while self._buffer and len(found) < limit:
            queue, priority, message = self._pick()
            delivery = self._delivery(queue, priority, message)
            self._held[delivery.token] = _Held(message, deadline)
            found.append(delivery)
        return found

    def wake(self) -> None:
        self._ready.set()

    # -- answers ----------------------------------------------------------------------------

    async def _settle(self, delivery: Delivery, *, ack: bool) -> None:
        held = self._held.pop(delivery.token, None)
        message: aio_pika.abc.AbstractIncomingMessage = delivery.ref
        if held is None and message.processed:
            return  # already given back (its lease ran out); the broker redelivers it
        if ack:
            await message.ack()
        else:
            await message.nack(requeue=True)

    async def ack(self, delivery: Delivery) -> None:
        await self._settle(delivery, ack=True)

    async def retry(
        self,
        delivery: Delivery,
        delay: timedelta,
        category: Category,
        error: str,
        *,
        trace: str | None = None,
    ) -> None:
        record = retry_record(delivery, delay, category, error, trace)
        meta = Meta.again(delivery, attempts=delivery.attempt, history=[*delivery.history, record])
        route = await self._route(delivery.queue, delay.total_seconds(), delivery.priority)
        await self._send(route, delivery.payload, meta)
        await self._settle(delivery, ack=True)

    async def release(self, delivery: Delivery, *, attempted: bool) -> None:
        attempts = delivery.attempt if attempted else delivery.attempt - 1
        await self._republish(delivery, attempts=attempts, delay=0.0)

    async def defer(self, delivery: Delivery, delay: timedelta, *, note: str | None = None) -> None:
        """A refunded copy through the delay bucket for ``delay`` (confirmed; a coarser grid
        than retries', see :func:`defer_delay`), then the old message acked: a new message,
        so its ``x-delivery-count`` starts again and no number of deferrals reaches the
        delivery limit."""
        history = deferred_history(delivery, delay, note)
        meta = Meta.again(delivery, attempts=delivery.attempt - 1, history=history)
        route = await self._route(delivery.queue, 0, ms=defer_bucket(delay.total_seconds()))
        await self._send(route, delivery.payload, meta)
        await self._settle(delivery, ack=True)

    async def extend(self, deliveries: Sequence[Delivery]) -> None:
        deadline = time.monotonic() + self.lease.total_seconds()
        for delivery in deliveries:
            held = self._held.get(delivery.token)
            if held is not None:
                held.deadline = deadline

    async def maintenance(self) -> None:
        """Give back deliveries whose lease ran out without an answer (the harness could not
        record their outcome): RabbitMQ redelivers them and counts the attempt."""
        now = time.monotonic()
        expired = [key for key, held in self._held.items() if held.deadline < now]
        for key in expired:
            held = self._held.pop(key)
            log.warning(
                "lease expired without an answer: returning the message to RabbitMQ",
                extra={"job_id": (held.message.headers or {}).get("jobfence-job-id")},
            )
            with contextlib.suppress(Exception):
                await held.message.nack(requeue=True)


def _int(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def _limit_deaths(headers: dict[str, Any], queues: set[str]) -> int:
    """How often RabbitMQ dead-lettered this message from ``queues`` (a queue and its
    priority lanes) for its delivery limit."""
    total = 0
    for death in headers.get("x-death") or []:
        if not isinstance(death, dict):
            continue
        reason = death.get("reason")
        where = death.get("queue")
        if isinstance(reason, bytes):
            reason = reason.decode()
        if isinstance(where, bytes):
            where = where.decode()
        if reason == "delivery_limit" and where in queues:
            total += int(death.get("count") or 0)
    return total
