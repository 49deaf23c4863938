"""The purchase-order service (SPEC A2) on real PostgreSQL, a real API server and the ERP
stand-in process: request + outbox event in one transaction, domain uniqueness (I3), the
request states of every outcome, dead letters with the seed's attributes, operator retry."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from datetime import timedelta
from typing import Any

import httpx
import pytest

from jobfence import RetryPolicy
from jobfence.ops.auth import create_token
from jobfence_examples.purchase_orders import QUEUE, migrate
from jobfence_examples.purchase_orders.demo import LocalStack, Scenario
from jobfence_examples.purchase_orders.erp import ErpProcess

from ..helpers import eventually, query

QUIET = Scenario(
    transient_share=0.0,
    functional_share=0.0,
    worker_concurrency=4,
    erp_latency_ms=0.0,
    token_ttl=3600.0,
    policy=RetryPolicy(
        max_retries=1,
        base=timedelta(seconds=0.05),
        cap=timedelta(seconds=0.1),
        justification="tests: one quick broker-level retry",
    ),
)

DOC = {
    "company_id": "BU-1",
    "document_type": "STANDARD",
    "external_reference": "EXT-1",
    "lines": [{"item": "ITEM-1", "quantity": 2, "unit_price": "9.50"}],
}


class Ctx:
    """A running stack with two partners and three ops tokens, and an HTTP client."""

    def __init__(self, stack: LocalStack, http: httpx.AsyncClient) -> None:
        self.stack = stack
        self.http = http
        self.tokens: dict[str, str] = {}

    def partner(self, name: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[name]}"}

    async def post(self, name: str, body: dict[str, Any], key: str) -> httpx.Response:
        return await self.http.post(
            "/requests", json=body, headers={**self.partner(name), "Idempotency-Key": key}
        )

    async def state(self, request_id: str) -> str:
        response = await self.http.get(f"/requests/{request_id}", headers=self.partner("acme"))
        state: str = response.json()["state"]
        return state

    async def settled(self, request_id: str, *states: str) -> dict[str, Any]:
        async def check() -> dict[str, Any] | None:
            response = await self.http.get(f"/requests/{request_id}", headers=self.partner("acme"))
            data: dict[str, Any] = response.json()
            return data if data["state"] in states else None

        found: dict[str, Any] = await eventually(check, timeout=30, what=f"state in {states}")
        return found


@pytest.fixture(scope="module")
def erp_process() -> Iterator[ErpProcess]:
    """One ERP stand-in process for the module; each stack resets it."""
    process = ErpProcess()
    process.start()
    try:
        yield process
    finally:
        process.stop()


async def _ctx(
    pg_database: str, scenario: Scenario, pipeline: bool, erp: ErpProcess
) -> AsyncIterator[Ctx]:
    async with (
        LocalStack(pg_database, scenario, pipeline=pipeline, erp=erp) as stack,
        httpx.AsyncClient(base_url=stack.api_url, timeout=30) as http,
    ):
        ctx = Ctx(stack, http)
        svc = stack.svc
        ctx.tokens["acme"] = await svc.create_partner("acme", "Acme")
        ctx.tokens["globex"] = await svc.create_partner("globex", "Globex")
        ctx.tokens["operator"] = await create_token(svc.db, name="op-ann", role="operator")
        ctx.tokens["viewer"] = await create_token(svc.db, name="view-vic", role="viewer")
        ctx.tokens["globex-operator"] = await create_token(
            svc.db, name="op-glen", role="operator", partner="globex"
        )
        ctx.tokens["acme-operator"] = await create_token(
            svc.db, name="op-amy", role="operator", partner="acme"
        )
        yield ctx


@pytest.fixture
async def api_only(pg_database: str, erp_process: ErpProcess) -> AsyncIterator[Ctx]:
    """API and ERP, no relay or worker: requests stay where the API put them."""
    async for ctx in _ctx(pg_database, QUIET, False, erp_process):
        yield ctx


@pytest.fixture
async def running(pg_database: str, erp_process: ErpProcess) -> AsyncIterator[Ctx]:
    """The whole pipeline: API, relay, worker, ERP."""
    async for ctx in _ctx(pg_database, QUIET, True, erp_process):
        yield ctx


async def test_migrate_is_idempotent_and_uses_its_own_schema(pg_database: str) -> None:
    """migrate() can run again; the service's tables live in schema purchase_orders."""
    await migrate(pg_database)
    await migrate(pg_database)
    tables = await query(
        pg_database,
        "SELECT table_name FROM information_schema.tables "
        "WHERE table_schema = 'purchase_orders' ORDER BY table_name",
    )
    assert tables == [("audit",), ("partners",), ("request_history",), ("requests",)]


