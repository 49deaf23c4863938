"""Job control through the service layer (jobfence.review.jobctl, jobfence.review.discards), on both
stores: lists with every filter and keyset pages, cancel (a discarded CANCELLED letter, in
one transaction with its audit row), retry-now, pause/resume, partner scope, bulk discard."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from jobfence import App, Job, Tx
from jobfence.errors import InvalidRequest, NotFound, ReviewConflict
from jobfence.review import discards, jobctl
from jobfence.review.deadletters import Actor, Filter

from ..deadletters.conftest import letter_params, seed_letters
from ..helpers import RunningWorker, eventually, query, start_worker, table

OPS = Actor("otto", "cli")


def dialect(url: str) -> str:
    return "postgresql" if url.startswith("postgresql") else "sqlite"


async def fail_once(url: str, row: int, error: str) -> None:
    """Make a queued job look like it failed once and is scheduled in an hour."""
    later = "now() + interval '1 hour'" if dialect(url) == "postgresql" else "unixepoch() + 3600"
    history = (
        '[{"attempt":1,"at":"2026-01-01T00:00:00Z","category":"TEMPORARY_ERROR",'
        f'"error":"{error}","trace":"Traceback (most recent call last):\\n  boom"}}]'
    )
    cast = "::jsonb" if dialect(url) == "postgresql" else ""
    p = "%s" if dialect(url) == "postgresql" else "?"
    await query(
        url,
        f"UPDATE {table(url, 'jobs')} SET attempts = 1, run_at = {later}, "
        f"history = {p}{cast} WHERE id = {p}",
        (history, row),
    )


async def row_ids(url: str) -> dict[str, int]:
    rows = await query(url, f"SELECT job_id, id FROM {table(url, 'jobs')}")
    return {job_id: int(i) for job_id, i in rows}


@pytest.fixture
async def app(database_url: str) -> App:
    jf = App(database_url)
    await jf.open()
    yield jf  # type: ignore[misc]
    await jf.close()


async def test_lists_filter_and_page_by_keyset(app: App, database_url: str) -> None:
    """Waiting, retrying and the filters (queue, state, job_id, correlation_id, error, time
    range) each select exactly their jobs; pages follow each other without gaps or repeats."""
    for n in range(7):
        await app.enqueue("mail", {"n": n}, job_id=f"m-{n}", correlation_id=f"c-{n % 2}")
    await app.enqueue("sms", {"n": 9}, job_id="s-1")
    ids = await row_ids(database_url)
    await fail_once(database_url, ids["m-3"], "SMTP 451 try later")
    db = app.db

    async def job_ids(**kw: object) -> list[str]:
        page = await jobctl.list_jobs(db, jobctl.JobFilter(**kw), actor=OPS)  # type: ignore[arg-type]
        return [j.job_id for j in page.items]

    assert await job_ids() == [f"m-{n}" for n in range(7)] + ["s-1"]
    assert await job_ids(queue="sms") == ["s-1"]
    assert await job_ids(state="retrying") == ["m-3"]
    assert await job_ids(state="waiting", queue="mail") == [
        "m-0",
        "m-1",
        "m-2",
        "m-4",
        "m-5",
        "m-6",
    ]
    assert await job_ids(state="running") == []
    assert await job_ids(job_id="m-5") == ["m-5"]
    assert await job_ids(correlation_id="c-1", queue="mail") == ["m-1", "m-3", "m-5"]
    assert await job_ids(error="smtp 451") == ["m-3"]
    now = datetime.now(UTC)
    assert await job_ids(since=now - timedelta(hours=1), queue="sms") == ["s-1"]
    assert await job_ids(until=now - timedelta(hours=1)) == []
    retrying = (await jobctl.list_jobs(db, jobctl.JobFilter(state="retrying"), actor=OPS)).items[0]
    assert (retrying.state, retrying.last_error, retrying.last_category) == (
        "retrying",
        "SMTP 451 try later",
        "TEMPORARY_ERROR",
    )
    assert retrying.run_at > now + timedelta(minutes=50)

    seen: list[str] = []
    cursor = None
    while True:
        page = await jobctl.list_jobs(db, jobctl.JobFilter(), actor=OPS, limit=3, after=cursor)
        seen += [j.job_id for j in page.items]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert seen == [f"m-{n}" for n in range(7)] + ["s-1"]

    view = await jobctl.show_job(db, ids["m-3"], actor=OPS)
    assert json.loads(view.payload) == {"n": 3}
    assert view.history[0].trace == "Traceback (most recent call last):\n  boom"
    with pytest.raises(InvalidRequest, match="unknown job state"):
        await jobctl.list_jobs(db, jobctl.JobFilter(state="done"), actor=OPS)
    with pytest.raises(NotFound):
        await jobctl.show_job(db, 10**9, actor=OPS)


async def test_cancel_makes_a_discarded_letter_and_an_audit_row(
    app: App, database_url: str
) -> None:
    """Cancelling needs a reason; the job leaves the queue and a discarded CANCELLED letter
    holds its payload and history; the audit row names the actor, reason and letter; no
    alert event is raised. A cancelled job cannot be cancelled again (404)."""
    await app.enqueue("mail", {"to": "a@example.com"}, job_id="m-1")
    await app.enqueue("mail", {"to": "b@example.com"}, job_id="m-2")
    ids = await row_ids(database_url)
    await fail_once(database_url, ids["m-2"], "SMTP 451")
    with pytest.raises(InvalidRequest, match="reason"):
        await jobctl.cancel_job(app.db, ids["m-2"], actor=OPS, reason="  ")
    done = await jobctl.cancel_job(
        app.db, ids["m-2"], actor=OPS, reason="customer unsubscribed", consumers={"mail": "mailer"}
    )
    assert done.job.job_id == "m-2"
    assert await row_ids(database_url) == {"m-1": ids["m-1"]}
    letters = await query(
        database_url,
        f"SELECT consumer, job_id, status, error_code, error_category, reviewed_by, "
        f"review_reason, last_error FROM {table(database_url, 'dead_letters')}",
    )
    assert [tuple(r) for r in letters] == [
        (
            "mailer",
            "m-2",
            "discarded",
            "CANCELLED",
            "NON_RETRYABLE_ERROR",
            "otto",
            "customer unsubscribed",
            "cancelled by otto: customer unsubscribed",
        )
    ]
    audit = await query(
        database_url,
        f"SELECT actor, via, action, dead_letter_id, reason, old_state, new_state "
        f"FROM {table(database_url, 'audit_log')}",
    )
    assert [tuple(r) for r in audit] == [
        (
            "otto",
            "cli",
            "job.cancel",
            done.dead_letter_id,
            "customer unsubscribed",
            "retrying",
            "cancelled",
        )
    ]
    events = await query(
        database_url, f"SELECT count(*) FROM {table(database_url, 'alert_events')}"
    )
    assert events[0][0] == 0
    with pytest.raises(NotFound):
        await jobctl.cancel_job(app.db, ids["m-2"], actor=OPS, reason="again")


async def test_running_jobs_cannot_be_cancelled_and_retry_now_makes_due(
    app: App, database_url: str
) -> None:
    await app.enqueue("mail", {"n": 1}, job_id="m-1")
    await app.enqueue("mail", {"n": 2}, job_id="m-2")
    ids = await row_ids(database_url)
    claimed = await app.transport.fetch(["mail"], 1, 0)
    assert [d.job_id for d in claimed] == ["m-1"]
    with pytest.raises(ReviewConflict, match="running on worker"):
        await jobctl.cancel_job(app.db, ids["m-1"], actor=OPS, reason="stop")
    running = await jobctl.list_jobs(app.db, jobctl.JobFilter(state="running"), actor=OPS)
    assert [
        (j.job_id, j.worker_id is not None, j.lease_expires_at is not None) for j in running.items
    ] == [("m-1", True, True)]
    with pytest.raises(ReviewConflict, match="already due"):
        await jobctl.retry_now(app.db, ids["m-2"], actor=OPS)
    await fail_once(database_url, ids["m-2"], "boom")
    job = await jobctl.retry_now(app.db, ids["m-2"], actor=OPS, reason="ERP is back")
    assert job.run_at <= datetime.now(UTC) + timedelta(seconds=1)
    again = await app.transport.fetch(["mail"], 5, 0)
    assert [d.job_id for d in again] == ["m-2"]


async def test_cancel_of_a_job_whose_handler_is_working_answers_at_once(
    pg_database: str,
) -> None:
    """A running job's attempt holds its queue row in the handler's transaction: cancel and
    retry-now say "running" at once instead of waiting for the handler to finish."""
    app = App(pg_database)
    inside, release = asyncio.Event(), asyncio.Event()

    @app.consumer("mail")
    async def handle(job: Job[Any], tx: Tx) -> None:
        inside.set()
        await release.wait()

    async with app:
        await app.enqueue("mail", {"n": 1}, job_id="m-1")
        (row,) = (await row_ids(pg_database)).values()
        async with RunningWorker(app) as w:
            await asyncio.wait_for(inside.wait(), timeout=30)
            for act in (
                jobctl.cancel_job(app.db, row, actor=OPS, reason="stop it"),
                jobctl.retry_now(app.db, row, actor=OPS),
            ):
                with pytest.raises(ReviewConflict, match="running on worker"):
                    await asyncio.wait_for(act, timeout=10)  # not blocked by the handler
            release.set()
            await eventually(lambda: w.stats.handled == 1, what="the job done")
    assert await query(
        pg_database, f"SELECT count(*) FROM {table(pg_database, 'dead_letters')}"
    ) == [(0,)]


async def test_cancel_beside_a_sqlite_worker_holding_the_write_lock_answers_at_once(
    sqlite_database: str, tmp_path: Path
) -> None:
    """On SQLite a running handler's transaction holds the database's write lock (in another
    process: a worker). Cancel and retry-now read the job first and say "running" at once,
    instead of waiting up to the busy timeout for the lock."""
    from ..conftest import make_ledger

    await make_ledger(sqlite_database)
    env = {"JF_DB": sqlite_database, "JF_MARKS": str(tmp_path), "JF_LEASE": "30"}
    async with App(sqlite_database) as app:  # opened first, like an ops server
        await app.enqueue("crash", {"mode": "sleep", "seconds": 60}, job_id="slow-1")
        (row,) = (await row_ids(sqlite_database)).values()
        worker = start_worker("tests.apps.crash_app:app", env, tmp_path / "w.log")
        try:
            await eventually(
                lambda: (tmp_path / "slow-1.started.1").exists(), timeout=60, what="its handler"
            )
            for act in (
                jobctl.cancel_job(app.db, row, actor=OPS, reason="stop it"),
                jobctl.retry_now(app.db, row, actor=OPS),
            ):
                with pytest.raises(ReviewConflict, match="running on worker"):
                    await asyncio.wait_for(act, timeout=10)
        finally:
            worker.kill()  # kill -9: the job would come back when its lease runs out
            worker.wait()


async def test_pause_stops_claims_and_resume_restores_them(app: App, database_url: str) -> None:
    await app.enqueue("mail", {"n": 1}, job_id="m-1")
    await app.enqueue("sms", {"n": 1}, job_id="s-1")
    info = await jobctl.pause_queue(app.db, "mail", actor=OPS, reason="SMTP relay down")
    assert (info.paused, info.paused_by, info.pause_reason, info.waiting) == (
        True,
        "otto",
        "SMTP relay down",
        1,
    )
    with pytest.raises(ReviewConflict, match="already paused"):
        await jobctl.pause_queue(app.db, "mail", actor=OPS)
    with pytest.raises(InvalidRequest, match="partner-scoped"):
        await jobctl.pause_queue(app.db, "sms", actor=Actor("acme", "api", "acme"))
    got = await app.transport.fetch(["mail", "sms"], 10, 0)
    assert [d.job_id for d in got] == ["s-1"]
    queues = await jobctl.list_queues(app.db, actor=OPS, served={"mail", "push"})
    assert [(q.queue, q.paused, q.served, q.waiting, q.running) for q in queues] == [
        ("mail", True, True, 1, 0),
        ("push", False, True, 0, 0),
        ("sms", False, False, 0, 1),
    ]
    assert await jobctl.unserved_jobs(app.db, {"mail", "push"}, actor=OPS) == 0
    assert jobctl.unserved_among(queues) == 0  # sms's one job is running
    await app.enqueue("sms", {"n": 2}, job_id="s-2")
    await app.enqueue("sms", {"n": 3}, job_id="s-3")
    again = await jobctl.list_queues(app.db, actor=OPS, served={"mail", "push"})
    assert jobctl.unserved_among(again) == 2
    assert await jobctl.unserved_jobs(app.db, {"mail", "push"}, actor=OPS) == 2
    await jobctl.resume_queue(app.db, "mail", actor=OPS)
    got = await app.transport.fetch(["mail"], 10, 0)
    assert [d.job_id for d in got] == ["m-1"]
    with pytest.raises(ReviewConflict, match="not paused"):
        await jobctl.resume_queue(app.db, "mail", actor=OPS)
    actions = await query(
        database_url, f"SELECT action, old_state, new_state FROM {table(database_url, 'audit_log')}"
    )
    assert [tuple(a) for a in actions] == [
        ("queue.pause", "active", "paused"),
        ("queue.resume", "paused", "active"),
    ]


async def test_partner_scope_hides_other_partners_jobs_and_counts(app: App) -> None:
    await app.enqueue("po", {"partner_id": "acme", "po": 1}, job_id="a-1")
    await app.enqueue("po", {"partner_id": "globex", "po": 2}, job_id="g-1")
    await app.enqueue("po", {"po": 3}, job_id="n-1")
    acme = Actor("acme-ops", "api", "acme")
    page = await jobctl.list_jobs(app.db, jobctl.JobFilter(), actor=acme)
    assert [(j.job_id, j.partner) for j in page.items] == [("a-1", "acme")]
    queues = await jobctl.list_queues(app.db, actor=acme)
    assert [(q.queue, q.waiting) for q in queues] == [("po", 1)]
    globex_row = (await jobctl.list_jobs(app.db, jobctl.JobFilter(job_id="g-1"), actor=OPS)).items
    with pytest.raises(NotFound):
        await jobctl.show_job(app.db, globex_row[0].id, actor=acme)
    with pytest.raises(NotFound):
        await jobctl.cancel_job(app.db, globex_row[0].id, actor=acme, reason="not mine")


async def test_bulk_discard_previews_then_discards_with_a_reason(database_url: str) -> None:
    d = dialect(database_url)
    ids = await seed_letters(
        database_url,
        [
            letter_params(d, "a", error="TemporaryError: ERP answered 503"),
            letter_params(d, "b", error="TemporaryError: ERP answered 503"),
            letter_params(d, "c", error="BusinessError: unknown member"),
            letter_params(d, "d", queue="other", error="TemporaryError: ERP answered 503"),
        ],
    )
    app = App(database_url)
    async with app:
        flt = Filter(queue="points.credit", error="erp answered")
        with pytest.raises(InvalidRequest, match="say which letters"):
            await discards.preview_discard(app.db, Filter(), actor=OPS)
        preview = await discards.preview_discard(app.db, flt, actor=OPS)
        assert (preview.total, preview.upto_id) == (2, ids[1])
        assert [s["job_id"] for s in preview.sample] == ["b", "a"]
        later = await seed_letters(database_url, [letter_params(d, "e")])
        with pytest.raises(InvalidRequest, match="reason"):
            await discards.discard_matching(
                app.db, flt, actor=OPS, reason="", upto_id=preview.upto_id or 0, expect=2
            )
        with pytest.raises(InvalidRequest, match="more than the 1 previewed"):
            await discards.discard_matching(
                app.db,
                flt,
                actor=OPS,
                reason="ERP outage, re-sent by hand",
                upto_id=ids[1],
                expect=1,
            )
        result = await discards.discard_matching(
            app.db,
            flt,
            actor=OPS,
            reason="ERP outage, re-sent by hand",
            upto_id=preview.upto_id or 0,
            expect=preview.total,
        )
        assert result.ids == ids[:2]
    statuses = await query(
        database_url,
        f"SELECT job_id, status FROM {table(database_url, 'dead_letters')} ORDER BY id",
    )
    assert [tuple(s) for s in statuses] == [
        ("a", "discarded"),
        ("b", "discarded"),
        ("c", "pending_review"),
        ("d", "pending_review"),
        ("e", "pending_review"),
    ]
    assert later
    audit = await query(
        database_url,
        f"SELECT action, dead_letter_id, reason FROM {table(database_url, 'audit_log')} "
        "ORDER BY id",
    )
    assert [tuple(a) for a in audit] == [
        ("dead_letter.discard", ids[0], "ERP outage, re-sent by hand"),
        ("dead_letter.discard", ids[1], "ERP outage, re-sent by hand"),
    ]
