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
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import re
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from .db import Database, Tx, to_datetime
from .errors import TAXONOMY, Category, ConfigurationError, clean_text
from .leases import Lease, default_holder

if TYPE_CHECKING:
    import httpx

log = logging.getLogger("jobfence.alerts")

DEFAULT_WINDOW = timedelta(minutes=5)
LEASE_NAME = "alert-dispatcher"
LEASE_TTL = timedelta(minutes=2)
RETRY_FIRST = 5.0  # seconds before the first redelivery of a failed alert
RETRY_CAP = 600.0
EVENT_BATCH = 500
DELIVERY_BATCH = 50
ERROR_CHARS = 300

ENV_BETTERSTACK_TOKEN = "JOBFENCE_BETTERSTACK_TOKEN"
ENV_BETTERSTACK_URL = "JOBFENCE_BETTERSTACK_URL"
ENV_BETTERSTACK_EMAIL = "JOBFENCE_BETTERSTACK_EMAIL"
ENV_WEBHOOK_URL = "JOBFENCE_ALERT_WEBHOOK_URL"
ENV_WEBHOOK_TOKEN = "JOBFENCE_ALERT_WEBHOOK_TOKEN"

# -- what may appear in an alert ---------------------------------------------------------------

_SECRETS = [
    (re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s:@]+:[^/\s@]+@"), r"\1***@"),  # URL password
    (re.compile(r"(?i)\b(bearer|basic|token)\s+[A-Za-z0-9._~+/=-]{6,}"), r"\1 ***"),
    (
        re.compile(
            r"(?i)\b(password|passwd|pwd|secret|token|api[_-]?key|access[_-]?key|"
            r"authorization|auth|credentials?|session|cookie)(\"?\s*[:=]\s*)"
            r"(\"[^\"]*\"|'[^']*'|[^\s,;&]+)"
        ),
        r"\1\2***",
    ),
    (re.compile(r"[A-Za-z0-9_+/=-]{32,}"), "***"),  # long opaque strings: keys, tokens, blobs
]
_VARIABLE = [
    (re.compile(r"(?i)\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b"), "<uuid>"),
    (re.compile(r"(?i)\b0x[0-9a-f]+\b|\b[0-9a-f]{8,}\b"), "<hex>"),
    (re.compile(r"\d+(\.\d+)?"), "<n>"),
    (re.compile(r"'[^']*'|\"[^\"]*\""), "<str>"),
]


def redact(text: str, limit: int = ERROR_CHARS) -> str:
    """The first line of ``text`` with secrets masked, at most ``limit`` characters."""
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    for pattern, replacement in _SECRETS:
        line = pattern.sub(replacement, line)
    return clean_text(line, limit)


def fingerprint(error_code: str | None, error: str) -> str:
    """What makes two failures "the same": the error code and the error's first line with
    numbers, ids and quoted values blanked out."""
    line = (error or "").strip().splitlines()[0] if (error or "").strip() else ""
    for pattern, replacement in _VARIABLE:
        line = pattern.sub(replacement, line)
    line = " ".join(line.lower().split())
    return hashlib.sha256(f"{error_code or ''}|{line}".encode()).hexdigest()[:16]


async def enqueue_alert(
    tx: Tx,
    *,
    source: str,
    queue: str,
    category: str,
    fingerprint: str,
    title: str,
    details: dict[str, str],
) -> None:
    """Queue an alert inside the caller's transaction (it exists only if that commits).

    Grouping uses (source, queue, category, fingerprint). ``title`` and ``details`` must not
    hold payloads; values are redacted and cut anyway.
    """
    for name, value in (("source", source), ("queue", queue), ("category", category)):
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"{name} must be a non-blank string")
    if not isinstance(fingerprint, str) or not fingerprint:
        raise ValueError("fingerprint must be a non-empty string")
    clean = {clean_text(str(k), 100): redact(str(v)) for k, v in details.items()}
    await tx.q(
        "alert_event_insert",
        {
            "source": clean_text(source, 100),
            "queue": clean_text(queue, 200),
            "category": clean_text(category, 100),
            "fingerprint": clean_text(fingerprint, 200),
            "title": redact(title, 200),
            "details": json.dumps(clean),
        },
    )