async def test_post_writes_the_request_and_its_outbox_event_in_one_transaction(
    api_only: Ctx,
) -> None:
    """202 with requestId and eventId; the request row (RECEIVED) and its outbox event
    (event id = eventId, ordering key and correlation id = requestId) exist together."""
    ctx = api_only
    response = await ctx.post("acme", DOC, "key-1")
    body = response.json()
    request_id = body["requestId"]
    url = ctx.stack.database_url
    event = await query(
        url,
        "SELECT event_id, queue, ordering_key, correlation_id, state, payload FROM core.outbox",
    )
    shown = await ctx.http.get(f"/requests/{request_id}", headers=ctx.partner("acme"))
    other = await ctx.http.get(f"/requests/{request_id}", headers=ctx.partner("globex"))
    anonymous = await ctx.http.get(f"/requests/{request_id}")
    assert response.status_code == 202
    assert response.headers["location"] == f"/requests/{request_id}"
    assert body["state"] == "RECEIVED"
    assert len(event) == 1
    event_id, queue, key, correlation, state, payload = event[0]
    assert (event_id, queue, key, correlation, state) == (
        body["eventId"],
        QUEUE,
        request_id,
        request_id,
        "PENDING",
    )
    assert b'"partner_id":"acme"' in bytes(payload)
    assert shown.json()["state"] == "RECEIVED"
    assert [h["state"] for h in shown.json()["history"]] == ["RECEIVED"]
    assert other.status_code == 404
    assert anonymous.status_code == 401
    assert anonymous.json()["code"] == "UNAUTHENTICATED"


async def test_invalid_body_is_422_and_unauthenticated_post_is_401(api_only: Ctx) -> None:
    """A body that breaks the schema: 422 VALIDATION_ERROR (problem+json); a POST without a
    partner token: 401 — and neither writes anything."""
    ctx = api_only
    bad = await ctx.post("acme", {**DOC, "lines": []}, "key-bad")
    anonymous = await ctx.http.post("/requests", json=DOC, headers={"Idempotency-Key": "k"})
    assert bad.status_code == 422
    assert bad.headers["content-type"] == "application/problem+json"
    assert bad.json()["code"] == "VALIDATION_ERROR"
    assert anonymous.status_code == 401
    assert await query(ctx.stack.database_url, "SELECT count(*) FROM core.outbox") == [(0,)]


async def test_duplicate_document_is_409_naming_the_existing_request(api_only: Ctx) -> None:
    """SPEC I3: the same (company, document type, external reference) from one partner with
    a new key → 409 DUPLICATE_DOCUMENT naming the first request; another partner, or a
    document without an external reference, is not a duplicate."""
    ctx = api_only
    first = await ctx.post("acme", DOC, "key-a")
    again = await ctx.post("acme", {**DOC, "currency": "EUR"}, "key-b")
    other_partner = await ctx.post("globex", DOC, "key-a")
    no_ref = {k: v for k, v in DOC.items() if k != "external_reference"}
    loose = [await ctx.post("acme", no_ref, f"key-loose-{n}") for n in range(2)]
    assert first.status_code == 202
    assert again.status_code == 409
    problem = again.json()
    assert problem["code"] == "DUPLICATE_DOCUMENT"
    assert problem["existingRequestId"] == first.json()["requestId"]
    assert problem["existingState"] == "RECEIVED"
    assert other_partner.status_code == 202
    assert [r.status_code for r in loose] == [202, 202]
    assert await query(ctx.stack.database_url, "SELECT count(*) FROM core.outbox") == [(4,)]


