"""A broker delivery's admission in one statement and its slot given back by its work
transaction (issue 26).

On PostgreSQL :meth:`FlowControl.admit` is one statement (``core.flow_admit``: the queue's
flow lock, the key's state, the slot and the start); SQLite keeps one write transaction of the
same steps. Both refuse over concurrency, over the rate and for a held key without writing
anything. A job whose work transaction commits gives its slot back in that transaction (with
the COMMIT); one whose transaction rolls back, even at its COMMIT, gives it back after.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from typing import Any

import pytest

from jobfence import App, Job, Limit, Rate, RetryPolicy, Tx
from jobfence.config import parse_database_url
from jobfence.core.holds import hold
from jobfence.db import Database, connect
from jobfence.runtime.flow import Admitted, Deferred, FlowControl
from jobfence.runtime.harness import Outcome

from ..contract.support import Target, cleanup, make_target
from ..helpers import RunningWorker, eventually, query

LEASE = timedelta(seconds=30)
POLICY = RetryPolicy(
    base=timedelta(seconds=0.2),
    cap=timedelta(seconds=1),
    justification="admission tests: a job fails once on purpose",
)


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[Database]:
    database = connect(parse_database_url(database_url))
    await database.open(max_size=4)
    try:
        yield database
    finally:
        await database.close()


def _table(db: Database, name: str) -> str:
    return f"core.{name}" if db.dialect == "postgresql" else f"core_{name}"


async def _rows(db: Database, name: str) -> int:
    async with db.transaction() as tx:
        row = await tx.fetchone(f"SELECT count(*) FROM {_table(db, name)}")  # type: ignore[arg-type]
    assert row is not None
    return int(row[0])


async def test_admission_refuses_over_concurrency_and_takes_no_slot(db: Database) -> None:
    flow = FlowControl(db, {"q": Limit(concurrency=2)}, holder="w")
    first = await flow.admit("q", "acme", "j1", LEASE)
    second = await flow.admit("q", "acme", "j2", LEASE)
    assert isinstance(first, Admitted)
    assert isinstance(second, Admitted)
    assert first.slot is not None
    assert second.slot is not None
    assert first.slot != second.slot
    over = await flow.admit("q", "acme", "j3", LEASE)
    assert isinstance(over, Deferred)
    assert over.reason == "concurrency"
    assert over.wait is not None
    assert 0 < over.wait <= LEASE.total_seconds()
    assert (await _rows(db, "flow_slots"), await _rows(db, "flow_starts")) == (2, 0)
    assert isinstance(await flow.admit("q", "globex", "j4", LEASE), Admitted)  # its own key
    await flow.release(first.slot)
    again = await flow.admit("q", "acme", "j3", LEASE)
    assert isinstance(again, Admitted)
    assert again.slot is not None


async def test_admission_refuses_over_the_rate_and_records_no_start(db: Database) -> None:
    flow = FlowControl(db, {"q": Limit(rate=Rate(2, per=60))}, holder="w")
    for n in range(2):
        admitted = await flow.admit("q", "acme", f"j{n}", LEASE)
        assert admitted == Admitted(None)  # no concurrency: no slot
    over = await flow.admit("q", "acme", "j2", LEASE)
    assert isinstance(over, Deferred)
    assert over.reason == "rate"
    assert over.wait is not None
    assert 0 < over.wait <= 60
    assert (await _rows(db, "flow_starts"), await _rows(db, "flow_slots")) == (2, 0)
    assert isinstance(await flow.admit("q", "globex", "j3", LEASE), Admitted)
    assert await _rows(db, "flow_starts") == 3


async def test_admission_of_a_held_key_takes_nothing(db: Database) -> None:
    """A back-off, then a pause (which outranks it), refuse a key that has room, with no slot
    and no start written."""
    limit = Limit(concurrency=5, rate=Rate(5, per=60))
    flow = FlowControl(db, {"q": limit}, holder="w")
    await flow.back_off("q", "acme", timedelta(seconds=40), "partner said 429")
    backing = await flow.admit("q", "acme", "j1", LEASE)
    assert isinstance(backing, Deferred)
    assert backing.reason == "backoff"
    assert backing.wait is not None
    assert 0 < backing.wait <= 40
    await hold(db, "q", "acme", kind="pause", seconds=None, reason="ops", held_by="test")
    assert await flow.admit("q", "acme", "j1", LEASE) == Deferred("pause", None)
    assert (await _rows(db, "flow_slots"), await _rows(db, "flow_starts")) == (0, 0)
    assert isinstance(await flow.admit("q", "globex", "j2", LEASE), Admitted)


async def test_postgresql_admission_waits_for_the_queues_flow_lock(pg_database: str) -> None:
    """The one statement takes the lock limited claims of the database queue take
    (``flow_lock``): while another transaction holds it, the admission waits inside
    ``core.flow_admit``, and goes on when it is released."""
    db = connect(parse_database_url(pg_database))
    await db.open(max_size=4)
    try:
        flow = FlowControl(db, {"q": Limit(concurrency=1)}, holder="w")
        async with db.transaction() as holder:
            await holder.q("flow_lock", {"queue": "q"})
            admission = asyncio.create_task(flow.admit("q", "acme", "j1", LEASE))

            async def waiting() -> bool:
                rows = await query(
                    pg_database,
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'advisory' "
                    "AND query LIKE %s",
                    ("%core.flow_admit%",),
                )
                return int(rows[0][0]) == 1

            await eventually(waiting, timeout=20, what="the admission to wait for the lock")
            assert not admission.done()
        admitted = await asyncio.wait_for(admission, timeout=20)
        assert isinstance(admitted, Admitted)
        assert admitted.slot is not None
    finally:
        await db.close()


# -- the slot given back by the work transaction (Redis, in process) ------------------------


@pytest.fixture
def redis(request: pytest.FixtureRequest) -> Iterator[Target]:
    made = make_target("redis", request)
    yield made
    asyncio.run(cleanup(made))


async def _setup_witness(url: str) -> None:
    """A trigger notes the transaction that deletes each slot; handlers note theirs."""
    db = connect(parse_database_url(url))
    await db.open(max_size=1)
    try:
        async with db.transaction() as tx:
            await tx.execute("CREATE TABLE slot_frees (job_id text, txid bigint)")
            await tx.execute("CREATE TABLE work_txids (job_id text, attempt int, txid bigint)")
            await tx.execute(
                "CREATE FUNCTION note_free() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                "INSERT INTO slot_frees VALUES (OLD.job_id, txid_current()); RETURN OLD; END $$"
            )
            await tx.execute(
                "CREATE TRIGGER note_free AFTER DELETE ON core.flow_slots "
                "FOR EACH ROW EXECUTE FUNCTION note_free()"
            )
            # a key checked at COMMIT: a job's work can fail after its handler returned
            await tx.execute(
                "CREATE TABLE unique_at_commit (n int UNIQUE DEFERRABLE INITIALLY DEFERRED)"
            )
    finally:
        await db.close()


def _app(target: Target, concurrency: int) -> App:
    app = App(
        target.database_url,
        transport=target.transport_url,
        lease=timedelta(seconds=60),  # a slot that is not given back stays for a minute
        auto_migrate=True,
    )

    @app.consumer(target.queue, limit=Limit(concurrency=concurrency), retry=POLICY)
    async def handle(job: Job[dict[str, Any]], tx: Tx) -> None:
        await tx.execute(
            "INSERT INTO work_txids VALUES (%s, %s, txid_current())", (job.job_id, job.attempt)
        )
        if job.payload.get("mode") == "fail_at_commit" and job.attempt == 1:
            # two equal values of a deferred unique key: refused by the COMMIT, after the
            # handler returned (and after the slot's release was queued with it)
            await tx.execute("INSERT INTO unique_at_commit VALUES (1), (1)")

    return app


async def test_a_processed_jobs_slot_is_given_back_by_its_work_transaction(
    redis: Target,
) -> None:
    await _setup_witness(redis.database_url)
    app = _app(redis, concurrency=1)
    async with app:
        for n in range(3):
            await app.enqueue(redis.queue, {"n": n}, job_id=f"job-{n}")
        async with RunningWorker(app, concurrency=3, poll_interval=0.2) as w:
            await eventually(
                lambda: w.stats.outcomes[Outcome.PROCESSED] == 3, timeout=30, what="3 jobs"
            )
    frees = await query(redis.database_url, "SELECT job_id, txid FROM slot_frees ORDER BY 1")
    works = await query(redis.database_url, "SELECT job_id, txid FROM work_txids ORDER BY 1")
    assert frees == works  # each slot left in its job's own work transaction
    live = await query(redis.database_url, "SELECT count(*) FROM core.flow_slots")
    assert live[0][0] == 0


async def test_a_slot_comes_back_when_the_work_fails_at_its_commit(redis: Target) -> None:
    """Limit(concurrency=1) and a lease of a minute: the first job's COMMIT fails (its slot's
    release rolled back with it), so the harness gives the slot back on its own; the job's
    retry and the next job then run on the one slot, long before a lease could free it."""
    await _setup_witness(redis.database_url)
    app = _app(redis, concurrency=1)
    async with app:
        await app.enqueue(redis.queue, {"mode": "fail_at_commit"}, job_id="flaky")
        await app.enqueue(redis.queue, {}, job_id="next")
        async with RunningWorker(app, concurrency=2, poll_interval=0.2) as w:
            outcomes = w.stats.outcomes
            await eventually(lambda: outcomes[Outcome.PROCESSED] == 2, timeout=30, what="both jobs")
            assert outcomes[Outcome.RETRY] == 1
    works = await query(redis.database_url, "SELECT job_id, attempt FROM work_txids ORDER BY 1, 2")
    assert ("flaky", 2) in works
    assert ("next", 1) in works
    frees = await query(redis.database_url, "SELECT job_id, txid FROM slot_frees")
    committed = await query(
        redis.database_url,
        "SELECT job_id, txid FROM work_txids WHERE NOT (job_id = 'flaky' AND attempt = 1)",
    )
    # the failed attempt's slot was freed outside its (rolled back) work transaction
    flaky_frees = [txid for job_id, txid in frees if job_id == "flaky"]
    assert len(flaky_frees) == 2
    assert {txid for _, txid in committed} <= {txid for _, txid in frees}
    live = await query(redis.database_url, "SELECT count(*) FROM core.flow_slots")
    assert live[0][0] == 0
