"""Dead letters for people (SPEC D2, D3, D5): find them, understand them, act on them.

One copy of each operation; the CLI (``jobfence dead-letters …``) and the ops HTTP API
(:mod:`jobfence.ops`) are thin doors onto these functions, so both behave the same.

Review states, enforced by the database (CHECK constraints and a trigger)::

    pending_review ──replay──►  replayed    (the job is republished with the same job_id)
          │
          └──────discard────►  discarded   (needs a non-blank reason)

A decision is final: a decided letter never changes again. Every action appends a row to
the append-only audit log (who, when, what, why). A replay and a discard racing on one letter
both ask for ``status = 'pending_review'`` in one UPDATE: exactly one wins, the other gets
:class:`~jobfence.errors.ReviewConflict`.

**Replay** republishes the job with the same job_id, payload and correlation_id, so the
consumer's fence turns a job that was meanwhile applied into a skipped duplicate. With the
database queue in the same database the republish is an INSERT in the transaction that marks
the letter replayed and writes the audit row: nothing lost, nothing doubled. With another
transport (a broker, or a queue in another database) the publish happens *inside* that still
open transaction, before it commits: if the publish fails the letter stays pending; if the
commit fails after a successful publish the letter stays pending too and a later replay
publishes the job again — a duplicate delivery that the fence absorbs. A replay is never lost.
A letter whose job_id is already fenced for its consumer is marked replayed without
republishing (``already_applied``): its effect exists. Bulk replay: :mod:`jobfence.review.replays`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Generic, Literal, TypeVar, get_args

from .. import tracing
from ..core.jobs import OutgoingJob
from ..db import Database, Tx, to_datetime
from ..errors import Category, InvalidRequest, NotFound, ReviewConflict
from ..transports import Transport
from .letters import DeadLetter, from_row, get_letter
from .validation import (
    MAX_ID,
    MAX_IDS,
    MAX_PAGE,
    aware,
    check_texts,
    checked_choice,
    checked_id,
    checked_limit,
    checked_reason,
    checked_window,
    like_pattern,
    when_text,
)

T = TypeVar("T")

Via = Literal["cli", "api", "library", "console"]
ItemOutcome = Literal["published", "already_applied", "not_pending", "truncated"]
#: every item outcome of a replay, in report order (the CLI, the ops API and docs use these)
ITEM_OUTCOMES: tuple[ItemOutcome, ...] = get_args(ItemOutcome)

STATUSES = ("pending_review", "replayed", "discarded")


@dataclass(frozen=True)
class Actor:
    """Who acts, through which door, and within which partner scope (None: all partners)."""

    name: str
    via: Via = "library"
    partner: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip() or len(self.name) > 200:
            raise InvalidRequest("the actor (who is acting) must be 1–200 characters")

    def sees(self, partner: str | None) -> bool:
        return self.partner is None or self.partner == partner


@dataclass(frozen=True)
class Filter:
    """Which dead letters: every given criterion must match. ``error`` is a case-insensitive
    substring of the last error; ``since``/``until`` bound ``failed_at`` (until excluded)."""

    queue: str | None = None
    consumer: str | None = None
    category: str | None = None
    error: str | None = None
    job_id: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    ids: tuple[int, ...] | None = None
    status: str | None = None  # for listing ("all": any); a bulk replay takes pending only

    def check(self) -> Filter:
        """Validate; raise :class:`InvalidRequest` saying what is wrong."""
        if self.category is not None and self.category not in {c.value for c in Category}:
            raise InvalidRequest(
                f"unknown category {self.category!r}; one of: "
                + ", ".join(c.value for c in Category)
            )
        status = checked_choice(self.status, STATUSES, "status")
        check_texts(
            {
                "queue": self.queue,
                "consumer": self.consumer,
                "job_id": self.job_id,
                "error": self.error,
            }
        )
        since, until = checked_window(self.since, self.until)
        if self.ids is not None and (
            len(self.ids) > MAX_IDS or any(not 1 <= i <= MAX_ID for i in self.ids)
        ):
            raise InvalidRequest(
                f"ids must be at most {MAX_IDS} letter ids, each from 1 to {MAX_ID}"
            )
        return replace(self, since=since, until=until, status=status)

    def search_query(self, dialect: str) -> str:
        """The search: a PostgreSQL time window through its failed_at index, or dl_search."""
        own_index = self.job_id is not None or self.ids is not None
        window = not own_index and (self.since is not None or self.until is not None)
        return "dl_search_window" if window and dialect == "postgresql" else "dl_search"

    @property
    def is_empty(self) -> bool:
        return not self.criteria()

    def criteria(self) -> dict[str, Any]:
        """The given criteria, JSON-ready (what a replay records as its filter)."""
        out: dict[str, Any] = {}
        for name in ("queue", "consumer", "category", "error", "job_id", "status"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        for name in ("since", "until"):
            value = getattr(self, name)
            if value is not None:
                out[name] = aware(value).isoformat()  # type: ignore[union-attr]
        if self.ids is not None:
            out["ids"] = list(self.ids)
        return out

    def params(self, db: Database, partner: str | None) -> dict[str, Any]:
        return {
            "status": self.status,
            "queue": self.queue,
            "consumer": self.consumer,
            "category": self.category,
            "job_id": self.job_id,
            "error": like_pattern(self.error) if self.error is not None else None,
            "since": db.at(aware(self.since)),
            "until": db.at(aware(self.until)),
            "ids": db.array(self.ids),
            "partner": partner,
        }


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of a listing; pass ``next_cursor`` back to get the next (None: the end)."""

    items: list[T]
    next_cursor: int | None


