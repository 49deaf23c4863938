"""Flow control on RabbitMQ, proven with three real worker processes (issue 26).

Each worker is ``jobfence worker tests.flow_brokers.apps:app`` (4 concurrent jobs each, 12
in all: more than any key's limit). The handler records, by the database's clock, when it
started and ended (tests/flow_brokers/apps.py); the measures are taken on those records:

* concurrency: the most jobs of one key whose handlers overlap never exceeds the limit, and
  reaches it (the test could fail);
* rate: the handler's start comes after its admission (the start the limit counts) by the
  time it takes to open the work transaction and fence the job — a few milliseconds, up to
  a few hundred on a loaded machine. Starts are counted in every window of ``per`` less
  that allowance (``LATENESS``); a limiter letting two windows' worth through (a token
  bucket) would put up to twice the rate in one such window;
* every job ran exactly once (one committed run each, by the fence) and as attempt 1:
  deferring used no attempt, though each job was deferred many times (the Observer hook
  counted them);
* kill -9 of the workers holding a key's slots: their slots keep counting until their lease
  ends — no job of that key starts before — and capacity is back within one lease (plus
  one recheck of a deferred delivery).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from jobfence import App, Job, Limit, Tx
from jobfence.runtime.harness import Outcome

from ..contract.support import Target, cleanup, kill_worker, make_target, wait_started
from ..helpers import RunningWorker, eventually, query, start_worker, stop_process
from .support import (
    create_runs_table,
    deferrals,
    most_at_once,
    most_at_once_per_key,
    most_in_window,
    runs,
)

WORKERS = 3
#: the most a handler may start after its admission, for the rate measure (see above)
LATENESS = 0.25


@pytest.fixture
def rabbitmq(request: pytest.FixtureRequest) -> Iterator[Target]:
    made = make_target("rabbitmq", request)
    create_runs_table(made.database_url)
    yield made
    asyncio.run(cleanup(made))


def _env(target: Target, marks: Path, **limits: str) -> dict[str, str]:
    return {
        "JF_DB": target.database_url,
        "JF_TRANSPORT": target.transport_url or "",
        "JF_QUEUE": target.queue,
        "JF_MARKS": str(marks),
        "JF_LEASE": limits.pop("lease", "3"),
        "JF_CONCURRENCY": limits.pop("concurrency", ""),
        "JF_RATE": limits.pop("rate", ""),
    }


async def _workers(env: dict[str, str], tmp_path: Path) -> list[Any]:
    procs = []
    for n in range(WORKERS):
        log = tmp_path / f"worker-{n}.log"
        procs.append(start_worker("tests.flow_brokers.apps:app", env, log, "--concurrency", "4"))
    for n in range(WORKERS):
        await wait_started(tmp_path / f"worker-{n}.log")
    return procs


def _app(target: Target) -> App:
    return target.app()


async def test_three_workers_never_exceed_a_keys_concurrency_or_rate(
    rabbitmq: Target, tmp_path: Path
) -> None:
    """3 keys × 12 jobs of 0.1 s under Limit(concurrency=2, rate=4 per second, per key):
    per key at most 2 handlers at once (and 2 reached), at most 4 starts in any window of
    1 s (less the allowance), each job once as attempt 1, and deferrals for both reasons."""
    marks = tmp_path / "marks"
    marks.mkdir()
    env = _env(rabbitmq, marks, concurrency="2", rate="4/1")
    jobs = {f"{key}-{n}": key for key in "abc" for n in range(12)}
    procs = await _workers(env, tmp_path)
    try:
        async with _app(rabbitmq) as app:
            for job_id, key in jobs.items():
                await app.enqueue(rabbitmq.queue, {"key": key, "seconds": 0.1}, job_id=job_id)
        await eventually(lambda: _count(rabbitmq, len(jobs)), timeout=120, what="all jobs ran")
    finally:
        for proc in procs:
            stop_process(proc)
    found = await runs(rabbitmq.database_url)
    assert Counter(r.job_id for r in found) == Counter(list(jobs))  # each exactly once
    assert {(r.attempt, r.lost) for r in found} == {(1, 0)}
    assert {r.pid for r in found} == {p.pid for p in procs}  # every worker took part
    at_once = most_at_once_per_key(found)
    assert max(at_once.values()) == 2, at_once
    for key in "abc":
        starts = [r.started for r in found if r.key == key]
        assert most_in_window(starts, 1.0 - LATENESS) <= 4, key
        # 12 starts at 4 per second: the 5th starts a window after the 1st, the 9th two
        assert (starts[8] - starts[0]).total_seconds() >= 2 * (1.0 - LATENESS), starts
    deferred = deferrals(marks)
    assert {reason for _, _, reason, _ in deferred} == {"concurrency", "rate"}
    assert {attempt for _, attempt, _, _ in deferred} == {1}
    assert len(deferred) >= 20


async def test_kill_9_of_the_workers_holding_a_keys_slots_frees_them_within_a_lease(
    rabbitmq: Target, tmp_path: Path
) -> None:
    """Limit(concurrency=2) on key ``k``; two jobs hang on their first attempt, holding
    both slots, then their workers are SIGKILLed. The dead slots keep counting until their
    lease (3 s) ends: no job of ``k`` starts before that, counting the hung jobs as
    running until then never shows more than 2 at once; after it, capacity is back within
    the lease plus a deferred delivery's recheck (1.5 s) and some slack; the 10 other jobs
    and the 2 hung ones all run, each once, each attempt 1 plus the deliveries lost with a
    killed worker (at least the hung one), none used by a deferral."""
    marks = tmp_path / "marks"
    marks.mkdir()
    env = _env(rabbitmq, marks, concurrency="2", lease="3")
    procs = await _workers(env, tmp_path)
    try:
        async with _app(rabbitmq) as app:
            for n in range(2):
                await app.enqueue(rabbitmq.queue, {"key": "k", "mode": "hang"}, job_id=f"hang-{n}")
            for n in range(10):
                await app.enqueue(rabbitmq.queue, {"key": "k", "seconds": 0.05}, job_id=f"k-{n}")
        hung = [marks / f"hang-{n}.hang" for n in range(2)]
        await eventually(lambda: all(p.exists() for p in hung), timeout=60, what="both hang")
        holders = {int(p.read_text().split(" ")[0]) for p in hung}
        hung_at = [datetime.fromisoformat(p.read_text().split(" ")[1]) for p in hung]
        slots = await query(
            rabbitmq.database_url,
            "SELECT holder, expires_at FROM core.flow_slots WHERE queue = %s AND key = 'k'",
            (rabbitmq.queue,),
        )
        assert len(slots) == 2, slots
        for proc in procs:
            if proc.pid in holders:
                kill_worker(proc)
        killed_at = (await query(rabbitmq.database_url, "SELECT clock_timestamp()"))[0][0]
        # the dead slots' last renewal: read after the kill, nothing renews them any more
        dead = await query(
            rabbitmq.database_url,
            "SELECT expires_at FROM core.flow_slots WHERE queue = %s AND key = 'k' "
            "AND expires_at > %s ORDER BY expires_at",
            (rabbitmq.queue, killed_at),
        )
        assert len(dead) == 2, dead
        expiries = [row[0] for row in dead]
        await eventually(lambda: _count(rabbitmq, 12), timeout=120, what="all jobs ran")
    finally:
        for proc in procs:
            stop_process(proc)
    found = await runs(rabbitmq.database_url)
    assert Counter(r.job_id for r in found) == Counter(
        [f"hang-{n}" for n in range(2)] + [f"k-{n}" for n in range(10)]
    )
    # each attempt is 1 + the deliveries lost with a killed worker (the hung ones, and any
    # prefetched by a killed worker): none was used by the many deferrals
    assert all(r.attempt >= 2 for r in found if r.job_id.startswith("hang")), found
    assert all(r.attempt == 1 + r.lost for r in found), [
        (r.job_id, r.attempt, r.lost) for r in found
    ]
    after = sorted(r.started for r in found if r.started > killed_at)
    assert after[0] >= expiries[0], (after[0], expiries)  # dead slots counted to their end
    spans = [(r.started, r.ended) for r in found] + list(zip(hung_at, expiries, strict=True))
    assert most_at_once(spans) <= 2
    back_within = (after[0] - killed_at).total_seconds()
    assert back_within <= 3.0 + 1.5 + 1.0, back_within
    # the deliveries of k waited (deferred) rather than ran while the slots were held
    assert any(reason == "concurrency" for _, _, reason, _ in deferrals(marks))


async def test_a_slot_renewal_stuck_on_the_database_does_not_cost_held_deliveries_their_lease(
    rabbitmq: Target,
) -> None:
    """A worker of one slot runs a job of a limited queue for 4 s under a 1.5 s lease, the
    next job waiting in its buffer, while the database makes the renewal of the running
    job's concurrency slot wait (another session locks the slot's row for 3.2 s: more than
    two leases). The
    deliveries' leases with RabbitMQ are renewed in the worker's memory, on their own beat:
    they do not wait behind the slot's renewal, so no message is given back — each job
    commits once, as attempt 1, nothing lost in its history, no duplicate delivery."""
    app = App(rabbitmq.database_url, transport=rabbitmq.transport_url,
              lease=timedelta(seconds=1.5), auto_migrate=True)  # fmt: skip
    started = asyncio.Event()

    @app.consumer(rabbitmq.queue, limit=Limit(concurrency=1, key=lambda p: p["key"]))
    async def handle(job: Job[dict[str, Any]], tx: Tx) -> None:
        row = await tx.fetchone("SELECT clock_timestamp()")
        assert row is not None
        started.set()
        await asyncio.sleep(float(job.payload["seconds"]))
        await tx.execute(
            "INSERT INTO flow_runs (job_id, key, attempt, lost, pid, started, ended) "
            "VALUES (%s, %s, %s, %s, 0, %s, clock_timestamp())",
            (job.job_id, job.payload["key"], job.attempt, len(job.history), row[0]),
        )

    async with app:
        await app.enqueue(rabbitmq.queue, {"key": "a", "seconds": 4}, job_id="slow")
        await app.enqueue(rabbitmq.queue, {"key": "b", "seconds": 0}, job_id="next")
        async with RunningWorker(app, concurrency=1, poll_interval=0.2) as worker:
            await asyncio.wait_for(started.wait(), timeout=30)
            blocker = await psycopg.AsyncConnection.connect(rabbitmq.database_url)
            async with blocker, blocker.transaction():
                locked = await blocker.execute(
                    "SELECT id FROM core.flow_slots WHERE queue = %s FOR UPDATE",
                    (rabbitmq.queue,),
                )
                assert len(await locked.fetchall()) == 1  # the running job's slot
                await asyncio.sleep(3.2)  # renewals of that slot wait on its row
            await eventually(lambda: _count(rabbitmq, 2), timeout=30, what="both jobs committed")
            assert worker.stats.outcomes[Outcome.DUPLICATE] == 0  # no message was given back
    found = await runs(rabbitmq.database_url)
    assert sorted((r.job_id, r.attempt, r.lost) for r in found) == [
        ("next", 1, 0),
        ("slow", 1, 0),
    ]


async def _count(target: Target, expected: int) -> bool:
    rows = await query(target.database_url, "SELECT count(*) FROM flow_runs")
    return int(rows[0][0]) == expected