async def test_concurrent_posts_commit_together_and_a_duplicate_document_alone(
    api_only: Ctx,
) -> None:
    """Issue 27: 12 POSTs at once, two of them the same document under different keys. The
    keyed POSTs' claims, rows, events and answers commit together (claim_at_commit); the
    duplicate breaks the shared commit, so each request is committed alone and the second
    copy of the document runs again on a transaction that looks: 409 DUPLICATE_DOCUMENT
    naming the first, which was not lost."""
    ctx = api_only
    docs = [{**DOC, "external_reference": f"EXT-C{n}"} for n in range(10)]
    docs += [{**DOC, "external_reference": "EXT-TWICE"}] * 2
    answers = await asyncio.gather(
        *(ctx.post("acme", doc, f"key-c{n}") for n, doc in enumerate(docs))
    )
    url = ctx.stack.database_url
    assert [r.status_code for r in answers[:10]] == [202] * 10
    twice = sorted(answers[10:], key=lambda r: r.status_code)
    assert [r.status_code for r in twice] == [202, 409]
    assert twice[1].json()["code"] == "DUPLICATE_DOCUMENT"
    assert twice[1].json()["existingRequestId"] == twice[0].json()["requestId"]
    ids = {r.json()["requestId"] for r in answers if r.status_code == 202}
    rows = await query(url, "SELECT request_id::text FROM purchase_orders.requests")
    events = await query(url, "SELECT event_id FROM core.outbox")
    assert {r for (r,) in rows} == ids
    assert {e for (e,) in events} == {r.json()["eventId"] for r in answers if r.status_code == 202}
    stored = await query(
        url, "SELECT status_code, count(*) FROM core.idempotency_keys GROUP BY 1 ORDER BY 1"
    )
    assert stored == [(202, 11), (409, 1)]


async def test_a_request_flows_to_completed_with_one_erp_order(running: Ctx) -> None:
    """POST → relay → consumer → ERP: COMPLETED with the ERP's order number, a history from
    RECEIVED to COMPLETED through SENT_TO_ERP, exactly one order at the ERP."""
    ctx = running
    request_id = (await ctx.post("acme", DOC, "key-flow")).json()["requestId"]
    done = await ctx.settled(request_id, "COMPLETED")
    states = [h["state"] for h in done["history"]]
    counters = await ctx.stack.erp_stats()
    assert states[0] == "RECEIVED"
    assert states[-2:] == ["SENT_TO_ERP", "COMPLETED"]
    assert set(states) <= {"RECEIVED", "PUBLISHED", "SENT_TO_ERP", "COMPLETED"}
    assert done["erpOrderId"].startswith("PO")
    assert done["history"][-1]["detail"]["erp_order_id"] == done["erpOrderId"]
    assert done["error"] is None
    assert counters["orders_created"] == 1