@dataclass(frozen=True)
class AuditEntry:
    id: int
    at: datetime
    actor: str
    via: str
    action: str
    partner: str | None
    dead_letter_id: int | None
    replay_id: int | None
    reason: str | None
    details: dict[str, Any]
    old_state: str | None = None  # the transition the action made (None: none, or before
    new_state: str | None = None  # audit rows recorded it)

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "at": self.at.isoformat()}


@dataclass(frozen=True)
class LetterView:
    """Everything a person needs to understand one letter."""

    letter: DeadLetter
    followers: list[int]  # letters of the same job that failed after this one was replayed
    audit: list[AuditEntry]


@dataclass(frozen=True)
class LetterLock:
    """A letter locked for a review decision (``dl_lock_for_review``): what a replay or a
    discard decides on."""

    id: int
    status: str
    partner: str | None
    payload_truncated: bool
    queue: str
    consumer: str
    job_id: str
    reviewed_by: str | None
    reviewed_at: datetime | None
    #: its job_id is fenced for its consumer: its effect exists
    applied: bool

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> LetterLock:
        return cls(
            id=int(row["id"]),
            status=row["status"],
            partner=row["partner"],
            payload_truncated=bool(row["payload_truncated"]),
            queue=row["queue"],
            consumer=row["consumer"],
            job_id=row["job_id"],
            reviewed_by=row["reviewed_by"],
            reviewed_at=to_datetime(row["reviewed_at"]),
            applied=bool(row["applied"]),
        )

    @property
    def decided(self) -> str:
        """Why no review decision can be made on it any more."""
        return (
            f"dead letter {self.id} was already {self.status} by {self.reviewed_by} at "
            f"{when_text(self.reviewed_at)}; a review decision is final"
        )


@dataclass(frozen=True)
class ItemResult:
    dead_letter_id: int
    outcome: ItemOutcome
    detail: str | None = None


# -- helpers ------------------------------------------------------------------------------


