"""A job's metadata as Pub/Sub message attributes: ids and attempts, and the history as one
attribute per attempt, each value within Pub/Sub's limit."""

from __future__ import annotations

import contextlib
import json
from dataclasses import replace

from ...core.jobs import AttemptRecord
from ...errors import tail
from .._broker import DELAY, HISTORY, Meta

#: Pub/Sub's limit on one message (data and attributes), and what jobfence keeps for its
#: attributes (ids, attempts and one attribute per attempt of history, each ≤ 1 024 bytes)
MAX_MESSAGE_BYTES = 10_000_000
ATTRIBUTES_RESERVE = 256 * 1024

#: Pub/Sub's limit on the bytes of one attribute value
ATTRIBUTE_BYTES = 1024
#: the history travels as one attribute per attempt (Pub/Sub allows 100 attributes)
HISTORY_ATTRIBUTE = "jobfence-history-"
MAX_HISTORY = 80


def fit_bytes(value: str, limit: int = ATTRIBUTE_BYTES) -> str:
    """``value`` cut (at a character boundary) to at most ``limit`` UTF-8 bytes."""
    raw = value.encode("utf-8")
    if len(raw) <= limit:
        return value
    return raw[: limit - 3].decode("utf-8", errors="ignore") + "…"


def _dumps(data: dict[str, object]) -> str:
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


def _record_value(record: AttemptRecord) -> str:
    """One history record as an attribute value of at most 1024 bytes: the error is cut, and
    the traceback keeps only the last bytes that fit in the room left (often none)."""
    data = record.to_json()
    trace = data.pop("trace", None)
    text = _dumps(data)
    error = record.error
    while len(text.encode("utf-8")) > ATTRIBUTE_BYTES and error:
        error = fit_bytes(error, max(len(error.encode("utf-8")) * 3 // 4, 4))
        data["error"] = error
        text = _dumps(data)
    room = ATTRIBUTE_BYTES - len(text.encode("utf-8")) - len(',"trace":""')
    while trace and room > 64:
        candidate = _dumps({**data, "trace": tail(trace, room)})
        if len(candidate.encode("utf-8")) <= ATTRIBUTE_BYTES:
            return candidate
        room -= 64  # JSON escapes made it longer: keep less
    return text


def attributes(meta: Meta, delay: float = 0.0) -> dict[str, str]:
    """A job's metadata as Pub/Sub message attributes (each value within Pub/Sub's limit)."""
    found = meta.headers()
    found.pop(HISTORY, None)
    for index, record in enumerate(meta.history[-MAX_HISTORY:]):
        found[f"{HISTORY_ATTRIBUTE}{index:03d}"] = _record_value(record)
    if delay > 0:
        found[DELAY] = f"{delay:.6f}"
    return found


def read_meta(attrs: dict[str, str], fallback_job_id: str) -> Meta:
    """The metadata of a message published by :func:`attributes`."""
    meta = Meta.read(attrs, fallback_job_id=fallback_job_id)
    history: list[AttemptRecord] = []
    for key in sorted(k for k in attrs if k.startswith(HISTORY_ATTRIBUTE)):
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            history.append(AttemptRecord.from_json(json.loads(attrs[key])))
    return replace(meta, history=history)
