"""Bulk replay (SPEC D3): preview on a fixed snapshot, confirmation, rate limit, progress,
per-item report, idempotence — and 10 000 letters ending with exactly one effect each."""

from __future__ import annotations

import sqlite3
import time
from datetime import timedelta
from typing import Any

import pytest

from jobfence import App, Job, ReviewConflict, Tx
from jobfence.review import deadletters as dl
from jobfence.review import replays
from jobfence.runtime.maintenance import Maintenance
from jobfence.transports.database import DatabaseQueue

from ..helpers import RunningWorker, credit, eventually, query, scalar, table
from .conftest import letter_params, opened, seed_letters, seed_many

OPS = dl.Actor("otto", "cli")


def dialect(url: str) -> str:
    return "postgresql" if url.startswith("postgresql") else "sqlite"


async def jobs_in_queue(url: str) -> int:
    return int(await scalar(url, f"SELECT count(*) FROM {table(url, 'jobs')}"))


async def drained(url: str) -> bool:
    return await jobs_in_queue(url) == 0


@pytest.mark.slow
async def test_bulk_replay_of_10000_letters_some_applied_meanwhile_gives_one_effect_each(
    ledger: str,
) -> None:
    """10 000 pending letters; 1 000 of their job_ids are delivered again meanwhile (500
    applied before the replay, 500 still queued while it runs). The bulk replay (with a worker
    running) leaves exactly one ledger row per job; repeating the bulk replay — a new preview
    over the same filter, or running the old snapshot again — republishes nothing."""
    url, n = ledger, 10_000
    d = dialect(url)
    await seed_many(url, [letter_params(d, f"c-{i:05d}", queue="credits") for i in range(n)])
    app = App(url, auto_migrate=True, maintenance=Maintenance(alerts=False, cleanup=False))

    @app.consumer("credits")
    async def handle(job: Job[Any], tx: Tx) -> None:
        await credit(tx, job.job_id, job.payload["member_id"], job.payload["points"])

    async with app:
        again = [
            app.job("credits", {"member_id": f"c-{i:05d}", "points": 1}, job_id=f"c-{i:05d}")
            for i in range(0, n, 10)
        ]
        await app.enqueue_many(again[:500])
        async with RunningWorker(app, concurrency=8) as w:
            await eventually(lambda: w.stats.handled == 500, timeout=180, what="500 applied")
        await app.enqueue_many(again[500:])  # these are processed while the replay runs

        preview = await replays.preview_replay(app.db, dl.Filter(queue="credits"), actor=OPS)
        assert preview.total == n
        assert preview.already_applied == 500
        seen: list[tuple[int, int]] = []
        async with RunningWorker(app, concurrency=8) as w:
            status = await replays.run_replay(
                app.db,
                app.transport,
                preview.replay_id,
                actor=OPS,
                expected_total=n,
                on_progress=lambda done, total: seen.append((done, total)),
            )
            await eventually(lambda: drained(url), timeout=240, what="queue drained")
            again_preview = await replays.preview_replay(
                app.db, dl.Filter(queue="credits"), actor=OPS
            )
            with pytest.raises(ReviewConflict, match="already finished"):
                await replays.run_replay(
                    app.db, app.transport, preview.replay_id, actor=OPS, expected_total=n
                )
            rerun = await replays.execute_replay(
                app.db, app.transport, preview.replay_id, actor=OPS, runner="someone"
            )
    assert status.state == "done"
    assert status.counts["published"] + status.counts["already_applied"] == n
    assert status.counts["already_applied"] >= 500
    assert set(status.counts) <= {"published", "already_applied"}
    assert seen[0] == (0, n)
    assert seen[-1] == (n, n)
    assert [done for done, _ in seen] == sorted(done for done, _ in seen)
    rows = await query(url, "SELECT count(*), count(DISTINCT job_id), sum(points) FROM ledger")
    assert rows == [(n, n, n)]
    assert again_preview.total == 0
    assert rerun.counts == status.counts  # nothing left to do, nothing redone
    assert await jobs_in_queue(url) == 0
    replayed = await scalar(
        url, f"SELECT count(*) FROM {table(url, 'dead_letters')} WHERE status = 'replayed'"
    )
    assert replayed == n
    audit = await query(
        url,
        f"SELECT action, count(*) FROM {table(url, 'audit_log')} GROUP BY action ORDER BY action",
    )
    assert audit == [
        ("dead_letter.replay", n),
        ("replay.finish", 1),
        ("replay.preview", 2),
        ("replay.start", 1),
    ]