# -- alerts and sinks ------------------------------------------------------------------------


@dataclass(frozen=True)
class Alert:
    """One alert as a sink sends it."""

    id: int
    kind: str  # "first" or "summary"
    source: str
    queue: str
    category: str
    fingerprint: str
    title: str
    details: dict[str, str]
    count: int
    window_start: datetime
    window_end: datetime

    @property
    def name(self) -> str:
        if self.kind == "summary":
            return f"{self.count} more like this: {self.title}"
        return self.title

    @property
    def summary(self) -> str:
        when = f"{self.window_start:%H:%M:%S}–{self.window_end:%H:%M:%S} UTC"
        if self.kind == "summary":
            return (
                f"{self.count} more {self.category} failures in {self.queue} with the same "
                f"error between {when} (after the alert sent for the first one)"
            )
        return (
            f"{self.category} in {self.queue}; identical failures until "
            f"{self.window_end:%H:%M:%S} UTC will be summed up in one follow-up"
        )

    @property
    def description(self) -> str:
        lines = [self.summary, ""]
        lines += [f"{key}: {value}" for key, value in self.details.items()]
        lines += [f"fingerprint: {self.fingerprint}", f"alert: #{self.id} ({self.kind})"]
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "source": self.source,
            "queue": self.queue,
            "category": self.category,
            "fingerprint": self.fingerprint,
            "name": self.name,
            "summary": self.summary,
            "count": self.count,
            "window_start": self.window_start.isoformat(),
            "window_end": self.window_end.isoformat(),
            "details": self.details,
        }


class DeliveryFailed(Exception):
    """A sink did not accept an alert (retried later)."""


class AlertSink(ABC):
    """Where alerts go. ``key`` names it in ``core.alert_deliveries`` (keep it stable)."""

    key: str

    @abstractmethod
    async def send(self, alert: Alert, client: httpx.AsyncClient) -> None:
        """Deliver or raise (any exception means "try again later")."""


def _check(response: httpx.Response, expected: Sequence[int]) -> None:
    if response.status_code not in expected:
        raise DeliveryFailed(f"HTTP {response.status_code}: {redact(response.text, 200)}")


@dataclass(frozen=True)
class BetterStack(AlertSink):
    """BetterStack Uptime: each alert opens an incident (and pages on-call per your policy).

    ``POST {base_url}/api/v3/incidents`` with ``Authorization: Bearer <Uptime API token>``
    (Better Stack → Uptime → API tokens) and a JSON body with ``requester_email``, ``name``,
    ``summary``, ``description``, the ``call``/``sms``/``email``/``push`` switches and,
    optionally, ``team_wait``, ``policy_id`` and ``team_name``. Success is HTTP 201.
    """

    token: str = field(repr=False)
    requester_email: str | None = None
    base_url: str = "https://uptime.betterstack.com"
    call: bool = False
    sms: bool = False
    email: bool = True
    push: bool = True
    team_wait: int | None = None
    policy_id: str | None = None
    team_name: str | None = None
    key: str = "betterstack"

    def __post_init__(self) -> None:
        if not self.token.strip():
            raise ConfigurationError("the BetterStack sink needs an Uptime API token")
        if not self.base_url.startswith(("https://", "http://")):
            raise ConfigurationError(
                f"BetterStack base_url must be http(s)://…, got {self.base_url!r}"
            )

    @property
    def url(self) -> str:
        return self.base_url.rstrip("/") + "/api/v3/incidents"

    def body(self, alert: Alert) -> dict[str, Any]:
        body: dict[str, Any] = {
            "name": alert.name[:255],
            "summary": alert.summary,
            "description": alert.description,
            "call": self.call,
            "sms": self.sms,
            "email": self.email,
            "push": self.push,
        }
        optional = {
            "requester_email": self.requester_email,
            "team_wait": self.team_wait,
            "policy_id": self.policy_id,
            "team_name": self.team_name,
        }
        body.update({k: v for k, v in optional.items() if v is not None})
        return body

    async def send(self, alert: Alert, client: httpx.AsyncClient) -> None:
        response = await client.post(
            self.url, json=self.body(alert), headers={"Authorization": f"Bearer {self.token}"}
        )
        _check(response, (201,))