async def test_functional_rejection_dead_letter_and_operator_retry(running: Ctx) -> None:
    """The ERP rejects the order (400): the request is FAILED with INTEGRATION_ERROR and a
    dead letter carrying requestId, eventId, partnerId, original queue, attempts, error
    code and category. Retry: 401 without a token, 403 for a viewer, 404 for an operator
    of another partner; an operator of the partner gets a new eventId and an audit row; a
    second retry while it runs is 409; after the ERP is fixed it completes with one order,
    the old dead letter is closed, and a retry of a completed request is 409."""
    ctx = running
    await ctx.stack.control(functional_rate=1.0)
    created = (await ctx.post("acme", DOC, "key-reject")).json()
    request_id, first_event = created["requestId"], created["eventId"]
    failed = await ctx.settled(request_id, "FAILED")
    letter = failed["deadLetter"]
    url = f"/requests/{request_id}/retry"
    reason = {"reason": "supplier site fixed in the ERP"}
    no_token = await ctx.http.post(url, json=reason)
    viewer = await ctx.http.post(url, json=reason, headers=ctx.partner("viewer"))
    other = await ctx.http.post(url, json=reason, headers=ctx.partner("globex-operator"))
    await ctx.stack.control(functional_rate=0.0)
    await ctx.stack.stop_relay()  # hold the retry in RECEIVED to see the duplicate refused
    retried = await ctx.http.post(url, json=reason, headers=ctx.partner("acme-operator"))
    twice = await ctx.http.post(url, json=reason, headers=ctx.partner("operator"))
    ctx.stack.start_relay()
    done = await ctx.settled(request_id, "COMPLETED")
    after = await ctx.http.post(url, json=reason, headers=ctx.partner("operator"))
    audit = await ctx.stack.svc.audit_of(request_id)
    old_letter = await query(
        ctx.stack.database_url,
        "SELECT status, reviewed_by, partner FROM core.dead_letters WHERE job_id = %s",
        (first_event,),
    )
    counters = await ctx.stack.erp_stats()

    assert failed["error"]["category"] == "INTEGRATION_ERROR"
    assert failed["error"]["code"] == "ERP_HTTP_400"
    assert letter == {
        "deadLetterId": letter["deadLetterId"],
        "requestId": request_id,
        "eventId": first_event,
        "partnerId": "acme",
        "originalQueue": QUEUE,
        "attempts": 1,
        "errorCode": "ERP_HTTP_400",
        "errorCategory": "INTEGRATION_ERROR",
    }
    assert failed["history"][-1]["detail"]["deadLetter"] == letter
    assert no_token.status_code == 401
    assert viewer.status_code == 403
    assert other.status_code == 404
    assert retried.status_code == 202
    body = retried.json()
    assert body["previousEventId"] == first_event
    assert body["eventId"] != first_event
    assert body["previousState"] == "FAILED"
    assert twice.status_code == 409
    assert twice.json()["code"] == "RETRY_ALREADY_RUNNING"
    assert done["eventId"] == body["eventId"]
    assert done["operatorRetries"] == 1
    assert after.status_code == 409
    assert after.json()["code"] == "REQUEST_NOT_RETRYABLE"
    assert [(a["actor"], a["role"], a["scope"], a["action"]) for a in audit] == [
        ("op-amy", "operator", "acme", "retry")
    ]
    assert audit[0]["detail"]["reason"] == "supplier site fixed in the ERP"
    assert audit[0]["detail"]["new_event_id"] == body["eventId"]
    assert old_letter == [("discarded", "op-amy", "acme")]
    assert counters["orders_created"] == 1
    assert counters["rejected_functional"] == 1


async def test_business_rejection_ends_rejected(running: Ctx) -> None:
    """A business refusal (409 from the ERP) is BUSINESS_ERROR: no retry, state REJECTED."""
    ctx = running
    await ctx.stack.control(business_rate=1.0)
    request_id = (await ctx.post("acme", DOC, "key-business")).json()["requestId"]
    rejected = await ctx.settled(request_id, "REJECTED")
    assert rejected["error"]["category"] == "BUSINESS_ERROR"
    assert rejected["deadLetter"]["errorCode"] == "ERP_HTTP_409"
    assert (await ctx.stack.erp_stats())["order_calls"] == 1


async def test_transient_failures_show_retry_pending_then_failed(running: Ctx) -> None:
    """An ERP that keeps answering 503: each delivery makes 3 in-process attempts (R5); the
    broker retries once (the test policy) with the request in RETRY_PENDING; then FAILED
    with TEMPORARY_ERROR and a dead letter after 2 deliveries — 6 ERP calls in all."""
    ctx = running
    await ctx.stack.control(error_rate=1.0)
    request_id = (await ctx.post("acme", DOC, "key-transient")).json()["requestId"]
    failed = await ctx.settled(request_id, "FAILED")
    states = [h["state"] for h in failed["history"]]
    counters = await ctx.stack.erp_stats()
    assert "RETRY_PENDING" in states
    assert states[-1] == "FAILED"
    assert failed["error"]["category"] == "TEMPORARY_ERROR"
    assert failed["deadLetter"]["attempts"] == 2
    assert failed["deadLetter"]["errorCode"] == "ERP_HTTP_503"
    assert counters["order_calls"] == 6
    assert counters["orders_created"] == 0


async def test_invalid_event_payload_ends_validation_failed(api_only: Ctx) -> None:
    """An event whose payload no longer matches the consumer's schema is poison: a dead
    letter with zero retries, and the request shows VALIDATION_FAILED."""
    ctx = api_only
    request_id = (await ctx.post("acme", DOC, "key-poison")).json()["requestId"]
    await query(
        ctx.stack.database_url,
        "UPDATE core.outbox SET payload = convert_to(%s, 'UTF8')",
        (f'{{"request_id": "{request_id}", "partner_id": "acme"}}',),
    )
    ctx.stack.start_pipeline()
    failed = await ctx.settled(request_id, "VALIDATION_FAILED")
    assert failed["error"]["category"] == "VALIDATION_ERROR"
    assert failed["deadLetter"]["attempts"] == 1
    assert failed["deadLetter"]["errorCode"] == "POISON"
    assert (await ctx.stack.erp_stats())["order_calls"] == 0


