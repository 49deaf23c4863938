"""A key's holds (``core.flow_holds``): an operator's pause of one key of a limited queue, or a
back-off a handler asked for (:class:`~jobfence.errors.BackOff`). Written by the worker
(:mod:`jobfence.runtime.flow`) and by the operators' doors (``review.jobctl.pause_key`` /
``resume_key``), read by every claim and admission (docs/flow-control.md)."""

from __future__ import annotations

from ..db import Database, Tx


async def hold(
    db: Database,
    queue: str,
    key: str,
    *,
    kind: str,
    seconds: float | None,
    reason: str,
    held_by: str,
    tx: Tx | None = None,
) -> float | None:
    """Hold ``key`` of ``queue``: a back-off for ``seconds`` (a longer one in place stays) or
    a pause (``seconds`` None). Returns the seconds the key is held from now (None: paused)."""
    params = {
        "queue": queue,
        "key": key,
        "kind": kind,
        "seconds": seconds,
        "reason": reason[:500],
        "held_by": held_by[:200],
    }
    rows = await (tx.q("flow_hold", params) if tx is not None else db.run("flow_hold", params))
    if not rows:
        return seconds
    held_for = rows[0]["held_for"]
    return None if held_for is None else float(held_for)


async def unhold(db: Database, queue: str, key: str, *, kind: str, tx: Tx | None = None) -> bool:
    """End ``key``'s hold of ``kind``; whether there was one."""
    params = {"queue": queue, "key": key, "kind": kind}
    rows = await (tx.q("flow_unhold", params) if tx is not None else db.run("flow_unhold", params))
    return bool(rows)
