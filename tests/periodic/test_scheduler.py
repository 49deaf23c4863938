"""The scheduler on both stores: several schedulers enqueue each tick once, the missed-tick
policies after downtime, the worker's scheduler and its off switch, what the doors list."""

from __future__ import annotations

import asyncio
import itertools
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from jobfence import App, Job, NonRetryableError, Tx
from jobfence.core.periodic import slot_of
from jobfence.review.schedules import list_schedules
from jobfence.runtime.scheduler import Scheduler

from ..helpers import RunningWorker, credit, eventually, query, scalar, table
from ..test_cli import jf


def beat_app(url: str, *, cron: str = "* * * * * *", **options: Any) -> App:
    app = App(url)
    app.periodic("beat", cron=cron, queue="beat", payload={"k": 1}, **options)

    @app.consumer("beat")
    async def handle(job: Job[Any], tx: Tx) -> None:
        await credit(tx, job.job_id, "m", job.attempt)

    return app


async def move_back(url: str, seconds: int) -> None:
    """Downtime, as the database sees it: the schedule's tick put ``seconds`` back."""
    if url.startswith("postgresql"):
        sql = f"UPDATE core.schedules SET last_slot = now() - interval '{seconds} seconds'"
    else:
        sql = (
            "UPDATE core_schedules SET last_slot = "
            f"(julianday('now') - 2440587.5) * 86400.0 - {seconds}"
        )
    await query(url, sql)


async def queued(url: str) -> list[str]:
    rows = await query(url, f"SELECT job_id FROM {table(url, 'jobs')} ORDER BY job_id")
    return [r[0] for r in rows]


async def test_schedulers_racing_for_the_same_ticks_enqueue_each_once(ledger: str) -> None:
    """Two apps' schedulers, 20 seconds of per-second ticks due at once, three rounds each in
    parallel: every tick is enqueued by exactly one of them (the row lock), none is missing."""
    apps = [beat_app(ledger, missed="all"), beat_app(ledger, missed="all")]
    async with apps[0], apps[1]:
        schedulers = [Scheduler(a.runtime) for a in apps]
        await schedulers[0].define()
        await schedulers[1].define()
        await move_back(ledger, 20)
        await asyncio.gather(*(s.tick() for s in schedulers for _ in range(3)))
        ids = await queued(ledger)
        assert len(ids) == len(set(ids)) == schedulers[0].enqueued + schedulers[1].enqueued
        assert len(ids) >= 20
        slots = sorted(s for s in map(slot_of, ids) if s is not None)
        assert len(slots) == len(ids)
        assert all(b - a == timedelta(seconds=1) for a, b in itertools.pairwise(slots))
        rows = await query(ledger, f"SELECT last_job_id FROM {table(ledger, 'schedules')}")
        assert rows == [(ids[-1],)]


@pytest.mark.parametrize(("missed", "expected"), [("last", 1), ("skip", 0), ("all", 60)])
async def test_an_hour_down_under_each_missed_tick_policy(
    ledger: str, missed: str, expected: int
) -> None:
    """A per-minute job whose schedulers were down for an hour (grace 0: every tick before
    now is missed): last runs the latest once, skip none, all each; the schedule moves to the
    latest tick in every case."""
    app = beat_app(ledger, cron="* * * * *", missed=missed, grace=timedelta(0))
    async with app:
        scheduler = Scheduler(app.runtime)
        await scheduler.define()
        await move_back(ledger, 3600)
        await scheduler.tick()
        ids = await queued(ledger)
        # a minute may turn between the two statements: "all" then has one more to run
        assert len(ids) == expected or (missed == "all" and len(ids) == expected + 1)
        now = datetime.now(tz=UTC)
        rows = await query(ledger, f"SELECT last_slot FROM {table(ledger, 'schedules')}")
        last = rows[0][0]
        last = last if isinstance(last, datetime) else datetime.fromtimestamp(last, tz=UTC)
        assert now - timedelta(seconds=61) < last <= now
        assert last.second == 0
        assert last.microsecond == 0
        if ids:
            assert slot_of(ids[-1]) == last
        await scheduler.tick()  # a second round enqueues no tick again
        again = await queued(ledger)
        assert len(again) == len(set(again))
        assert again[: len(ids)] == ids


async def test_the_worker_runs_the_ticks_once_each_and_lists_them(ledger: str) -> None:
    """A worker with its scheduler (the default) runs a per-second job: one ledger row per
    tick, consecutive slots; the listing shows the schedule, its next run and the last run
    processed."""
    app = beat_app(ledger, missed="all")
    async with app, RunningWorker(app, concurrency=2, poll_interval=0.2):
        await eventually(lambda: _count_at_least(ledger, 3), timeout=30, what="three ticks run")
        rows = await query(ledger, "SELECT job_id FROM ledger ORDER BY job_id")
        ids = [r[0] for r in rows]
        assert len(ids) == len(set(ids))
        slots = [slot_of(i) for i in ids]
        assert all(s is not None for s in slots)
        found = await eventually(lambda: _processed(app), timeout=20, what="last run processed")
        assert found.name == "beat"
        assert found.cron == "* * * * * *"
        assert found.tz == "UTC"
        assert found.next_run is not None
        assert found.last_slot is not None
        assert found.next_run > found.last_slot
        assert found.defined is True


async def _count_at_least(url: str, n: int) -> bool:
    return int(await scalar(url, "SELECT count(*) FROM ledger")) >= n


