"""An operator pauses one key of a limited queue (review.jobctl.pause_key): its jobs wait,
the other keys' run, and resuming it lets them go; both actions are audited."""

from __future__ import annotations

from typing import Any

import pytest

from jobfence import App, InvalidRequest, Job, Limit, ReviewConflict, Tx
from jobfence.review import jobctl
from jobfence.review.deadletters import Actor

from ..helpers import RunningWorker, eventually, query, table


async def test_a_paused_key_waits_and_the_others_run(database_url: str) -> None:
    app = App(database_url)
    done: list[str] = []

    @app.consumer("orders", limit=Limit(concurrency=3, key="partner"))
    async def handle(job: Job[Any], tx: Tx) -> None:
        done.append(job.job_id)

    otto = Actor("otto")
    async with app:
        db = app.transport.job_control()
        paused = await jobctl.pause_key(app.db, "orders", "acme", actor=otto, reason="outage")
        assert (paused.key, paused.paused_by, paused.reason) == ("acme", "otto", "outage")
        with pytest.raises(ReviewConflict, match="already paused"):
            await jobctl.pause_key(app.db, "orders", "acme", actor=otto)
        assert [p.key for p in await jobctl.paused_keys(db, "orders")] == ["acme"]
        await app.enqueue_many(
            [app.job("orders", {"partner_id": p}, job_id=f"{p}{i}")
             for i in range(3) for p in ("acme", "globex")]
        )  # fmt: skip
        async with RunningWorker(app, concurrency=4, poll_interval=0.2):
            await eventually(lambda: len(done) == 3, what="globex's jobs")
            left = await query(
                database_url, f"SELECT job_id, attempts FROM {table(database_url, 'jobs')}"
            )
            assert sorted(tuple(r) for r in left) == [("acme0", 0), ("acme1", 0), ("acme2", 0)]
            await jobctl.resume_key(app.db, "orders", "acme", actor=otto)
            await eventually(lambda: len(done) == 6, what="acme's jobs after the resume")
        with pytest.raises(ReviewConflict, match="not paused"):
            await jobctl.resume_key(app.db, "orders", "acme", actor=otto)
    audit = await query(
        database_url, f"SELECT actor, action FROM {table(database_url, 'audit_log')} ORDER BY id"
    )
    assert [tuple(a) for a in audit] == [("otto", "key.pause"), ("otto", "key.resume")]


async def test_a_partner_scoped_operator_pauses_only_its_own_key(database_url: str) -> None:
    app = App(database_url)
    async with app:
        scoped = Actor("pat", partner="acme")
        with pytest.raises(InvalidRequest, match="only its own partner's key"):
            await jobctl.pause_key(app.db, "orders", "globex", actor=scoped)
        await jobctl.pause_key(app.db, "orders", "acme", actor=scoped)
        with pytest.raises(InvalidRequest, match="at most 200 characters"):
            await jobctl.pause_key(app.db, "orders", "x" * 201, actor=Actor("otto"))
