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

The package: :mod:`.transport` (the adapter: connecting, publishing, consuming, the
answers), :mod:`.topology` (names, topics, subscriptions and their policies, created or only
verified), :mod:`.messaging` (the requests that move messages: publish within Pub/Sub's
limits, pull, ack deadlines, batched acks), :mod:`.attributes` (a job's metadata as
attributes), :mod:`.delayed` (holding delayed jobs until due), :mod:`.dlq` (the DLQ topic:
jobfence's dead letters published there, what Pub/Sub dead-lettered read back).
"""

from __future__ import annotations

from .attributes import (
    ATTRIBUTE_BYTES,
    ATTRIBUTES_RESERVE,
    HISTORY_ATTRIBUTE,
    MAX_HISTORY,
    MAX_MESSAGE_BYTES,
    attributes,
    read_meta,
)
from .delayed import DELAY_POLL, delayed_step
from .dlq import (
    DEAD_LETTER,
    DLQ_ATTRIBUTES,
    DLQ_POLL,
    SOURCE_COUNT,
    SOURCE_SUBSCRIPTION,
    dead_letter_attributes,
)
from .messaging import ACK_BATCH, MAX_PULL, PUBLISH_BATCH, PUBLISH_BYTES
from .topology import (
    API_TIMEOUT,
    AUX_ACK_DEADLINE,
    DLQ_ACK_DEADLINE,
    MAX_ACK_DEADLINE,
    NAME_LIMIT,
    Names,
    encode_name,
)
from .transport import PubSubTransport

__all__ = [
    "ACK_BATCH",
    "API_TIMEOUT",
    "ATTRIBUTES_RESERVE",
    "ATTRIBUTE_BYTES",
    "AUX_ACK_DEADLINE",
    "DEAD_LETTER",
    "DELAY_POLL",
    "DLQ_ACK_DEADLINE",
    "DLQ_ATTRIBUTES",
    "DLQ_POLL",
    "HISTORY_ATTRIBUTE",
    "MAX_ACK_DEADLINE",
    "MAX_HISTORY",
    "MAX_MESSAGE_BYTES",
    "MAX_PULL",
    "NAME_LIMIT",
    "PUBLISH_BATCH",
    "PUBLISH_BYTES",
    "SOURCE_COUNT",
    "SOURCE_SUBSCRIPTION",
    "Names",
    "PubSubTransport",
    "attributes",
    "dead_letter_attributes",
    "delayed_step",
    "encode_name",
    "read_meta",
]
