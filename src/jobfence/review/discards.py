"""Bulk discard: discard every pending letter a filter matches — the mirror of bulk replay
(:mod:`jobfence.review.replays`), previewed first and carried out with a reason.

:func:`preview_discard` counts what a filter matches now (a breakdown by queue and category, a
sample) and fixes the snapshot's bound ``upto_id``, the highest matching id. Nothing changes.
:func:`discard_matching` then discards, in one transaction, the letters still pending that
match the filter with an id up to that bound, each with the reason and an audit row
(``dead_letter.discard``, details ``{"outcome": "discarded", "bulk": true}``). Letters that
were replayed or discarded since the preview are left alone; letters written since have
higher ids and are not touched. The operator confirms the previewed count (``expect``): if
more letters would be discarded than were shown, nothing is.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from ..db import Database
from ..errors import InvalidRequest
from .deadletters import Actor, Filter, search
from .replays import MAX_BULK
from .validation import checked_id, checked_reason

__all__ = ["DiscardPreview", "DiscardResult", "discard_matching", "preview_discard"]


@dataclass(frozen=True)
class DiscardPreview:
    """What a bulk discard would touch now."""

    total: int
    upto_id: int | None  # the snapshot's bound: the highest matching id (None: nothing)
    filter: dict[str, Any]
    breakdown: list[dict[str, Any]]  # queue, category, letters
    sample: list[dict[str, Any]]  # id, queue, job_id, error_category, last_error, failed_at

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class DiscardResult:
    discarded: int
    ids: list[int]


def _checked(flt: Filter, all_pending: bool) -> Filter:
    flt = replace(flt.check(), status=None)
    if flt.is_empty and not all_pending:
        raise InvalidRequest(
            "say which letters to discard: give a filter (queue, category, error text, time "
            "range, ids…), or ask for every pending letter explicitly (all_pending)"
        )
    return flt


async def preview_discard(
    db: Database,
    flt: Filter,
    *,
    actor: Actor,
    all_pending: bool = False,
    sample: int = 10,
) -> DiscardPreview:
    """Count the pending letters ``flt`` matches (nothing is changed)."""
    flt = _checked(flt, all_pending)
    if not 0 <= sample <= 100:
        raise InvalidRequest("sample must be between 0 and 100")
    rows = await db.run("discard_breakdown", flt.params(db, actor.partner))
    breakdown = [
        {"queue": r["queue"], "category": r["category"], "letters": int(r["letters"])} for r in rows
    ]
    total = sum(b["letters"] for b in breakdown)
    upto = max((int(r["upto"]) for r in rows), default=None)
    examples: list[dict[str, Any]] = []
    if sample and total:
        page = await search(
            db, replace(flt, status="pending_review"), actor=actor, limit=min(sample, total)
        )
        examples = [
            {
                "id": x.id,
                "queue": x.queue,
                "job_id": x.job_id,
                "error_category": x.error_category,
                "last_error": x.last_error,
                "failed_at": x.failed_at.isoformat(),
            }
            for x in page.items
        ]
    return DiscardPreview(total, upto, flt.criteria() or {"all_pending": True}, breakdown, examples)


async def discard_matching(
    db: Database,
    flt: Filter,
    *,
    actor: Actor,
    reason: str,
    upto_id: int,
    expect: int,
    all_pending: bool = False,
) -> DiscardResult:
    """Discard the pending letters ``flt`` matches with ids up to ``upto_id`` (from
    :func:`preview_discard`), with ``reason``, audited, in one transaction. Refused (nothing
    discarded) if more than ``expect`` letters — the previewed count — would be."""
    why = checked_reason(reason, required=True)
    flt = _checked(flt, all_pending)
    checked_id(upto_id, "upto_id (from the preview)")
    if isinstance(expect, bool) or not isinstance(expect, int) or not 0 <= expect <= MAX_BULK:
        raise InvalidRequest(f"expect must be the previewed count (0 to {MAX_BULK})")
    async with db.transaction() as tx:
        rows = await tx.q(
            "discard_matching",
            {
                **flt.params(db, actor.partner),
                "upto": upto_id,
                "actor": actor.name,
                "reason": why,
            },
        )
        ids = sorted(int(r["id"]) for r in rows)
        if len(ids) > expect:
            raise InvalidRequest(
                f"{len(ids)} letters match now, more than the {expect} previewed; nothing was "
                "discarded — preview again"
            )
        if ids:
            await tx.q(
                "audit_letters",
                {
                    "actor": actor.name,
                    "via": actor.via,
                    "action": "dead_letter.discard",
                    "replay_id": None,
                    "reason": why,
                    "details": json.dumps({"outcome": "discarded", "bulk": True}),
                    "ids": db.array(ids),
                    "old_state": "pending_review",
                },
            )
    return DiscardResult(len(ids), ids)
