"""Several real scheduler processes with the same per-second schedule, two of them killed
with SIGKILL and restarted mid-run: exactly one handler run per tick, no tick missing while
one scheduler lives (issue 26's proof). The full three-minute run is ``-m proof``."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from jobfence.core.periodic import slot_of

from ..conftest import make_ledger
from ..helpers import REPO, eventually, query, scalar, start_worker, stop_process, table

APP = "tests.apps.periodic_app:app"


def start_scheduler(env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    """``jobfence scheduler APP`` as a real process (killable with SIGKILL)."""
    log = open(log_path, "ab")  # noqa: SIM115 - closed by the process' end
    return subprocess.Popen(
        [sys.executable, "-m", "jobfence.cli", "scheduler", APP, "--log-level", "DEBUG"],
        cwd=REPO,
        env={**os.environ, **env, "PYTHONUNBUFFERED": "1"},
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def kill9(proc: subprocess.Popen[bytes]) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


async def ticks_run(url: str) -> int:
    return int(await scalar(url, "SELECT count(DISTINCT job_id) FROM ledger"))


async def at_least(url: str, n: int) -> bool:
    return await ticks_run(url) >= n


async def run_schedulers(
    url: str, tmp_path: Path, *, schedulers: int, phases: list[tuple[int, str]], end: int
) -> dict[str, Any]:
    """Start a worker (without its scheduler) and ``schedulers`` scheduler processes; at each
    ``(ticks, action)`` of ``phases`` — when that many ticks have run — "kill" SIGKILLs the
    first two (or the one, with two schedulers) and "restart" starts them again; stop at
    ``end`` ticks and check the ledger."""
    env = {"JF_DB": url, "JF_MISSED": "last", "JF_CRON": "* * * * * *"}
    worker = start_worker(APP, env, tmp_path / "worker.log", "--no-scheduler", "-c", "4")
    procs = [start_scheduler(env, tmp_path / f"scheduler-{i}.log") for i in range(schedulers)]
    victims = [0, 1] if schedulers > 2 else [0]
    restarts = 0
    try:
        for ticks, action in phases:
            await eventually(
                lambda t=ticks: at_least(url, t),  # type: ignore[misc]
                timeout=ticks * 3 + 30,
                interval=0.2,
                what=f"{ticks} ticks run",
            )
            for i in victims:
                if action == "kill":
                    kill9(procs[i])
                else:
                    restarts += 1
                    log_path = tmp_path / f"scheduler-{i}-{restarts}.log"
                    procs[i] = start_scheduler(env, log_path)
                    # running before the next phase: the next kill hits a scheduler at work,
                    # and the last stop one that handles SIGTERM
                    await eventually(
                        lambda p=log_path: _started(p),  # type: ignore[misc]
                        timeout=60,
                        interval=0.1,
                        what=f"{log_path.name} started",
                    )
        await eventually(
            lambda: at_least(url, end), timeout=end * 3 + 30, interval=0.2, what="the last tick"
        )
    finally:
        for proc in procs:
            if proc.poll() is None:
                assert stop_process(proc) == 0
    # what the schedulers enqueued is run, then the worker stops
    await eventually(
        lambda: _empty(url), timeout=60, interval=0.2, what="every enqueued tick processed"
    )
    assert stop_process(worker) == 0
    return await check_ledger(url, tmp_path)


def _started(log_path: Path) -> bool:
    return "scheduler started" in log_path.read_text()


async def _empty(url: str) -> bool:
    return await scalar(url, f"SELECT count(*) FROM {table(url, 'jobs')}") == 0


async def check_ledger(url: str, tmp_path: Path) -> dict[str, Any]:
    rows = await query(url, "SELECT job_id, count(*) FROM ledger GROUP BY job_id ORDER BY job_id")
    twice = [job_id for job_id, n in rows if n != 1]
    assert twice == [], f"ticks run more than once: {twice[:10]}"
    slots = [slot_of(job_id) for job_id, _ in rows]
    assert all(s is not None for s in slots)
    gaps = [
        (a, b)
        for a, b in itertools.pairwise(slots)
        if a is not None and b is not None and b - a != timedelta(seconds=1)
    ]
    assert gaps == [], f"ticks missing between: {gaps[:10]}"
    # enqueued once, not only run once: no delivery met the fence as a duplicate
    log = (tmp_path / "worker.log").read_text()
    assert "duplicate skipped" not in log
    enqueued = _enqueue_lines(tmp_path)
    lag = await query(
        url,
        f"SELECT job_id, processed_at FROM {table(url, 'processed_jobs')} WHERE consumer = 'beat'",
    )
    delays = sorted(
        (_seconds(at) - slot.timestamp())
        for job_id, at in lag
        for slot in (slot_of(job_id),)
        if slot is not None
    )
    return {
        "ticks": len(rows),
        "first": slots[0],
        "last": slots[-1],
        "enqueue_rounds": enqueued,
        "lag_p50_s": round(delays[len(delays) // 2], 3),
        "lag_max_s": round(delays[-1], 3),
    }


def _enqueue_lines(folder: Path) -> dict[str, int]:
    """Per scheduler process, how many rounds of ticks it enqueued (its log lines)."""
    return {
        p.stem: p.read_text().count("periodic tick enqueued")
        for p in sorted(folder.glob("scheduler-*.log"))
    }


def _seconds(value: Any) -> float:
    return value.timestamp() if hasattr(value, "timestamp") else float(value)


@pytest.mark.slow
async def test_three_schedulers_on_postgresql_two_killed_and_restarted(
    pg_ledger: str, tmp_path: Path
) -> None:
    """~25 s: three scheduler processes, two of them SIGKILLed at tick 5 and restarted at
    tick 8, killed again at 14 and restarted at 17: 22+ ticks, each run exactly once, none
    missing."""
    found = await run_schedulers(
        pg_ledger,
        tmp_path,
        schedulers=3,
        phases=[(5, "kill"), (8, "restart"), (14, "kill"), (17, "restart")],
        end=22,
    )
    assert found["ticks"] >= 22
    print(f"\nthree schedulers, PostgreSQL: {found}")


@pytest.mark.slow
async def test_two_schedulers_on_sqlite_one_killed_and_restarted(
    sqlite_database: str, tmp_path: Path
) -> None:
    """~15 s on one SQLite file: two scheduler processes, one SIGKILLed at tick 5 and
    restarted at tick 9: every tick run exactly once, none missing."""
    ledger = await make_ledger(sqlite_database)
    found = await run_schedulers(
        ledger, tmp_path, schedulers=2, phases=[(5, "kill"), (9, "restart")], end=15
    )
    assert found["ticks"] >= 15
    print(f"\ntwo schedulers, SQLite: {found}")


@pytest.mark.proof  # three minutes: `pytest -m proof tests/periodic`
async def test_proof_three_schedulers_for_three_minutes(pg_ledger: str, tmp_path: Path) -> None:
    """The issue's proof: three scheduler processes, per-second, for 180 ticks; two of them
    SIGKILLed and restarted three times. Exactly one run per tick, none missing."""
    phases = [
        (30, "kill"),
        (45, "restart"),
        (80, "kill"),
        (95, "restart"),
        (130, "kill"),
        (140, "restart"),
    ]
    found = await run_schedulers(pg_ledger, tmp_path, schedulers=3, phases=phases, end=180)
    assert found["ticks"] >= 180
    print(f"\nproof, three schedulers, PostgreSQL, 3 minutes: {found}")
