"""The Google Cloud Pub/Sub adapter (see :mod:`jobfence.transports.pubsub` for the layout
on the server): connecting, publishing, consuming and the answers; its bases hold the
topology, the requests, the delayed jobs and the DLQ."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
from collections import deque
from collections.abc import Sequence
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

import grpc
from google.api_core import exceptions as gexc
from google.auth.credentials import AnonymousCredentials
from google.pubsub_v1 import types
from google.pubsub_v1.services.publisher import PublisherAsyncClient
from google.pubsub_v1.services.publisher.transports import PublisherGrpcAsyncIOTransport
from google.pubsub_v1.services.subscriber import SubscriberAsyncClient
from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcAsyncIOTransport

from ...core.jobs import Delivery, OutgoingJob
from ...errors import Category, ConfigurationError
from .. import Transport
from .._broker import Meta, Options, deferred_history, retry_record
from ..shielded import ShieldedFetch
from .attributes import ATTRIBUTES_RESERVE, MAX_MESSAGE_BYTES, attributes, read_meta
from .delayed import DelayedHolds
from .dlq import DeadLetterQueue
from .messaging import AckBatcher, AckToken
from .topology import MAX_ACK_DEADLINE, Names, encode_name, log


class PubSubTransport(DelayedHolds, DeadLetterQueue, Transport):
    """Jobs as messages of Google Cloud Pub/Sub topics, pulled from one shared subscription."""

    name = "pubsub"
    no_priorities_reason = "Pub/Sub delivers in no particular order and has no message priorities"
    shares_database = False

    def __init__(
        self,
        project: str,
        *,
        lease: timedelta = timedelta(seconds=30),
        worker_id: str = "jobfence",
        emulator: str | None = None,
        prefix: str = "jobfence",
        subscription: str = "workers",
        dlq: str = "dlq",
        max_delivery_attempts: int = 10,
        min_backoff: int = 10,
        max_backoff: int = 600,
        exactly_once: bool = False,
        create: bool = True,
    ) -> None:
        if not project:
            raise ConfigurationError("the Pub/Sub URL needs a project: pubsub://PROJECT")
        if not 5 <= max_delivery_attempts <= 100:
            raise ConfigurationError(
                "pubsub URL option max_delivery_attempts must be between 5 and 100 "
                f"(Pub/Sub's limits; the seed asks for 5–15), got {max_delivery_attempts}"
            )
        if not 0 <= min_backoff <= max_backoff <= MAX_ACK_DEADLINE:
            raise ConfigurationError(
                "pubsub URL options need 0 <= min_backoff <= max_backoff <= 600 seconds, got "
                f"min_backoff={min_backoff}, max_backoff={max_backoff}"
            )
        for option, value in (("subscription", subscription), ("dlq", dlq)):
            if not value or encode_name(value) != value:
                raise ConfigurationError(
                    f"pubsub URL option {option}={value!r} must be a non-empty name of "
                    "letters, digits and - _ . ~ +"
                )
        if not prefix or encode_name(prefix) != prefix or not prefix[0].isalpha():
            raise ConfigurationError(
                f"pubsub URL option prefix={prefix!r} must start with a letter and use only "
                "letters, digits and - _ . ~ +"
            )
        self.project = project
        self.lease = lease
        self.worker_id = worker_id
        self.emulator = emulator or os.environ.get("PUBSUB_EMULATOR_HOST") or None
        self.prefix = prefix
        self.subscription_suffix = subscription
        self.dlq_suffix = dlq
        self.max_delivery_attempts = max_delivery_attempts
        self.min_backoff = min_backoff
        self.max_backoff = max_backoff
        self.exactly_once = exactly_once
        self.create = create
        #: seconds a pulled message stays ours without a renewal (Pub/Sub counts whole seconds)
        self.deadline = min(max(math.ceil(lease.total_seconds()), 1), MAX_ACK_DEADLINE)
        #: longest wait of one pull of a queue. A pull that outlives its worker (killed) can
        #: still be handed a message until it ends (the emulator notices a dead client only
        #: then), and that message comes back only after the subscription's ack deadline,
        #: one lost attempt more. A pull shorter than the lease ends before a dead worker's
        #: own messages come back (the emulator answers an empty pull about 1 s early).
        self.pull_hold = 1.0 + lease.total_seconds() / 2
        self._publisher: PublisherAsyncClient | None = None
        self._subscriber: SubscriberAsyncClient | None = None
        self._ready: dict[str, Names] = {}
        self._sub_deadline: dict[str, int] = {}
        self._declare_lock = asyncio.Lock()
        self._consumed: set[str] = set()
        self._movers: dict[str, asyncio.Task[None]] = {}
        self._timers: dict[asyncio.Task[None], tuple[str, str]] = {}
        self._exhausted: deque[Delivery] = deque()
        self._reads = ShieldedFetch()
        self._acks = AckBatcher(self._ack_ids)

    @classmethod
    def from_url(cls, url: str, *, lease: timedelta, worker_id: str) -> PubSubTransport:
        options = Options(url, "pubsub")
        parts = urlsplit(url)
        project = parts.netloc or parts.path.strip("/")
        kwargs: dict[str, Any] = {
            "emulator": options.text("emulator", "") or None,
            "prefix": options.text("prefix", "jobfence"),
            "subscription": options.text("subscription", "workers"),
            "dlq": options.text("dlq", "dlq"),
            "max_delivery_attempts": options.integer("max_delivery_attempts", 10, minimum=5),
            "min_backoff": options.integer("min_backoff", 10),
            "max_backoff": options.integer("max_backoff", 600),
            "exactly_once": bool(options.integer("exactly_once", 0)),
            "create": bool(options.integer("create", 1)),
        }
        unknown = options.unused()
        if unknown:
            raise ConfigurationError(
                f"unknown pubsub URL option(s) {', '.join(unknown)}; known: emulator, prefix, "
                "subscription, dlq, max_delivery_attempts, min_backoff, max_backoff, "
                "exactly_once, create"
            )
        return cls(project, lease=lease, worker_id=worker_id, **kwargs)

    # -- connection -------------------------------------------------------------------------

    async def open(self) -> None:
        if self.emulator:
            publisher_channel = grpc.aio.insecure_channel(self.emulator)
            try:
                async with asyncio.timeout(15):
                    await publisher_channel.channel_ready()
            except TimeoutError:
                await publisher_channel.close()
                raise ConfigurationError(
                    f"cannot reach the Pub/Sub emulator at {self.emulator} (is it running? "
                    "gcloud beta emulators pubsub start --host-port=…)"
                ) from None
            credentials = AnonymousCredentials()  # type: ignore[no-untyped-call]
            self._publisher = PublisherAsyncClient(
                transport=PublisherGrpcAsyncIOTransport(
                    channel=publisher_channel,
                    credentials=credentials,
                )
            )
            self._subscriber = SubscriberAsyncClient(
                transport=SubscriberGrpcAsyncIOTransport(
                    channel=grpc.aio.insecure_channel(self.emulator),
                    credentials=credentials,
                )
            )
        else:
            try:
                self._publisher = PublisherAsyncClient()
                self._subscriber = SubscriberAsyncClient()
            except Exception as exc:
                raise ConfigurationError(
                    f"cannot create the Pub/Sub clients ({exc}); set up application default "
                    "credentials, or point ?emulator= / PUBSUB_EMULATOR_HOST at an emulator"
                ) from None

    async def close(self) -> None:
        if self._subscriber is None:
            return
        tasks = list(self._movers.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
        self._movers.clear()
        waiting = list(self._timers.items())
        self._timers.clear()
        for task, _ in waiting:
            task.cancel()
        for task, (subscription, ack_id) in waiting:
            with contextlib.suppress(BaseException):
                await task
            with contextlib.suppress(Exception):  # a delayed job goes back to be held again
                await self._modify(subscription, [ack_id], 0)
        for delivery in [*await self._reads.settle(), *self._exhausted]:
            try:
                await self.release(delivery, attempted=False)
            except Exception:
                log.exception("could not hand back a pulled message; its ack deadline will")
        self._exhausted.clear()
        for client in (self._publisher, self._subscriber):
            if client is not None:
                with contextlib.suppress(Exception):
                    await client.transport.close()  # type: ignore[no-untyped-call]
        self._publisher = None
        self._subscriber = None
        self._ready.clear()
        self._consumed.clear()

    @property
    def max_payload(self) -> int | None:
        return MAX_MESSAGE_BYTES - ATTRIBUTES_RESERVE

    @property
    def max_payload_reason(self) -> str:
        return (
            "Pub/Sub's 10 MB message limit counts data and attributes; "
            f"{ATTRIBUTES_RESERVE // 1024} KiB are kept for jobfence's attributes"
        )

    async def publish(self, jobs: Sequence[OutgoingJob]) -> None:
        self.check_payloads(jobs)
        groups: dict[tuple[str, bool], list[types.PubsubMessage]] = {}
        for job in jobs:
            message = types.PubsubMessage(
                data=job.payload, attributes=attributes(Meta.new(job), job.delay)
            )
            groups.setdefault((job.queue, job.delay > 0), []).append(message)
        await asyncio.gather(
            *(
                self._publish_to_queue(queue, messages, to="delay_topic" if delayed else "topic")
                for (queue, delayed), messages in groups.items()
            )
        )

    async def _copy(self, delivery: Delivery, meta: Meta, delay: float) -> None:
        """Publish a new copy of ``delivery`` (confirmed), then ack the old one."""
        message = types.PubsubMessage(data=delivery.payload, attributes=attributes(meta, delay))
        await self._publish_to_queue(
            delivery.queue, [message], to="delay_topic" if delay > 0 else "topic"
        )
        await self.ack(delivery)

    def _delivery(self, queue: str, names: Names, received: types.ReceivedMessage) -> Delivery:
        message = received.message
        meta = read_meta(dict(message.attributes), message.message_id)
        attempt = meta.attempts + max(int(received.delivery_attempt), 1)
        token = AckToken(self.subscription_path(names.subscription), received.ack_id)
        return meta.delivery(queue, bytes(message.data), attempt, token=token, ref=names.topic)

    async def fetch(self, queues: Sequence[str], limit: int, timeout: float) -> list[Delivery]:
        return await self._reads.fetch(
            self._exhausted, limit, lambda: self._read(queues, limit, timeout)
        )

    async def _read(self, queues: Sequence[str], limit: int, timeout: float) -> list[Delivery]:
        found: list[Delivery] = []
        per_queue = min(max(timeout / max(len(queues), 1), 0.05), self.pull_hold)
        for queue in queues:
            if len(found) >= limit:
                break
            names = await self.declare(queue)
            self._consume(queue)
            try:
                received = await self._pull(names.subscription, limit - len(found), per_queue)
            except gexc.NotFound as exc:
                await self._lost_topology(queue, exc)
                continue
            if not received:
                continue
            if self.deadline != self._sub_deadline.get(queue):
                # the subscription's deadline is not this worker's lease: set ours at once
                await self._modify(
                    self.subscription_path(names.subscription),
                    [r.ack_id for r in received],
                    self.deadline,
                )
            found += [self._delivery(queue, names, r) for r in received]
        return found

    def _consume(self, queue: str) -> None:
        """From the first fetch of ``queue`` on: move its due delayed jobs, read its DLQ."""
        self._consumed.add(queue)
        task = self._movers.get(queue)
        if task is None or task.done():
            self._movers[queue] = asyncio.get_running_loop().create_task(
                self._move_forever(queue), name=f"jobfence-pubsub-delay-{queue}"
            )

    async def ack(self, delivery: Delivery) -> None:
        token: AckToken = delivery.token
        await self._acks.ack(token.subscription, token.ack_id)

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
        await self._copy(delivery, meta, delay.total_seconds())

    async def release(self, delivery: Delivery, *, attempted: bool) -> None:
        token: AckToken = delivery.token
        if token.from_dlq:
            await self._modify(token.subscription, [token.ack_id], 0)
            return
        attempts = delivery.attempt if attempted else delivery.attempt - 1
        await self._copy(
            delivery, Meta.again(delivery, attempts=attempts, history=delivery.history), 0.0
        )

    async def defer(self, delivery: Delivery, delay: timedelta, *, note: str | None = None) -> None:
        """A refunded copy on the delay topic (held there until due, like a retry's), then
        the old message acked: the copy's ``delivery_attempt`` starts again, so no number of
        deferrals reaches ``max_delivery_attempts``."""
        token: AckToken = delivery.token
        if token.from_dlq:  # Pub/Sub's own dead letter: held on the DLQ subscription instead
            seconds = min(max(math.ceil(delay.total_seconds()), 0), MAX_ACK_DEADLINE)
            await self._modify(token.subscription, [token.ack_id], seconds)
            return
        history = deferred_history(delivery, delay, note)
        meta = Meta.again(delivery, attempts=delivery.attempt - 1, history=history)
        await self._copy(delivery, meta, max(delay.total_seconds(), 0.0))

    async def extend(self, deliveries: Sequence[Delivery]) -> None:
        by_subscription: dict[str, list[str]] = {}
        for delivery in deliveries:
            token: AckToken = delivery.token
            by_subscription.setdefault(token.subscription, []).append(token.ack_id)
        for subscription, ack_ids in by_subscription.items():
            await self._modify(subscription, ack_ids, self.deadline)
