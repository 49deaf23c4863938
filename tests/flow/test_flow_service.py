"""The flow-control service the harness uses for broker deliveries (jobfence.runtime.flow):
admission against concurrency slots, the rate's sliding window and held keys, on PostgreSQL
and SQLite, with the database's own clock."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest

from jobfence import Limit, Rate
from jobfence.config import parse_database_url
from jobfence.db import Database, connect
from jobfence.runtime.flow import Admitted, Deferred, FlowControl

LEASE = timedelta(seconds=30)


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[Database]:
    database = connect(parse_database_url(database_url))
    await database.open(max_size=4)
    try:
        yield database
    finally:
        await database.close()


async def test_concurrency_slots_are_counted_per_key_and_come_back_on_release(
    db: Database,
) -> None:
    flow = FlowControl(db, {"q": Limit(concurrency=2, key="partner")}, holder="w1")
    first = await flow.admit("q", "acme", "j1", LEASE)
    second = await flow.admit("q", "acme", "j2", LEASE)
    assert isinstance(first, Admitted)
    assert isinstance(second, Admitted)
    assert first.slot is not None
    assert second.slot is not None
    third = await flow.admit("q", "acme", "j3", LEASE)
    assert isinstance(third, Deferred)
    assert third.reason == "concurrency"
    # a slot frees at the latest when its lease runs out
    assert third.wait is not None
    assert 0 < third.wait <= LEASE.total_seconds()
    # another key is not affected
    assert isinstance(await flow.admit("q", "globex", "j4", LEASE), Admitted)
    await flow.release(first.slot)
    assert isinstance(await flow.admit("q", "acme", "j3", LEASE), Admitted)


async def test_an_expired_slot_counts_for_nothing_and_extend_keeps_a_live_one(
    db: Database,
) -> None:
    flow = FlowControl(db, {"q": Limit(concurrency=1)}, holder="w1")
    short = timedelta(milliseconds=300)
    taken = await flow.admit("q", "", "j1", short)
    assert isinstance(taken, Admitted)
    assert taken.slot is not None
    await flow.extend([taken.slot], LEASE)  # renewed: it outlives the short lease
    await asyncio.sleep(0.4)  # a lease must run out here: this is the subject of the test
    assert isinstance(await flow.admit("q", "", "j2", short), Deferred)
    await flow.release(taken.slot)
    lost = await flow.admit("q", "", "j2", short)  # its worker will be "killed": never renewed
    assert isinstance(lost, Admitted)

    async def admitted() -> bool:
        return isinstance(await flow.admit("q", "", "j3", LEASE), Admitted)

    # the killed worker's slot is back within its lease
    from tests.helpers import eventually

    await eventually(admitted, timeout=5, what="the expired slot to count for nothing")


async def test_the_rate_is_a_sliding_window_of_starts(db: Database) -> None:
    per = 1.0
    flow = FlowControl(db, {"q": Limit(rate=Rate(3, per=per), key="partner")}, holder="w1")
    for n in range(3):
        admitted = await flow.admit("q", "acme", f"j{n}", LEASE)
        assert isinstance(admitted, Admitted)
        assert admitted.slot is None  # no concurrency limit: no slot to give back
        if n == 0:
            await asyncio.sleep(0.4)  # time is the subject: the first start is the oldest by far
    over = await flow.admit("q", "acme", "j3", LEASE)
    assert isinstance(over, Deferred)
    assert over.reason == "rate"
    assert over.wait is not None
    assert 0 < over.wait <= per - 0.4
    assert isinstance(await flow.admit("q", "globex", "j4", LEASE), Admitted)
    await asyncio.sleep(over.wait + 0.01)  # the oldest start leaves the window then, not before
    assert isinstance(await flow.admit("q", "acme", "j3", LEASE), Admitted)
    assert isinstance(await flow.admit("q", "acme", "j5", LEASE), Deferred)


async def test_concurrent_admissions_never_exceed_the_limit(database_url: str) -> None:
    """Admissions from several connections at once: each slot goes to one of them."""
    limit = {"q": Limit(concurrency=3, rate=Rate(5, per=60))}
    dbs = [connect(parse_database_url(database_url)) for _ in range(4)]
    for d in dbs:
        await d.open(max_size=2)
    try:
        flows = [FlowControl(d, limit, holder=f"w{i}") for i, d in enumerate(dbs)]
        results = await asyncio.gather(
            *(flows[i % 4].admit("q", "k", f"j{i}", LEASE) for i in range(20))
        )
        admitted = [r for r in results if isinstance(r, Admitted)]
        assert len(admitted) == 3
        for r in admitted:
            await flows[0].release(r.slot)
        more = [await flows[1].admit("q", "k", f"m{i}", LEASE) for i in range(4)]
        # concurrency has room again, the rate has 2 starts left of 5 in its minute
        assert [isinstance(r, Admitted) for r in more] == [True, True, False, False]
        assert {r.reason for r in more if isinstance(r, Deferred)} == {"rate"}
    finally:
        for d in dbs:
            await d.close()


async def test_a_back_off_holds_the_key_and_a_longer_one_stays(db: Database) -> None:
    flow = FlowControl(db, {"q": Limit(concurrency=5, key="partner")}, holder="w1")
    held = await flow.back_off("q", "acme", timedelta(seconds=30), "partner 429")
    assert 29 < held <= 30
    shorter = await flow.back_off("q", "acme", timedelta(seconds=5), "again")
    assert shorter > 25  # the longer back-off stays
    deferred = await flow.admit("q", "acme", "j1", LEASE)
    assert isinstance(deferred, Deferred)
    assert deferred.reason == "backoff"
    assert deferred.wait is not None
    assert 25 < deferred.wait <= 30
    assert isinstance(await flow.admit("q", "globex", "j2", LEASE), Admitted)
    status = await flow.status("q")
    assert status is not None
    assert [(h.key, h.kind, h.reason) for h in status.holds] == [("acme", "backoff", "partner 429")]


async def test_a_short_back_off_ends_by_itself(db: Database) -> None:
    flow = FlowControl(db, {"q": Limit(concurrency=5)}, holder="w1")
    held = await flow.back_off("q", "", timedelta(milliseconds=200), "brief")
    assert isinstance(await flow.admit("q", "", "j1", LEASE), Deferred)
    await asyncio.sleep(held + 0.01)
    assert isinstance(await flow.admit("q", "", "j1", LEASE), Admitted)
    await flow.prune()
    status = await flow.status("q")
    assert status is not None
    assert status.holds == []


async def test_status_shows_each_key_in_use_and_starts(db: Database) -> None:
    flow = FlowControl(
        db, {"q": Limit(concurrency=2, rate=Rate(10, per=60), key="partner")}, holder="w1"
    )
    assert await flow.status("unlimited") is None
    a = await flow.admit("q", "acme", "j1", LEASE)
    await flow.admit("q", "acme", "j2", LEASE)
    await flow.admit("q", "globex", "j3", LEASE)
    status = await flow.status("q")
    assert status is not None
    assert [(k.key, k.in_use, k.starts) for k in status.keys] == [
        ("acme", 2, 2),
        ("globex", 1, 1),
    ]
    assert isinstance(a, Admitted)
    await flow.release(a.slot)
    await flow.prune()  # starts inside the minute stay
    status = await flow.status("q")
    assert status is not None
    assert [(k.key, k.in_use, k.starts) for k in status.keys] == [
        ("acme", 1, 2),
        ("globex", 1, 1),
    ]


async def test_a_queue_without_a_limit_is_admitted_without_a_write(db: Database) -> None:
    flow = FlowControl(db, {}, holder="w1")
    assert await flow.admit("other", "k", "j1", LEASE) == Admitted(None)