def _entry(row: Mapping[str, Any]) -> AuditEntry:
    details = row["details"]
    if isinstance(details, str | bytes):
        details = json.loads(details)
    at = to_datetime(row["at"])
    assert at is not None
    return AuditEntry(
        id=int(row["id"]),
        at=at,
        actor=row["actor"],
        via=row["via"],
        action=row["action"],
        partner=row["partner"],
        dead_letter_id=row["dead_letter_id"],
        replay_id=row["replay_id"],
        reason=row["reason"],
        details=dict(details or {}),
        old_state=row.get("old_state"),
        new_state=row.get("new_state"),
    )


async def record(
    tx: Tx,
    actor: Actor,
    action: str,
    *,
    dead_letter_id: int | None = None,
    replay_id: int | None = None,
    partner: str | None = None,
    reason: str | None = None,
    details: Mapping[str, Any] | None = None,
    old_state: str | None = None,
    new_state: str | None = None,
) -> int:
    """Append one audit row in ``tx`` (commits or rolls back with the action it records).
    ``old_state`` → ``new_state`` is the transition the action made (None where there is no
    such state, e.g. before a replay existed)."""
    rows = await tx.q(
        "audit_insert",
        {
            "actor": actor.name,
            "via": actor.via,
            "action": action,
            "partner": partner,
            "dead_letter_id": dead_letter_id,
            "replay_id": replay_id,
            "reason": reason,
            "details": json.dumps(dict(details or {})),
            "old_state": old_state,
            "new_state": new_state,
        },
    )
    return int(rows[0]["id"])


# -- find and understand -------------------------------------------------------------------


async def search(
    db: Database,
    flt: Filter,
    *,
    actor: Actor,
    limit: int = 50,
    before: int | None = None,
) -> Page[DeadLetter]:
    """Letters matching ``flt`` within the actor's scope, newest first, without payloads."""
    flt = flt.check()
    params = {
        **flt.params(db, actor.partner),
        "before": checked_id(before, "before (the cursor)", low=0),
        "limit": checked_limit(limit),
    }
    rows = await db.run(flt.search_query(db.dialect), params)
    letters = [from_row(row) for row in rows]
    cursor = letters[-1].id if len(letters) == limit else None
    return Page(letters, cursor)


async def letters(
    db: Database,
    *,
    status: str | None = None,
    queue: str | None = None,
    category: str | None = None,
    limit: int = 50,
    actor: Actor | None = None,
) -> list[DeadLetter]:
    """Up to ``limit`` letters, newest first, without payloads: :func:`search` page by page
    (the library's and the CLI's listing; ``actor`` defaults to the library, all partners)."""
    flt = Filter(status=status, queue=queue, category=category)
    return await matching(db, flt, actor=actor or Actor("library"), limit=limit)


async def matching(db: Database, flt: Filter, *, actor: Actor, limit: int = 50) -> list[DeadLetter]:
    """Up to ``limit`` letters that ``flt`` matches, newest first, without payloads:
    :func:`search` page by page (``jobfence dead-letters list``)."""
    found: list[DeadLetter] = []
    cursor: int | None = None
    while len(found) < limit:
        page = await search(
            db, flt, actor=actor, limit=min(MAX_PAGE, limit - len(found)), before=cursor
        )
        found.extend(page.items)
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    return found


async def show(db: Database, letter_id: int, *, actor: Actor) -> LetterView:
    """One letter with its payload, every attempt, its replay chain and its audit trail."""
    checked_id(letter_id, "the dead letter id")
    letter = await get_letter(db, letter_id)
    if letter is None or not actor.sees(letter.partner):
        raise NotFound(f"no dead letter {letter_id}")
    followers = await db.run("dl_followers", {"id": letter.id, "job_id": letter.job_id})
    trail = await db.run(
        "audit_list",
        {
            "partner": actor.partner,
            "dead_letter_id": letter.id,
            "replay_id": None,
            "actor": None,
            "before": None,
            "limit": 100,
        },
    )
    return LetterView(letter, [int(r["id"]) for r in followers], [_entry(r) for r in trail])


