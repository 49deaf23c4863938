"""The keyed POST written by hand (issue 27 §1): what a team would write without jobfence,
the baseline the purchase-order API's ``POST /requests`` is held against.

FastAPI + pydantic (the same :class:`PurchaseOrderRequest` model) + a psycopg pool of the
same size (20), on the same tables the reference service writes, one transaction:

1. claim the key: ``INSERT INTO core.idempotency_keys … ON CONFLICT DO NOTHING``
   (a key already there: read it, replay its stored response or answer 409);
2. the request row; 3. its history row; 4. the outbox event;
5. the response stored on the key; then ``COMMIT``.

Each statement is its own round trip (``BEGIN`` too, as ``conn.transaction()`` sends it), as
straightforward code does; the partner's token is resolved as the reference service does it
(SHA-256, one query, cached for 10 s). Served by bench/systems/http_server.py (``hand``).
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from jobfence_examples.purchase_orders.models import QUEUE, PurchaseOrderRequest

CLAIM = """
INSERT INTO core.idempotency_keys (partner_id, key, fingerprint, state, lease_token,
                                   lease_expires_at, expires_at)
VALUES (%s, %s, %s, 'in_progress', gen_random_uuid(), now() + interval '30 seconds',
        now() + interval '24 hours')
ON CONFLICT DO NOTHING
RETURNING 1
"""
STORED = """
SELECT fingerprint, state, status_code, response_body FROM core.idempotency_keys
WHERE partner_id = %s AND key = %s
"""
REQUEST = """
INSERT INTO purchase_orders.requests (request_id, partner_id, idempotency_key,
    idempotency_expires_at, company_id, document_type, external_reference, document, state,
    current_event_id)
VALUES (%s, %s, %s, now() + interval '24 hours', %s, %s, %s, %s, 'RECEIVED', %s)
"""
HISTORY = """
INSERT INTO purchase_orders.request_history (request_id, state, event_id, detail)
VALUES (%s, 'RECEIVED', %s, %s)
"""
EVENT = """
INSERT INTO core.outbox (event_id, queue, ordering_key, correlation_id, payload)
VALUES (%s, %s, %s, %s, %s)
"""
COMPLETE = """
UPDATE core.idempotency_keys
SET state = 'completed', lease_token = NULL, lease_expires_at = NULL, status_code = 202,
    response_headers = %s, response_body = %s, completed_at = now()
WHERE partner_id = %s AND key = %s
"""


def problem(status: int, code: str, detail: str) -> JSONResponse:
    return JSONResponse(
        {"title": code, "status": status, "detail": detail, "code": code},
        status_code=status,
        media_type="application/problem+json",
    )


def create_app(pool: AsyncConnectionPool[Any]) -> FastAPI:
    api = FastAPI()
    partners: dict[str, tuple[str | None, float]] = {}

    async def partner_of(request: Request) -> str | None:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token:
            return None
        digest = hashlib.sha256(token.encode()).hexdigest()
        cached = partners.get(digest)
        if cached is not None and cached[1] > time.monotonic():
            return cached[0]
        async with pool.connection() as conn:
            cur = await conn.execute(
                "SELECT partner_id FROM purchase_orders.partners WHERE token_hash = %s",
                (digest,),
            )
            row = await cur.fetchone()
        partners[digest] = (row[0] if row else None, time.monotonic() + 10)
        return partners[digest][0]

    @api.post("/requests", status_code=202)
    async def create(body: PurchaseOrderRequest, request: Request) -> Response:
        partner = await partner_of(request)
        if partner is None:
            return problem(401, "UNAUTHENTICATED", "send the partner's token")
        key = request.headers.get("idempotency-key") or request.headers.get("x-idempotency-key")
        if not key or len(key) > 255:
            return problem(400, "IDEMPOTENCY_KEY_MISSING", "send an Idempotency-Key header")
        raw = await request.body()
        fingerprint = hashlib.sha256(b"POST /requests\n" + raw).hexdigest()
        request_id, event_id = str(uuid.uuid4()), str(uuid.uuid4())
        answer = {
            "requestId": request_id,
            "eventId": event_id,
            "state": "RECEIVED",
            "links": {"self": f"/requests/{request_id}"},
        }
        payload = json.dumps(answer).encode()
        async with pool.connection() as conn, conn.transaction():
            cur = await conn.execute(CLAIM, (partner, key, fingerprint))
            if await cur.fetchone() is None:
                cur = await conn.execute(STORED, (partner, key))
                row = await cur.fetchone()
                if row is None or row[0] != fingerprint:
                    return problem(409, "IDEMPOTENCY_KEY_MISMATCH", "another request's key")
                if row[1] != "completed":
                    return problem(409, "IDEMPOTENCY_KEY_IN_FLIGHT", "still running")
                return Response(
                    bytes(row[3]),
                    status_code=row[2],
                    media_type="application/json",
                    headers={"Idempotent-Replayed": "true"},
                )
            document = body.model_dump(mode="json")
            await conn.execute(
                REQUEST,
                (request_id, partner, key, body.company_id, body.document_type,
                 body.external_reference, Jsonb(document), event_id),
            )  # fmt: skip
            await conn.execute(HISTORY, (request_id, event_id, Jsonb({"by": partner})))
            event = {
                "request_id": request_id,
                "partner_id": partner,
                "company_id": body.company_id,
                "document_type": body.document_type,
                "external_reference": body.external_reference,
            }
            await conn.execute(
                EVENT, (event_id, QUEUE, request_id, request_id, json.dumps(event).encode())
            )
            headers = {"location": f"/requests/{request_id}", "content-type": "application/json"}
            await conn.execute(COMPLETE, (Jsonb(headers), payload, partner, key))
        return Response(
            payload,
            status_code=202,
            media_type="application/json",
            headers={"Location": f"/requests/{request_id}"},
        )

    return api
