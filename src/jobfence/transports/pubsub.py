"""Google Cloud Pub/Sub as the queue (``pubsub://PROJECT``), with the official client
(google-cloud-pubsub's asyncio clients), on the Pub/Sub emulator or the real service.

Per jobfence queue ``Q`` (names derived from ``prefix``; ``Q`` percent-encoded where Pub/Sub's
name rules need it, see :meth:`PubSubTransport.names`):

* topic ``<prefix>.Q`` and the pull subscription ``<prefix>.Q.<subscription>`` shared by every
  worker: acks only after the work committed, ack deadline = the app's lease (renewed with
  ModifyAckDeadline while a handler runs), a dead-letter policy to the DLQ topic after
  ``max_delivery_attempts`` (default 10) deliveries without an answer, a retry policy
  (``min_backoff`` 10 s, ``max_backoff`` 10 min) for those redeliveries, exactly-once
  delivery off (the fence makes a redelivery harmless);
* topic ``<prefix>.Q.<dlq>`` (``.dlq``) and its subscription: what Pub/Sub dead-letters comes
  back to a worker and becomes a jobfence dead letter without being run again; every
  jobfence dead letter of ``Q`` is published there with the attributes of seed 004 §10.5
  and the marker ``jobfence-dead-letter``, which workers ack without reading further: the
  two paths cannot feed each other;
* topic ``<prefix>.Q.delay`` and its subscription (no dead-letter policy, no retry policy):
  a job due later (a retry's delay, ``enqueue(delay=…)``) is published there with its delay
  in an attribute; a worker holds it (ModifyAckDeadline, at most 10 min at a time) until it
  is due, then publishes it to ``Q``'s topic and acks it. Pub/Sub has no scheduled delivery;
  holding the copy on a subscription of its own keeps the holds out of ``Q``'s delivery
  counter.

A retry is a new copy of the message carrying the attempts and the history in its
attributes, so Pub/Sub's ``delivery_attempt`` restarts with every copy and only counts the
deliveries of one copy that got no answer: jobfence's retry policy decides every dead letter
of an attempt that reached a harness. Attempts follow SPEC R1: the attributes' count plus
the copy's ``delivery_attempt`` (a delivery lost with its worker counts).

URL options (all read by jobfence): ``emulator`` (``host:port``; default
``$PUBSUB_EMULATOR_HOST``, else the real service with application default credentials),
``prefix`` (default ``jobfence``), ``subscription`` (suffix, default ``workers``), ``dlq``
(suffix, default ``dlq``), ``max_delivery_attempts`` (5–100, default 10), ``min_backoff`` and
``max_backoff`` (seconds, 0–600, default 10 and 600), ``exactly_once`` (0/1, default 0),
``create`` (1: create missing topics and subscriptions; 0: only verify them, for projects
where the workers may not create resources).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import math
import os
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import timedelta
from typing import Any
from urllib.parse import quote, urlsplit

import grpc
from google.api_core import exceptions as gexc
from google.auth.credentials import AnonymousCredentials
from google.pubsub_v1 import types
from google.pubsub_v1.services.publisher import PublisherAsyncClient
from google.pubsub_v1.services.publisher.transports import PublisherGrpcAsyncIOTransport
from google.pubsub_v1.services.subscriber import SubscriberAsyncClient
from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcAsyncIOTransport

from ..errors import Category, ConfigurationError
from ..jobs import AttemptRecord, Delivery
from ..store import OutgoingJob
from . import Transport
from ._broker import DELAY, HISTORY, JOB_ID, Meta, Options, ShieldedFetch, retry_record

log = logging.getLogger("jobfence.transport.pubsub")
#: Pub/Sub's limit on one message (data and attributes), and what jobfence keeps for its
#: attributes (ids, attempts and one attribute per attempt of history, each ≤ 1 024 bytes)
MAX_MESSAGE_BYTES = 10_000_000
ATTRIBUTES_RESERVE = 256 * 1024

#: Pub/Sub's limits: messages per publish request, bytes of one attribute value, ack
#: deadline (seconds), ack ids per acknowledge/modify request (we stay well below 512 KB)
PUBLISH_BATCH = 1000
PUBLISH_BYTES = 9 * 1024 * 1024
ATTRIBUTE_BYTES = 1024
MAX_ACK_DEADLINE = 600
ACK_BATCH = 1000
MAX_PULL = 1000
#: the history travels as one attribute per attempt (Pub/Sub allows 100 attributes)
HISTORY_ATTRIBUTE = "jobfence-history-"
MAX_HISTORY = 80
#: marks a message jobfence published to a DLQ topic (workers ack it and read no further)
DEAD_LETTER = "jobfence-dead-letter"
#: attributes Pub/Sub adds to a message it dead-letters
SOURCE_COUNT = "CloudPubSubDeadLetterSourceDeliveryCount"
SOURCE_SUBSCRIPTION = "CloudPubSubDeadLetterSourceSubscription"
#: the seed's DLQ attributes (004 §10.5), always all present ("" when unknown)
DLQ_ATTRIBUTES = (
    "requestId",
    "eventId",
    "partnerId",
    "original_topic",
    "original_subscription",
    "attempts",
    "error_code",
    "error_category",
)

API_TIMEOUT = 30.0  # seconds for an administrative call, a publish or an ack
DELAY_POLL = 10.0  # seconds one pull of a delay subscription may wait
DLQ_POLL = 0.5  # seconds one pull of a DLQ subscription may wait (from maintenance)
AUX_ACK_DEADLINE = 10  # the delay subscriptions' ack deadline (Pub/Sub's minimum)
DLQ_ACK_DEADLINE = 60
NAME_LIMIT = 255
_NAME_SAFE = "-_.~+"


def encode_name(queue: str) -> str:
    """``queue`` in the characters Pub/Sub allows in a name (the rest percent-encoded)."""
    return quote(queue, safe=_NAME_SAFE)


@dataclass(frozen=True)
class Names:
    """The short ids of one queue's topics and subscriptions."""

    topic: str
    subscription: str
    delay_topic: str
    delay_subscription: str
    dlq_topic: str
    dlq_subscription: str


