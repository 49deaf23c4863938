"""The DLQ topic of a queue: every jobfence dead letter is published there (seed 004 §10.5
attributes, marked ``jobfence-dead-letter``); what Pub/Sub itself dead-lettered is read back
and handed to the harness, which makes it a jobfence dead letter without running it."""

from __future__ import annotations

import json
from collections import deque
from typing import Any

from google.api_core import exceptions as gexc
from google.pubsub_v1 import types

from ...core.jobs import Delivery, trace_headers
from ...errors import Category
from .._broker import JOB_ID
from .attributes import fit_bytes, read_meta
from .messaging import AckToken, PubSubMessaging
from .topology import Names, log

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
DLQ_POLL = 0.5  # seconds one pull of a DLQ subscription may wait (from maintenance)


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
    found = {key: fit_bytes(seed[key]) for key in DLQ_ATTRIBUTES}
    found[DEAD_LETTER] = "1"
    found[JOB_ID] = delivery.job_id
    found["jobfence-queue"] = fit_bytes(delivery.queue)
    found["jobfence-consumer"] = fit_bytes(consumer)
    found.update(trace_headers(delivery.trace_context))  # the job's trace (docs/tracing.md)
    return found


class DeadLetterQueue(PubSubMessaging):
    """The DLQ side of a :class:`~.transport.PubSubTransport` (its base)."""

    _consumed: set[str]
    _exhausted: deque[Delivery]

    # -- jobfence's dead letters ------------------------------------------------------------

    async def dead_lettered(
        self, delivery: Delivery, *, consumer: str, category: Category, code: str | None
    ) -> None:
        """Publish a jobfence dead letter to the queue's DLQ topic (seed 004 §10.5) — unless
        Pub/Sub itself put the message there: one DLQ message per failure, and no loop."""
        token: AckToken = delivery.token
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
        token = AckToken(self.subscription_path(names.dlq_subscription), item.ack_id, from_dlq=True)
        delivery = meta.delivery(
            queue, bytes(item.message.data), meta.attempts + count + 1, token=token, ref=names.topic
        )
        delivery.given_up = reason
        return delivery
