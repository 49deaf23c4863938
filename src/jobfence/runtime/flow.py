"""Flow control (issue 26): concurrency and rate limits per key, shared by every worker.

The state is in the database (schema ``core``: ``flow_slots``, ``flow_starts``,
``flow_holds``, and ``jobs.flow_key``), so a limit holds across processes and hosts:

- **The database queue** enforces its limits in its claim (``flow_claim`` in jobs.sql,
  :mod:`jobfence.transports.database`): a job over its key's limit is simply not claimed.
  This module keys the jobs enqueued without their key (:meth:`FlowControl.key_jobs`) and
  prunes the log of starts.
- **A broker** cannot leave a message unclaimed: the harness asks :meth:`FlowControl.admit`
  before it runs a delivery (a concurrency slot in ``flow_slots`` and a start in
  ``flow_starts``; on PostgreSQL one statement, ``core.flow_admit``), defers the delivery
  when the answer is :class:`Deferred`, and gives the slot back with the outcome: inside
  the job's work transaction when it commits (:func:`release_at_commit`, with the COMMIT),
  else by :meth:`FlowControl.release` after a retry, a dead letter or a back-off
  (:meth:`FlowControl.extend` renews it with the delivery's lease; an expired slot counts
  for nothing, so a killed worker's slots come back within one lease).
- **Holds**: a handler's :class:`~jobfence.errors.BackOff` holds its key for a while
  (:meth:`FlowControl.back_off`); an operator pauses a key (``review.jobctl.pause_key``).

Rates are a sliding window log: a start is admitted only while the window of ``per`` that
ends now holds fewer than ``count`` starts, so no window anywhere ever holds more (a token
bucket lets a full bucket and its refill through in one window: up to twice the rate).
Admissions and limited claims of one queue take turns (PostgreSQL: an advisory transaction
lock per queue; SQLite: its one writer). See docs/flow-control.md.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from ..core.holds import hold
from ..core.limits import QUEUE_KEY, Limit
from ..db import Database, Tx

log = logging.getLogger("jobfence.flow")

#: jobs keyed by one statement of the keying pass
KEYING_BATCH = 500
#: keys listed by :meth:`FlowControl.status` at most (the busiest first)
STATUS_KEYS = 100


@dataclass(frozen=True)
class Admitted:
    """The delivery may run. ``slot``: its concurrency slot, to :meth:`FlowControl.release`
    after the outcome (None when the limit has no concurrency)."""

    slot: int | None


@dataclass(frozen=True)
class Deferred:
    """The delivery must wait: ``reason`` is ``"concurrency"``, ``"rate"``, ``"backoff"`` or
    ``"pause"``; ``wait`` the seconds until capacity can come back at the earliest (a rate
    window's oldest start leaves it, a back-off ends, a slot's lease runs out), None while
    the key is paused (until an operator resumes it)."""

    reason: str
    wait: float | None


Admission = Admitted | Deferred


@dataclass(frozen=True)
class KeyStatus:
    """One key of a limited queue: running (jobs with a live lease and broker slots),
    waiting (available jobs, due or not), and starts within the rate's window."""

    key: str
    in_use: int
    waiting: int
    starts: int


@dataclass(frozen=True)
class Hold:
    """A held key: a back-off (``held_for`` seconds left) or a pause (``held_for`` None)."""

    key: str
    kind: str
    held_for: float | None
    reason: str
    held_by: str


@dataclass(frozen=True)
class FlowStatus:
    """What operators see of one queue's flow: its limit, its busiest keys, the jobs not yet
    keyed, and the held keys."""

    queue: str
    limit: Limit
    keys: list[KeyStatus]
    unkeyed: int
    holds: list[Hold]


async def lock(tx: Tx, queue: str) -> None:
    """Take ``queue``'s flow lock in ``tx`` (PostgreSQL; SQLite's write transaction is one
    already): limited claims and admissions of one queue take turns."""
    if tx.dialect == "postgresql":
        await tx.q("flow_lock", {"queue": queue})


async def record_starts(tx: Tx, db: Database, queue: str, keys: Sequence[str], at: Any) -> None:
    """One start per entry of ``keys`` at ``at`` (the database clock's time the window was
    counted; in ``tx``, under the queue's flow lock)."""
    if keys:
        await tx.q("flow_record_starts", {"queue": queue, "keys": db.array(keys), "at": at})