async def test_a_bulk_replay_works_on_its_fixed_snapshot(database_url: str) -> None:
    """Letters that match the filter after the preview are not touched by that replay; a
    letter decided by someone else meanwhile is reported, not republished."""
    d = dialect(database_url)
    old = await seed_letters(database_url, [letter_params(d, f"o-{i}") for i in range(5)])
    app = App(database_url, auto_migrate=True)
    async with app:
        preview = await replays.preview_replay(app.db, dl.Filter(queue="points.credit"), actor=OPS)
        late = await seed_letters(database_url, [letter_params(d, f"l-{i}") for i in range(3)])
        await dl.discard(app.db, old[2], actor=dl.Actor("dora"), reason="cancelled order")
        status = await replays.run_replay(
            app.db, app.transport, preview.replay_id, actor=OPS, expected_total=5
        )
        items = await replays.replay_items(app.db, preview.replay_id, actor=OPS)
    assert [s["id"] for s in preview.sample] == old
    assert status.counts == {"published": 4, "not_pending": 1}
    assert [(i["dead_letter_id"], i["outcome"], i["detail"]) for i in items.items] == [
        (old[0], "published", None),
        (old[1], "published", None),
        (old[2], "not_pending", "already discarded by dora"),
        (old[3], "published", None),
        (old[4], "published", None),
    ]
    rows = await query(
        database_url, f"SELECT job_id FROM {table(database_url, 'jobs')} ORDER BY job_id"
    )
    assert rows == [("o-0",), ("o-1",), ("o-3",), ("o-4",)]
    pending = await query(
        database_url,
        f"SELECT id FROM {table(database_url, 'dead_letters')} WHERE status = 'pending_review' "
        "ORDER BY id",
    )
    assert [r[0] for r in pending] == late


async def test_a_bulk_replay_needs_a_filter_and_the_confirmed_count(database_url: str) -> None:
    """No filter without all_pending; a wrong count, an expired preview, a finished replay and
    a replay that another runner holds are refused; nothing is republished by refusals."""
    d = dialect(database_url)
    await seed_letters(database_url, [letter_params(d, f"x-{i}") for i in range(3)])
    app = App(database_url, auto_migrate=True)
    async with app:
        with pytest.raises(dl.InvalidRequest, match="say which letters"):
            await replays.preview_replay(app.db, dl.Filter(), actor=OPS)
        preview = await replays.preview_replay(app.db, dl.Filter(), actor=OPS, all_pending=True)
        with pytest.raises(ReviewConflict, match="covers 3 letters but 2 were confirmed"):
            await replays.start_replay(
                app.db, preview.replay_id, actor=OPS, expected_total=2, runner="r1"
            )
        stale = await replays.preview_replay(
            app.db,
            dl.Filter(queue="points.credit"),
            actor=OPS,
            expires_in=timedelta(seconds=-1),
        )
        with pytest.raises(ReviewConflict, match="expired"):
            await replays.start_replay(
                app.db, stale.replay_id, actor=OPS, expected_total=3, runner="r1"
            )
        await replays.start_replay(
            app.db, preview.replay_id, actor=OPS, expected_total=3, runner="r1"
        )
        with pytest.raises(ReviewConflict, match="is being run by r1"):
            await replays.start_replay(
                app.db, preview.replay_id, actor=OPS, expected_total=3, runner="r2"
            )
        assert await jobs_in_queue(database_url) == 0
        done = await replays.execute_replay(
            app.db, app.transport, preview.replay_id, actor=OPS, runner="r1"
        )
        with pytest.raises(ReviewConflict, match="already finished"):
            await replays.start_replay(
                app.db, preview.replay_id, actor=OPS, expected_total=3, runner="r1"
            )
        with pytest.raises(dl.NotFound):
            await replays.replay_status(app.db, preview.replay_id, actor=dl.Actor("x", partner="p"))
    assert done.counts == {"published": 3}
    assert preview.filter == {"all_pending": True}
    assert await jobs_in_queue(database_url) == 3


