"""What operators see of flow control (issue 26 §5): per queue with a Limit, the limit and,
per key, how full it is, what waits on it and why; the held keys; and the Prometheus gauges
made of it (docs/flow-control.md "Seeing it", docs/metrics.md).

The state is read with :func:`jobfence.runtime.flow.status` (one queue at a time, the busiest
keys first); the limits are the app's (:func:`limits_of`): a console or a CLI whose app does
not declare a queue's Limit cannot say how full it is, and shows the held keys only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..core.limits import Limit
from ..db import Database
from .flow import STATUS_KEYS, Hold, KeyStatus, status

#: the keys per queue the gauges name (the busiest: most jobs running, then waiting); the
#: rest are summed under the key ``"(other)"`` — a label set of at most this many keys plus
#: one per queue, however many partners there are
METRIC_KEYS = 10
OTHER = "(other)"

#: why a key's waiting jobs wait (the ``reason`` label of the deferral metrics)
REASONS = ("hold", "concurrency", "rate")


@dataclass(frozen=True)
class KeyView:
    """One key: ``in_use`` running jobs (and broker slots) of ``concurrency``; ``starts``
    within the rate's window of ``rate``; ``waiting`` jobs; ``held`` ``"pause"`` or
    ``"backoff"`` when the key is held; ``deferred`` why its waiting jobs are not claimed now
    (``hold``, ``concurrency``, ``rate``; None: they are claimed as workers get to them)."""

    key: str
    in_use: int
    waiting: int
    starts: int
    held: str | None
    deferred: str | None

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "in_use": self.in_use,
            "waiting": self.waiting,
            "starts": self.starts,
            "held": self.held,
            "deferred": self.deferred,
        }


@dataclass(frozen=True)
class QueueFlow:
    """A queue's limit, its busiest keys, the jobs not keyed yet, and the held keys (with no
    limit known here: ``limit`` None and no keys)."""

    queue: str
    limit: Limit | None
    keys: list[KeyView]
    unkeyed: int
    holds: list[Hold]

    @property
    def in_use(self) -> int:
        return sum(k.in_use for k in self.keys)

    @property
    def deferred(self) -> int:
        return sum(k.waiting for k in self.keys if k.deferred)

    def to_json(self) -> dict[str, Any]:
        limit = self.limit
        return {
            "queue": self.queue,
            "limit": None
            if limit is None
            else {
                "concurrency": limit.concurrency,
                "rate": None
                if limit.rate is None
                else {"count": limit.rate.count, "per_s": limit.rate.seconds},
                "describe": limit.describe(),
            },
            "keys": [k.to_json() for k in self.keys],
            "unkeyed": self.unkeyed,
            "holds": [
                {
                    "key": h.key,
                    "kind": h.kind,
                    "held_for_s": h.held_for,
                    "reason": h.reason,
                    "held_by": h.held_by,
                }
                for h in self.holds
            ],
        }


def limits_of(consumers: Mapping[str, Any]) -> dict[str, Limit]:
    """The Limits of an app's consumers (``App.consumers``), by queue."""
    return {q: c.limit for q, c in consumers.items() if getattr(c, "limit", None) is not None}


def deferred_reason(limit: Limit, key: KeyStatus, held: str | None) -> str | None:
    """Why ``key``'s waiting jobs are not claimed now: held, its slots are all taken, or its
    rate's window is full; None when it has room (or nothing waits)."""
    if not key.waiting:
        return None
    if held is not None:
        return "hold"
    if limit.concurrency is not None and key.in_use >= limit.concurrency:
        return "concurrency"
    if limit.rate is not None and key.starts >= limit.rate.count:
        return "rate"
    return None


async def queue_flow(
    db: Database, queue: str, limit: Limit, *, keys: int = STATUS_KEYS
) -> QueueFlow:
    """One queue's flow on ``db`` (where its jobs and flow tables are)."""
    found = await status(db, queue, limit, keys=keys)
    held: dict[str, str] = {}
    for h in found.holds:  # a pause outranks a back-off of the same key
        if h.kind == "pause" or h.key not in held:
            held[h.key] = h.kind
    views = [
        KeyView(
            k.key,
            k.in_use,
            k.waiting,
            k.starts,
            held.get(k.key),
            deferred_reason(limit, k, held.get(k.key)),
        )
        for k in found.keys
    ]
    return QueueFlow(queue, limit, views, found.unkeyed, found.holds)


async def queue_flows(
    db: Database, limits: Mapping[str, Limit], *, keys: int = STATUS_KEYS
) -> list[QueueFlow]:
    """:func:`queue_flow` of every limited queue, by name."""
    return [await queue_flow(db, q, limits[q], keys=keys) for q in sorted(limits)]


def _label(index: int, key: str) -> str:
    return key if index < METRIC_KEYS else OTHER


async def refresh_flow_gauges(db: Database, limits: Mapping[str, Limit]) -> None:
    """Set the flow gauges (docs/metrics.md) from the state of every limited queue: slots in
    use and deferred jobs per key (the :data:`METRIC_KEYS` busiest keys by name, the rest as
    ``(other)``), and the held keys per kind. Read first, set after: a scrape sees all."""
    from .. import metrics as m

    flows = await queue_flows(db, limits, keys=STATUS_KEYS)
    m.FLOW_SLOTS_IN_USE.clear()
    m.FLOW_DEFERRED_JOBS.clear()
    m.FLOW_KEYS_HELD.clear()
    for flow in flows:
        slots: dict[str, int] = {}
        deferred: dict[tuple[str, str], int] = {}
        for index, key in enumerate(flow.keys):
            label = _label(index, key.key)
            slots[label] = slots.get(label, 0) + key.in_use
            if key.deferred is not None:
                pair = (key.deferred, label)
                deferred[pair] = deferred.get(pair, 0) + key.waiting
        for label, n in slots.items():
            m.FLOW_SLOTS_IN_USE.labels(flow.queue, label).set(n)
        for (reason, label), n in deferred.items():
            m.FLOW_DEFERRED_JOBS.labels(flow.queue, reason, label).set(n)
        kinds: dict[str, int] = {}
        for h in flow.holds:
            kinds[h.kind] = kinds.get(h.kind, 0) + 1
        for kind, n in kinds.items():
            m.FLOW_KEYS_HELD.labels(flow.queue, kind).set(n)