async def release_at_commit(tx: Tx, slot: int) -> None:
    """Give back ``slot`` when ``tx`` (a job's work transaction, in the slots' database)
    commits: on PostgreSQL the statement leaves with the COMMIT, no round trip of its own.
    If ``tx`` rolls back, the slot is still held (give it back with
    :meth:`FlowControl.release`)."""
    await tx.q_at_commit("flow_release_slot", {"id": slot})


def _seconds(value: Any) -> float | None:
    return None if value is None else float(value)


class FlowControl:
    """The flow-control service of one app: its consumers' limits (queue → :class:`Limit`)
    over the database ``db`` (the fence's database for brokers; the queue's database for
    the database queue). ``holder`` names this worker in slots and holds."""

    def __init__(self, db: Database, limits: Mapping[str, Limit], *, holder: str) -> None:
        self.db = db
        self.limits = dict(limits)
        self.holder = holder

    def limit(self, queue: str) -> Limit | None:
        return self.limits.get(queue)

    # -- brokers: admission ---------------------------------------------------------------

    async def admit(self, queue: str, key: str, job_id: str, lease: timedelta) -> Admission:
        """Admit one delivery of ``queue`` (its key ``key``) or say why and how long it must
        wait. Admitted: a slot (if the limit has a concurrency) renewed by :meth:`extend`
        and given back by :meth:`release` (or :func:`release_at_commit`), and a start
        recorded (if it has a rate), both under the queue's flow lock: on PostgreSQL in one
        statement (``core.flow_admit``, one round trip), on SQLite in one write transaction
        of the same steps. A queue without a limit is admitted without a write."""
        limit = self.limits.get(queue)
        if limit is None:
            return Admitted(None)
        per = limit.rate.seconds if limit.rate is not None else 0.0
        if self.db.dialect == "postgresql":
            rows = await self.db.run(
                "flow_admit",
                {
                    "queue": queue,
                    "key": key,
                    "job_id": job_id,
                    "holder": self.holder,
                    "lease": lease.total_seconds(),
                    "concurrency": limit.concurrency,
                    "count": limit.rate.count if limit.rate is not None else None,
                    "per": per,
                },
            )
            state = rows[0]
            if state["admitted"]:
                return Admitted(None if state["slot"] is None else int(state["slot"]))
            return _refused(limit, state)
        async with self.db.transaction() as tx:
            state = (await tx.q("flow_admit_state", {"queue": queue, "key": key, "per": per}))[0]
            deferred = _deferral(limit, state)
            if deferred is not None:
                return deferred
            slot: int | None = None
            if limit.concurrency is not None:
                taken = await tx.q(
                    "flow_take_slot",
                    {
                        "queue": queue,
                        "key": key,
                        "job_id": job_id,
                        "holder": self.holder,
                        "lease": lease.total_seconds(),
                    },
                )
                slot = int(taken[0]["id"])
            if limit.rate is not None:
                await record_starts(tx, self.db, queue, [key], state["now"])
            return Admitted(slot)

    async def release(self, slot: int | None) -> None:
        """Give back a slot :meth:`admit` took (after the delivery's outcome); None: none."""
        if slot is not None:
            await self.db.run("flow_release_slot", {"id": slot})

    def releases_in(self, work: object) -> bool:
        """Whether a slot can be given back inside a job's work transaction opened by
        ``work`` (:func:`release_at_commit`): the slots are in that database."""
        return work is self.db

    async def extend(self, slots: Sequence[int], lease: timedelta) -> None:
        """Renew live slots for another ``lease`` (with the deliveries' leases)."""
        if slots:
            await self.db.run(
                "flow_extend_slots",
                {"ids": self.db.array(slots), "lease": lease.total_seconds()},
            )

    # -- back-off ---------------------------------------------------------------------------

    async def back_off(
        self, queue: str, key: str, delay: timedelta, reason: str, *, tx: Tx | None = None
    ) -> float:
        """Hold ``key`` of ``queue`` for ``delay`` on every worker (a longer back-off already
        in place stays). Returns the seconds it is held from now: the delivery that asked
        waits that long."""
        held = await hold(
            self.db,
            queue,
            key,
            kind="backoff",
            seconds=delay.total_seconds(),
            reason=reason,
            held_by=self.holder,
            tx=tx,
        )
        return delay.total_seconds() if held is None else max(held, 0.0)

    # -- the database queue -----------------------------------------------------------------

    async def key_jobs(self, queue: str, decode: Callable[[bytes], Any]) -> int:
        """The keying pass: give the available jobs of ``queue`` enqueued without their key
        (by an app that did not know the limit, the outbox relay, a retry of a group-commit
        batch) their key, a batch at a time. Returns how many were keyed."""
        limit = self.limits.get(queue)
        if limit is None:
            return 0
        done = 0
        while True:
            rows = await self.db.run("flow_unkeyed", {"queue": queue, "limit": KEYING_BATCH})
            if not rows:
                return done
            ids = [row["id"] for row in rows]
            keys = [limit.key_of(bytes(row["payload"]), decode) for row in rows]
            if self.db.dialect == "postgresql":
                params: dict[str, Any] = {"ids": ids, "keys": keys}
            else:
                params = {"pairs": self.db.array([list(p) for p in zip(ids, keys, strict=True)])}
            await self.db.run("flow_set_keys", params)
            done += len(rows)
            if len(rows) < KEYING_BATCH:
                return done

    async def prune(self) -> None:
        """Forget what no limit needs any more: starts older than their queue's rate period,
        expired slots, ended back-offs."""
        for queue, limit in self.limits.items():
            per = limit.rate.seconds if limit.rate is not None else 0.0
            await self.db.run("flow_prune_starts", {"queue": queue, "per": per})
            await self.db.run("flow_prune_slots", {"queue": queue})
            await self.db.run("flow_prune_holds", {"queue": queue})

    # -- operators --------------------------------------------------------------------------

    async def status(self, queue: str, *, keys: int = STATUS_KEYS) -> FlowStatus | None:
        """``queue``'s limit and how full it is per key (the busiest ``keys`` keys), the jobs
        not keyed yet and the held keys; None when the queue has no limit."""
        limit = self.limits.get(queue)
        if limit is None:
            return None
        return await status(self.db, queue, limit, keys=keys)


