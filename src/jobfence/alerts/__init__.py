"""Alerts (SPEC D4): durable, grouped, retried — and never in the way of dead-lettering.

The path of an alert::

    dead letter INSERT ──trigger, same transaction──► core.alert_events      (cannot be lost)
    enqueue_alert(tx, …) ─────caller's transaction──► core.alert_events
                                                          │ dispatcher (one at a time, lease)
                                                          ▼
    group by (source, queue, category, error fingerprint) within a window (default 5 min):
      the first event of a window → a "first" alert, delivered at once
      the rest of that window     → one "summary" alert with their count, due at window end
                                                          │
                                                          ▼
    core.alert_deliveries: one row per (alert, sink); failures (HTTP ≥ 300, timeouts,
    refused connections) are retried with backoff (5 s doubling to 10 min), forever.

Writing a dead letter costs one extra small INSERT (the trigger); no HTTP call ever happens
on that path, so a sink that is down or slow cannot block or slow it. Dead letters of
categories whose taxonomy entry says ``alert=False`` (VALIDATION_ERROR, BUSINESS_ERROR) are
grouped away without an alert.

An alert carries no payload and no secrets: queue, consumer, category, error code, the
letter's ids, and the first line of the error with URL passwords, bearer tokens, ``key=value``
secrets and long opaque strings masked, cut to 300 characters.

Sinks: :class:`BetterStack` (Uptime API, ``POST {base_url}/api/v3/incidents`` with
``Authorization: Bearer <token>``, answer 201) and :class:`Webhook` (a JSON POST).

The package: :mod:`.events` (what may appear in an alert, and recording an event),
:mod:`.sinks` (the alert as sent, BetterStack, the webhook, sinks from the environment),
:mod:`.dispatcher` (grouping events into alerts, delivering them, listing them).
"""

from __future__ import annotations

from .dispatcher import (
    DEFAULT_WINDOW,
    DELIVERY_BATCH,
    EVENT_BATCH,
    LEASE_NAME,
    LEASE_TTL,
    RETRY_CAP,
    RETRY_FIRST,
    AlertDispatcher,
    TickResult,
    recent_alerts,
)
from .events import ERROR_CHARS, enqueue_alert, fingerprint, redact
from .sinks import (
    ENV_BETTERSTACK_EMAIL,
    ENV_BETTERSTACK_TOKEN,
    ENV_BETTERSTACK_URL,
    ENV_WEBHOOK_TOKEN,
    ENV_WEBHOOK_URL,
    Alert,
    AlertSink,
    BetterStack,
    DeliveryFailed,
    Webhook,
    sinks_from_env,
)

__all__ = [
    "DEFAULT_WINDOW",
    "DELIVERY_BATCH",
    "ENV_BETTERSTACK_EMAIL",
    "ENV_BETTERSTACK_TOKEN",
    "ENV_BETTERSTACK_URL",
    "ENV_WEBHOOK_TOKEN",
    "ENV_WEBHOOK_URL",
    "ERROR_CHARS",
    "EVENT_BATCH",
    "LEASE_NAME",
    "LEASE_TTL",
    "RETRY_CAP",
    "RETRY_FIRST",
    "Alert",
    "AlertDispatcher",
    "AlertSink",
    "BetterStack",
    "DeliveryFailed",
    "TickResult",
    "Webhook",
    "enqueue_alert",
    "fingerprint",
    "recent_alerts",
    "redact",
    "sinks_from_env",
]
