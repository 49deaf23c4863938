"""Issue 12 §6: a healthy worker is not silent at INFO. Every ``--summary-interval`` it logs
one summary line (jobs/s, done, retries, dead letters, duplicates since the last line), says
"idle" once per quiet stretch, and nothing with ``--summary-interval 0``. A real worker
subprocess on real PostgreSQL and SQLite, logging JSON at the default level."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jobfence import App

from .helpers import REPO, eventually, scalar, stop_process, wait_until

APP = "tests.apps.shutdown_app:app"


def start(ledger: str, tmp_path: Path, *args: str) -> Any:
    import os
    import subprocess
    import sys

    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("JOBFENCE_")},
        "JF_DB": ledger,
        "JF_MARKS": str(tmp_path),
        "PYTHONUNBUFFERED": "1",
    }
    log = (tmp_path / "worker.log").open("ab")
    return subprocess.Popen(
        [sys.executable, "-m", "jobfence.cli", "worker", APP, "--log-format", "json", *args],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def records(tmp_path: Path) -> list[dict[str, Any]]:
    lines = (tmp_path / "worker.log").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.startswith("{")]


def events(tmp_path: Path, name: str) -> list[dict[str, Any]]:
    return [r for r in records(tmp_path) if r.get("event") == name]


async def enqueue(ledger: str, jobs: list[tuple[str, dict[str, Any]]]) -> None:
    app = App(ledger)
    async with app:
        for job_id, payload in jobs:
            await app.enqueue("work", payload, job_id=job_id)


async def test_the_summary_counts_what_happened_and_idle_is_said_once(
    ledger: str, tmp_path: Path
) -> None:
    jobs = [(f"ok-{i}", {}) for i in range(5)]
    jobs += [("again", {"mode": "retry-once"}), ("doomed", {"mode": "dead"})]
    await enqueue(ledger, jobs)
    proc = start(ledger, tmp_path, "--summary-interval", "300ms")
    try:
        await eventually(lambda: ledger_has(ledger, 6), what="every effect (not the dead one)")

        def totals() -> dict[str, int] | None:
            lines = events(tmp_path, "worker summary")
            keys = ("done", "retries", "dead_letters", "duplicates")
            total = {k: sum(int(line[k]) for line in lines) for k in keys}
            return total if total["done"] == 6 and total["dead_letters"] == 1 else None

        total = wait_until(totals, what="summary lines covering every job")
        assert total == {"done": 6, "retries": 1, "dead_letters": 1, "duplicates": 0}
        first = events(tmp_path, "worker summary")[0]
        assert first["level"] == "info"
        assert first["jobs_per_s"] > 0
        assert 0.2 < first["interval_s"] < 30
        # several quiet intervals later, "idle" was said once
        wait_until(lambda: events(tmp_path, "worker idle"), what="idle line")
        wait_until(lambda: _quiet_for(tmp_path, 5), what="five quiet intervals")
    finally:
        assert stop_process(proc) == 0
    assert len(events(tmp_path, "worker idle")) == 1


async def ledger_has(ledger: str, jobs: int) -> bool:
    return bool(await scalar(ledger, "SELECT count(DISTINCT job_id) FROM ledger") == jobs)


def _quiet_for(tmp_path: Path, intervals: int) -> bool:
    """True once the log has been quiet for a few summary intervals (its mtime): a worker
    that said "idle" at every interval never gets there."""
    import time

    return time.time() - (tmp_path / "worker.log").stat().st_mtime > 0.3 * intervals


async def test_summary_interval_zero_turns_it_off(ledger: str, tmp_path: Path) -> None:
    await enqueue(ledger, [("ok-1", {})])
    proc = start(ledger, tmp_path, "--summary-interval", "0", "--log-level", "DEBUG")
    try:
        await eventually(lambda: ledger_has(ledger, 1), what="the job")
        wait_until(lambda: events(tmp_path, "job processed"), what="processed line")
    finally:
        assert stop_process(proc) == 0
    names = {r.get("event") for r in records(tmp_path)}
    assert "worker summary" not in names
    assert "worker idle" not in names
