"""The checks every review service applies to what an operator sends, in one place.

The dead-letter review, the bulk replay and discard, job control and the CLI ask these
before they touch the database, so the four doors (library, CLI, ops API, console) refuse
the same input with the same one line (:class:`~jobfence.errors.InvalidRequest`).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from ..db import to_datetime
from ..errors import InvalidRequest, clean_text

MAX_PAGE = 1000
MAX_IDS = 10_000
MAX_REASON = 4000
#: The largest id or cursor the stores hold (PostgreSQL bigint, SQLite INTEGER).
MAX_ID = 2**63 - 1
MAX_TEXT = 500  # a filter's text criterion (queue, consumer, job_id, error, …)
#: the state filter that means any state (``--status all``, ``--state all``)
ALL_STATUSES = "all"


def aware(value: datetime | None) -> datetime | None:
    """``value`` with a time zone (a naive time is read as UTC)."""
    if value is None:
        return None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def like_pattern(text: str) -> str:
    """A case-insensitive substring match for ``text`` (its LIKE wildcards escaped)."""
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def checked_choice(value: str | None, choices: tuple[str, ...], what: str) -> str | None:
    """A state criterion: one of ``choices``, or None (no criterion, or :data:`ALL_STATUSES`)."""
    chosen = None if value == ALL_STATUSES else value
    if chosen is not None and chosen not in choices:
        raise InvalidRequest(
            f"unknown {what} {value!r}; one of: {', '.join(choices)}, or {ALL_STATUSES} for any"
        )
    return chosen


def check_texts(criteria: dict[str, str | None]) -> None:
    """Text criteria (queue, consumer, job_id, error, …): 1–:data:`MAX_TEXT` characters
    without NUL each, when given."""
    for name, value in criteria.items():
        if value is not None and (not value or len(value) > MAX_TEXT or "\x00" in value):
            raise InvalidRequest(f"{name} must be 1–{MAX_TEXT} characters without NUL")


def checked_window(
    since: datetime | None, until: datetime | None
) -> tuple[datetime | None, datetime | None]:
    """A time window (``since`` included, ``until`` excluded), both with a time zone."""
    since, until = aware(since), aware(until)
    if since is not None and until is not None and since >= until:
        raise InvalidRequest("since must be before until")
    return since, until


def checked_reason(reason: str | None, *, required: bool) -> str | None:
    """An operator's reason, cleaned (None when blank); a blank one refused if ``required``."""
    if reason is not None and not isinstance(reason, str):
        raise InvalidRequest("the reason must be text")
    text = clean_text(reason.strip(), MAX_REASON) if reason is not None else ""
    if required and not text:
        raise InvalidRequest(
            "a discard needs a reason: say why this letter needs no replay "
            "(e.g. 'order cancelled by the partner, ticket OPS-123')"
        )
    return text or None


def checked_id(value: int | None, what: str, *, low: int = 1) -> int | None:
    """``value`` when it is a whole number the stores can hold (``low``…:data:`MAX_ID`);
    else :class:`InvalidRequest` naming it (a driver would fail with an overflow)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_ID:
        raise InvalidRequest(f"{what} must be a whole number from {low} to {MAX_ID}, not {value!r}")
    return value


def checked_limit(limit: int) -> int:
    """A page size (1…:data:`MAX_PAGE`)."""
    if not 1 <= limit <= MAX_PAGE:
        raise InvalidRequest(f"page size must be between 1 and {MAX_PAGE}")
    return limit


def when_text(value: Any) -> str:
    """A stored moment as messages show it (``2026-12-04 14:20:00 UTC``; ``?`` when unknown)."""
    moment = to_datetime(value)
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC") if moment else "?"