@dataclass(frozen=True)
class Webhook(AlertSink):
    """A JSON POST of :meth:`Alert.to_json` to ``url`` (any 2xx is success), with
    ``Authorization: Bearer <token>`` when a token is set."""

    url: str
    token: str | None = field(default=None, repr=False)
    key: str = "webhook"

    def __post_init__(self) -> None:
        if not self.url.startswith(("https://", "http://")):
            raise ConfigurationError(f"the webhook URL must be http(s)://…, got {self.url!r}")

    async def send(self, alert: Alert, client: httpx.AsyncClient) -> None:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        response = await client.post(self.url, json=alert.to_json(), headers=headers)
        _check(response, range(200, 300))


def sinks_from_env(env: Mapping[str, str] | None = None) -> list[AlertSink]:
    """Sinks configured by environment variables:

    - ``JOBFENCE_BETTERSTACK_TOKEN`` (Uptime API token) turns BetterStack on;
      ``JOBFENCE_BETTERSTACK_EMAIL`` sets ``requester_email``; ``JOBFENCE_BETTERSTACK_URL``
      overrides the base URL (default ``https://uptime.betterstack.com``).
    - ``JOBFENCE_ALERT_WEBHOOK_URL`` turns the webhook on; ``JOBFENCE_ALERT_WEBHOOK_TOKEN``
      adds a bearer token.
    """
    env = os.environ if env is None else env
    sinks: list[AlertSink] = []
    token = env.get(ENV_BETTERSTACK_TOKEN, "").strip()
    if token:
        sinks.append(
            BetterStack(
                token=token,
                requester_email=env.get(ENV_BETTERSTACK_EMAIL) or None,
                base_url=env.get(ENV_BETTERSTACK_URL) or "https://uptime.betterstack.com",
            )
        )
    url = env.get(ENV_WEBHOOK_URL, "").strip()
    if url:
        sinks.append(Webhook(url=url, token=env.get(ENV_WEBHOOK_TOKEN) or None))
    return sinks


# -- the dispatcher ---------------------------------------------------------------------------


@dataclass
class TickResult:
    events: int = 0  # events grouped
    alerts: int = 0  # alerts created
    delivered: int = 0
    failed: int = 0
    busy: str | None = None  # another dispatcher held the lease


@dataclass
class _Group:
    window_start: datetime
    window_end: datetime
    summary_id: int | None
    count: int = 0  # the summary's count so far
    sent: bool = False  # a delivery of the summary was attempted: it can no longer grow
    dirty: bool = False


def _alerting(category: str) -> bool:
    try:
        return TAXONOMY[Category(category)].alert
    except ValueError:
        return True  # not a taxonomy category: the caller of enqueue_alert decided


