"""Alert events: what may appear in an alert (secrets masked, failures fingerprinted) and
:func:`enqueue_alert`, which records an event in the caller's transaction (dead letters
record theirs by a trigger on the same table)."""

from __future__ import annotations

import hashlib
import json
import re

from ..db import Tx
from ..errors import clean_text

ERROR_CHARS = 300

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