async def status(db: Database, queue: str, limit: Limit, *, keys: int = STATUS_KEYS) -> FlowStatus:
    """:meth:`FlowControl.status` for one queue and its ``limit`` on ``db``."""
    per = limit.rate.seconds if limit.rate is not None else 0.0
    rows = await db.run("flow_status_keys", {"queue": queue, "per": per, "limit": keys})
    unkeyed = await db.run("flow_status_unkeyed", {"queue": queue})
    holds = await db.run("flow_status_holds", {"queue": queue})
    return FlowStatus(
        queue=queue,
        limit=limit,
        keys=[
            KeyStatus(
                key=row["key"],
                in_use=int(row["in_use"]),
                waiting=int(row["waiting"]),
                starts=int(row["starts"]),
            )
            for row in rows
        ],
        unkeyed=int(unkeyed[0]["jobs"]) if unkeyed else 0,
        holds=[
            Hold(
                key=row["key"],
                kind=row["kind"],
                held_for=_seconds(row["held_for"]),
                reason=row["reason"],
                held_by=row["held_by"],
            )
            for row in holds
        ],
    )


def _refused(limit: Limit, state: Mapping[str, Any]) -> Deferred:
    """Why ``core.flow_admit`` refused a key with ``state`` (its rules are
    :func:`_deferral`'s)."""
    deferred = _deferral(limit, state)
    if deferred is None:
        raise RuntimeError(f"flow control refused a key that has room: {dict(state)!r}")
    return deferred


def _deferral(limit: Limit, state: Mapping[str, Any]) -> Deferred | None:
    """Why a key with ``state`` (``flow_admit_state``, or what ``core.flow_admit`` read)
    takes no start now, and until when; None: it has room."""
    if state["paused"]:
        return Deferred("pause", None)
    backoff = _seconds(state["backoff_for"])
    if backoff is not None and backoff > 0:
        return Deferred("backoff", backoff)
    if limit.concurrency is not None and int(state["slots"]) >= limit.concurrency:
        return Deferred("concurrency", max(_seconds(state["slot_free_in"]) or 0.0, 0.0))
    if limit.rate is not None and int(state["starts"]) >= limit.rate.count:
        wait = _seconds(state["start_free_in"])
        return Deferred("rate", max(wait if wait is not None else 0.0, 0.0))
    return None


def key_for(limit: Limit | None, raw: bytes, decode: Callable[[bytes], Any]) -> str:
    """The flow key of a job of a queue with ``limit`` (:data:`QUEUE_KEY` without one)."""
    return QUEUE_KEY if limit is None else limit.key_of(raw, decode)