class AlertDispatcher:
    """Groups alert events and delivers alerts; one runs at a time (a lease row)."""

    def __init__(
        self,
        db: Database,
        sinks: Sequence[AlertSink],
        *,
        window: timedelta = DEFAULT_WINDOW,
        timeout: float = 10.0,
        holder: str | None = None,
    ) -> None:

        keys = [s.key for s in sinks]
        if len(set(keys)) != len(keys):
            raise ConfigurationError(f"alert sinks need distinct keys, got {keys}")
        if window <= timedelta(0):
            raise ConfigurationError("the alert grouping window must be positive")
        self.db = db
        self.sinks = list(sinks)
        self.window = window
        self.timeout = timeout
        self.lease = Lease(db, LEASE_NAME, holder or default_holder(), LEASE_TTL)
        self._client: httpx.AsyncClient | None = None

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
        with contextlib.suppress(Exception):
            await self.lease.release()

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            try:
                import httpx
            except ImportError:  # pragma: no cover - httpx comes with jobfence[ops]
                raise ConfigurationError(
                    "alert delivery needs httpx: pip install 'jobfence[ops]'"
                ) from None
            self._client = httpx.AsyncClient(timeout=self.timeout, follow_redirects=False)
        return self._client

    async def _now(self, now: datetime | None) -> datetime:
        if now is not None:
            return now
        moment = to_datetime((await self.db.run("db_now"))[0]["now"])
        assert moment is not None
        return moment

    async def tick(self, now: datetime | None = None) -> TickResult:
        """Group what is new, then deliver what is due (``now`` pins the clock for tests)."""
        result = TickResult()
        moment = await self._now(now)
        work = await self.db.run("alert_work", {"now": self.db.at(moment)})
        if not work[0]["work"]:
            return result  # idle: write nothing (and leave SQLite's writer lock alone)
        if not await self.lease.acquire():
            result.busy = await self.lease.current_holder() or "?"
            return result
        while True:
            grouped = await self._group(result)
            if grouped < EVENT_BATCH:
                break
        await self._deliver(moment, result)
        return result

    # grouping ---------------------------------------------------------------------------

    async def _group(self, result: TickResult) -> int:
        async with self.db.transaction() as tx:
            if not await self.lease.renew(tx):
                return 0
            events = await tx.q("alert_events_batch", {"limit": EVENT_BATCH})
            groups: dict[tuple[str, str, str, str], _Group | None] = {}
            for event in events:
                if event["dead_letter_id"] is not None:
                    if not _alerting(event["category"]):
                        continue
                    key_fp = fingerprint(event["error_code"], event["last_error"] or "")
                    title = f"jobfence: dead letter in {event['queue']} ({event['category']})"
                    details = self._letter_details(event)
                else:
                    key_fp = str(event["fingerprint"])
                    title = str(
                        event["title"] or f"jobfence: {event['category']} in {event['queue']}"
                    )
                    raw = event["details"]
                    details = json.loads(raw) if isinstance(raw, str) else dict(raw or {})
                key = (event["source"], event["queue"], event["category"], key_fp)
                if key not in groups:
                    groups[key] = await self._load_group(tx, key)
                group = groups[key]
                at = to_datetime(event["created_at"])
                assert at is not None
                # same window: before its end, and its summary not yet on its way to a sink
                if group is None or at >= group.window_end or group.sent:
                    if group is not None and group.dirty and group.summary_id is not None:
                        # the closing window's summary keeps the count it reached
                        await tx.q(
                            "alert_set_count", {"id": group.summary_id, "count": group.count}
                        )
                    end = at + self.window
                    await self._create(tx, "first", key, title, details, 1, at, end, at)
                    result.alerts += 1
                    groups[key] = _Group(at, end, None, dirty=True)
                    continue
                group.count += 1
                group.dirty = True
                if group.summary_id is None:
                    group.summary_id = await self._create(
                        tx, "summary", key, title, details, 1,
                        group.window_start, group.window_end, group.window_end,
                    )  # fmt: skip
                    result.alerts += 1
                    group.count = 1
            for key, group in groups.items():
                if group is None or not group.dirty:
                    continue
                if group.summary_id is not None:
                    await tx.q("alert_set_count", {"id": group.summary_id, "count": group.count})
                await tx.q(
                    "alert_group_put",
                    {
                        "source": key[0],
                        "queue": key[1],
                        "category": key[2],
                        "fingerprint": key[3],
                        "window_start": self.db.at(group.window_start),
                        "window_end": self.db.at(group.window_end),
                        "summary_id": group.summary_id,
                    },
                )
            if events:
                ids = [int(e["id"]) for e in events]
                await tx.q(
                    "alert_events_delete",
                    {"ids": self.db.array(ids)},
                )
        result.events += len(events)
        return len(events)

    @staticmethod
    def _letter_details(event: Mapping[str, Any]) -> dict[str, str]:
        letter = event["dead_letter_id"]
        return {
            "queue": str(event["queue"]),
            "consumer": str(event["consumer"]),
            "category": str(event["category"]),
            "error_code": str(event["error_code"] or "-"),
            "error": redact(event["last_error"] or ""),
            "attempts": str(event["attempts"]),
            "dead_letter_id": str(letter),
            "job_id": redact(str(event["job_id"]), 255),
            "correlation_id": redact(str(event["correlation_id"] or "-"), 255),
            "look": f"jobfence dead-letters show {letter}",
        }

    async def _load_group(self, tx: Tx, key: tuple[str, str, str, str]) -> _Group | None:
        rows = await tx.q(
            "alert_group_get",
            {"source": key[0], "queue": key[1], "category": key[2], "fingerprint": key[3]},
        )
        if not rows:
            return None
        row = rows[0]
        start, end = to_datetime(row["window_start"]), to_datetime(row["window_end"])
        assert start is not None
        assert end is not None
        group = _Group(start, end, row["summary_id"])
        if group.summary_id is not None:
            summary = await tx.q("alert_summary_state", {"id": group.summary_id})
            group.count = int(summary[0]["count"])
            group.sent = bool(summary[0]["started"])
        return group

    async def _create(
        self,
        tx: Tx,
        kind: str,
        key: tuple[str, str, str, str],
        title: str,
        details: Mapping[str, str],
        count: int,
        start: datetime,
        end: datetime,
        ready: datetime,
    ) -> int:
        rows = await tx.q(
            "alert_insert",
            {
                "kind": kind,
                "source": key[0],
                "queue": key[1],
                "category": key[2],
                "fingerprint": key[3],
                "title": title,
                "details": json.dumps(dict(details)),
                "count": count,
                "window_start": self.db.at(start),
                "window_end": self.db.at(end),
                "ready_at": self.db.at(ready),
            },
        )
        alert_id = int(rows[0]["id"])
        for sink in self.sinks:
            await tx.q(
                "alert_delivery_insert",
                {"alert_id": alert_id, "sink": sink.key, "at": self.db.at(ready)},
            )
        return alert_id

    # delivery ---------------------------------------------------------------------------

    async def _deliver(self, now: datetime, result: TickResult) -> None:
        if not self.sinks:
            return
        by_key = {sink.key: sink for sink in self.sinks}
        due = await self.db.run("alert_due", {"now": self.db.at(now), "limit": DELIVERY_BATCH})
        per_sink: dict[str, list[Mapping[str, Any]]] = {}
        for row in due:
            if row["sink"] in by_key:
                per_sink.setdefault(row["sink"], []).append(row)

        async def drain(sink: AlertSink, rows: list[Mapping[str, Any]]) -> None:
            for row in rows:
                await self._send(sink, row, now, result)

        await asyncio.gather(*(drain(by_key[k], rows) for k, rows in per_sink.items()))

    async def _send(
        self, sink: AlertSink, row: Mapping[str, Any], now: datetime, result: TickResult
    ) -> None:
        details = row["details"]
        alert = Alert(
            id=int(row["alert_id"]),
            kind=row["kind"],
            source=row["source"],
            queue=row["queue"],
            category=row["category"],
            fingerprint=row["fingerprint"],
            title=row["title"],
            details=json.loads(details) if isinstance(details, str) else dict(details),
            count=int(row["count"]),
            window_start=to_datetime(row["window_start"]),  # type: ignore[arg-type]
            window_end=to_datetime(row["window_end"]),  # type: ignore[arg-type]
        )
        ref = {"alert_id": alert.id, "sink": sink.key}
        try:
            await sink.send(alert, self._http())
        except Exception as exc:
            attempts = int(row["attempts"]) + 1
            delay = min(RETRY_CAP, RETRY_FIRST * 2 ** (attempts - 1))
            error = redact(f"{type(exc).__name__}: {exc}", 500)
            log.warning(
                "alert delivery failed; will retry",
                extra={"sink": sink.key, "alert": alert.id, "error": error, "retry_in": delay},
            )
            await self.db.run(
                "alert_failed",
                {
                    **ref,
                    "error": error,
                    "now": self.db.at(now),
                    "delay": delay,
                },
            )
            result.failed += 1
            return
        await self.db.run("alert_delivered", ref)
        result.delivered += 1

    async def run(self, *, interval: timedelta, stop: asyncio.Event | None = None) -> None:
        """Tick every ``interval`` until ``stop`` is set or the task is cancelled."""
        stop = stop or asyncio.Event()
        try:
            while not stop.is_set():
                try:
                    await self.tick()
                except Exception:
                    log.exception("alert dispatch failed; trying again next round")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=interval.total_seconds())
        finally:
            await asyncio.shield(self.close())


async def recent_alerts(db: Database, limit: int = 50) -> list[dict[str, Any]]:
    """The latest alerts with the state of each delivery (for ``jobfence alerts list``)."""
    return [dict(r) for r in await db.run("alerts_recent", {"limit": limit})]