async def audit(
    db: Database,
    *,
    actor: Actor,
    dead_letter_id: int | None = None,
    replay_id: int | None = None,
    by: str | None = None,
    action: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    before: int | None = None,
    limit: int = 50,
) -> Page[AuditEntry]:
    """The audit log (newest first) in the actor's scope, by letter, replay, actor (``by``),
    ``action`` (``dead_letter.``: every action under that prefix) and time (since ≤ at < until)."""
    since, until = Filter(since=since, until=until).check().since, aware(until)
    prefix = like_pattern(action)[1:] if action is not None and action.endswith(".") else None
    rows = await db.run(
        "audit_search",
        {
            "partner": actor.partner,
            "dead_letter_id": checked_id(dead_letter_id, "dead_letter_id"),
            "replay_id": checked_id(replay_id, "replay_id"),
            "actor": by,
            "action": action,
            "action_prefix": prefix,
            "since": db.at(since),
            "until": db.at(until),
            "before": checked_id(before, "before (the cursor)", low=0),
            "limit": checked_limit(limit),
        },
    )
    entries = [_entry(r) for r in rows]
    return Page(entries, entries[-1].id if len(entries) == limit else None)


# -- act: discard ----------------------------------------------------------------------------


async def discard(db: Database, letter_id: int, *, actor: Actor, reason: str) -> DeadLetter:
    """Discard a pending letter; ``reason`` must say why (blank is refused)."""
    why = checked_reason(reason, required=True)
    checked_id(letter_id, "the dead letter id")
    async with db.transaction() as tx:
        done = await tx.q(
            "dl_discard",
            {"id": letter_id, "actor": actor.name, "reason": why, "scope": actor.partner},
        )
        row = (await lock_for_review(db, tx, [letter_id])).get(letter_id)
        if row is None or not actor.sees(row.partner):
            raise NotFound(f"no dead letter {letter_id}")
        if not done:
            raise ReviewConflict(row.decided)
        await tx.q(
            "audit_letters",
            {
                "actor": actor.name,
                "via": actor.via,
                "action": "dead_letter.discard",
                "replay_id": None,
                "reason": why,
                "details": json.dumps({"outcome": "discarded"}),
                "ids": db.array([letter_id]),
                "old_state": "pending_review",
            },
        )
    letter = await get_letter(db, letter_id)
    assert letter is not None
    return letter


# -- act: replay -----------------------------------------------------------------------------


async def replay(
    db: Database,
    transport: Transport,
    letter_id: int,
    *,
    actor: Actor,
    reason: str | None = None,
) -> ItemResult:
    """Replay one pending letter: ``published`` or ``already_applied``.

    Raises :class:`NotFound` (no such letter in scope) or
    :class:`~jobfence.errors.ReviewConflict` (already decided, or its payload was truncated).
    """
    checked_id(letter_id, "the dead letter id")
    why = checked_reason(reason, required=False)
    async with db.transaction() as tx:
        rows = await lock_for_review(db, tx, [letter_id])
        row = rows.get(letter_id)
        if row is None or not actor.sees(row.partner):
            raise NotFound(f"no dead letter {letter_id}")
        if row.status != "pending_review":
            raise ReviewConflict(row.decided)
        (result,) = replay_outcomes(rows, [letter_id], actor)
        if result.outcome == "truncated":
            raise ReviewConflict(f"dead letter {letter_id}: {result.detail}")
        woke = await republish(db, tx, transport, [result], actor=actor, reason=why)
    if woke:
        transport.wake()  # local workers (SQLite has no notifications)
    return result


async def lock_for_review(db: Database, tx: Tx, ids: Sequence[int]) -> dict[int, LetterLock]:
    """The letters ``ids``, locked for a review decision in ``tx``, by id."""
    rows = await tx.q("dl_lock_for_review", {"ids": db.array(ids)})
    return {lock.id: lock for lock in map(LetterLock.from_row, rows)}