async def test_outbox_routes_need_an_unscoped_operator_to_redrive(running: Ctx) -> None:
    """The outbox routes on the service's API: a viewer lists, only an operator without a
    partner scope previews and re-drives all failed events (with the confirmed count and a
    reason, audited), a partner-scoped one gets 403."""
    ctx = running
    await ctx.post("acme", DOC, "key-ops")
    await eventually(
        lambda: query(
            ctx.stack.database_url, "SELECT 1 FROM core.outbox WHERE state = 'PUBLISHED'"
        ),
        what="the event published",
    )
    await query(
        ctx.stack.database_url,
        "UPDATE core.outbox SET state = 'PUBLISH_FAILED_RETRY', published_at = NULL",
    )
    listed = await ctx.http.get(
        "/outbox/events?state=PUBLISH_FAILED_RETRY", headers=ctx.partner("viewer")
    )
    scoped = await ctx.http.post(
        "/outbox/events/redrive", json={"reason": "x"}, headers=ctx.partner("acme-operator")
    )
    viewer = await ctx.http.post(
        "/outbox/events/redrive", json={"reason": "x"}, headers=ctx.partner("viewer")
    )
    preview = await ctx.http.get("/outbox/events/redrive/preview", headers=ctx.partner("operator"))
    done = await ctx.http.post(
        "/outbox/events/redrive",
        json={**preview.json()["confirm"], "reason": "broker back"},
        headers=ctx.partner("operator"),
    )
    audit = await query(
        ctx.stack.database_url,
        "SELECT actor, via, action, reason FROM core.audit_log WHERE action = 'outbox.redrive'",
    )
    assert listed.status_code == 200
    assert listed.json()["counts"]["PUBLISH_FAILED_RETRY"] == 1
    assert scoped.status_code == 403
    assert viewer.status_code == 403
    assert done.status_code == 200
    assert done.json()["count"] == 1
    assert audit == [("op-ann", "api", "outbox.redrive", "broker back")]


async def test_replaying_the_dead_letter_completes_the_request(running: Ctx) -> None:
    """Instead of the operator retry, the dead letter can be replayed through jobfence's
    dead-letter service (same event id): the consumer completes the request, one order."""
    from jobfence.review.deadletters import Actor, replay

    ctx = running
    await ctx.stack.control(functional_rate=1.0)
    created = (await ctx.post("acme", DOC, "key-replay")).json()
    failed = await ctx.settled(created["requestId"], "FAILED")
    await ctx.stack.control(functional_rate=0.0)
    svc = ctx.stack.svc
    outcome = await replay(
        svc.db,
        svc.app.transport,
        failed["deadLetter"]["deadLetterId"],
        actor=Actor("op-ann", "library"),
        reason="ERP rule fixed",
    )
    done = await ctx.settled(created["requestId"], "COMPLETED")
    assert outcome.outcome == "published"
    assert done["eventId"] == created["eventId"]
    assert done["operatorRetries"] == 0
    assert (await ctx.stack.erp_stats())["orders_created"] == 1


# -- idempotency keys on the requests table (issue 10 §3.1) ------------------------------------

SHORT_KEYS = replace(
    QUIET, idempotency_window=timedelta(seconds=2), idempotency_lease=timedelta(seconds=1)
)
OTHER_DOC = {
    **DOC,
    "external_reference": "EXT-2",
    "lines": [{"item": "ITEM-9", "quantity": 1, "unit_price": "1.00"}],
}


async def _documents(url: str) -> list[tuple[str, str | None, str]]:
    rows = await query(
        url,
        "SELECT request_id::text, external_reference, idempotency_key "
        "FROM purchase_orders.requests ORDER BY created_at",
    )
    return [(a, b, c) for a, b, c in rows]


