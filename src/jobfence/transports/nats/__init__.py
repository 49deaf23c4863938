"""NATS JetStream as the queue (``nats://host:4222``), with nats-py.

Per jobfence queue ``Q`` the adapter keeps:

* a stream ``<prefix>_<Q>`` on subject ``<prefix>.jobs.<Q>``: file storage, work-queue
  retention (a message is removed once acked), ``replicas`` copies;
* a durable pull consumer ``<prefix>-workers`` shared by every worker: explicit acks,
  ``AckWait`` = the app's lease (renewed with progress acks, ``+WPI``, while a handler runs),
  ``MaxDeliver`` = ``max_deliver``;
* a retry with a delay is a negative ack with that delay (``nak(delay)``) on the same
  message; what the header cannot carry any more (the attempt's history, hand-backs that
  must not count) goes to the state stream ``<prefix>_STATE``, one subject per message,
  purged when the message is acked;
* MaxDeliver is never silence: the server's MAX_DELIVERIES advisories are captured by the
  stream ``<prefix>_EXHAUSTED``; the adapter hands each such message to the harness again
  (with its true attempt count), which ends it in jobfence's dead letters.

Attempts follow SPEC R1: the message's ``num_delivered`` (every delivery, a lost one
included) minus the deliveries handed back unattempted.

URL options (removed before connecting): ``prefix`` (default ``jobfence``), ``max_deliver``
(default 20; keep it above the policies' attempts), ``replicas`` (default 1; use 3 in a
cluster), ``state_ttl`` seconds (default 8 days; longer than any retry window).

The package: :mod:`.transport` (the adapter: publishing, consuming, answers, exhausted
messages), :mod:`.topology` (names, streams and the consumer), :mod:`.messages` (headers and
the state record of a message), :mod:`.connection` (the connection's one-line outage logs,
what counts as unavailable, secrets kept out of what is shown).
"""

from __future__ import annotations

from .connection import API_TIMEOUT, INITIAL_CONNECT_ATTEMPTS, UNAVAILABLE, ClientEvents
from .messages import HEADER_ROOM
from .topology import ADVISORY, ADVISORY_ACK_WAIT, slug
from .transport import PUBLISH_BATCH, NatsTransport

__all__ = [
    "ADVISORY",
    "ADVISORY_ACK_WAIT",
    "API_TIMEOUT",
    "HEADER_ROOM",
    "INITIAL_CONNECT_ATTEMPTS",
    "PUBLISH_BATCH",
    "UNAVAILABLE",
    "ClientEvents",
    "NatsTransport",
    "slug",
]