async def test_a_bulk_replay_is_rate_limited_and_reports_progress(database_url: str) -> None:
    """30 letters at 20 per second: batches of 20 then 10, progress after each, and the run
    cannot finish before the limiter allows (at least 1.5 s for the 30th letter)."""
    d = dialect(database_url)
    await seed_letters(database_url, [letter_params(d, f"r-{i}") for i in range(30)])
    app = App(database_url, auto_migrate=True)
    seen: list[tuple[int, int]] = []
    async with app:
        preview = await replays.preview_replay(
            app.db, dl.Filter(job_id=None, queue="points.credit"), actor=OPS
        )
        started = time.monotonic()
        status = await replays.run_replay(
            app.db,
            app.transport,
            preview.replay_id,
            actor=OPS,
            expected_total=30,
            rate=20,
            on_progress=lambda a, b: seen.append((a, b)),
        )
        elapsed = time.monotonic() - started
    assert seen == [(0, 30), (20, 30), (30, 30)]
    assert status.counts == {"published": 30}
    assert elapsed >= 1.5


async def test_a_stopped_bulk_replay_resumes_without_redoing_anything(database_url: str) -> None:
    """A runner that dies after its first batch leaves the rest pending; resuming finishes
    it, each letter republished exactly once."""
    d = dialect(database_url)
    await seed_letters(database_url, [letter_params(d, f"s-{i}") for i in range(25)])
    app = App(database_url, auto_migrate=True)

    class Crash(Exception):
        pass

    def die_after_first_batch(done: int, total: int) -> None:
        if done >= 10:
            raise Crash

    async with app:
        preview = await replays.preview_replay(app.db, dl.Filter(queue="points.credit"), actor=OPS)
        await replays.start_replay(
            app.db, preview.replay_id, actor=OPS, expected_total=25, runner="r"
        )
        with pytest.raises(Crash):
            await replays.execute_replay(
                app.db,
                app.transport,
                preview.replay_id,
                actor=OPS,
                runner="r",
                batch_size=10,
                on_progress=die_after_first_batch,
            )
        middle = await replays.replay_status(app.db, preview.replay_id, actor=OPS)
        await replays.start_replay(
            app.db, preview.replay_id, actor=OPS, expected_total=25, runner="r"
        )
        final = await replays.execute_replay(
            app.db, app.transport, preview.replay_id, actor=OPS, runner="r", batch_size=10
        )
    assert (middle.state, middle.counts) == ("running", {"published": 10, "pending": 15})
    assert (final.state, final.counts) == ("done", {"published": 25})
    rows = await query(
        database_url, f"SELECT count(*), count(DISTINCT job_id) FROM {table(database_url, 'jobs')}"
    )
    assert rows == [(25, 25)]


async def test_replay_through_another_transport_is_never_lost(
    database_url: str, tmp_path: Any
) -> None:
    """With a queue outside the letters' database (a broker, here a queue in another
    database) the publish happens before the letter's status commits: when the publish fails
    the letter stays pending with no audit row; when it works the job is in that queue."""
    other = f"sqlite:///{tmp_path}/broker.db"
    async with opened(other) as db:
        from jobfence.store import Store

        await Store(db).migrate()
    d = dialect(database_url)
    first, second = await seed_letters(database_url, [letter_params(d, j) for j in ("b1", "b2")])
    app = App(database_url, transport=other, auto_migrate=True)
    async with app:
        transport = app.transport
        assert isinstance(transport, DatabaseQueue)
        assert not transport.shares_database
        published = await dl.replay(app.db, transport, first, actor=OPS)
        # the "broker" refuses publishes for a while
        await query(
            other,
            "CREATE TRIGGER refuse BEFORE INSERT ON core_jobs "
            "BEGIN SELECT RAISE(ABORT, 'broker unavailable'); END",
        )
        with pytest.raises(sqlite3.IntegrityError, match="broker unavailable"):
            await dl.replay(app.db, transport, second, actor=OPS)
        state = await query(
            database_url,
            f"SELECT id, status FROM {table(database_url, 'dead_letters')} ORDER BY id",
        )
        audit = await scalar(
            database_url, f"SELECT count(*) FROM {table(database_url, 'audit_log')}"
        )
        await query(other, "DROP TRIGGER refuse")
        retried = await dl.replay(app.db, transport, second, actor=OPS)
    assert (published.outcome, retried.outcome) == ("published", "published")
    assert state == [(first, "replayed"), (second, "pending_review")]
    assert audit == 1
    assert await query(other, "SELECT job_id FROM core_jobs ORDER BY job_id") == [("b1",), ("b2",)]
    assert await jobs_in_queue(database_url) == 0
