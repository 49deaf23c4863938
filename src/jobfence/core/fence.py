"""The fence (SPEC F1–F6, T1): one row per (consumer, job_id), written in the same transaction
as the work it fences, first.

- :func:`work` opens the transaction a job runs in: the fence row first (and, when the queue
  is a table in the same database, the queue row's ack), then the handler's statements, then
  COMMIT — so the work and its fence become visible together or not at all.
- :func:`claim_tx` fences a job_id inside a transaction the *caller* holds (enqueue-side
  dedup, ORM integrations): it commits or rolls back with the caller's work.
- :func:`ttl_problem` is the start-up check that a fence outlives every redelivery of its
  job (SPEC T1), with the arithmetic in its message.

A parallel duplicate blocks on the fence's primary key until the first transaction ends,
then sees the row (a duplicate: skip) or not (proceed).
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

from ..db import Row, Tx, WorkSource
from .jobs import Delivery
from .retry import RetryPolicy

DEFAULT_FENCE_TTL = timedelta(days=7)
#: The least margin a fence TTL keeps beyond the longest redelivery exposure.
MIN_FENCE_MARGIN = timedelta(hours=1)


class FenceOutcome(enum.Enum):
    FENCED = "fenced"  # first time: run the handler
    DUPLICATE = "duplicate"  # already processed: skip silently
    LOST = "lost"  # our lease was taken over: another worker owns this delivery


def plan(
    db: WorkSource,
    consumer: str,
    delivery: Delivery,
    ttl: timedelta,
    *,
    ack: bool,
    enabled: bool = True,
) -> tuple[list[str], dict[str, Any]]:
    """The named steps (and their parameters) that open a work transaction: the fence row
    first (SPEC F2, F6) and, with ``ack``, the queue row's delete in the same transaction —
    on PostgreSQL in one statement. ``enabled=False`` leaves the fence out (benchmarks
    measure its cost; never in use)."""
    params = {
        "consumer": consumer,
        "job_id": delivery.job_id,
        "ttl": ttl.total_seconds(),
        "id": delivery.ref,
        "token": delivery.token,
    }
    if not enabled:
        return (["ack"] if ack else []), params
    if ack and db.dialect == "postgresql":
        return ["fence_and_ack"], params
    return (["ack", "fence"] if ack else ["fence"]), params


def outcome(steps: Sequence[str], results: Sequence[list[Row]]) -> FenceOutcome:
    """Read what :func:`plan`'s steps found."""
    rows: Mapping[str, list[Row]] = dict(zip(steps, results, strict=True))
    if "fence_and_ack" in rows:
        row = rows["fence_and_ack"][0]
        if not row["acked"]:
            return FenceOutcome.LOST
        return FenceOutcome.FENCED if row["fenced"] else FenceOutcome.DUPLICATE
    if "ack" in rows and not rows["ack"]:
        return FenceOutcome.LOST
    if "fence" in rows and not rows["fence"]:
        return FenceOutcome.DUPLICATE
    return FenceOutcome.FENCED


@asynccontextmanager
async def work(
    db: WorkSource,
    consumer: str,
    delivery: Delivery,
    ttl: timedelta,
    *,
    ack: bool,
    enabled: bool = True,
) -> AsyncIterator[tuple[Tx, FenceOutcome]]:
    """The transaction a job runs in, opened with its fence (one round trip on PostgreSQL);
    the caller runs the handler when the outcome is FENCED. Commits when the block ends, after
    the transaction boundary is checked (SPEC H5); rolls back if it raises."""
    steps, params = plan(db, consumer, delivery, ttl, ack=ack, enabled=enabled)
    async with db.work(steps, params) as (tx, results):
        yield tx, outcome(steps, results)


async def claim_tx(tx: Tx, consumer: str, job_id: str, ttl: timedelta = DEFAULT_FENCE_TTL) -> bool:
    """Fence ``job_id`` for ``consumer`` inside the caller's open transaction: True the first
    time (do the work in the same transaction), False when it is already fenced (skip). The
    fence commits or rolls back with the caller's transaction."""
    rows = await tx.q("fence", {"consumer": consumer, "job_id": job_id, "ttl": ttl.total_seconds()})
    return bool(rows)


async def unclaim_tx(tx: Tx, consumer: str, job_id: str) -> None:
    """Take back a fence written earlier in ``tx`` (a job of a group commit failed: its
    savepoint rolled back its work, and its fence must not commit without it)."""
    await tx.q("unfence", {"consumer": consumer, "job_id": job_id})


# -- the TTL (SPEC T1) --------------------------------------------------------------------------


def exposure(policy: RetryPolicy, lease: timedelta) -> timedelta:
    """How long after its first delivery a job can still be delivered again: the sum of its
    retry delays plus one lease per attempt (an attempt lost with its worker comes back only
    when its lease runs out, and counts as an attempt)."""
    return policy.max_window() + lease * policy.max_attempts


def longest_exposure(policies: Iterable[RetryPolicy], lease: timedelta) -> timedelta:
    """The longest :func:`exposure` among ``policies``: the youngest a fence may be deleted
    (cleanup's ``min_age``)."""
    return max(exposure(policy, lease) for policy in policies)


def span(value: timedelta) -> str:
    """A duration for people: 7d, 1h18m, 15m30s, 0.5s."""
    seconds = value.total_seconds()
    if seconds < 60:
        return f"{seconds:g}s"
    whole = int(seconds)
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if whole >= size:
            parts.append(f"{whole // size}{unit}")
            whole %= size
    return "".join(parts)


def ttl_problem(
    ttl: timedelta, lease: timedelta, policies: Iterable[tuple[str, RetryPolicy]]
) -> str | None:
    """Why ``ttl`` is unsafe (SPEC T1), with the arithmetic; None when it is safe.

    A fence must outlive every redelivery of its job: the longest retry window plus one
    lease per attempt (:func:`exposure`), with a margin of the same size again and at least
    :data:`MIN_FENCE_MARGIN`, for clocks, queues that back up and slow reaping. The queue with
    the longest exposure decides.
    """
    worst: tuple[str, RetryPolicy, timedelta] | None = None
    for queue, policy in policies:
        exposed = exposure(policy, lease)
        if worst is None or exposed > worst[2]:
            worst = (queue, policy, exposed)
    if worst is None:
        return None
    queue, policy, exposed = worst
    margin = max(exposed, MIN_FENCE_MARGIN)
    needed = exposed + margin
    if ttl > needed:
        return None
    delays = [span(policy.ceiling(n)) for n in range(1, policy.max_retries + 1)]
    window = " + ".join(delays) if delays else "no retries"
    return (
        f"fence TTL {span(ttl)} is too short for queue {queue!r}: retry window "
        f"{span(policy.max_window())} ({window}) + {policy.max_attempts} attempts × lease "
        f"{span(lease)} = {span(exposed)} during which a delivery can still arrive; plus a "
        f"margin of {span(margin)} (as much again, at least {span(MIN_FENCE_MARGIN)}) the "
        f"TTL must exceed {span(needed)}. A delivery after its fence expired would apply the "
        f"work twice: use fence_ttl > {span(needed)} (the default is "
        f"{span(DEFAULT_FENCE_TTL)})."
    )
