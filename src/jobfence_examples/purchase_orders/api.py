"""The purchase-order HTTP API (FastAPI).

- ``POST /requests`` — partner token; ``Idempotency-Key``/``X-Idempotency-Key`` required
  (:class:`~jobfence.http.IdempotencyMiddleware`); 202 with the requestId; 409
  ``DUPLICATE_DOCUMENT`` naming the existing request when the partner already sent the
  document (SPEC I3); 409 ``IDEMPOTENCY_KEY_MISMATCH`` when the key, inside its window, names a
  request with another document (after the window the key is new: a new request); 422
  ``VALIDATION_ERROR`` for a bad body.
- ``GET /requests/{requestId}`` — the partner's own request (or an ops token in scope): state,
  history, ERP order, error and dead letter.
- ``POST /requests/{requestId}/retry`` — ops token with role operator in the partner's scope;
  only failed requests; 409 while one is running; a new eventId; an audit row.
- ``/outbox/…`` — the outbox routes for operators (list, show, re-drive).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from jobfence.http import (
    DEFAULT_LEASE,
    DEFAULT_WINDOW,
    MISMATCH,
    IdempotencyMiddleware,
    idempotency_of,
)
from jobfence.ops.auth import Principal, authenticate, require
from jobfence.ops.routes import outbox as outbox_routes

from .models import PurchaseOrderRequest
from .service import Created, DuplicateDocument, KeyMismatch, PurchaseOrderService, Refused

PROBLEM = "application/problem+json"


def problem(status: int, code: str, title: str, detail: str, **extra: Any) -> JSONResponse:
    body = {
        "type": f"urn:jobfence:problem:{code.lower().replace('_', '-')}",
        "title": title,
        "status": status,
        "detail": detail,
        "code": code,
        **extra,
    }
    return JSONResponse(body, status_code=status, media_type=PROBLEM)


def _bearer(request: Request) -> str | None:
    value = request.headers.get("authorization", "")
    scheme, _, token = value.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


class RetryBody(BaseModel):
    reason: str = Field(min_length=1, max_length=2000, description="Why (kept in the audit).")


class _Unauthorized(Exception):
    pass


def create_api(
    service: PurchaseOrderService,
    *,
    idempotency_window: timedelta = DEFAULT_WINDOW,
    idempotency_lease: timedelta = DEFAULT_LEASE,
    manage_service: bool = True,
) -> FastAPI:
    """The API over ``service``. With ``manage_service`` the app's lifespan opens and closes
    the service; otherwise the caller does (and it must be open before the first request)."""

    @asynccontextmanager
    async def lifespan(api: FastAPI) -> AsyncIterator[None]:
        if manage_service:
            await service.open()
        api.state.jobfence_db = service.db
        try:
            yield
        finally:
            if manage_service:
                await service.close()

    api = FastAPI(
        title="Purchase-order requests (jobfence reference service)",
        version="1",
        lifespan=lifespan,
    )

    async def partner_of(request: Request) -> str | None:
        return await service.partner_for_token(_bearer(request))

    api.add_middleware(
        IdempotencyMiddleware,
        database=lambda: service.db,
        partner=partner_of,
        match=lambda method, path: method == "POST" and path == "/requests",
        window=idempotency_window,
        lease=idempotency_lease,
        # key, request row, outbox event and response: one commit, in one round trip (the
        # route's only effects are the transaction's rows, so it may run before the claim)
        claim_at_commit=True,
    )

    @api.exception_handler(_Unauthorized)
    async def unauthorized(request: Request, exc: _Unauthorized) -> JSONResponse:
        response = problem(401, "UNAUTHENTICATED", "Unauthenticated", str(exc))
        response.headers["WWW-Authenticate"] = "Bearer"
        return response

    @api.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return problem(
            422,
            "VALIDATION_ERROR",
            "The request is not valid",
            "the body does not match the purchase-order request schema",
            errors=jsonable_encoder(exc.errors()),
        )

    async def partner(request: Request) -> str:
        found = await partner_of(request)
        if found is None:
            raise _Unauthorized("send the partner's token: 'Authorization: Bearer pop_…'")
        return found

    @api.post("/requests", status_code=202)
    async def create(
        body: PurchaseOrderRequest, request: Request, partner_id: str = Depends(partner)
    ) -> JSONResponse:
        context = idempotency_of(request)
        result = await service.create_request(
            partner_id,
            body,
            idempotency_key=context.key if context else None,
            key_expires_at=context.expires_at if context else None,
            key_window=idempotency_window,
            tx=context.transaction if context else None,
        )
        if isinstance(result, KeyMismatch):
            return problem(
                409,
                MISMATCH,
                "Idempotency key reused for a different request",
                f"this key still names request {result.existing_request_id}, which carries "
                "another document; use a new key for a new document",
                existingRequestId=result.existing_request_id,
                existingState=result.existing_state,
            )
        if isinstance(result, DuplicateDocument):
            return problem(
                409,
                "DUPLICATE_DOCUMENT",
                "This document was already received",
                f"request {result.existing_request_id} already carries this company_id, "
                "document_type and external_reference",
                existingRequestId=result.existing_request_id,
                existingState=result.existing_state,
            )
        assert isinstance(result, Created)
        return JSONResponse(
            {
                "requestId": result.request_id,
                "eventId": result.event_id,
                "state": result.state,
                "links": {"self": f"/requests/{result.request_id}"},
            },
            status_code=202,
            headers={"Location": f"/requests/{result.request_id}"},
        )

    @api.get("/requests/{request_id}")
    async def read(request_id: str, request: Request) -> JSONResponse:
        token = _bearer(request)
        scope: str | None
        if token is not None and token.startswith("jfo_"):
            principal = await authenticate(service.db, token)
            if principal is None:
                raise _Unauthorized("unknown, revoked or expired token")
            scope = principal.partner
        else:
            partner_id = await service.partner_for_token(token)
            if partner_id is None:
                raise _Unauthorized("send the partner's token: 'Authorization: Bearer pop_…'")
            scope = partner_id
        found = await service.get_request(request_id)
        if found is None or (scope is not None and found["partnerId"] != scope):
            return problem(404, "REQUEST_NOT_FOUND", "Not found", "no such request")
        return JSONResponse(found)

    @api.post("/requests/{request_id}/retry", status_code=202)
    async def retry(
        request_id: str, body: RetryBody, principal: Principal = Depends(require("operator"))
    ) -> JSONResponse:
        if not body.reason.strip():
            return problem(422, "VALIDATION_ERROR", "A reason is required", "say why you retry")
        result = await service.retry_request(
            request_id,
            actor=principal.name,
            role=principal.role,
            scope=principal.partner,
            reason=body.reason.strip(),
        )
        if isinstance(result, Refused):
            return problem(result.status, result.code, "Retry refused", result.detail)
        return JSONResponse(
            {
                "requestId": result.request_id,
                "eventId": result.event_id,
                "previousEventId": result.previous_event_id,
                "previousState": result.previous_state,
                "state": "RECEIVED",
                "auditId": result.audit_id,
            },
            status_code=202,
        )

    @api.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    api.include_router(outbox_routes.router())
    return api
