"""Proof of flow control on the database queue with real worker processes (issue 26):
three workers on PostgreSQL (two on SQLite, whose one writer runs one job at a time) share
one limit per partner. Each committed run of a job leaves one row in ``flow_runs`` with its
start and end by the database's clock (tests/apps/flow_app.py), so:

- the concurrency limit is never exceeded: the most runs of one partner overlapping in time;
- the rate is never exceeded: the claims' own log of starts (core.flow_starts) in every
  window of ``per``, and the handlers' starts allowing for the claim-to-start delay;
- a kill -9 of a worker holding a key's slots gives them back within one lease;
- a BackOff holds the whole key on every worker;
- every job is done exactly once (one run, one fence, no row left), and jobs that were only
  deferred were attempted once.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import pytest

from jobfence import App

from ..helpers import eventually, query, scalar, start_worker, stop_processes, table, wait_until

APP = "tests.apps.flow_app:app"


async def _prepare(url: str, jobs: list[tuple[str, dict[str, Any]]]) -> None:
    timestamp = "timestamptz" if url.startswith("postgresql") else "REAL"
    await query(
        url,
        f"CREATE TABLE flow_runs (job_id text NOT NULL, partner text NOT NULL, "
        f"attempt integer NOT NULL, pid integer NOT NULL, started_at {timestamp} NOT NULL, "
        f"ended_at {timestamp} NOT NULL)",
    )
    # the workers prune the claims' log of starts as it ages: a trigger keeps a copy
    if url.startswith("postgresql"):
        await query(url, "CREATE TABLE starts_log (key text, started_at timestamptz)")
        await query(
            url,
            "CREATE FUNCTION log_start() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "INSERT INTO starts_log VALUES (NEW.key, NEW.started_at); RETURN NEW; END $$",
        )
        await query(
            url,
            "CREATE TRIGGER log_start AFTER INSERT ON core.flow_starts "
            "FOR EACH ROW EXECUTE FUNCTION log_start()",
        )
    else:
        await query(url, "CREATE TABLE starts_log (key TEXT, started_at REAL)")
        await query(
            url,
            "CREATE TRIGGER log_start AFTER INSERT ON core_flow_starts BEGIN "
            "INSERT INTO starts_log VALUES (NEW.key, NEW.started_at); END",
        )
    await _enqueue(url, jobs)


async def _enqueue(url: str, jobs: list[tuple[str, dict[str, Any]]]) -> None:
    # the producer knows nothing of the limit: the workers' keying pass keys these jobs
    producer = App(url)
    async with producer:
        await producer.enqueue_many([producer.job("flow", p, job_id=j) for j, p in jobs])


def _env(url: str, marks: Path, **limit: Any) -> dict[str, str]:
    env = {"JF_DB": url, "JF_MARKS": str(marks), "JF_LEASE": str(limit.pop("lease", 30))}
    env.update({f"JF_{k.upper()}": str(v) for k, v in limit.items()})
    return env


def _workers(
    n: int, env: dict[str, str], tmp_path: Path, *args: str, first: int = 0, slots: int = 4
) -> list[Any]:
    """``n`` worker processes of ``slots`` each, once each has started (so that each can
    take part)."""
    logs = [tmp_path / f"w{first + i}.log" for i in range(n)]
    procs = [start_worker(APP, env, log, "--concurrency", str(slots), *args) for log in logs]
    for log in logs:
        wait_until(
            lambda log=log: log.exists() and b"worker started" in log.read_bytes(),
            timeout=30,
            what=f"{log.name} started",
        )
    return procs


def _stop(procs: list[Any], tmp_path: Path) -> None:
    codes = stop_processes(procs)
    if any(code not in (0, -9) for code in codes):
        logs = "\n".join(p.read_text()[-3000:] for p in sorted(tmp_path.glob("w*.log")))
        raise AssertionError(f"a worker failed ({codes}):\n{logs}")


async def _runs(url: str) -> list[tuple[str, str, int, int, float, float]]:
    rows = await query(
        url, "SELECT job_id, partner, attempt, pid, started_at, ended_at FROM flow_runs"
    )
    return [(j, p, a, pid, _seconds(s), _seconds(e)) for j, p, a, pid, s, e in rows]


async def _all_done_once(url: str, jobs: int) -> list[tuple[str, str, int, int, float, float]]:
    """Every job ran and committed exactly once: one run row, one fence, no queue row."""
    runs = await _runs(url)
    assert sorted(r[0] for r in runs) == sorted({r[0] for r in runs})  # none doubled
    assert len(runs) == jobs  # none lost
    assert await scalar(url, f"SELECT count(*) FROM {table(url, 'processed_jobs')}") == jobs
    assert await scalar(url, f"SELECT count(*) FROM {table(url, 'jobs')}") == 0
    return runs


async def _count(url: str) -> int:
    return int(await scalar(url, "SELECT count(*) FROM flow_runs"))


def _most_at_once(runs: list[tuple[str, str, int, int, float, float]], partner: str) -> int:
    """The most runs of ``partner`` overlapping at any moment (an end before a start at the
    same instant frees the slot first)."""
    events = sorted(
        [(r[4], 1) for r in runs if r[1] == partner]
        + [(r[5], -1) for r in runs if r[1] == partner],
        key=lambda e: (e[0], e[1]),
    )
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


def _most_in_window(times: list[float], per: float) -> int:
    """The most of ``times`` in any window (t - per, t]."""
    times = sorted(times)
    most = start = 0
    for end, t in enumerate(times):
        while times[start] <= t - per:
            start += 1
        most = max(most, end - start + 1)
    return most


def _seconds(value: Any) -> float:
    return value.timestamp() if hasattr(value, "timestamp") else float(value)


@pytest.mark.parametrize("workers", [3])
async def test_concurrency_per_partner_holds_across_worker_processes(
    pg_database: str, tmp_path: Path, workers: int
) -> None:
    url = pg_database
    partners = ("acme", "globex", "initech")
    jobs = [(f"{p}-{i}", {"partner_id": p, "seconds": 0.1}) for i in range(20) for p in partners]
    await _prepare(url, [])
    # 2 slots a worker, one job a transaction, no prefetch (a claimed job holds its key's
    # slot while it waits in its worker's buffer): the 6 slots of the 3 partners need every
    # worker, and a key's room is contended by all of them. Each worker's first job waits
    # until every worker has started one (JF_MEET): the first two cannot claim while they
    # wait, so the third takes part however the machine schedules them
    env = _env(url, tmp_path, concurrency=2, meet=workers)
    procs = _workers(workers, env, tmp_path, "--batch-size", "1", "--prefetch", "0", slots=2)
    try:
        await _enqueue(url, jobs)
        await eventually(lambda: _count(url), timeout=30, what="a first run")
        await eventually(
            lambda: _count_is(url, len(jobs)), timeout=120, what="every job run", interval=0.2
        )
    finally:
        _stop(procs, tmp_path)
    runs = await _all_done_once(url, len(jobs))
    for partner in partners:
        # never over the limit, and the limit was reached (the test can see an excess)
        assert _most_at_once(runs, partner) == 2
    assert len({r[3] for r in runs}) == workers  # every worker process took part
    assert {r[2] for r in runs} == {1}  # jobs held back by the limit kept their attempts


async def test_concurrency_per_partner_holds_across_sqlite_worker_processes(
    sqlite_database: str, tmp_path: Path
) -> None:
    """SQLite: one writer, so one job transaction at a time across processes; the limit's
    rules (the claim's count of running jobs, the keying pass, attempts) are the same."""
    url = sqlite_database
    partners = ("acme", "globex")
    jobs = [(f"{p}-{i}", {"partner_id": p, "seconds": 0.01}) for i in range(15) for p in partners]
    await _prepare(url, [])
    procs = _workers(2, _env(url, tmp_path, concurrency=1, rate=10, per=1), tmp_path)
    try:
        await _enqueue(url, jobs)
        await eventually(
            lambda: _count_is(url, len(jobs)), timeout=120, what="every job run", interval=0.2
        )
    finally:
        _stop(procs, tmp_path)
    runs = await _all_done_once(url, len(jobs))
    starts = await query(url, "SELECT key, started_at FROM starts_log")
    for partner in partners:
        assert _most_at_once(runs, partner) == 1
        times = [float(at) for key, at in starts if key == partner]
        assert len(times) == 15
        assert _most_in_window(times, 1.0) == 10
    # not asserted here: that both processes ran jobs. SQLite has one writer, and which of
    # two waiting workers wins its lock when a key has room again is the scheduler's choice
    # (under load one worker won every time); the PostgreSQL proof above asserts that every
    # worker process took part.
    assert {r[2] for r in runs} == {1}


async def _count_keyed(url: str, like: str) -> bool:
    rows = await query(
        url, "SELECT count(*) FROM core.jobs WHERE job_id LIKE %s AND flow_key = 'acme'", (like,)
    )
    return bool(rows[0][0] == 6)


async def _count_is(url: str, n: int) -> bool:
    return await _count(url) == n


async def test_the_rate_per_partner_holds_in_every_window_across_worker_processes(
    pg_database: str, tmp_path: Path
) -> None:
    url = pg_database
    per, rate = 1.0, 5
    partners = ("acme", "globex")
    jobs = [(f"{p}-{i}", {"partner_id": p}) for i in range(15) for p in partners]
    await _prepare(url, [])
    # no prefetch: a job claimed (its start counted) then kept in a buffer would start late,
    # next to the following window's jobs
    args = ("--batch-size", "1", "--prefetch", "0")
    procs = _workers(3, _env(url, tmp_path, rate=rate, per=per), tmp_path, *args)
    try:
        await _enqueue(url, jobs)
        await eventually(
            lambda: _count_is(url, len(jobs)), timeout=60, what="every job run", interval=0.2
        )
    finally:
        _stop(procs, tmp_path)
    runs = await _all_done_once(url, len(jobs))
    starts = await query(url, "SELECT key, started_at FROM starts_log")
    for partner in partners:
        # the claims' log (the database's clock at each claim): exactly the rate, in every
        # window of `per` wherever it starts
        logged = [_seconds(at) for key, at in starts if key == partner]
        assert len(logged) == 15
        assert _most_in_window(logged, per) == rate
        # the handlers' starts (the database's clock in each job's transaction): a job starts
        # after its claim by the time to reach its handler, which differs from claim to claim
        # (at most ~200 ms on a loaded machine, allowed for here): no window of per - 200 ms
        # holds more than the rate
        handled = [r[4] for r in runs if r[1] == partner]
        assert _most_in_window(handled, per - 0.2) <= rate
        # 15 starts at 5 per second: the third five cannot start before 2 s after the first
        assert max(handled) - min(handled) >= 2 * per - 0.2
    assert {r[2] for r in runs} == {1}


async def test_a_killed_workers_slots_come_back_within_one_lease(
    pg_database: str, tmp_path: Path
) -> None:
    url = pg_database
    lease = 3.0
    jobs = [(f"hang-{i}", {"partner_id": "acme", "mode": "hang"}) for i in range(2)]
    await _prepare(url, jobs)
    env = _env(url, tmp_path, concurrency=2, lease=lease)
    first = _workers(1, env, tmp_path)[0]
    others: list[Any] = []
    try:
        for job_id, _ in jobs:
            wait_until(lambda j=job_id: (tmp_path / f"{j}.hang").exists(), what=f"{job_id} held")
        # the key is full: two more workers start, and acme's next jobs wait for a slot
        others = _workers(2, env, tmp_path, first=1)
        producer = App(url)
        async with producer:
            await producer.enqueue_many(
                [producer.job("flow", {"partner_id": "acme"}, job_id=f"next-{i}") for i in range(6)]
            )
        await eventually(
            lambda: _count_keyed(url, "next-%"), what="the waiting jobs keyed (claimable)"
        )
        # a negative needs time: two idle workers would take them at once if acme had room
        await asyncio.sleep(1.0)
        assert await _count(url) == 0
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
        killed_at = _seconds(await scalar(url, "SELECT clock_timestamp()"))
        await eventually(lambda: _count_is(url, 8), timeout=60, what="every job run", interval=0.1)
    finally:
        if first.poll() is None:
            first.kill()
        _stop(others, tmp_path)
    runs = await _all_done_once(url, 8)
    after = min(r[4] for r in runs if r[0].startswith("next-"))
    assert after > killed_at  # acme's slots were held until the worker holding them died
    # the hung jobs' leases ran out `lease` after their claim (a job's own transaction holds
    # its row, which renews nothing, and keeps it counted while its worker lives); once the
    # worker died, the next claim hands them back and their slots are free: a waiting worker
    # wakes at a live lease's end or its poll (2 s < lease), and 0.5 s more for its claim
    # and its handler to begin
    assert after - killed_at <= lease + 0.5
    assert _most_at_once(runs, "acme") <= 2
    attempts = {r[0]: r[2] for r in runs}
    assert {attempts[f"hang-{i}"] for i in range(2)} == {2}  # the lost delivery counted
    assert {attempts[f"next-{i}"] for i in range(6)} == {1}  # the waiting ones: never attempted


async def test_a_back_off_holds_the_whole_key_on_every_worker(
    pg_database: str, tmp_path: Path
) -> None:
    url = pg_database
    await _prepare(url, [])
    procs = _workers(3, _env(url, tmp_path, concurrency=5), tmp_path)
    try:
        await _enqueue(url, [("trigger", {"partner_id": "acme", "mode": "backoff", "seconds": 3})])
        wait_until(lambda: (tmp_path / "trigger.backoff").exists(), what="the back-off")
        [(until,)] = await eventually(
            lambda: query(url, "SELECT until FROM core.flow_holds WHERE key = 'acme'"),
            what="the hold",
        )
        producer = App(url)
        async with producer:
            await producer.enqueue_many(
                [producer.job("flow", {"partner_id": p}, job_id=f"{p}-{i}")
                 for i in range(6) for p in ("acme", "globex")]
            )  # fmt: skip
        await eventually(lambda: _count_is(url, 13), timeout=60, what="every job run", interval=0.1)
    finally:
        _stop(procs, tmp_path)
    runs = await _all_done_once(url, 13)
    held_until = _seconds(until)
    acme = [r for r in runs if r[1] == "acme"]
    globex = [r for r in runs if r[1] == "globex"]
    assert min(r[4] for r in acme) >= held_until  # no worker started acme while it was held
    assert max(r[4] for r in globex) < held_until  # globex went on meanwhile
    assert {r[2] for r in runs} == {1}  # the backed-off job's attempt was refunded
    history = await query(url, "SELECT count(*) FROM core.flow_holds")
    assert history  # the ended hold may remain until pruned; it holds nothing
