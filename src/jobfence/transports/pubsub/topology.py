"""The Pub/Sub topology of jobfence queues: names and paths, the topics and subscriptions
with their dead-letter and retry policies, created (or, with ``create=0``, only verified)
once, and recreated when they are gone."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from urllib.parse import quote

from google.api_core import exceptions as gexc
from google.pubsub_v1 import types
from google.pubsub_v1.services.publisher import PublisherAsyncClient
from google.pubsub_v1.services.subscriber import SubscriberAsyncClient

from ...errors import ConfigurationError

log = logging.getLogger("jobfence.transport.pubsub")

#: Pub/Sub's longest ack deadline (seconds)
MAX_ACK_DEADLINE = 600
API_TIMEOUT = 30.0  # seconds for an administrative call, a publish or an ack
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


def _seconds(value: Any) -> float:
    """A protobuf Duration as proto-plus hands it over (a timedelta), in seconds."""
    if isinstance(value, timedelta):
        return value.total_seconds()
    return float(getattr(value, "seconds", 0) or 0) + float(getattr(value, "nanos", 0) or 0) / 1e9


class PubSubTopology:
    """The names, topics and subscriptions of a :class:`~.transport.PubSubTransport` (its
    base), and its clients."""

    project: str
    prefix: str
    subscription_suffix: str
    dlq_suffix: str
    max_delivery_attempts: int
    min_backoff: int
    max_backoff: int
    exactly_once: bool
    create: bool
    deadline: int
    _publisher: PublisherAsyncClient | None
    _subscriber: SubscriberAsyncClient | None
    _ready: dict[str, Names]
    _sub_deadline: dict[str, int]
    _declare_lock: asyncio.Lock

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

    # -- clients ----------------------------------------------------------------------------

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
        """The workers' subscription of a queue, as jobfence declares it. With
        ``min_backoff=0&max_backoff=0`` it has no retry policy: Pub/Sub's default, which
        redelivers as soon as possible (and which the emulator keeps without the flaw of its
        backoff, see docs/transports.md)."""
        config = types.Subscription(
            name=self.subscription_path(names.subscription),
            topic=self.topic_path(names.topic),
            ack_deadline_seconds=min(max(self.deadline, 10), MAX_ACK_DEADLINE),
            dead_letter_policy=types.DeadLetterPolicy(
                dead_letter_topic=self.topic_path(names.dlq_topic),
                max_delivery_attempts=self.max_delivery_attempts,
            ),
            enable_exactly_once_delivery=self.exactly_once,
        )
        if self.max_backoff > 0:
            config.retry_policy = types.RetryPolicy(
                minimum_backoff=timedelta(seconds=self.min_backoff),
                maximum_backoff=timedelta(seconds=self.max_backoff),
            )
        return config

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
