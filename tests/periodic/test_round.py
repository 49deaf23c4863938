"""A scheduler round does every due schedule of the app at once (one claim, one publish, one
move per transaction), splits a round with another scheduler without doubling a tick, bounds
each transaction of a long catch-up; rows of schedules no running app declares any more are
shown as such and pruned."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections import defaultdict
from datetime import timedelta
from typing import Any

import pytest

from jobfence import App
from jobfence.core.periodic import MAX_CATCH_UP, slot_of
from jobfence.errors import ConfigurationError
from jobfence.review.schedules import list_schedules, prune_schedules
from jobfence.runtime import scheduler as scheduler_module
from jobfence.runtime.scheduler import ROUND_TICKS, Scheduler

from ..helpers import query, table
from ..test_cli import jf
from .test_scheduler import move_back, queued


def many_app(url: str, n: int, **options: Any) -> App:
    app = App(url)
    for i in range(n):
        app.periodic(f"s{i:03d}", cron="* * * * * *", queue="many", **options)
    return app


def by_schedule(ids: list[str]) -> dict[str, list[Any]]:
    found: dict[str, list[Any]] = defaultdict(list)
    for job_id in ids:
        found[job_id.rsplit(":", 3)[0]].append(slot_of(job_id))
    return {name: sorted(slots) for name, slots in found.items()}


def consecutive(slots: list[Any]) -> bool:
    return all(b - a == timedelta(seconds=1) for a, b in itertools.pairwise(slots))


async def ticks_per_transaction(url: str) -> list[int]:
    """PostgreSQL: how many of the queued jobs each writing transaction wrote (their xmin)."""
    rows = await query(url, "SELECT count(*) FROM core.jobs GROUP BY xmin::text")
    return sorted(int(r[0]) for r in rows)


async def test_one_round_enqueues_every_due_schedule_in_one_transaction(ledger: str) -> None:
    """100 per-second schedules three seconds behind: one round, one transaction, every
    schedule's ticks enqueued once and its row moved to its last one."""
    app = many_app(ledger, 100, missed="all")
    async with app:
        scheduler = Scheduler(app.runtime)
        await scheduler.define()
        await move_back(ledger, 3)
        await scheduler.tick()
        ids = await queued(ledger)
        assert len(ids) == len(set(ids)) == scheduler.enqueued
        slots = by_schedule(ids)
        assert len(slots) == 100
        assert all(len(s) >= 3 and consecutive(s) for s in slots.values())
        assert scheduler.transactions == 1
        if ledger.startswith("postgresql"):
            assert await ticks_per_transaction(ledger) == [len(ids)]
        rows = await query(ledger, f"SELECT name, last_job_id FROM {table(ledger, 'schedules')}")
        last = {name: max(i for i in ids if i.startswith(f"{name}:")) for name in slots}
        assert dict(rows) == last


async def test_two_schedulers_racing_the_same_100_schedules_enqueue_each_tick_once(
    ledger: str,
) -> None:
    """Two apps' schedulers with the same 100 schedules, five seconds due, three rounds each
    at once: on PostgreSQL each skips the rows the other holds (no waiting), on SQLite the
    write lock serialises them; every tick is enqueued by exactly one, none is missing."""
    apps = [many_app(ledger, 100, missed="all"), many_app(ledger, 100, missed="all")]
    async with apps[0], apps[1]:
        schedulers = [Scheduler(a.runtime) for a in apps]
        for s in schedulers:
            await s.define()
        await move_back(ledger, 5)
        await asyncio.gather(*(s.tick() for s in schedulers for _ in range(3)))
        ids = await queued(ledger)
        assert len(ids) == len(set(ids)) == sum(s.enqueued for s in schedulers)
        slots = by_schedule(ids)
        assert len(slots) == 100
        assert all(len(s) >= 5 and consecutive(s) for s in slots.values())
        # the next rounds go on from where the other left each row: still no tick twice
        await asyncio.gather(*(s.tick() for s in schedulers))
        again = await queued(ledger)
        assert len(again) == len(set(again))
        assert all(consecutive(s) for s in by_schedule(again).values())


