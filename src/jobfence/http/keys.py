"""Idempotency keys (SPEC I1–I4): parsing, request fingerprints, problem documents and the key
table. The ASGI middleware that enforces them is :mod:`jobfence.http.idempotency`."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from ..db import Database, Tx, to_datetime

HEADER = "idempotency-key"
X_HEADER = "x-idempotency-key"
REPLAYED_HEADER = "idempotent-replayed"
MAX_KEY_LENGTH = 255
DEFAULT_WINDOW = timedelta(hours=24)
DEFAULT_LEASE = timedelta(seconds=60)
DEFAULT_MAX_BODY = 1024 * 1024

MISSING = "IDEMPOTENCY_KEY_MISSING"
MALFORMED = "IDEMPOTENCY_KEY_MALFORMED"
MISMATCH = "IDEMPOTENCY_KEY_MISMATCH"
IN_FLIGHT = "IDEMPOTENCY_KEY_IN_FLIGHT"
TOO_LARGE = "REQUEST_TOO_LARGE"


def problem_body(status: int, code: str, title: str, detail: str, **extra: Any) -> bytes:
    """An RFC 9457 problem+json document with a stable machine-readable ``code``."""
    document = {
        "type": f"urn:jobfence:problem:{code.lower().replace('_', '-')}",
        "title": title,
        "status": status,
        "detail": detail,
        "code": code,
        **extra,
    }
    return json.dumps(document, ensure_ascii=False).encode()


@dataclass(frozen=True)
class StoredResponse:
    status: int
    headers: list[tuple[str, str]]
    body: bytes


@dataclass(frozen=True)
class IdempotencyContext:
    """What the app sees at ``request.state.idempotency`` for a request with a key."""

    partner_id: str
    key: str
    fingerprint: str
    expires_at: datetime | None
    #: with ``IdempotencyMiddleware(one_transaction=True)``: the transaction that claimed the
    #: key and will store the response; the app writes in it, and it commits once.
    transaction: Tx | None = None


class KeyProblem(Exception):
    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail


def parse_key(values: list[str]) -> str:
    """The key from the values of both headers, or raise :class:`KeyProblem`.

    A key is 1–255 printable ASCII characters (0x20–0x7E), sent bare or as a structured-field
    string (``"…"``, as the IETF draft writes it). Sending it twice with different values is
    malformed.
    """
    if not values:
        raise KeyProblem(
            MISSING,
            "this request needs an Idempotency-Key (or X-Idempotency-Key) header: a unique "
            "value per operation, reused only when retrying that same operation",
        )
    keys = set()
    for raw in values:
        value = raw.strip()
        if len(value) >= 2 and value.startswith('"') and value.endswith('"'):
            value = value[1:-1].replace('\\"', '"').replace("\\\\", "\\")
        keys.add(value)
    if len(keys) > 1:
        raise KeyProblem(MALFORMED, "the request carries different idempotency keys")
    key = keys.pop()
    if not key:
        raise KeyProblem(MALFORMED, "the idempotency key is empty")
    if len(key) > MAX_KEY_LENGTH:
        raise KeyProblem(
            MALFORMED,
            f"the idempotency key is {len(key)} characters; at most {MAX_KEY_LENGTH} are allowed",
        )
    if any(not (0x20 <= ord(ch) <= 0x7E) for ch in key):
        raise KeyProblem(
            MALFORMED, "the idempotency key must be printable ASCII characters (0x20–0x7E)"
        )
    return key


def fingerprint_request(
    method: str, path: str, query: bytes, body: bytes, content_type: str
) -> str:
    """SHA-256 of the method, path, query and body. A JSON body is canonicalised first (keys
    sorted, no whitespace), so the same document sent with another key order or spacing is
    the same request."""
    canonical = body
    if "json" in content_type.lower() and body:
        try:
            canonical = json.dumps(
                json.loads(body), sort_keys=True, separators=(",", ":"), ensure_ascii=False
            ).encode()
        except (ValueError, RecursionError):
            canonical = body
    digest = hashlib.sha256()
    for part in (method.upper().encode(), path.encode(), query):
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    digest.update(canonical)
    return digest.hexdigest()


class IdempotencyStore:
    """The key table, one operation per named query (``sql/<dialect>/queries/idempotency.sql``)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def claim(
        self, partner_id: str, key: str, fingerprint: str, *, lease: timedelta, window: timedelta
    ) -> tuple[str, datetime | None] | None:
        rows = await self.db.run(
            "idempotency_claim",
            {
                "partner_id": partner_id,
                "key": key,
                "fingerprint": fingerprint,
                "lease": lease.total_seconds(),
                "window": window.total_seconds(),
            },
        )
        if not rows:
            return None
        return str(rows[0]["lease_token"]), to_datetime(rows[0]["expires_at"])

    async def get(self, partner_id: str, key: str) -> dict[str, Any] | None:
        rows = await self.db.run("idempotency_get", {"partner_id": partner_id, "key": key})
        return dict(rows[0]) if rows else None

    async def extend(self, partner_id: str, key: str, token: str, lease: timedelta) -> bool:
        rows = await self.db.run(
            "idempotency_extend",
            {"partner_id": partner_id, "key": key, "token": token, "lease": lease.total_seconds()},
        )
        return bool(rows)

    async def complete(
        self,
        partner_id: str,
        key: str,
        token: str,
        response: StoredResponse,
        tx: Tx | None = None,
    ) -> bool:
        params = {
            "partner_id": partner_id,
            "key": key,
            "token": token,
            "status_code": response.status,
            "headers": json.dumps([list(h) for h in response.headers]),
            "body": response.body,
        }
        if tx is not None:
            # the key's row is locked by ``tx`` since its claim: the update cannot miss it
            await tx.q_at_commit("idempotency_complete", params)
            return True
        return bool(await self.db.run("idempotency_complete", params))

    async def release(self, partner_id: str, key: str, token: str) -> None:
        await self.db.run(
            "idempotency_release", {"partner_id": partner_id, "key": key, "token": token}
        )


async def cleanup_keys(db: Database, batch: int = 1000) -> int:
    """Delete keys whose window is over (never one still in flight), in bounded batches."""
    total = 0
    while True:
        rows = await db.run("idempotency_cleanup", {"limit": batch})
        total += len(rows)
        if len(rows) < batch:
            return total


def stored_response(row: Mapping[str, Any]) -> StoredResponse:
    headers = row["response_headers"]
    if isinstance(headers, str | bytes):
        headers = json.loads(headers)
    return StoredResponse(
        status=int(row["status_code"]),
        headers=[(str(name), str(value)) for name, value in headers],
        body=bytes(row["response_body"]),
    )
