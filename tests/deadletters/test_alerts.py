"""Alerts (SPEC D4) against a real HTTP server on loopback standing in for BetterStack:
grouping with a window, durable retries when the sink fails or hangs, no payload and no
secrets, never in the way of dead-lettering."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from jobfence import App, Job, NonRetryableError, RetryPolicy, Tx
from jobfence.alerts import (
    AlertDispatcher,
    BetterStack,
    Webhook,
    enqueue_alert,
    fingerprint,
    redact,
    sinks_from_env,
)
from jobfence.runtime.harness import Outcome
from jobfence.runtime.maintenance import Maintenance

from ..helpers import RunningWorker, eventually, query, table
from .conftest import SinkStandIn, letter_params, opened, seed_letters, seed_many

TOKEN = "uptime-token-for-tests-0123456789abcdef"
NO_RETRY = RetryPolicy(max_retries=0, justification="tests: dead-letter at the first failure")


def dialect(url: str) -> str:
    return "postgresql" if url.startswith("postgresql") else "sqlite"


def betterstack(sink: SinkStandIn) -> BetterStack:
    return BetterStack(token=TOKEN, requester_email="oncall@example.com", base_url=sink.url)


async def deliveries(url: str) -> list[tuple[Any, ...]]:
    """(kind, count, sink, attempts, delivered?, last error) per delivery, oldest first."""
    rows = await query(
        url,
        f"SELECT a.kind, a.count, d.sink, d.attempts, d.delivered_at IS NOT NULL, d.last_error "
        f"FROM {table(url, 'alerts')} a JOIN {table(url, 'alert_deliveries')} d "
        "ON d.alert_id = a.id ORDER BY a.id",
    )
    return [(k, c, s, a, bool(done), e) for k, c, s, a, done, e in rows]


def test_fingerprints_ignore_numbers_and_ids_and_redaction_masks_secrets() -> None:
    """Same error with other numbers/ids → same fingerprint; another code → another one."""
    a = fingerprint(
        "ERP_5XX", "ERP answered 503 for order 1234 (req 9f1c2e3a-1b2c-4d5e-8f90-a1b2c3d4e5f6)"
    )
    b = fingerprint(
        "ERP_5XX", "ERP answered 502 for order 77 (req 00000000-1111-2222-3333-444444444444)"
    )
    assert a == b
    assert fingerprint("ERP_4XX", "ERP answered 503 for order 1234") != a
    text = (
        "connect postgresql://app:hunter2@db:5432/x failed; Authorization: Bearer abcDEF123456789; "
        "api_key=sk_live_XYZ secret='s3cr3t' token: tkn-42\nsecond line with the payload"
    )
    assert redact(text) == (
        "connect postgresql://***@db:5432/x failed; Authorization: *** ***; api_key=*** "
        "secret=*** token: ***"
    )


async def test_1000_identical_dead_letters_make_one_alert_at_once_and_one_summary_per_window(
    database_url: str, sink: SinkStandIn
) -> None:
    """1 000 letters with the same queue, category and error (numbers vary) → one BetterStack
    incident at once; at the end of the 5-minute window one summary with count 999. Nothing
    else. The next failure after the window alerts at once again."""
    url, d = database_url, dialect(database_url)
    await seed_many(
        url,
        [
            letter_params(
                d,
                f"po-{i}",
                queue="erp.send",
                error=f"TemporaryError: ERP answered 503 for order {i}",
            )
            for i in range(1000)
        ],
    )
    async with opened(url) as db:
        dispatcher = AlertDispatcher(db, [betterstack(sink)])
        try:
            first = await dispatcher.tick()
            early = await dispatcher.tick(now=datetime.now(UTC) + timedelta(minutes=4))
            after_window = datetime.now(UTC) + timedelta(minutes=6)
            late = await dispatcher.tick(now=after_window)
            await seed_letters(
                url,
                [
                    letter_params(
                        d,
                        "po-late",
                        queue="erp.send",
                        error="TemporaryError: ERP answered 503 for order 5",
                    )
                ],
            )
            next_window = await dispatcher.tick()
        finally:
            await dispatcher.close()
    assert (first.events, first.alerts, first.delivered) == (1000, 2, 1)
    assert (early.delivered, late.delivered, next_window.delivered) == (0, 1, 1)
    assert [r["path"] for r in sink.requests] == ["/api/v3/incidents"] * 3
    incident, summary, again = (r["json"] for r in sink.requests)
    assert incident["name"] == "jobfence: dead letter in erp.send (TEMPORARY_ERROR)"
    assert (
        summary["name"] == "999 more like this: jobfence: dead letter in erp.send (TEMPORARY_ERROR)"
    )
    assert summary["summary"].startswith("999 more TEMPORARY_ERROR failures in erp.send")
    assert again["name"] == incident["name"]
    assert await deliveries(url) == [
        ("first", 1, "betterstack", 1, True, None),
        ("summary", 999, "betterstack", 1, True, None),
        ("first", 1, "betterstack", 1, True, None),
    ]


async def test_failures_spanning_two_windows_in_one_round_are_counted_in_each_window(
    database_url: str, sink: SinkStandIn
) -> None:
    """Ten identical failures, five of them six minutes after the others, grouped in one
    round: each window has its first alert and a summary of the other four."""
    url, d = database_url, dialect(database_url)
    ids = await seed_letters(url, [letter_params(d, f"po-{i}") for i in range(10)])
    events, p = table(url, "alert_events"), "%s" if url.startswith("postgresql") else "?"
    later = datetime.now(UTC) + timedelta(minutes=6)
    await query(
        url,
        f"UPDATE {events} SET created_at = {p} WHERE dead_letter_id >= {p}",
        (later if url.startswith("postgresql") else later.timestamp(), ids[5]),
    )
    async with opened(url) as db:
        dispatcher = AlertDispatcher(db, [betterstack(sink)])
        try:
            grouped = await dispatcher.tick()
            await dispatcher.tick(now=later + timedelta(minutes=6))
            # a summary waits for its first alert to reach the sink: one more round
            await dispatcher.tick(now=later + timedelta(minutes=6))
        finally:
            await dispatcher.close()
    assert (grouped.events, grouped.alerts) == (10, 4)
    assert [(kind, count) for kind, count, *_ in await deliveries(url)] == [
        ("first", 1),
        ("summary", 4),
        ("first", 1),
        ("summary", 4),
    ]
    names = [r["json"]["name"][:6] for r in sink.requests]
    assert names == ["jobfen", "4 more", "jobfen", "4 more"]


async def test_the_betterstack_request_is_the_uptime_incident_api(
    database_url: str, sink: SinkStandIn
) -> None:
    """POST {base}/api/v3/incidents, Authorization: Bearer <token>, JSON with requester_email,
    name, summary, description and the paging switches; a 201 counts as delivered."""
    await seed_letters(
        database_url,
        [letter_params(dialect(database_url), "po-1", queue="erp.send", correlation_id="req-1")],
    )
    async with opened(database_url) as db:
        dispatcher = AlertDispatcher(db, [betterstack(sink)])
        try:
            result = await dispatcher.tick()
        finally:
            await dispatcher.close()
    [request] = sink.requests
    assert result.delivered == 1
    assert request["headers"]["authorization"] == f"Bearer {TOKEN}"
    assert request["headers"]["content-type"] == "application/json"
    body = request["json"]
    assert sorted(body) == sorted(
        ["requester_email", "name", "summary", "description", "call", "sms", "email", "push"]
    )
    assert (body["requester_email"], body["call"], body["sms"], body["email"], body["push"]) == (
        "oncall@example.com",
        False,
        False,
        True,
        True,
    )
    for expected in (
        "queue: erp.send",
        "job_id: po-1",
        "correlation_id: req-1",
        "look: jobfence dead-letters show 1",
        "category: TEMPORARY_ERROR",
    ):
        assert expected in body["description"]


async def test_a_sink_answering_500_or_timing_out_is_retried_later_with_backoff(
    database_url: str, sink: SinkStandIn
) -> None:
    """500 → retried 5 s later; then a hang past the timeout → retried 10 s later; then 201
    → delivered once, the error cleared. Each failed attempt is recorded."""
    await seed_letters(database_url, [letter_params(dialect(database_url), "po-1")])
    t0 = datetime.now(UTC) + timedelta(seconds=1)
    async with opened(database_url) as db:
        dispatcher = AlertDispatcher(db, [betterstack(sink)], timeout=0.3)
        try:
            sink.mode = "fail"
            failed = await dispatcher.tick(now=t0)
            after_500 = await deliveries(database_url)
            not_yet = await dispatcher.tick(now=t0 + timedelta(seconds=4))
            sink.mode, sink.hang_seconds = "hang", 1.0
            timed_out = await dispatcher.tick(now=t0 + timedelta(seconds=6))
            after_timeout = await deliveries(database_url)
            sink.mode = "ok"
            waiting = await dispatcher.tick(now=t0 + timedelta(seconds=15))
            delivered = await dispatcher.tick(now=t0 + timedelta(seconds=17))
        finally:
            await dispatcher.close()
    assert (failed.failed, not_yet.failed, not_yet.delivered) == (1, 0, 0)
    assert after_500 == [
        ("first", 1, "betterstack", 1, False, 'DeliveryFailed: HTTP 500: {"errors":"internal"}')
    ]
    assert timed_out.failed == 1
    assert after_timeout[0][3] == 2
    assert after_timeout[0][5].startswith("ReadTimeout")
    assert (waiting.delivered, delivered.delivered) == (0, 1)
    assert await deliveries(database_url) == [("first", 1, "betterstack", 3, True, None)]
    assert [r["mode"] for r in sink.requests] == ["fail", "hang", "ok"]


async def test_alerts_carry_no_payload_and_no_secrets(database_url: str, sink: SinkStandIn) -> None:
    """The payload never leaves; URL passwords, bearer tokens and key=value secrets in the
    error are masked, in BetterStack's body and the webhook's alike."""
    payload = b'{"card": "4111-1111-1111-1111", "marker": "PAYLOAD-MARKER-77"}'
    error = (
        "IntegrationError: POST https://erp:Sup3rSecret@erp.example.com/po failed with "
        "Authorization: Bearer eyJhbGciOiJIUzI1NiJ9 password=hunter2 "
        "PAYLOAD-MARKER-77"
    )
    await seed_letters(
        database_url,
        [
            letter_params(
                dialect(database_url),
                "po-1",
                payload=payload,
                category="INTEGRATION_ERROR",
                error=error,
            )
        ],
    )
    async with opened(database_url) as db:
        hook = Webhook(url=f"{sink.url}/hook", token="hook-token-123456")
        dispatcher = AlertDispatcher(db, [betterstack(sink), hook])
        try:
            result = await dispatcher.tick()
        finally:
            await dispatcher.close()
    assert result.delivered == 2
    assert sorted(r["path"] for r in sink.requests) == ["/api/v3/incidents", "/hook"]
    for request in sink.requests:
        for secret in ("4111", "Sup3rSecret", "eyJhbGciOiJIUzI1NiJ9", "hunter2", "card"):
            assert secret not in request["body"], (secret, request["body"])
    hook_body = next(r for r in sink.requests if r["path"] == "/hook")
    assert hook_body["headers"]["authorization"] == "Bearer hook-token-123456"
    assert hook_body["json"]["details"]["error"] == (
        "IntegrationError: POST https://***@erp.example.com/po failed with Authorization: *** "
        "*** password=*** PAYLOAD-MARKER-77"
    )


async def test_categories_the_taxonomy_does_not_alert_on_are_grouped_away(
    database_url: str, sink: SinkStandIn
) -> None:
    """VALIDATION_ERROR and BUSINESS_ERROR letters raise no alert; the events are consumed."""
    d = dialect(database_url)
    await seed_letters(
        database_url,
        [
            letter_params(d, "v", category="VALIDATION_ERROR", error="bad schema"),
            letter_params(d, "b", category="BUSINESS_ERROR", error="order already closed"),
        ],
    )
    async with opened(database_url) as db:
        dispatcher = AlertDispatcher(db, [betterstack(sink)])
        try:
            result = await dispatcher.tick()
        finally:
            await dispatcher.close()
    assert (result.events, result.alerts, result.delivered) == (2, 0, 0)
    assert sink.requests == []
    assert await query(
        database_url, f"SELECT count(*) FROM {table(database_url, 'alert_events')}"
    ) == [(0,)]


async def test_enqueue_alert_joins_the_callers_transaction(
    database_url: str, sink: SinkStandIn
) -> None:
    """An alert queued in a transaction that rolls back never exists; a committed one is
    delivered with its title and (redacted) details, and repeats become a summary."""
    async with opened(database_url) as db:

        async def queue_then_fail() -> None:
            async with db.transaction() as tx:
                await enqueue_alert(
                    tx,
                    source="outbox",
                    queue="po.created",
                    category="PUBLISH_FAILED",
                    fingerprint="relay:amqp",
                    title="never",
                    details={},
                )
                raise RuntimeError("rolled back")

        with pytest.raises(RuntimeError):
            await queue_then_fail()
        for event in ("e-1", "e-2", "e-3"):
            async with db.transaction() as tx:
                await enqueue_alert(
                    tx,
                    source="outbox",
                    queue="po.created",
                    category="PUBLISH_FAILED",
                    fingerprint="relay:amqp",
                    title="outbox event could not be published",
                    details={"event_id": event, "broker": "amqp://relay:pw1234@mq/"},
                )
        dispatcher = AlertDispatcher(db, [Webhook(url=f"{sink.url}/hook")])
        try:
            now = await dispatcher.tick()
            later = await dispatcher.tick(now=datetime.now(UTC) + timedelta(minutes=6))
        finally:
            await dispatcher.close()
    assert (now.events, now.alerts, now.delivered, later.delivered) == (3, 2, 1, 1)
    first, summary = (r["json"] for r in sink.requests)
    assert (first["name"], first["count"], first["source"]) == (
        "outbox event could not be published",
        1,
        "outbox",
    )
    assert first["details"] == {"event_id": "e-1", "broker": "amqp://***@mq/"}
    assert (summary["kind"], summary["count"]) == ("summary", 2)


def test_sinks_come_from_the_environment() -> None:
    """BetterStack with a token (base URL overridable), a webhook with a URL; none if unset."""
    sinks = sinks_from_env(
        {
            "JOBFENCE_BETTERSTACK_TOKEN": "t0k3n",
            "JOBFENCE_BETTERSTACK_EMAIL": "ops@example.com",
            "JOBFENCE_BETTERSTACK_URL": "http://127.0.0.1:9",
            "JOBFENCE_ALERT_WEBHOOK_URL": "https://hooks.example.com/x",
        }
    )
    assert [s.key for s in sinks] == ["betterstack", "webhook"]
    assert isinstance(sinks[0], BetterStack)
    assert sinks[0].url == "http://127.0.0.1:9/api/v3/incidents"
    assert "t0k3n" not in repr(sinks[0])
    assert sinks_from_env({}) == []


async def test_a_hanging_sink_never_slows_dead_lettering_and_its_alerts_arrive_later(
    database_url: str, sink: SinkStandIn
) -> None:
    """Workers deliver alerts in the background: with the sink hanging, 100 failing jobs are
    all dead-lettered anyway; once it answers, the alerts arrive — a first alert per window
    and at most one summary after it, their counts adding up to the 100 letters."""
    sink.mode, sink.hang_seconds = "hang", 3
    app = App(
        database_url,
        auto_migrate=True,
        maintenance=Maintenance(
            alert_sinks=[Webhook(url=f"{sink.url}/hook")],
            alert_interval=timedelta(seconds=0.1),
            alert_timeout=timedelta(seconds=0.5),
            alert_window=timedelta(seconds=3),
        ),
    )

    @app.consumer("erp.send", retry=NO_RETRY)
    async def handle(job: Job[Any], tx: Tx) -> None:
        raise NonRetryableError(f"ERP rejected order {job.job_id}: supplier 42 blocked")

    def alerted() -> int:
        return sum(r["json"]["count"] for r in sink.accepted())

    async with app:
        await app.enqueue_many(
            [app.job("erp.send", {"po": i}, job_id=f"po-{i}") for i in range(100)]
        )
        async with RunningWorker(app, concurrency=8) as w:
            await eventually(lambda: w.stats.outcomes[Outcome.DEAD] == 100, what="100 letters")
            await eventually(lambda: len(sink.requests) >= 1, what="a delivery attempt")
            sink.mode = "ok"
            await eventually(lambda: alerted() == 100, timeout=60, what="all letters alerted")
    alerts = [r["json"] for r in sink.accepted()]
    windows: dict[str, list[str]] = {}
    for alert in alerts:
        windows.setdefault(alert["window_start"], []).append(alert["kind"])
    assert all(kinds in (["first"], ["first", "summary"]) for kinds in windows.values()), windows
    assert alerts[0]["kind"] == "first"
    assert "ERP rejected order po-" in alerts[0]["details"]["error"]  # as is, not normalised