@dataclass
class _Token:
    subscription: str  # full path of the subscription the message was pulled from
    ack_id: str
    from_dlq: bool = False


def _fit(value: str, limit: int = ATTRIBUTE_BYTES) -> str:
    """``value`` cut (at a character boundary) to at most ``limit`` UTF-8 bytes."""
    raw = value.encode("utf-8")
    if len(raw) <= limit:
        return value
    return raw[: limit - 3].decode("utf-8", errors="ignore") + "…"


def _record_value(record: AttemptRecord) -> str:
    """One history record as an attribute value of at most 1024 bytes (the error is cut)."""
    data = asdict(record)
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    error = record.error
    while len(text.encode("utf-8")) > ATTRIBUTE_BYTES and error:
        error = _fit(error, max(len(error.encode("utf-8")) * 3 // 4, 4))
        data["error"] = error
        text = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    return text


def attributes(meta: Meta, delay: float = 0.0) -> dict[str, str]:
    """A job's metadata as Pub/Sub message attributes (each value within Pub/Sub's limit)."""
    found = meta.headers()
    found.pop(HISTORY, None)
    for index, record in enumerate(meta.history[-MAX_HISTORY:]):
        found[f"{HISTORY_ATTRIBUTE}{index:03d}"] = _record_value(record)
    if delay > 0:
        found[DELAY] = f"{delay:.6f}"
    return found


def read_meta(attrs: dict[str, str], fallback_job_id: str) -> Meta:
    """The metadata of a message published by :func:`attributes`."""
    meta = Meta.read(attrs, fallback_job_id=fallback_job_id)
    history: list[AttemptRecord] = []
    for key in sorted(k for k in attrs if k.startswith(HISTORY_ATTRIBUTE)):
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            history.append(AttemptRecord.from_json(json.loads(attrs[key])))
    return replace(meta, history=history)


def _payload_object(payload: bytes) -> dict[str, Any]:
    """A payload that is a JSON object (of at most 1 MiB), else {}."""
    if len(payload) > 1024 * 1024 or payload.lstrip()[:1] != b"{":
        return {}
    try:
        data = json.loads(payload)
    except (ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def _first_text(data: dict[str, Any], *keys: str) -> str:
    """The first non-blank string among ``keys`` of ``data``, else ""."""
    for key in keys:
        value = data.get(key)
        if isinstance(value, str) and value.strip():
            return value
    return ""


def dead_letter_attributes(
    delivery: Delivery,
    names: Names,
    *,
    consumer: str,
    category: Category,
    code: str | None,
) -> dict[str, str]:
    """The attributes of a jobfence dead letter on the DLQ topic: seed 004 §10.5 (every key
    present, "" when unknown) plus jobfence's marker and identity."""
    event = _payload_object(delivery.payload)
    seed = {
        "requestId": _first_text(event, "requestId", "request_id")
        or (delivery.correlation_id or ""),
        "eventId": delivery.job_id,
        "partnerId": _first_text(event, "partnerId", "partner_id"),
        "original_topic": names.topic,
        "original_subscription": names.subscription,
        "attempts": str(delivery.attempt),
        "error_code": code or "",
        "error_category": category.value,
    }
    found = {key: _fit(seed[key]) for key in DLQ_ATTRIBUTES}
    found[DEAD_LETTER] = "1"
    found[JOB_ID] = delivery.job_id
    found["jobfence-queue"] = _fit(delivery.queue)
    found["jobfence-consumer"] = _fit(consumer)
    return found


def delayed_step(wait: float) -> tuple[str, float]:
    """What a worker does with a delayed job due in ``wait`` seconds (its clock):

    * ``("move", 0)`` — due: publish it to the queue's topic now;
    * ``("hold", s)`` — give it back to Pub/Sub for ``s`` whole seconds (its ack deadline:
      1 ≤ s ≤ min(wait, 600)), after which Pub/Sub hands it out again, never early;
    * ``("timer", wait)`` — less than a second left: wait for it in this process.
    """
    if wait <= 0:
        return ("move", 0.0)
    if wait < 1.0:
        return ("timer", wait)
    return ("hold", float(min(int(wait), MAX_ACK_DEADLINE)))


def _seconds(value: Any) -> float:
    """A protobuf Duration as proto-plus hands it over (a timedelta), in seconds."""
    if isinstance(value, timedelta):
        return value.total_seconds()
    return float(getattr(value, "seconds", 0) or 0) + float(getattr(value, "nanos", 0) or 0) / 1e9


class _AckBatcher:
    """Acks that arrive while one Acknowledge request is on its way go out together in the
    next one (per subscription): under load one request answers many jobs, and an ack still
    returns only once Pub/Sub has it."""

    def __init__(self, send: Callable[[str, Sequence[str]], Awaitable[None]]) -> None:
        self._send = send
        self._pending: dict[str, list[tuple[str, asyncio.Future[None]]]] = {}
        self._task: asyncio.Task[None] | None = None

    async def ack(self, subscription: str, ack_id: str) -> None:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.setdefault(subscription, []).append((ack_id, done))
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())
        await done

    async def _run(self) -> None:
        try:
            while self._pending:
                pending, self._pending = self._pending, {}
                for subscription, items in pending.items():
                    try:
                        await self._send(subscription, [ack_id for ack_id, _ in items])
                    except Exception as exc:
                        for _, done in items:
                            if not done.done():
                                done.set_exception(exc)
                    else:
                        for _, done in items:
                            if not done.done():
                                done.set_result(None)
        finally:
            self._task = None


class PubSubTransport(Transport):
    """Jobs as messages of Google Cloud Pub/Sub topics, pulled from one shared subscription."""

    name = "pubsub"
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
        self._acks = _AckBatcher(self._ack_ids)

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

    # -- names ------------------------------------------------------------------------------

    def names(self, queue: str) -> Names:
        """Topic and subscription ids of ``queue`` (a hash replaces what would not fit)."""
        base = f"{self.prefix}.{encode_name(queue)}"
        longest = max(len(self.dlq_suffix), len("delay")) + len(self.subscription_suffix) + 2
        if len(base) + longest > NAME_LIMIT:
            digest = hashlib.sha1(queue.encode()).hexdigest()[:10]
            base = f"{base[: NAME_LIMIT - longest - 11]}~{digest}"
        sub = self.subscription_suffix
        delay = f"{base}.delay"
        dlq = f"{base}.{self.dlq_suffix}"
        return Names(base, f"{base}.{sub}", delay, f"{delay}.{sub}", dlq, f"{dlq}.{sub}")

    def topic_path(self, topic: str) -> str:
        return f"projects/{self.project}/topics/{topic}"

    def subscription_path(self, subscription: str) -> str:
        return f"projects/{self.project}/subscriptions/{subscription}"

    # -- connection -------------------------------------------------------------------------

    async def open(self) -> None:
        if self.emulator:
            publisher_channel = grpc.aio.insecure_channel(self.emulator)
            try:
                await asyncio.wait_for(publisher_channel.channel_ready(), timeout=15)
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
    def publisher(self) -> PublisherAsyncClient:
        if self._publisher is None:
            raise RuntimeError("the Pub/Sub transport is not open")
        return self._publisher

    @property
    def subscriber(self) -> SubscriberAsyncClient:
        if self._subscriber is None:
            raise RuntimeError("the Pub/Sub transport is not open")
        return self._subscriber

    # -- topology ---------------------------------------------------------------------------

    def subscription_config(self, names: Names) -> types.Subscription:
        """The workers' subscription of a queue, as jobfence declares it."""
        return types.Subscription(
            name=self.subscription_path(names.subscription),
            topic=self.topic_path(names.topic),
            ack_deadline_seconds=min(max(self.deadline, 10), MAX_ACK_DEADLINE),
            dead_letter_policy=types.DeadLetterPolicy(
                dead_letter_topic=self.topic_path(names.dlq_topic),
                max_delivery_attempts=self.max_delivery_attempts,
            ),
            retry_policy=types.RetryPolicy(
                minimum_backoff=timedelta(seconds=self.min_backoff),
                maximum_backoff=timedelta(seconds=self.max_backoff),
            ),
            enable_exactly_once_delivery=self.exactly_once,
        )

    def _problems(self, found: types.Subscription, names: Names) -> list[str]:
        """How ``found`` (read from the server) differs from what jobfence needs."""
        want = self.subscription_config(names)
        problems = []
        if found.topic != want.topic:
            problems.append(f"topic {found.topic} (want {want.topic})")
        dead = found.dead_letter_policy
        if dead.dead_letter_topic != want.dead_letter_policy.dead_letter_topic:
            problems.append(
                f"dead-letter topic {dead.dead_letter_topic or 'none'} "
                f"(want {want.dead_letter_policy.dead_letter_topic})"
            )
        if dead.max_delivery_attempts != self.max_delivery_attempts:
            problems.append(
                f"max_delivery_attempts {dead.max_delivery_attempts} "
                f"(want {self.max_delivery_attempts})"
            )
        backoff = (
            _seconds(found.retry_policy.minimum_backoff),
            _seconds(found.retry_policy.maximum_backoff),
        )
        if backoff != (float(self.min_backoff), float(self.max_backoff)):
            problems.append(
                f"retry policy {backoff[0]:g}s–{backoff[1]:g}s "
                f"(want {self.min_backoff}s–{self.max_backoff}s)"
            )
        if found.enable_exactly_once_delivery != self.exactly_once:
            problems.append(
                f"exactly-once delivery {found.enable_exactly_once_delivery} "
                f"(want {self.exactly_once})"
            )
        if found.filter:
            problems.append(f"filter {found.filter!r} (want none)")
        return problems

    async def _ensure_topic(self, topic: str) -> None:
        path = self.topic_path(topic)
        if self.create:
            with contextlib.suppress(gexc.AlreadyExists):
                await self.publisher.create_topic(name=path, timeout=API_TIMEOUT)
            return
        try:
            await self.publisher.get_topic(topic=path, timeout=API_TIMEOUT)
        except gexc.NotFound:
            raise ConfigurationError(
                f"Pub/Sub topic {path} does not exist and this transport may only verify "
                "(?create=0): create it (see docs/transports.md) or allow creation"
            ) from None

    async def _ensure_subscription(self, config: types.Subscription) -> types.Subscription:
        if self.create:
            with contextlib.suppress(gexc.AlreadyExists):
                return await self.subscriber.create_subscription(
                    request=config, timeout=API_TIMEOUT
                )
        try:
            return await self.subscriber.get_subscription(
                subscription=config.name, timeout=API_TIMEOUT
            )
        except gexc.NotFound:
            raise ConfigurationError(
                f"Pub/Sub subscription {config.name} does not exist and this transport may "
                "only verify (?create=0): create it (see docs/transports.md) or allow creation"
            ) from None

    async def declare(self, queue: str) -> Names:
        """Create (or, with ``create=0``, verify) ``queue``'s topics and subscriptions.

        The order matters: a message published to a topic without a subscription is
        dropped, and Pub/Sub loses what it dead-letters to a topic that has none.
        """
        names = self._ready.get(queue)
        if names is not None:
            return names
        async with self._declare_lock:
            names = self._ready.get(queue)
            if names is not None:
                return names
            names = self.names(queue)
            for topic in (names.dlq_topic, names.delay_topic, names.topic):
                await self._ensure_topic(topic)
            await self._ensure_subscription(
                types.Subscription(
                    name=self.subscription_path(names.dlq_subscription),
                    topic=self.topic_path(names.dlq_topic),
                    ack_deadline_seconds=DLQ_ACK_DEADLINE,
                )
            )
            await self._ensure_subscription(
                types.Subscription(
                    name=self.subscription_path(names.delay_subscription),
                    topic=self.topic_path(names.delay_topic),
                    ack_deadline_seconds=AUX_ACK_DEADLINE,
                )
            )
            found = await self._ensure_subscription(self.subscription_config(names))
            problems = self._problems(found, names)
            if problems:
                raise ConfigurationError(
                    f"Pub/Sub subscription {found.name} exists with other settings than "
                    f"jobfence declares: {'; '.join(problems)}. Update it (gcloud pubsub "
                    "subscriptions update …) or change the URL options to match"
                )
            self._sub_deadline[queue] = int(found.ack_deadline_seconds)
            self._ready[queue] = names
            return names

    async def _lost_topology(self, queue: str, exc: Exception) -> None:
        """A topic or subscription is gone (an emulator restarted; someone deleted it)."""
        self._ready.pop(queue, None)
        if not self.create:
            log.error(
                "a Pub/Sub topic or subscription of this queue is gone, and this transport "
                "may not create it (?create=0)",
                extra={"queue": queue, "error": str(exc)},
            )
            return
        log.warning(
            "a Pub/Sub topic or subscription of this queue is gone (emulator restarted? "
            "deleted?): creating it again; messages it held are lost",
            extra={"queue": queue, "error": str(exc)},
        )
        await self.declare(queue)

    # -- publishing -------------------------------------------------------------------------

    async def _publish(self, topic: str, messages: Sequence[types.PubsubMessage]) -> None:
        """Publish in requests within Pub/Sub's limits; returns once all were accepted."""
        path = self.topic_path(topic)
        chunk: list[types.PubsubMessage] = []
        size = 0
        pending = []
        for message in messages:
            weight = len(message.data) + sum(len(k) + len(v) for k, v in message.attributes.items())
            if chunk and (len(chunk) >= PUBLISH_BATCH or size + weight > PUBLISH_BYTES):
                pending.append(chunk)
                chunk, size = [], 0
            chunk.append(message)
            size += weight
        if chunk:
            pending.append(chunk)
        await asyncio.gather(
            *(
                self.publisher.publish(topic=path, messages=part, timeout=API_TIMEOUT)
                for part in pending
            )
        )

    async def _publish_to_queue(
        self, queue: str, messages: Sequence[types.PubsubMessage], *, to: str = "topic"
    ) -> None:
        """Publish to one of ``queue``'s topics (``to``: a :class:`Names` field), creating the
        topology again once if it is gone."""
        names = await self.declare(queue)
        try:
            await self._publish(getattr(names, to), messages)
        except gexc.NotFound as exc:
            await self._lost_topology(queue, exc)
            await self._publish(getattr(await self.declare(queue), to), messages)

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

    # -- consuming --------------------------------------------------------------------------

    async def _pull(
        self, subscription: str, max_messages: int, timeout: float
    ) -> list[types.ReceivedMessage]:
        """One pull; Pub/Sub holds it until messages arrive or (about) ``timeout`` passed."""
        try:
            response = await self.subscriber.pull(
                subscription=self.subscription_path(subscription),
                max_messages=min(max_messages, MAX_PULL),
                timeout=max(timeout, 0.05),
                retry=None,
            )
        except gexc.DeadlineExceeded:
            return []
        return list(response.received_messages)

    async def _modify(self, subscription: str, ack_ids: Sequence[str], seconds: int) -> None:
        for start in range(0, len(ack_ids), ACK_BATCH):
            await self.subscriber.modify_ack_deadline(
                subscription=subscription,
                ack_ids=list(ack_ids[start : start + ACK_BATCH]),
                ack_deadline_seconds=seconds,
                timeout=API_TIMEOUT,
            )

    def _delivery(self, queue: str, names: Names, received: types.ReceivedMessage) -> Delivery:
        message = received.message
        meta = read_meta(dict(message.attributes), message.message_id)
        attempt = meta.attempts + max(int(received.delivery_attempt), 1)
        token = _Token(self.subscription_path(names.subscription), received.ack_id)
        return meta.delivery(queue, bytes(message.data), attempt, token=token, ref=names.topic)

    async def fetch(self, queues: Sequence[str], limit: int, timeout: float) -> list[Delivery]:
        if limit <= 0:
            return []
        found: list[Delivery] = []
        while self._exhausted and len(found) < limit:
            found.append(self._exhausted.popleft())
        found += self._reads.take(limit - len(found))
        if found:
            return found
        return await self._reads.run(self._read(queues, limit, timeout))

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

    # -- delayed jobs -----------------------------------------------------------------------

    async def _move_forever(self, queue: str) -> None:
        """Hold delayed jobs of ``queue`` until due, then move them to its topic."""
        while True:
            try:
                names = await self.declare(queue)
                received = await self._pull(names.delay_subscription, 100, DELAY_POLL)
                if received:
                    await self._sort_delayed(queue, names, received)
            except asyncio.CancelledError:
                raise
            except gexc.NotFound as exc:
                with contextlib.suppress(Exception):
                    await self._lost_topology(queue, exc)
                await asyncio.sleep(1.0)
            except gexc.ServiceUnavailable as exc:
                log.warning("Pub/Sub is unavailable: delayed jobs wait", extra={"error": str(exc)})
                await asyncio.sleep(1.0)
            except Exception:
                log.exception("moving delayed jobs failed; trying again", extra={"queue": queue})
                await asyncio.sleep(1.0)

    async def _sort_delayed(
        self, queue: str, names: Names, received: Iterable[types.ReceivedMessage]
    ) -> None:
        """Due jobs are moved now; the others are held (server-side while a second or more
        is left, in this process for the last fraction of a second)."""
        subscription = self.subscription_path(names.delay_subscription)
        now = time.time()
        due: list[types.ReceivedMessage] = []
        holds: dict[int, list[str]] = {}
        for item in received:
            try:
                delay = float(item.message.attributes.get(DELAY) or 0)
            except ValueError:
                delay = 0.0
            step, seconds = delayed_step(item.message.publish_time.timestamp() + delay - now)
            if step == "hold":
                holds.setdefault(int(seconds), []).append(item.ack_id)
            elif step == "timer":
                timer = asyncio.get_running_loop().create_task(
                    self._move_later(queue, names, item, seconds)
                )
                self._timers[timer] = (subscription, item.ack_id)
                timer.add_done_callback(lambda t: self._timers.pop(t, None))
            else:
                due.append(item)
        for seconds, ack_ids in holds.items():
            await self._modify(subscription, ack_ids, seconds)
        if due:
            await self._move(queue, names, due)

    async def _move_later(
        self, queue: str, names: Names, item: types.ReceivedMessage, wait: float
    ) -> None:
        await asyncio.sleep(wait)
        try:
            await self._move(queue, names, [item])
        except Exception:
            log.exception("moving a delayed job failed; it comes back to be moved again")

    async def _move(self, queue: str, names: Names, items: Sequence[types.ReceivedMessage]) -> None:
        """Publish due jobs to the queue's topic (confirmed), then ack their delayed copies."""
        messages = []
        for item in items:
            attrs = dict(item.message.attributes)
            attrs.pop(DELAY, None)
            messages.append(types.PubsubMessage(data=item.message.data, attributes=attrs))
        await self._publish_to_queue(queue, messages)
        await self._ack_ids(
            self.subscription_path(names.delay_subscription), [i.ack_id for i in items]
        )

    # -- answers ----------------------------------------------------------------------------

    async def _ack_ids(self, subscription: str, ack_ids: Sequence[str]) -> None:
        for start in range(0, len(ack_ids), ACK_BATCH):
            await self.subscriber.acknowledge(
                subscription=subscription,
                ack_ids=list(ack_ids[start : start + ACK_BATCH]),
                timeout=API_TIMEOUT,
            )

    async def ack(self, delivery: Delivery) -> None:
        token: _Token = delivery.token
        await self._acks.ack(token.subscription, token.ack_id)

    async def retry(
        self, delivery: Delivery, delay: timedelta, category: Category, error: str
    ) -> None:
        record = retry_record(delivery, delay, category, error)
        meta = Meta.again(delivery, attempts=delivery.attempt, history=[*delivery.history, record])
        await self._copy(delivery, meta, delay.total_seconds())

    async def release(self, delivery: Delivery, *, attempted: bool) -> None:
        token: _Token = delivery.token
        if token.from_dlq:
            await self._modify(token.subscription, [token.ack_id], 0)
            return
        attempts = delivery.attempt if attempted else delivery.attempt - 1
        await self._copy(
            delivery, Meta.again(delivery, attempts=attempts, history=delivery.history), 0.0
        )

    async def extend(self, deliveries: Sequence[Delivery]) -> None:
        by_subscription: dict[str, list[str]] = {}
        for delivery in deliveries:
            token: _Token = delivery.token
            by_subscription.setdefault(token.subscription, []).append(token.ack_id)
        for subscription, ack_ids in by_subscription.items():
            await self._modify(subscription, ack_ids, self.deadline)

    async def dead_lettered(
        self, delivery: Delivery, *, consumer: str, category: Category, code: str | None
    ) -> None:
        """Publish a jobfence dead letter to the queue's DLQ topic (seed 004 §10.5) — unless
        Pub/Sub itself put the message there: one DLQ message per failure, and no loop."""
        token: _Token = delivery.token
        if token.from_dlq:
            return
        message = types.PubsubMessage(
            data=delivery.payload,
            attributes=dead_letter_attributes(
                delivery, self.names(delivery.queue), consumer=consumer, category=category,
                code=code,
            ),
        )  # fmt: skip
        await self._publish_to_queue(delivery.queue, [message], to="dlq_topic")

    # -- what Pub/Sub dead-lettered -----------------------------------------------------------

    async def maintenance(self) -> None:
        """Read each consumed queue's DLQ subscription: jobfence's own dead letters are acked,
        what Pub/Sub dead-lettered is handed to the harness (which dead-letters it)."""
        if self._exhausted:
            return  # the last ones still wait for a harness
        for queue in list(self._consumed):
            names = self._ready.get(queue)
            if names is None:
                continue
            try:
                received = await self._pull(names.dlq_subscription, 50, DLQ_POLL)
            except gexc.NotFound as exc:
                await self._lost_topology(queue, exc)
                continue
            own = [r.ack_id for r in received if r.message.attributes.get(DEAD_LETTER)]
            if own:
                await self._ack_ids(self.subscription_path(names.dlq_subscription), own)
            for item in received:
                if not item.message.attributes.get(DEAD_LETTER):
                    self._exhausted.append(self._from_dlq(queue, names, item))

    def _from_dlq(self, queue: str, names: Names, item: types.ReceivedMessage) -> Delivery:
        attrs = dict(item.message.attributes)
        meta = read_meta(attrs, item.message.message_id)
        try:
            count = max(int(attrs.get(SOURCE_COUNT) or 0), 0)
        except ValueError:
            count = 0
        source = attrs.get(SOURCE_SUBSCRIPTION, "")
        if source:
            reason = (
                f"Pub/Sub dead-lettered it after {count} deliveries without an answer "
                f"(max_delivery_attempts of subscription {source}); it is not run again"
            )
        else:
            reason = (
                f"found on the DLQ topic {names.dlq_topic} without Pub/Sub's dead-letter "
                "attributes (published there by something else); it is not run"
            )
        log.warning(
            "Pub/Sub dead-lettered a message: it becomes a jobfence dead letter",
            extra={"job_id": meta.job_id, "queue": queue, "deliveries": count},
        )
        token = _Token(self.subscription_path(names.dlq_subscription), item.ack_id, from_dlq=True)
        delivery = meta.delivery(
            queue, bytes(item.message.data), meta.attempts + count + 1, token=token, ref=names.topic
        )
        delivery.given_up = reason
        return delivery

    # -- introspection ----------------------------------------------------------------------

    async def durability(self, queue: str) -> dict[str, Any]:
        """The queue's subscriptions as the server reports them."""
        names = await self.declare(queue)

        async def read(name: str) -> types.Subscription:
            return await self.subscriber.get_subscription(
                subscription=self.subscription_path(name), timeout=API_TIMEOUT
            )

        main, delay, dlq = (
            await read(names.subscription),
            await read(names.delay_subscription),
            await read(names.dlq_subscription),
        )

        def short(path: str) -> str:
            return path.rpartition("/")[2]

        return {
            "topic": short(main.topic),
            "subscription": short(main.name),
            "ack_deadline_seconds": main.ack_deadline_seconds,
            "dead_letter_topic": short(main.dead_letter_policy.dead_letter_topic),
            "max_delivery_attempts": main.dead_letter_policy.max_delivery_attempts,
            "minimum_backoff": _seconds(main.retry_policy.minimum_backoff),
            "maximum_backoff": _seconds(main.retry_policy.maximum_backoff),
            "exactly_once": main.enable_exactly_once_delivery,
            "dlq_subscription": (short(dlq.name), short(dlq.topic)),
            "delay_subscription": (
                short(delay.name),
                short(delay.topic),
                bool(delay.dead_letter_policy.dead_letter_topic),
                _seconds(delay.retry_policy.minimum_backoff),
            ),
        }