def replay_outcomes(
    rows: Mapping[int, LetterLock], ids: Sequence[int], actor: Actor
) -> list[ItemResult]:
    """What replaying each of ``ids`` would do, from their locked rows: ``published``,
    ``already_applied`` (the job_id is fenced: its effect exists), ``truncated`` or
    ``not_pending`` (not found in scope, or already decided)."""
    results: list[ItemResult] = []
    for letter_id in ids:
        row = rows.get(letter_id)
        if row is None or not actor.sees(row.partner):
            results.append(ItemResult(letter_id, "not_pending", "not found in scope"))
        elif row.status != "pending_review":
            detail = f"already {row.status} by {row.reviewed_by}"
            results.append(ItemResult(letter_id, "not_pending", detail))
        elif row.payload_truncated:
            detail = (
                "its payload was truncated when it was dead-lettered, so it cannot be "
                "republished; recover the job from its source, then discard this letter"
            )
            results.append(ItemResult(letter_id, "truncated", detail))
        elif row.applied:
            detail = "its job_id is fenced (the effect exists): marked replayed, not republished"
            results.append(ItemResult(letter_id, "already_applied", detail))
        else:
            results.append(ItemResult(letter_id, "published"))
    return results


async def _replaying(
    db: Database, tx: Tx, transport: Transport, ids: Sequence[int]
) -> AbstractContextManager[str | None]:
    """The ``replay`` span of republishing the letters ``ids``, linked to their original
    traces; the replayed jobs carry its context (docs/tracing.md). Without tracing, they
    carry their letters' own."""
    traces = tracing.get()
    if traces is None or not traces.live:
        return nullcontext(None)  # the replayed jobs carry their letters' contexts
    rows = await tx.q("dl_trace_contexts", {"ids": db.array(ids)})
    queues = {row["queue"] for row in rows}
    return traces.replay(
        next(iter(queues)) if len(queues) == 1 else None,
        [row["trace_context"] for row in rows if row["trace_context"]],
        len(ids),
        transport.name,
    )


async def republish(
    db: Database,
    tx: Tx,
    transport: Transport,
    results: Sequence[ItemResult],
    *,
    actor: Actor,
    reason: str | None,
    replay_id: int | None = None,
) -> bool:
    """Carry out :func:`replay_outcomes` in ``tx``: mark the letters replayed, republish the
    ``published`` ones with the same job_id (:meth:`~jobfence.transports.Transport.publish_tx`:
    written in ``tx`` on the database queue of this database, else published before ``tx``
    commits) and audit each. True when jobs were queued in ``tx`` (wake local workers after
    the commit)."""
    publish = [r.dead_letter_id for r in results if r.outcome == "published"]
    applied = [r.dead_letter_id for r in results if r.outcome == "already_applied"]
    if publish or applied:
        await tx.q(
            "dl_mark_replayed",
            {"ids": db.array(publish + applied), "actor": actor.name, "reason": reason},
        )
    queued = False
    if publish:
        with await _replaying(db, tx, transport, publish) as trace_context:
            payloads = await tx.q("dl_payloads", {"ids": db.array(publish)})
            queued = await transport.publish_tx(
                tx,
                [
                    OutgoingJob(
                        r["queue"],
                        r["job_id"],
                        bytes(r["payload"]),
                        r["correlation_id"],
                        trace_context=trace_context or r["trace_context"],
                    )
                    for r in payloads
                ],
            )
    for outcome, letters in (("published", publish), ("already_applied", applied)):
        if letters:
            await tx.q(
                "audit_letters",
                {
                    "actor": actor.name,
                    "via": actor.via,
                    "action": "dead_letter.replay",
                    "replay_id": replay_id,
                    "reason": reason,
                    "details": json.dumps({"outcome": outcome}),
                    "ids": db.array(letters),
                    "old_state": "pending_review",
                },
            )
    return queued
