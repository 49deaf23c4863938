"""The requests that move messages: publish within Pub/Sub's limits (to a queue's topics,
recreating them once if they are gone), pull, set ack deadlines, acknowledge (batched while
a request is on its way); and the token of a pulled message."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from google.api_core import exceptions as gexc
from google.pubsub_v1 import types

from .topology import API_TIMEOUT, PubSubTopology

#: Pub/Sub's limits: messages and bytes per publish request, ack ids per acknowledge/modify
#: request (we stay well below 512 KB), messages per pull
PUBLISH_BATCH = 1000
PUBLISH_BYTES = 9 * 1024 * 1024
ACK_BATCH = 1000
MAX_PULL = 1000


@dataclass
class AckToken:
    subscription: str  # full path of the subscription the message was pulled from
    ack_id: str
    from_dlq: bool = False


class AckBatcher:
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


class PubSubMessaging(PubSubTopology):
    """Publishing, pulling, ack deadlines and acks of a :class:`~.transport.PubSubTransport`
    (its base)."""

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

    # -- answers ----------------------------------------------------------------------------

    async def _ack_ids(self, subscription: str, ack_ids: Sequence[str]) -> None:
        for start in range(0, len(ack_ids), ACK_BATCH):
            await self.subscriber.acknowledge(
                subscription=subscription,
                ack_ids=list(ack_ids[start : start + ACK_BATCH]),
                timeout=API_TIMEOUT,
            )