async def test_a_10000_tick_catch_up_is_bounded_per_transaction(ledger: str) -> None:
    """Ten missed="all" schedules down for longer than MAX_CATCH_UP seconds: 10 000 ticks
    due at once, enqueued in transactions of at most ROUND_TICKS ticks, each once and in
    order; the next round has nothing left."""
    app = many_app(ledger, 10, missed="all", grace=timedelta(0))
    async with app:
        scheduler = Scheduler(app.runtime)
        await scheduler.define()
        await move_back(ledger, MAX_CATCH_UP + 100)
        await scheduler.tick()
        ids = await queued(ledger)
        assert len(ids) == len(set(ids)) == scheduler.enqueued
        assert len(ids) >= 10 * MAX_CATCH_UP
        assert all(len(s) >= MAX_CATCH_UP and consecutive(s) for s in by_schedule(ids).values())
        assert 0 < scheduler.largest <= ROUND_TICKS
        assert scheduler.transactions >= len(ids) / ROUND_TICKS
        if ledger.startswith("postgresql"):
            sizes = await ticks_per_transaction(ledger)
            assert sum(sizes) == len(ids)
            assert max(sizes) <= ROUND_TICKS
        before = scheduler.enqueued
        await move_back(ledger, 0)  # every row at now: nothing due
        await scheduler.tick()
        assert scheduler.enqueued == before


async def age(url: str, name: str, hours: float) -> None:
    """Make ``name``'s row last declared ``hours`` ago."""
    if url.startswith("postgresql"):
        sql = f"UPDATE core.schedules SET defined_at = now() - interval '{hours} hours'"
    else:
        sql = (
            "UPDATE core_schedules SET defined_at = "
            f"(julianday('now') - 2440587.5) * 86400.0 - {hours * 3600}"
        )
    await query(url, f"{sql} WHERE name = '{name}'")


async def test_schedules_no_running_app_declares_are_shown_and_pruned(
    ledger: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row not declared for hours is listed as not declared since then (CLI, JSON);
    prune removes the rows older than asked, never younger than UNDECLARED_AFTER; a running
    scheduler declares its own again every DECLARE_EVERY."""
    app = many_app(ledger, 3)
    async with app:
        scheduler = Scheduler(app.runtime)
        await scheduler.define()
        await age(ledger, "s001", 4)
        await age(ledger, "s002", 24 * 8)
        found = {s.name: s for s in await list_schedules(app.db)}
        assert [n for n, s in found.items() if s.undeclared] == ["s001", "s002"]
        assert found["s000"].declared_at is not None
        shown = jf("schedules", "--database-url", ledger, env={"COLUMNS": "250"})
        assert shown.returncode == 0, shown.stderr
        assert "s001 (not declared since" in shown.stdout
        assert "s000 (not declared" not in shown.stdout
        with pytest.raises(ConfigurationError, match="3 hours or longer"):
            await prune_schedules(app.db, timedelta(hours=1))
        refused = jf("schedules", "prune", "--older-than", "1h", "--database-url", ledger)
        assert refused.returncode != 0
        # the database named before the subcommand (as for the listing) is the one pruned
        pruned = jf("schedules", "--database-url", ledger, "prune", "--json")
        assert pruned.returncode == 0, pruned.stderr
        assert json.loads(pruned.stdout) == {"removed": ["s002"]}
        assert await prune_schedules(app.db, timedelta(hours=3)) == ["s001"]
        # a running scheduler declares its schedules again: the pruned rows come back, fresh
        monkeypatch.setattr(scheduler_module, "DECLARE_EVERY", timedelta(0))
        await age(ledger, "s000", 4)
        await scheduler.tick()
        found = {s.name: s for s in await list_schedules(app.db)}
        assert sorted(found) == ["s000", "s001", "s002"]
        assert not any(s.undeclared for s in found.values())
