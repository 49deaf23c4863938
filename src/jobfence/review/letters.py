"""The dead-letter record (SPEC D1, D1b): what is kept of a job that could not succeed — its
exact payload bytes (up to a limit, truncation recorded), every attempt, the last error and
its category — written idempotently (one pending letter per consumer and job_id).

Reviewing letters (replay, discard, audit) is :mod:`jobfence.review.deadletters`; bulk replay is
:mod:`jobfence.review.replays`.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from ..core.jobs import PARTNER_FIELD as PARTNER_FIELD  # re-exported: where letters always had it
from ..core.jobs import AttemptRecord, Delivery, history_from, history_json
from ..core.jobs import partner_of as partner_of
from ..db import Database, Tx, to_datetime
from ..errors import Category

DEFAULT_PAYLOAD_LIMIT = 10 * 1024 * 1024


@dataclass(frozen=True)
class DeadLetter:
    id: int
    queue: str
    consumer: str
    job_id: str
    correlation_id: str | None
    payload_size: int
    payload_truncated: bool
    attempts: int
    error_category: str
    error_code: str | None
    last_error: str
    status: str
    enqueued_at: datetime | None
    failed_at: datetime
    payload: bytes | None = None
    history: list[AttemptRecord] = field(default_factory=list)
    partner: str | None = None  # tenant scope for the ops API (see partner_of)
    previous_id: int | None = None  # the replayed letter this one failed again after
    reviewed_at: datetime | None = None
    reviewed_by: str | None = None
    review_reason: str | None = None

    def summary(self) -> dict[str, Any]:
        """JSON-ready, without the payload."""
        data = asdict(self)
        data.pop("payload")
        for key in ("enqueued_at", "failed_at", "reviewed_at"):
            value = data[key]
            data[key] = value.isoformat() if value is not None else None
        return data


async def write(
    db: Database,
    delivery: Delivery,
    consumer: str,
    category: Category,
    error: str,
    code: str | None,
    *,
    ack: bool,
    payload_limit: int = DEFAULT_PAYLOAD_LIMIT,
    tx: Tx | None = None,
    trace: str | None = None,
) -> tuple[int | None, bool]:
    """Record a dead letter (idempotent: one pending letter per consumer and job_id).

    With ``ack`` the queue row goes in the same transaction; with ``tx`` the letter is
    written in that (open) transaction. ``trace`` is the last attempt's traceback (kept in
    its history entry). Returns the letter's id and whether this call created it (False: a
    pending letter for this job was already recorded — its id).
    """
    params = letter_params(db, delivery, consumer, category, error, code, payload_limit)
    params["trace"] = trace
    if tx is not None:
        return await _write(tx, params, ack)
    async with db.transaction() as own:
        return await _write(own, params, ack)


async def _write(tx: Tx, params: dict[str, Any], ack: bool) -> tuple[int | None, bool]:
    if ack:
        await tx.q("ack", params)
    rows = await tx.q("insert_dead_letter", params)
    if rows:
        return int(rows[0]["id"]), True
    # a separate statement: its snapshot sees a letter that a concurrent transaction
    # committed while the insert waited on it
    existing = await tx.q("dead_letter_pending_id", params)
    return (int(existing[0]["id"]) if existing else None), False


def letter_params(
    db: Database,
    delivery: Delivery,
    consumer: str,
    category: Category,
    error: str,
    code: str | None,
    payload_limit: int = DEFAULT_PAYLOAD_LIMIT,
) -> dict[str, Any]:
    payload = delivery.payload
    return {
        "id": delivery.ref,
        "token": delivery.token,
        "queue": delivery.queue,
        "consumer": consumer,
        "job_id": delivery.job_id,
        "correlation_id": delivery.correlation_id,
        "payload": payload[:payload_limit],
        "payload_size": len(payload),
        "payload_truncated": len(payload) > payload_limit,
        "attempts": delivery.attempt,
        "category": category.value,
        "error_code": code,
        "error": error,
        "history": history_json(delivery.history),
        "enqueued_at": db.at(delivery.enqueued_at),
        "partner": partner_of(payload),
        "trace": None,
        "trace_context": delivery.trace_context,
    }


async def get_letter(db: Database, letter_id: int) -> DeadLetter | None:
    """One letter, with its payload and history (no scope: see deadletters.show)."""
    rows = await db.run("get_dead_letter", {"id": letter_id})
    return from_row(rows[0]) if rows else None


def from_row(row: Mapping[str, Any]) -> DeadLetter:
    failed_at = to_datetime(row["failed_at"])
    assert failed_at is not None
    payload = row.get("payload")
    return DeadLetter(
        id=int(row["id"]),
        queue=row["queue"],
        consumer=row["consumer"],
        job_id=row["job_id"],
        correlation_id=row["correlation_id"],
        payload_size=int(row["payload_size"]),
        payload_truncated=bool(row["payload_truncated"]),
        attempts=int(row["attempts"]),
        error_category=row["error_category"],
        error_code=row["error_code"],
        last_error=row["last_error"],
        status=row["status"],
        enqueued_at=to_datetime(row["enqueued_at"]),
        failed_at=failed_at,
        payload=bytes(payload) if payload is not None else None,
        history=history_from(row["history"]) if "history" in row else [],
        partner=row.get("partner"),
        previous_id=row.get("previous_id"),
        reviewed_at=to_datetime(row.get("reviewed_at")),
        reviewed_by=row.get("reviewed_by"),
        review_reason=row.get("review_reason"),
    )


def payload_view(payload: bytes | None) -> dict[str, Any]:
    """A payload as people read it: UTF-8 text when it is, base64 otherwise."""
    if payload is None:
        return {"encoding": "none", "data": None}
    try:
        return {"encoding": "utf-8", "data": payload.decode("utf-8")}
    except UnicodeDecodeError:
        return {"encoding": "base64", "data": base64.b64encode(payload).decode("ascii")}
