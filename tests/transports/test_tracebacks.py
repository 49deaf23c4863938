"""Every failed attempt keeps its traceback (issue 14 §1), on every transport: a real
`jobfence worker` process, a job that crashes with an unexpected KeyError (retried, then
dead-lettered) and one rejected with a BusinessError. The dead letter's history has each
attempt's traceback (earlier attempts' travel with the job: a queue row's history, or the
broker message's headers / state), `jobfence dead-letters show` prints them, and the log
carries the traceback for the unexpected error only."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jobfence.core.jobs import history_from

from ..contract.support import (
    KINDS,
    REPO,
    Target,
    cleanup,
    make_target,
    start_worker,
    stop_worker,
    wait_started,
)
from ..helpers import eventually, query, table


@pytest.fixture(params=KINDS)
def target(request: pytest.FixtureRequest) -> Iterator[Target]:
    made = make_target(str(request.param), request)
    yield made
    asyncio.run(cleanup(made))


def _entries(log: Path) -> list[dict[str, Any]]:
    return [
        json.loads(line)
        for line in log.read_text(errors="replace").splitlines()
        if line.startswith("{")
    ]


async def _letters(url: str) -> dict[str, tuple[str, Any]]:
    rows = await query(
        url, f"SELECT job_id, error_category, history, id FROM {table(url, 'dead_letters')}"
    )
    return {job_id: (category, history, letter) for job_id, category, history, letter in rows}


async def test_each_attempt_keeps_its_traceback(target: Target, tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    worker = start_worker(target.env(tmp_path, lease=5.0), log, "--log-format", "json")
    try:
        await wait_started(log)
        app = target.app()
        async with app:
            await app.enqueue(target.queue, {"mode": "crash"}, job_id="crash-1")
            await app.enqueue(target.queue, {"mode": "reject"}, job_id="reject-1")

        async def both() -> bool:
            return len(await _letters(target.database_url)) == 2

        await eventually(both, timeout=90, what="two dead letters")
    finally:
        code = stop_worker(worker)
    assert code == 0, log.read_text(errors="replace")[-3000:]
    letters = await _letters(target.database_url)

    category, raw, crash_id = letters["crash-1"]
    history = history_from(raw)
    assert category == "TECHNICAL_ERROR"
    assert [h.attempt for h in history] == list(range(1, len(history) + 1))
    assert len(history) >= 2  # retried at least once: earlier traces travelled with the job
    for attempt in history:
        assert attempt.trace is not None, attempt
        assert attempt.trace.startswith("Traceback (most recent call last):")
        assert "in _lookup_member" in attempt.trace
        assert attempt.trace.rstrip().endswith("KeyError: 'member-of-crash-1'")
        assert "locals" not in attempt.trace

    category, raw, reject_id = letters["reject-1"]
    (only,) = history_from(raw)
    assert category == "BUSINESS_ERROR"
    assert only.trace is not None
    assert "BusinessError: order reject-1 was already shipped" in only.trace

    entries = _entries(log)
    crash_lines = [e for e in entries if e.get("job_id") == "crash-1" and "error" in e]
    assert crash_lines
    assert all("_lookup_member" in e.get("traceback", "") for e in crash_lines)
    reject_lines = [e for e in entries if e.get("job_id") == "reject-1" and "error" in e]
    assert [e["event"] for e in reject_lines] == ["job dead-lettered"]
    assert "traceback" not in reject_lines[0]

    shown = subprocess.run(  # noqa: ASYNC221 - the CLI as a user runs it, after the worker
        [sys.executable, "-m", "jobfence.cli", "dead-letters", "show", str(crash_id),
         "--database-url", target.database_url],
        cwd=REPO, capture_output=True, text=True, timeout=60, env={"COLUMNS": "200", "PATH": ""},
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert "traceback of attempt 1" in shown.stdout
    assert "KeyError: 'member-of-crash-1'" in shown.stdout
    assert reject_id


def test_brokers_carry_the_newest_traces_within_their_budget() -> None:
    """A broker message's history keeps tracebacks newest first within 32 KiB (older ones
    are dropped, one that does not fit is cut to its last bytes); Pub/Sub fits each attempt
    into one 1 024-byte attribute, keeping the traceback's last bytes that fit."""
    from jobfence.core.jobs import AttemptRecord
    from jobfence.errors import tail
    from jobfence.transports._broker import BROKER_TRACE_BUDGET, Meta, fit_traces
    from jobfence.transports.pubsub.attributes import attributes, read_meta

    big = "Traceback (most recent call last):\n" + "  frame\n" * 3000 + "KeyError: 'x'"
    history = [
        AttemptRecord(attempt=n, at="2026-01-01T00:00:00Z", category="TECHNICAL_ERROR",
                      error="KeyError: 'x'", trace=tail(big, 16 * 1024))
        for n in (1, 2, 3)
    ]  # fmt: skip
    fitted = fit_traces(history)
    assert fitted[0].trace is None
    assert fitted[2].trace == history[2].trace
    total = sum(len((h.trace or "").encode()) for h in fitted)
    assert 16 * 1024 < total <= BROKER_TRACE_BUDGET
    assert fitted[1].trace is not None
    assert fitted[1].trace.endswith("KeyError: 'x'")
    assert "bytes of traceback cut" in fitted[1].trace

    meta = Meta("job-1", None, None, 3, history)
    attrs = attributes(meta)
    assert all(len(v.encode()) <= 1024 for v in attrs.values())
    back = read_meta(attrs, "job-1").history
    assert [h.attempt for h in back] == [1, 2, 3]
    assert all(h.trace is not None and h.trace.endswith("KeyError: 'x'") for h in back)
