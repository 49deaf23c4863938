"""Calls for operators (SPEC E4): list the recorded calls of jobs (the in-doubt ones first of
all), show one, and settle an in-doubt call.

One copy of each operation; the CLI (``jobfence calls list|show|settle``), the ops API
(``/v1/calls``) and the console page (``/ui/calls``) are doors onto these functions.

A call is **in doubt** when nobody knows whether the downstream did what was asked (a timeout
after the request left, a reset, a 5xx after sending, a process killed between intent and
outcome) and neither a ``reconcile`` nor a repeatable step could resolve it: the job is
parked as a dead letter and the call waits for a person. An operator who has looked
downstream settles it, with a required reason:

``applied`` (with the downstream's reference)
    the effect exists: the job continues as if the call had answered — the step returns
    ``{"settled": "applied", "reference": …}`` instead of calling again.
``not_applied``
    the effect does not exist: the job's next delivery calls again, with the same key.

Settling is one transaction: the call's row (``in_doubt`` → ``applied`` | ``not_applied``,
who, when, why), an audit row (``call.settle``) and a replay of the job's parked dead letter
(same job_id, audited as ``dead_letter.replay``), so the operator's one action makes the job
go on. A job that is not parked (it waits in the queue for its next attempt) finds the
settlement when it runs. Only an ``in_doubt`` call can be settled: a ``pending`` one may have
its request in flight right now (its job's next delivery resolves it or makes it in doubt);
one with an outcome, or settled already, is final.

Everything is scoped like dead letters: a partner-scoped actor sees and settles only its
partner's calls (another's is :class:`~jobfence.errors.NotFound`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Literal, get_args

from ..db import Database, Tx, to_datetime
from ..errors import InvalidRequest, NotFound, ReviewConflict, clean_text
from ..review.deadletters import (
    Actor,
    ItemResult,
    lock_for_review,
    record,
    replay_outcomes,
    republish,
)
from ..review.validation import MAX_PAGE, MAX_REASON, checked_id, checked_limit
from ..transports import Transport
from .ledger import MAX_REFERENCE, Ledger
from .store import ledger_url

__all__ = [
    "ALL_STATES",
    "CALL_STATES",
    "MAX_PAGE",
    "MAX_REFERENCE",
    "SETTLEMENTS",
    "CallFilter",
    "CallPage",
    "CallSummary",
    "CallView",
    "SettleResult",
    "age_text",
    "ledger_db",
    "list_calls",
    "settle_call",
    "show_call",
]

CallState = Literal["pending", "succeeded", "failed", "in_doubt", "applied", "not_applied"]
#: every state of a recorded call (the ledger's CHECK), in the order of a call's life
CALL_STATES: tuple[CallState, ...] = get_args(CallState)
Settlement = Literal["applied", "not_applied"]
#: what an operator may settle an in-doubt call as
SETTLEMENTS: tuple[Settlement, ...] = get_args(Settlement)
#: the state filter that means any state (the default filter is ``in_doubt``)
ALL_STATES = "all"


@dataclass(frozen=True)
class CallFilter:
    """Which calls: every given criterion must match. ``state`` defaults to ``in_doubt`` (what
    waits for a person); ``all`` for any state. ``older_than``: the call's intent was
    committed at least that long ago (its age, by the database's clock)."""

    state: str | None = "in_doubt"
    queue: str | None = None
    consumer: str | None = None
    step: str | None = None
    job_id: str | None = None
    older_than: timedelta | None = None

    def check(self) -> CallFilter:
        """Validate; raise :class:`InvalidRequest` saying what is wrong."""
        state = None if self.state in (None, ALL_STATES) else self.state
        if state is not None and state not in CALL_STATES:
            raise InvalidRequest(
                f"unknown call state {self.state!r}; one of: {', '.join(CALL_STATES)}, "
                f"or {ALL_STATES} for any"
            )
        for name in ("queue", "consumer", "step", "job_id"):
            value = getattr(self, name)
            if value is not None and (not value or len(value) > 500 or "\x00" in value):
                raise InvalidRequest(f"{name} must be 1–500 characters without NUL")
        if self.older_than is not None and not (
            timedelta(0) <= self.older_than <= timedelta(days=36500)
        ):
            raise InvalidRequest("older_than must be a duration from 0 to 100 years")
        return replace(self, state=state)

    def params(self, partner: str | None) -> dict[str, Any]:
        return {
            "state": self.state,
            "queue": self.queue,
            "consumer": self.consumer,
            "step": self.step,
            "job_id": self.job_id,
            "older_than": self.older_than.total_seconds() if self.older_than is not None else None,
            "partner": partner,
        }


@dataclass(frozen=True)
class CallSummary:
    """A recorded call as lists show it (without the recorded outcome)."""

    id: int
    consumer: str
    queue: str
    job_id: str
    step: str
    key: str  # the idempotency key sent downstream
    partner: str | None
    state: str
    attempts: int
    created_at: datetime  # the intent's commit
    updated_at: datetime
    age_seconds: float  # since the intent, by the database's clock
    reference: str | None  # the downstream's reference (an order number)
    last_error: str | None
    settled_by: str | None
    settled_reason: str | None
    settled_at: datetime | None

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for name in ("created_at", "updated_at", "settled_at"):
            value = data[name]
            data[name] = value.isoformat() if value is not None else None
        return data


@dataclass(frozen=True)
class CallView:
    """One call: its summary, the recorded outcome and the job's parked dead letter (if any).
    A settlement's who, when and why are on the call; its audit row is ``call.settle``."""

    call: CallSummary
    outcome: Any  # the recorded summary of the answer (JSON), or None
    dead_letter_id: int | None  # the job's dead letter pending review (its parked job)

    def to_json(self) -> dict[str, Any]:
        return {
            **self.call.to_json(),
            "outcome": self.outcome,
            "dead_letter_id": self.dead_letter_id,
        }


@dataclass(frozen=True)
class CallPage:
    """One page of calls; pass ``next_cursor`` back as ``after`` (None: the last page)."""

    items: list[CallSummary]
    next_cursor: int | None

    def to_json(self) -> dict[str, Any]:
        return {"items": [c.to_json() for c in self.items], "next_cursor": self.next_cursor}


@dataclass(frozen=True)
class SettleResult:
    """A settled call and what became of its job's parked dead letter: ``replay`` is the
    replay's outcome (``published``, or ``already_applied``), None when the job was not
    parked (it runs again on its own)."""

    call: CallSummary
    audit_id: int
    replay: ItemResult | None

    def to_json(self) -> dict[str, Any]:
        return {
            "call": self.call.to_json(),
            "audit_id": self.audit_id,
            "replay": asdict(self.replay) if self.replay is not None else None,
        }


def _summary(row: Mapping[str, Any]) -> CallSummary:
    created, updated = to_datetime(row["created_at"]), to_datetime(row["updated_at"])
    assert created is not None
    assert updated is not None
    return CallSummary(
        id=int(row["id"]),
        consumer=row["consumer"],
        queue=row["queue"],
        job_id=row["job_id"],
        step=row["step"],
        key=row["idem_key"],
        partner=row["partner"],
        state=row["state"],
        attempts=int(row["attempts"]),
        created_at=created,
        updated_at=updated,
        age_seconds=max(0.0, float(row["age_seconds"])),
        reference=row["reference"],
        last_error=row["last_error"],
        settled_by=row["settled_by"],
        settled_reason=row["settled_reason"],
        settled_at=to_datetime(row["settled_at"]),
    )


def age_text(seconds: float) -> str:
    """An age as people read it (what the CLI and the console show): 45s, 12m 5s, 3h 20m,
    2d 4h."""
    whole = max(0, int(seconds))
    for unit, size, small, small_size in (
        ("d", 86400, "h", 3600),
        ("h", 3600, "m", 60),
        ("m", 60, "s", 1),
    ):
        if whole >= size:
            rest = (whole % size) // small_size
            return f"{whole // size}{unit}" + (f" {rest}{small}" if rest else "")
    return f"{whole}s"


def _outcome(value: Any) -> Any:
    if isinstance(value, str | bytes):
        return json.loads(value)
    return value


def _text(value: str | None, what: str, limit: int, *, required: bool, hint: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise InvalidRequest(f"the {what} must be text")
    text = clean_text(value.strip(), limit) if value is not None else ""
    if required and not text:
        raise InvalidRequest(hint)
    return text or None


# -- where the calls are --------------------------------------------------------------------


async def ledger_db(ledger: Ledger, db: Database) -> Database:
    """The database holding the calls of the app whose ledger is ``ledger`` and whose own
    database is ``db``: ``db`` itself on PostgreSQL (the ledger is its ``calls`` table); on
    SQLite the ledger's file next to the store (:mod:`jobfence.calls.store`)."""
    if ledger_url(db.url) == db.url:
        return db
    return await ledger.database()


# -- find and understand ---------------------------------------------------------------------


async def list_calls(
    calls: Database,
    flt: CallFilter | None = None,
    *,
    actor: Actor,
    limit: int = 50,
    after: int | None = None,
) -> CallPage:
    """Calls matching ``flt`` (default: the in-doubt ones) within the actor's scope, oldest
    first, from the ledger's database ``calls`` (:func:`ledger_db`). A keyset page on the
    primary key: deep pages cost what the first does."""
    flt = (flt or CallFilter()).check()
    params = {
        **flt.params(actor.partner),
        "after": checked_id(after, "after (the cursor)", low=0),
        "limit": checked_limit(limit),
    }
    items = [_summary(r) for r in await calls.run("calls_list", params)]
    return CallPage(items, items[-1].id if len(items) == limit else None)


async def show_call(db: Database, calls: Database, call_id: int, *, actor: Actor) -> CallView:
    """One call (from ``calls``, the ledger's database) with its recorded outcome and its
    job's parked dead letter (from ``db``, the app's)."""
    row = await _get(calls, call_id, actor)
    return CallView(_summary(row), _outcome(row["outcome"]), await _parked(db, row))


async def _get(calls: Database, call_id: int, actor: Actor) -> Mapping[str, Any]:
    checked_id(call_id, "the call id")
    rows = await calls.run("calls_show", {"id": call_id})
    if not rows or not actor.sees(rows[0]["partner"]):
        raise NotFound(f"no call {call_id}")
    return rows[0]


async def _parked(db: Database | Tx, row: Mapping[str, Any]) -> int | None:
    """The job's dead letter pending review (at most one per consumer and job_id)."""
    params = {"consumer": row["consumer"], "job_id": row["job_id"]}
    found = await (db.q if isinstance(db, Tx) else db.run)("calls_parked_letter", params)
    return int(found[0]["id"]) if found else None


# -- act: settle -----------------------------------------------------------------------------


def _not_settleable(row: Mapping[str, Any], parked: int | None) -> ReviewConflict:
    state = row["state"]
    if state in SETTLEMENTS:
        when = to_datetime(row["settled_at"])
        at = when.strftime("%Y-%m-%d %H:%M:%S UTC") if when else "?"
        still = (
            f"; its job is still parked as dead letter {parked}: replay that letter"
            if parked is not None
            else ""
        )
        return ReviewConflict(
            f"call {row['id']} was already settled as {state} by {row['settled_by']} at {at}; "
            f"a settlement is final{still}"
        )
    if state == "pending":
        return ReviewConflict(
            f"call {row['id']} is pending: its request may be in flight right now; its job's "
            "next delivery resolves it or records it as in doubt — settle it then"
        )
    return ReviewConflict(
        f"call {row['id']} has a recorded outcome ({state}); only an in-doubt call is settled"
    )


async def settle_call(
    db: Database,
    calls: Database,
    transport: Transport,
    call_id: int,
    *,
    actor: Actor,
    outcome: str,
    reason: str,
    reference: str | None = None,
) -> SettleResult:
    """Settle an in-doubt call as ``applied`` (``reference``: the downstream's, required) or
    ``not_applied``, with a required ``reason``; audited (``call.settle``), and the job's
    parked dead letter is replayed (republished to ``transport``).

    ``db`` is the app's database (letters, audit), ``calls`` the ledger's (:func:`ledger_db`).
    When they are one (PostgreSQL) all of it is one transaction. On SQLite the ledger is a
    file of its own: the settlement commits in it inside the open transaction of the replay
    and the audit row, just before that one commits — if that last commit fails, the call is
    settled and its job still parked (settling again says so; replay the letter).

    Raises :class:`InvalidRequest` (bad outcome, blank reason, a reference missing or
    given with not_applied), :class:`NotFound` (no such call in scope) or
    :class:`ReviewConflict` (not in doubt: pending, with an outcome, or settled already)."""
    if outcome not in SETTLEMENTS:
        raise InvalidRequest(
            f"settle a call as {' or '.join(SETTLEMENTS)}, not {outcome!r}: applied when the "
            "downstream has the effect (give its reference), not_applied when it has not"
        )
    why = _text(
        reason,
        "reason",
        MAX_REASON,
        required=True,
        hint="settling a call needs a reason: say what you checked downstream "
        "(e.g. 'order PO123 found in the ERP, ticket OPS-42')",
    )
    ref = _text(
        reference,
        "reference",
        MAX_REFERENCE,
        required=outcome == "applied",
        hint="a call settled as applied needs the downstream's reference (e.g. the order "
        "number the ERP shows), so the job can go on as if the call had answered",
    )
    if outcome == "not_applied" and ref is not None:
        raise InvalidRequest(
            "a call settled as not_applied has no downstream reference: leave it out"
        )
    row = await _get(calls, call_id, actor)
    if row["state"] != "in_doubt":
        raise _not_settleable(row, await _parked(db, row))
    settle = {
        "id": call_id,
        "state": outcome,
        "reference": ref,
        "actor": actor.name,
        "reason": why,
        # what the job's step returns from now on (applied), instead of calling
        "outcome": json.dumps({"settled": outcome, "reference": ref}) if ref else None,
    }
    async with db.transaction() as tx:
        if calls is db:
            await _settle(tx, call_id, actor, settle)
        replay, letter_id, woke = await _replay_parked(db, tx, transport, row, actor, why)
        audit_id = await record(
            tx,
            actor,
            "call.settle",
            dead_letter_id=letter_id,
            partner=row["partner"],
            reason=why,
            details={
                "call": call_id,
                "job_id": row["job_id"],
                "consumer": row["consumer"],
                "queue": row["queue"],
                "step": row["step"],
                "key": row["idem_key"],
                "reference": ref,
                "replay": replay.outcome if replay is not None else None,
            },
            old_state="in_doubt",
            new_state=outcome,
        )
        if calls is not db:
            async with calls.transaction() as ctx:
                await _settle(ctx, call_id, actor, settle)
    if woke:
        transport.wake()  # local workers (SQLite has no notifications)
    fresh = await _get(calls, call_id, actor)
    return SettleResult(_summary(fresh), audit_id, replay)


async def _settle(tx: Tx, call_id: int, actor: Actor, params: Mapping[str, Any]) -> None:
    """The settlement's row change, in ``tx`` (the ledger's): only an in-doubt call."""
    rows = await tx.q("calls_lock", {"id": call_id})
    if not rows or not actor.sees(rows[0]["partner"]):
        raise NotFound(f"no call {call_id}")
    if rows[0]["state"] != "in_doubt" or not await tx.q("calls_settle", params):
        raise ReviewConflict(
            f"call {call_id} changed while it was being settled (its job resolved it, or "
            "someone settled it); look at it again"
        )


async def _replay_parked(
    db: Database,
    tx: Tx,
    transport: Transport,
    row: Mapping[str, Any],
    actor: Actor,
    reason: str | None,
) -> tuple[ItemResult | None, int | None, bool]:
    """Replay the job's dead letter pending review, in ``tx``: its outcome, its id, and
    whether the job was queued in ``tx`` (wake local workers after the commit). None, None:
    the job is not parked."""
    letter_id = await _parked(tx, row)
    if letter_id is None:
        return None, None, False
    locked = await lock_for_review(db, tx, [letter_id])
    (result,) = replay_outcomes(locked, [letter_id], actor)
    if result.outcome not in ("published", "already_applied"):
        raise ReviewConflict(
            f"the call's job is parked as dead letter {letter_id}, which cannot be replayed "
            f"({result.detail}); nothing was settled"
        )
    woke = await republish(db, tx, transport, [result], actor=actor, reason=reason)
    return result, letter_id, woke
