"""The alert dispatcher: groups recorded events into alerts (a "first" at once, one
"summary" per window), delivers them to every sink with retries, one dispatcher at a time
(a lease row); and the latest alerts for ``jobfence alerts list``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from ..core.leases import Lease, default_holder
from ..db import Database, Tx, to_datetime
from ..errors import TAXONOMY, Category, ConfigurationError
from ..metrics import ALERT_FAILURES, ALERTS_DELIVERED
from .events import fingerprint, redact
from .sinks import Alert, AlertSink

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
            ALERT_FAILURES.labels(sink.key).inc()
            return
        await self.db.run("alert_delivered", ref)
        result.delivered += 1
        ALERTS_DELIVERED.labels(sink.key).inc()

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
                    async with asyncio.timeout(interval.total_seconds()):
                        await stop.wait()
        finally:
            await asyncio.shield(self.close())


async def recent_alerts(db: Database, limit: int = 50) -> list[dict[str, Any]]:
    """The latest alerts with the state of each delivery (for ``jobfence alerts list``)."""
    return [dict(r) for r in await db.run("alerts_recent", {"limit": limit})]