async def _processed(app: App) -> Any:
    [found] = await list_schedules(app.db, app.periodic_jobs)  # listed before it is stored too
    return found if found.last_outcome == "processed" else None


async def test_a_worker_without_its_scheduler_enqueues_no_tick(ledger: str) -> None:
    """scheduler=False: the worker runs jobs (an enqueued one is processed) but never
    defines the schedule, so no tick is ever enqueued by it."""
    app = beat_app(ledger)
    async with app, RunningWorker(app, scheduler=False, poll_interval=0.2):
        await app.enqueue("beat", {"k": 1}, job_id="by-hand")
        await eventually(lambda: scalar(ledger, "SELECT count(*) FROM ledger"), what="the job run")
        assert await scalar(ledger, f"SELECT count(*) FROM {table(ledger, 'schedules')}") == 0
    assert await query(ledger, "SELECT job_id FROM ledger") == [("by-hand",)]


async def test_the_last_runs_outcome_dead_letter_and_the_cli_listing(
    ledger: str, tmp_path: Path
) -> None:
    """A tick whose handler fails for good shows as a dead letter; `jobfence schedules`
    prints it (table and JSON), and with --app a job no scheduler stored yet shows as never
    run."""
    app = App(ledger)
    app.periodic("failing", cron="* * * * * *", queue="failing", missed="all")

    @app.consumer("failing")
    async def fail(job: Job[Any], tx: Tx) -> None:
        raise NonRetryableError("always")

    async with app, RunningWorker(app, poll_interval=0.2):
        found = await eventually(lambda: _dead(app), timeout=30, what="a dead-lettered tick")
    assert found.dead_letter_id is not None
    assert found.last_job_id is not None
    assert found.last_job_id.startswith("failing:")
    shown = jf("schedules", "--database-url", ledger, env={"COLUMNS": "200"})
    assert shown.returncode == 0, shown.stderr
    assert "failing" in shown.stdout
    assert f"dead letter #{found.dead_letter_id}" in shown.stdout
    assert "* * * * * *" in shown.stdout
    out = jf("schedules", "--database-url", ledger, "--json").stdout
    listed = [json.loads(line) for line in out.splitlines()]  # one object a line
    assert [s["name"] for s in listed] == ["failing"]
    assert listed[0]["last_outcome"] in ("dead_letter", "waiting", "running")
    assert listed[0]["next_run"] > listed[0]["last_slot"]
    app_file = tmp_path / "sched_cli_app.py"
    app_file.write_text(
        "import jobfence\n"
        f"app = jobfence.App({ledger!r})\n"
        "app.periodic('nightly', cron='0 3 * * *', queue='n', tz='Europe/Madrid')\n"
    )
    with_app = jf(
        "schedules", "--app", "sched_cli_app:app", "--json", env={"PYTHONPATH": str(tmp_path)}
    )
    assert with_app.returncode == 0, with_app.stderr
    by_name = {s["name"]: s for s in map(json.loads, with_app.stdout.splitlines())}
    assert by_name["nightly"]["last_outcome"] is None
    assert by_name["nightly"]["next_run"].endswith(("T01:00:00+00:00", "T02:00:00+00:00"))
    assert by_name["failing"]["defined"] is False


async def _dead(app: App) -> Any:
    found = await list_schedules(app.db)
    return found[0] if found and found[0].last_outcome == "dead_letter" else None


async def test_a_failing_payload_function_holds_up_no_other_schedule(
    ledger: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A schedule whose payload function raises is logged and tried again; the schedule
    after it in the same round is enqueued all the same, and the broken one's tick is not
    recorded as enqueued."""

    def broken(slot: datetime) -> Any:
        raise RuntimeError("the payload function is broken")

    app = App(ledger)
    app.periodic("a-broken", cron="* * * * * *", queue="q", payload=broken, missed="all")
    app.periodic("b-fine", cron="* * * * * *", queue="q", missed="all")
    async with app:
        scheduler = Scheduler(app.runtime)
        await scheduler.define()
        await move_back(ledger, 3)
        await scheduler.tick()
    ids = await queued(ledger)
    assert ids
    assert all(i.startswith("b-fine:") for i in ids)
    rows = await query(ledger, f"SELECT name, last_job_id FROM {table(ledger, 'schedules')}")
    assert dict(rows)["a-broken"] is None
    assert "periodic job a-broken: enqueuing its ticks failed" in caplog.text


def test_the_scheduler_command_refuses_an_app_without_periodic_jobs(sqlite_database: str) -> None:
    result = jf("scheduler", "tests.apps.crash_app:app", env={"JF_DB": sqlite_database})
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "jobfence: error: tests.apps.crash_app:app defines no periodic jobs: define them with "
        "app.periodic(...)"
    ]


async def test_a_deleted_schedule_row_is_stored_again(ledger: str) -> None:
    """Someone deleted the schedule's row: the next round stores the definition again (on
    SQLite outside the round's transaction, whose write lock a second connection would wait
    for) and the round after enqueues from there."""
    app = beat_app(ledger, missed="all")
    async with app:
        scheduler = Scheduler(app.runtime)
        await scheduler.define()
        await query(ledger, f"DELETE FROM {table(ledger, 'schedules')}")
        await scheduler.tick()
        rows = await query(ledger, f"SELECT name, last_slot FROM {table(ledger, 'schedules')}")
        assert rows == [("beat", None)]
        await move_back(ledger, 3)
        await scheduler.tick()
        assert len(await queued(ledger)) >= 3