@pytest.fixture
async def short_keys(pg_database: str, erp_process: ErpProcess) -> AsyncIterator[Ctx]:
    """API and ERP (no pipeline) whose idempotency keys expire after 2 seconds."""
    async for ctx in _ctx(pg_database, SHORT_KEYS, False, erp_process):
        yield ctx


async def test_after_its_window_a_key_is_new_and_the_new_document_is_a_new_request(
    short_keys: Ctx,
) -> None:
    """docs/http-idempotency.md: once a key's window is over the same key is a new request.
    A POST of another document with the expired key gets a new requestId and its own outbox
    event; the first request and its document stay as they were. Nothing is dropped."""
    ctx = short_keys
    first = await ctx.post("acme", DOC, "key-expiring")
    assert first.status_code == 202, first.text
    first_id = first.json()["requestId"]

    async def accepted() -> httpx.Response | None:
        response = await ctx.post("acme", OTHER_DOC, "key-expiring")
        return response if response.status_code == 202 else None

    second = await eventually(accepted, timeout=30, interval=0.2, what="the key to expire")
    body = second.json()
    shown = await ctx.http.get(f"/requests/{body['requestId']}", headers=ctx.partner("acme"))
    documents = await _documents(ctx.stack.database_url)
    events = await query(ctx.stack.database_url, "SELECT count(*) FROM core.outbox")
    assert body["requestId"] != first_id
    assert second.headers.get("idempotent-replayed") is None
    assert shown.json()["externalReference"] == "EXT-2"
    assert [(ref, key) for _, ref, key in documents] == [
        ("EXT-1", "key-expiring"),
        ("EXT-2", "key-expiring"),
    ]
    assert [rid for rid, _, _ in documents] == [first_id, body["requestId"]]
    assert events == [(2,)]


async def test_a_key_reused_for_another_document_is_409_even_when_the_middleware_forgot_it(
    api_only: Ctx,
) -> None:
    """The requests table keeps the key for its window on its own (a 5xx after the commit
    releases the middleware's key, a crash loses its stored answer): the same key with
    another document inside the window is 409 IDEMPOTENCY_KEY_MISMATCH naming the request
    that holds it — never a 202 with the old requestId; the same document is answered with
    the existing request, not a second one."""
    ctx = api_only
    first = (await ctx.post("acme", DOC, "key-forgotten")).json()
    await query(ctx.stack.database_url, "DELETE FROM core.idempotency_keys")
    other = await ctx.post("acme", OTHER_DOC, "key-forgotten")
    await query(ctx.stack.database_url, "DELETE FROM core.idempotency_keys")
    same = await ctx.post("acme", DOC, "key-forgotten")
    assert other.status_code == 409, other.text
    assert other.headers["content-type"] == "application/problem+json"
    assert other.json()["code"] == "IDEMPOTENCY_KEY_MISMATCH"
    assert other.json()["existingRequestId"] == first["requestId"]
    assert same.status_code == 202, same.text
    assert same.json()["requestId"] == first["requestId"]
    assert len(await _documents(ctx.stack.database_url)) == 1


async def test_parallel_posts_with_an_expired_key_create_one_new_request(api_only: Ctx) -> None:
    """Eight concurrent create_request calls with a key whose window ended: the expired key
    is released once and exactly one new request takes it; the others answer that one."""
    import asyncio
    from datetime import UTC, datetime

    from jobfence_examples.purchase_orders.models import PurchaseOrderRequest
    from jobfence_examples.purchase_orders.service import Created

    svc = api_only.stack.svc
    old = await svc.create_request(
        "acme",
        PurchaseOrderRequest.model_validate(DOC),
        idempotency_key="key-old",
        key_expires_at=datetime.now(UTC) - timedelta(seconds=1),
    )
    new_doc = PurchaseOrderRequest.model_validate(OTHER_DOC)
    results = await asyncio.gather(
        *(svc.create_request("acme", new_doc, idempotency_key="key-old") for _ in range(8))
    )
    assert isinstance(old, Created)
    assert all(isinstance(r, Created) for r in results), results
    created = [r for r in results if isinstance(r, Created) and r.new]
    assert len(created) == 1
    assert {r.request_id for r in results if isinstance(r, Created)} == {created[0].request_id}
    assert created[0].request_id != old.request_id
    assert len(await _documents(api_only.stack.database_url)) == 2
